"""Inside the worker: each task's reference (kept while the worker lives) and the judging of one candidate.

A candidate goes through: import (its build), the torch fingerprint, ``ModelNew(...)``, the correctness
trials with their guards, a profile of its kernels (GPU), timing against the reference (and the optional
torch.compile baseline) on rotating input sets with every timed output checked, a wall-clock second opinion
for a large speedup (confirmed when the wall-clock ratio is within 2x of the events' or above 10x itself),
and the fingerprint again. Its faults become an :class:`EvalResult`, never an exception.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend
from stark_ray.eval.build_log import LogTail, candidate_frame, compile_failure
from stark_ray.eval.compare import Tolerances, compare_outputs
from stark_ray.eval.correctness import check_correctness
from stark_ray.eval.diagnostics import compiler_log, describe_exception
from stark_ray.eval.guards import (
    TorchFingerprint,
    defined_kernels,
    kernel_launches,
    nbytes_of,
    own_kernel_names,
)
from stark_ray.eval.inputs import clone_all, make_inputs
from stark_ray.eval.loader import import_source
from stark_ray.eval.protocol import (
    MODE_COMPILE,
    MODE_REFERENCE,
    PHASE_CHECK,
    PHASE_COMPILE,
    PHASE_SETUP,
    PHASE_TIME,
    WorkerRequest,
)
from stark_ray.eval.task_state import TaskState, on_device
from stark_ray.eval.tasks import TaskError, build_reference, run_reference_once
from stark_ray.eval.timing import (
    GPU_WARMUP_MS,
    HEAD_START_US,
    WALL_SEED_OFFSET,
    Stats,
    TimingMismatch,
    leaves_work_behind,
    make_input_sets,
    time_interleaved,
    wall_times,
)
from stark_ray.records import STAGE_COMPILE, STAGE_CORRECTNESS, STAGE_OK, STAGE_RUNTIME, EvalResult, excerpt

Send = Callable[[dict[str, Any]], None]
LARGE_SPEEDUP = 10.0  # above this, a wall-clock re-measure on fresh inputs must confirm the speedup
WALL_AGREEMENT = 0.5  # confirmed when the wall-clock speedup is at least this fraction of the event one
WALL_ROUNDS = 10
KEPT_TASKS = 32  # task references a worker keeps at most (a campaign worker moves from task to task) ...
KEPT_SHARE = 0.25  # ... while what they hold on the device stays under this share of its memory
KEPT_CPU_BYTES = 4 << 30  # ... or, on the CPU, under this


class Judge:
    """Serves requests inside one worker process."""

    def __init__(self, backend: Backend, compile_only: bool = False) -> None:
        self.backend = backend
        self.compile_only = compile_only
        self.tasks: OrderedDict[str, TaskState] = OrderedDict()
        if not compile_only:
            _settle_torch()
        self.fingerprint = TorchFingerprint()
        self.count = 0

    # -- tasks ------------------------------------------------------------------------------------------------
    def task_state(self, req: WorkerRequest, cfg: EvalConfig) -> TaskState:
        key = hashlib.sha256(f"{cfg.seed}\0{req.task_source}".encode()).hexdigest()
        state = self.tasks.get(key)
        if state is not None:
            self.tasks.move_to_end(key)
            return state
        try:
            module = import_source(req.task_source, f"stark_task_{key[:12]}", Path(os.environ.get("TMPDIR", ".")),
                                   f"task_{key[:12]}.py")
        except Exception as e:
            raise TaskError(f"task {req.task_name}: import failed: {describe_exception(e)}") from None
        model, init_inputs = build_reference(module, req.task_name, cfg.seed)
        device = self.backend.device
        state = TaskState(req.task_name, module, on_device(model, device), init_inputs, device, cfg.seed)
        import torch

        torch.manual_seed(cfg.seed)
        out = run_reference_once(state.model, make_inputs(state.get_inputs, cfg.seed, device=device), state.name)
        state.output_nbytes = nbytes_of(out)
        self.tasks[key] = state
        self._evict(key)
        return state

    def _evict(self, keep: str) -> None:
        """Forget the least recently used tasks beyond KEPT_TASKS or the memory they may hold (never ``keep``)."""
        budget = self._kept_budget()
        while len(self.tasks) > 1:
            held = sum(s.held_bytes() for s in self.tasks.values())
            if len(self.tasks) <= KEPT_TASKS and held <= budget:
                return
            oldest = next(iter(self.tasks))
            if oldest == keep:
                return
            del self.tasks[oldest]

    def _kept_budget(self) -> int:
        if self.backend.device != "cuda":
            return KEPT_CPU_BYTES
        import torch

        return int(KEPT_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)

    # -- requests ---------------------------------------------------------------------------------------------
    def handle(self, req: WorkerRequest, send: Send) -> tuple[EvalResult, bool]:
        """The result of one request, and whether this worker may serve another."""
        cfg = EvalConfig(**req.cfg)
        self.count += 1
        try:
            if req.mode == MODE_COMPILE:
                result = self.build_only(req, send)
            else:
                send({"phase": PHASE_SETUP})
                state = self.task_state(req, cfg)
                if req.mode == MODE_REFERENCE:
                    result = self.reference(state, cfg, send)
                else:
                    result = self.candidate(req, cfg, state, send)
        except TaskError as e:
            result = EvalResult.failed(STAGE_RUNTIME, str(e), traceback.format_exc())
            result.flags.append("task_error")
        except BaseException as e:  # SystemExit or anything else the candidate raised while running
            result = EvalResult(compiled=True, stage=STAGE_RUNTIME,
                                error=describe_exception(e) + candidate_frame(e.__traceback__),
                                log=excerpt(traceback.format_exc()))
        if self.tasks:  # what this request made (trials, input sets) counts now
            self._evict(next(reversed(self.tasks)))
        changed = [] if self.compile_only else self.fingerprint.changed()
        if changed:
            result = EvalResult(compiled=True, stage=STAGE_CORRECTNESS, error=_tamper_error(changed),
                                flags=["tampered"], compile_s=result.compile_s)
        healthy = not changed and (self.compile_only or self.backend.healthy())
        return result, healthy

    def build_only(self, req: WorkerRequest, send: Send) -> EvalResult:
        """Import the candidate so that its extension is built into the cache (compile pool, no device)."""
        send({"phase": PHASE_COMPILE})
        tail = LogTail()
        tail.mark()
        started = time.perf_counter()
        try:
            import_source(req.candidate_source or "", f"stark_candidate_{self.count}", Path.cwd(), "candidate.py")
        except BaseException as e:
            return compile_failure(e, tail.since_mark(), started)
        return EvalResult(compiled=True, stage=STAGE_OK, compile_s=time.perf_counter() - started)

    def reference(self, state: TaskState, cfg: EvalConfig, send: Send) -> EvalResult:
        import torch

        send({"phase": PHASE_CHECK})
        inputs = make_inputs(state.get_inputs, cfg.seed, device=state.device)
        torch.manual_seed(cfg.seed)  # as in the correctness trials: random ops in forward draw the same numbers
        first = run_reference_once(state.model, clone_all(inputs), state.name)
        torch.manual_seed(cfg.seed)
        again = run_reference_once(state.model, clone_all(inputs), state.name)
        same = compare_outputs(again, first, Tolerances.of(cfg))
        if not same.ok:
            raise TaskError(f"task {state.name}: the reference is not deterministic: {same.problem}")
        send({"phase": PHASE_TIME})
        fns = [state.model, state.model]  # timed against itself: the ratio of the two halves shows the noise
        if cfg.baseline == "compile":
            fns.append(state.baseline_compiled())
        try:
            timings = time_interleaved(fns, state.timing_sets(), self.backend.timer(), cfg.warmup,
                                       self._trials(cfg), None, self._warmup_ms(state), cfg.timing_precision)
        except TaskError:
            raise
        except Exception as e:
            raise TaskError(f"task {state.name}: reference forward failed: {describe_exception(e)}") from None
        stats = Stats.of(timings[0].stats.samples + timings[1].stats.samples)
        noise = timings[0].stats.median / timings[1].stats.median
        log = f"reference: {stats.describe()}; self-speedup (noise) {noise:.3f}"
        compiled_ms = None
        if len(timings) > 2:
            compiled_ms = timings[2].stats.median
            log += f"\ntorch.compile baseline: {timings[2].stats.describe()}"
        return EvalResult(compiled=True, correct=True, runtime_ms=stats.median, ref_runtime_ms=stats.median,
                          speedup=1.0, stage=STAGE_OK, log=log, ref_compile_runtime_ms=compiled_ms,
                          runtime_cv=stats.cv, ref_runtime_cv=stats.cv)

    @staticmethod
    def _warmup_ms(state: TaskState) -> float:
        return GPU_WARMUP_MS if state.device == "cuda" else 0.0

    def _trials(self, cfg: EvalConfig) -> int:
        return cfg.timing_trials or self.backend.default_timing_trials()

    def candidate(self, req: WorkerRequest, cfg: EvalConfig, state: TaskState, send: Send) -> EvalResult:
        import torch

        send({"phase": PHASE_COMPILE})
        tail = LogTail()
        tail.mark()
        started = time.perf_counter()
        source = req.candidate_source or ""
        try:
            cand = import_source(source, f"stark_candidate_{self.count}", Path.cwd(), "candidate.py")
            changed = self.fingerprint.changed()
            if changed:  # before ModelNew runs anything next to the reference
                return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, error=_tamper_error(changed),
                                  flags=["tampered"])
            model_cls = getattr(cand, "ModelNew", None)
            if model_cls is None:
                return EvalResult.failed(STAGE_COMPILE, "the candidate defines no ModelNew")
            torch.manual_seed(cfg.seed)  # same seed as the reference: same parameters, in the same order
            new_model = on_device(model_cls(*copy.deepcopy(state.init_inputs)), state.device)
            self.backend.synchronize()
        except BaseException as e:  # SystemExit included: the candidate is never allowed to end the worker
            failed = compile_failure(e, tail.since_mark(), started)
            failed.flags = [f for f in failed.flags if f != "build_error"]  # only the compile pool needs it
            return failed
        finally:
            sys.modules.pop(f"stark_candidate_{self.count}", None)
        compile_s = time.perf_counter() - started
        build_output = tail.since_mark()

        send({"phase": PHASE_CHECK})
        phases = _Phases(compile_s)
        report = check_correctness(state.model, new_model, state.get_inputs, cfg, state.device, state.name,
                                   state.output_nbytes, self.backend.synchronize, state.trials)
        phases.lap("checks")
        base = {"compiled": True, "max_abs_err": report.max_abs_err, "rel_err": report.rel_err,
                "compile_s": compile_s}
        if not report.ok:
            return EvalResult(correct=False, stage=report.stage, error=report.error, log=excerpt(report.log),
                              **base)
        flags: list[str] = []
        notes: list[str] = []
        if state.device == "cuda":
            notes += self._kernel_profile(state, new_model, source, flags)
            phases.lap("kernel profile")

        send({"phase": PHASE_TIME})
        fns = [state.model, new_model]
        if cfg.baseline == "compile":
            fns.append(state.baseline_compiled())
        tol = Tolerances.of(cfg)

        def check(out: Any, ref: Any) -> str | None:
            c = compare_outputs(out, ref, tol)
            return None if c.ok else c.problem

        try:
            timings = time_interleaved(fns[:2], state.timing_sets(), self.backend.timer(), cfg.warmup,
                                       self._trials(cfg), check, self._warmup_ms(state), cfg.timing_precision)
            if len(fns) > 2:  # the baseline is checked once when compiled; timed beside the eager reference
                timings.append(time_interleaved([fns[0], fns[2]], state.timing_sets(), self.backend.timer(),
                                                cfg.warmup, self._trials(cfg), None, self._warmup_ms(state),
                                                cfg.timing_precision)[1])
        except TimingMismatch as e:
            return EvalResult(correct=False, stage=STAGE_CORRECTNESS, error=f"{e} (memoised or racy output?)",
                              **base)
        except Exception as e:
            return EvalResult(correct=True, stage=STAGE_RUNTIME, error=f"while timing: {describe_exception(e)}",
                              log=excerpt(traceback.format_exc()), **base)
        phases.lap("timing")
        ref_t, new_t = timings[0], timings[1]
        ref_stats, new_stats = ref_t.stats, new_t.stats
        if leaves_work_behind(new_t, ref_t) and "extra_stream" not in flags:
            flags.append("extra_stream")
            notes.append(f"work left running after forward returned ({new_t.gap_ms:.3g} ms)")
        if "extra_stream" in flags:  # then both sides are timed up to a device-wide sync
            ref_stats, new_stats = ref_t.synced, new_t.synced
        speedup = ref_stats.median / new_stats.median if new_stats.median > 0 else float("inf")
        if speedup > LARGE_SPEEDUP:
            flags.append("large_speedup")
            notes.append(self._second_opinion(state, fns[:2], speedup, check, flags))
            phases.lap("wall-clock re-measure")
        log = [f"correct over {cfg.trials} trials (max_abs_err {report.max_abs_err:.3g}, rel_err "
               f"{report.rel_err:.3g})", f"reference: {ref_stats.describe()}", f"candidate: {new_stats.describe()}"]
        compiled_ms = None
        if len(timings) > 2:
            compiled_ms = timings[2].stats.median
            log.append(f"torch.compile baseline: {timings[2].stats.describe()}")
        if ref_t.head_us and ref_t.head_us > HEAD_START_US:
            log.append(f"launch-bound: timed with a {ref_t.head_us:.0f} us head start (GPU time; launch overhead "
                       "not counted)")
        log += notes
        log.append(phases.describe())
        if "warning:" in build_output:
            log.append(compiler_log(build_output))
        rejected = [n for n in notes if n.startswith(("no kernel", "suspicious"))]
        return EvalResult(correct=True, runtime_ms=new_stats.median, ref_runtime_ms=ref_stats.median,
                          speedup=speedup, stage=STAGE_OK, log=excerpt("\n".join(log)), flags=flags,
                          error="; ".join(rejected) or None,
                          ref_compile_runtime_ms=compiled_ms, runtime_cv=new_stats.cv, ref_runtime_cv=ref_stats.cv,
                          **base)

    def _kernel_profile(self, state: TaskState, model: Any, source: str, flags: list[str]) -> list[str]:
        """Profile one call: flag ``no_kernel`` when none of the kernels the source defines was launched, and
        ``extra_stream`` when its own kernels ran on a stream the reference never uses."""
        try:
            if state.streams is None:
                state.streams = {s for _, s in kernel_launches(state.model, clone_all(state.timing_sets()[0]))
                                 if s is not None}
            launches = kernel_launches(model, clone_all(state.timing_sets()[0]))
        except Exception as e:  # no profiler here (CUPTI missing): say so, do not guess
            return [f"kernel profile unavailable: {describe_exception(e)}"]
        own = own_kernel_names([n for n, _ in launches], defined_kernels(source))
        if not own:
            flags.append("no_kernel")
            shown = ", ".join(sorted({n for n, _ in launches})[:6]) or "nothing"
            return [f"no kernel of its own was launched (only: {shown})"]
        elsewhere = {s for n, s in launches if n in own and s is not None} - (state.streams or set())
        if state.streams and elsewhere:
            flags.append("extra_stream")
            return [f"its kernels ran on another stream than the current one ({len(elsewhere)} stream(s)): "
                    "timed up to a device-wide sync"]
        return []

    def _second_opinion(self, state: TaskState, fns: list[Any], speedup: float,
                        check: Callable[[Any, Any], str | None], flags: list[str]) -> str:
        """Re-measure a large speedup with host wall-clock time on fresh inputs; flag it when unconfirmed."""
        fresh = make_input_sets(state.get_inputs, state.seed, state.device, offset=WALL_SEED_OFFSET)
        try:
            ref_w, new_w = wall_times(fns, fresh, self.backend.synchronize, WALL_ROUNDS, check)
        except TimingMismatch as e:
            flags.append("suspicious")
            return f"suspicious: {e}"
        wall = ref_w.median / new_w.median if new_w.median > 0 else float("inf")
        # the host's fixed cost per call compresses very large ratios: confirmed when the wall clock agrees
        # within a factor of two, or shows a large speedup by itself
        if wall < min(WALL_AGREEMENT * speedup, LARGE_SPEEDUP):
            flags.append("suspicious")
            return f"suspicious: {speedup:.1f}x by events but {wall:.1f}x by wall-clock time on fresh inputs"
        return f"large speedup confirmed by wall-clock time on fresh inputs: {wall:.1f}x"


class _Phases:
    """Where the evaluator's time went for one candidate (shown in its log)."""

    def __init__(self, build_s: float) -> None:
        self.laps: list[tuple[str, float]] = [("build/import", build_s)]
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.t))
        self.t = now

    def describe(self) -> str:
        return "evaluator time: " + ", ".join(f"{name} {s:.3f} s" for name, s in self.laps)


def preload() -> None:
    """The imports a device worker's judge needs, done ahead (no device work): a spare worker does them while
    it waits to be promoted."""
    import torch._dynamo  # noqa: F401


def _settle_torch() -> None:
    """Let torch make the patches it makes to itself (dynamo replaces torch.manual_seed on import, and tags
    nn.Module.__init__ on the first torch.compile) before the fingerprint, so that a candidate using
    torch.compile is not taken for one that tampers with torch."""
    import torch._dynamo  # noqa: F401

    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init

        install_generation_tagging_init()
    except Exception:  # another torch version: a false alarm there shows as "tampered" in a test, not silently
        pass


def _tamper_error(changed: list[str]) -> str:
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return f"the candidate replaced part of torch or of the evaluator ({shown}); rejected"
