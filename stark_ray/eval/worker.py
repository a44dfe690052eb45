"""The worker process: ``python -m stark_ray.eval.worker`` reads one request on stdin, evaluates, reports.

It is started by :mod:`stark_ray.eval.runner` in a new session (its own process group), a private working
directory and a scrubbed environment. At start it moves the control channel off fd 1 and points fd 1 at the
log (fd 2), so nothing the candidate or the compiler prints can corrupt the protocol, and all of it lands in
the log the debug agent sees. faulthandler dumps the Python stack on a segfault.
"""

from __future__ import annotations

import copy
import faulthandler
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend, get_backend
from stark_ray.eval.compare import Tolerance, compare_outputs
from stark_ray.eval.correctness import check_correctness
from stark_ray.eval.diagnostics import compiler_log, describe_exception, first_compiler_error
from stark_ray.eval.inputs import clone_all, make_inputs
from stark_ray.eval.loader import import_source
from stark_ray.eval.protocol import (
    MODE_REFERENCE,
    PHASE_COMPILE,
    PHASE_RUN,
    PHASE_SETUP,
    STACK_DUMP_SIGNAL,
    WorkerRequest,
    result_to_message,
)
from stark_ray.eval.tasks import TaskError, build_reference, make_task_inputs, run_reference_once
from stark_ray.eval.timing import Stats, time_interleaved
from stark_ray.records import (
    STAGE_COMPILE,
    STAGE_OK,
    STAGE_RUNTIME,
    EvalResult,
    excerpt,
)

Send = Callable[[dict[str, Any]], None]
LARGE_SPEEDUP = 10.0  # flagged (not rejected): KernelBench's threshold for a second look


class LogTail:
    """Reads what was written to the worker's log since a mark (the build output of one import)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.offset = os.lseek(2, 0, os.SEEK_CUR) if self.path else 0

    def since_mark(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        if not self.path:
            return ""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode("utf-8", errors="replace")


def _candidate_frame(tb: Any) -> str:
    """`` (candidate.py:LINE)`` for the innermost frame of the candidate in a traceback, if any."""
    where = ""
    for frame in traceback.extract_tb(tb):
        if frame.filename.endswith("candidate.py"):
            where = f" (candidate.py:{frame.lineno})"
    return where


def _compile_failure(exc: BaseException, output: str, started: float) -> EvalResult:
    tb = traceback.format_exc()
    compiler_error = first_compiler_error(output)
    if compiler_error and "Error building extension" in str(exc):
        error, log = compiler_error, compiler_log(output)
    else:
        error = describe_exception(exc) + _candidate_frame(exc.__traceback__)
        log = excerpt(f"{compiler_log(output)}\n{tb}".strip())
    result = EvalResult.failed(STAGE_COMPILE, error, log)
    result.compile_s = time.perf_counter() - started
    return result


def _model_on_device(model: Any, device: str) -> Any:
    return model.to(device) if device != "cpu" and hasattr(model, "to") else model


def evaluate_reference(req: WorkerRequest, cfg: EvalConfig, backend: Backend, module: Any, model: Any,
                       send: Send) -> EvalResult:
    send({"phase": PHASE_RUN})
    name = req.task_name

    def get_inputs() -> list[Any]:
        return make_task_inputs(module, name)

    import torch

    inputs = make_inputs(get_inputs, cfg.seed, device=backend.device)
    torch.manual_seed(cfg.seed)  # as in the correctness trials: random ops in forward draw the same numbers
    first = run_reference_once(model, clone_all(inputs), name)
    torch.manual_seed(cfg.seed)
    again = run_reference_once(model, clone_all(inputs), name)
    same = compare_outputs(again, first, Tolerance(cfg.atol, cfg.rtol, cfg.max_rel_err))
    if not same.ok:
        raise TaskError(f"task {name}: the reference is not deterministic: {same.problem}")
    # Timed against itself, exactly as a candidate run times the pair (two clones and two calls per round,
    # so the allocator sees the same pattern); the ratio of the two halves shows the timing noise.
    try:
        first_half, second_half = time_interleaved([model, model], get_inputs, backend.timer(), cfg.warmup,
                                                   cfg.timing_trials, cfg.seed, backend.device)
    except TaskError:
        raise
    except Exception as e:
        raise TaskError(f"task {name}: reference forward failed: {describe_exception(e)}") from None
    stats = Stats.of(first_half.samples + second_half.samples)
    noise = first_half.median / second_half.median
    return EvalResult(compiled=True, correct=True, runtime_ms=stats.median, ref_runtime_ms=stats.median,
                      speedup=1.0, stage=STAGE_OK,
                      log=f"reference: {stats.describe()}; self-speedup (noise) {noise:.3f}")


def evaluate_candidate(req: WorkerRequest, cfg: EvalConfig, backend: Backend, module: Any, ref_model: Any,
                       init_inputs: list[Any], send: Send) -> EvalResult:
    send({"phase": PHASE_COMPILE})
    tail = LogTail(req.log_path)
    tail.mark()
    started = time.perf_counter()
    try:
        cand = import_source(req.candidate_source or "", "stark_candidate", Path.cwd(), "candidate.py")
        model_cls = getattr(cand, "ModelNew", None)
        if model_cls is None:
            return EvalResult.failed(STAGE_COMPILE, "the candidate defines no ModelNew")
        import torch

        torch.manual_seed(cfg.seed)  # same seed as the reference: same parameters, created in the same order
        new_model = _model_on_device(model_cls(*copy.deepcopy(init_inputs)), backend.device)
    except BaseException as e:  # SystemExit included: the candidate is never allowed to end the worker
        return _compile_failure(e, tail.since_mark(), started)
    compile_s = time.perf_counter() - started
    build_output = tail.since_mark()

    send({"phase": PHASE_RUN})
    name = req.task_name

    def get_inputs() -> list[Any]:
        return make_task_inputs(module, name)

    report = check_correctness(ref_model, new_model, get_inputs, cfg, backend.device, name)
    if not report.ok:
        return EvalResult(compiled=True, correct=False, stage=report.stage, error=report.error,
                          log=excerpt(report.log), max_abs_err=report.max_abs_err, rel_err=report.rel_err,
                          compile_s=compile_s)
    try:
        ref_stats, new_stats = time_interleaved([ref_model, new_model], get_inputs, backend.timer(),
                                                cfg.warmup, cfg.timing_trials, cfg.seed, backend.device)
    except Exception as e:
        return EvalResult(compiled=True, correct=True, stage=STAGE_RUNTIME,
                          error=f"while timing: {describe_exception(e)}", log=excerpt(traceback.format_exc()),
                          max_abs_err=report.max_abs_err, rel_err=report.rel_err, compile_s=compile_s)
    speedup = ref_stats.median / new_stats.median if new_stats.median > 0 else float("inf")
    flags = ["large_speedup"] if speedup > LARGE_SPEEDUP else []
    log = (f"correct over {cfg.trials} trials (max_abs_err {report.max_abs_err:.3g}, rel_err "
           f"{report.rel_err:.3g})\nreference: {ref_stats.describe()}\ncandidate: {new_stats.describe()}")
    if "warning:" in build_output:
        log += "\n" + compiler_log(build_output)
    return EvalResult(compiled=True, correct=True, runtime_ms=new_stats.median,
                      ref_runtime_ms=ref_stats.median, speedup=speedup, stage=STAGE_OK, log=excerpt(log),
                      max_abs_err=report.max_abs_err, rel_err=report.rel_err, flags=flags,
                      compile_s=compile_s)


def run_request(req: WorkerRequest, send: Send) -> EvalResult:
    send({"phase": PHASE_SETUP})
    cfg = EvalConfig(**req.cfg)
    backend = get_backend(cfg.backend)
    backend.prepare_worker(Path(req.build_dir), req.threads)
    import torch

    torch.set_grad_enabled(False)
    try:
        try:
            module = import_source(req.task_source, "stark_task", Path.cwd(), "task.py")
        except Exception as e:
            raise TaskError(f"task {req.task_name}: import failed: {describe_exception(e)}") from None
        model, init_inputs = build_reference(module, req.task_name, cfg.seed)
        model = _model_on_device(model, backend.device)
        if req.mode == MODE_REFERENCE:
            return evaluate_reference(req, cfg, backend, module, model, send)
        return evaluate_candidate(req, cfg, backend, module, model, init_inputs, send)
    except TaskError as e:
        result = EvalResult.failed(STAGE_RUNTIME, str(e), traceback.format_exc())
        result.flags.append("task_error")
        return result
    except BaseException as e:  # SystemExit or anything else the candidate raised while running
        return EvalResult(compiled=True, stage=STAGE_RUNTIME, error=describe_exception(e) + _candidate_frame(
            e.__traceback__), log=excerpt(traceback.format_exc()))


def _control_channel() -> TextIO:
    """Keep the real stdout for the protocol; from now on fd 1 writes into the log (fd 2)."""
    sys.stdout.flush()
    ctrl = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return ctrl


def main() -> None:
    ctrl = _control_channel()
    faulthandler.enable(all_threads=True)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)  # the parent asks for a stack before a kill

    def send(msg: dict[str, Any]) -> None:
        ctrl.write(json.dumps(msg) + "\n")
        ctrl.flush()

    req = WorkerRequest.from_json(sys.stdin.read())
    result = run_request(req, send)
    send(result_to_message(result))
    sys.stdout.flush()
    sys.stderr.flush()
    ctrl.close()
    os._exit(0)  # no interpreter teardown: the candidate's atexit hooks and destructors cannot hang it


if __name__ == "__main__":
    main()
