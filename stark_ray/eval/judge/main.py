"""The judge's process: ``python -m stark_ray.eval.judge.main --backend B ...``, as the service starts it.

It starts the worker (in a thread, beside its own start: torch, the device, its facts and peaks), says hello with
the start's phases, then serves one request per line of its stdin with a :class:`~stark_ray.eval.judge.judge.Judge`,
answering on its own channel (the original stdout; what anything prints goes to stderr) until the device is no
longer healthy or the service closes the pipe. It dies with its parent, and what the worker's candidates detach
stays below it (:mod:`stark_ray.eval.proc.lifetime`).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# only what starting the worker needs, here: torch and the judge's own modules are imported once the worker's start
# is under way (``main``), so that the two processes' imports overlap (about a second each)
from stark_ray.eval.build.builder import serve_build
from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.eval.proc.lifetime import become_subreaper, die_with_parent
from stark_ray.eval.proc.runner import WorkerProcess
from stark_ray.eval.wire.protocol import STACK_DUMP_SIGNAL, WorkerRequest


def _serve_build(spec: WorkerSpec, request: dict[str, Any], seconds: float) -> dict[str, Any]:
    return serve_build(request, spec, Path(spec.build_dir), seconds)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stark_ray.eval.judge.main")
    p.add_argument("--backend", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--isolate-worker", action="store_true", help="the worker in namespaces of its own")
    p.add_argument("--hide", action="append", default=[], help="isolated: a path the worker does not see")
    p.add_argument("--worker-spares", type=int, default=0, help="the most hot spares of the worker it keeps")
    p.add_argument("--worker-disk-bytes", type=int, default=0, help="what the worker may write (its directory, a file)")
    p.add_argument("--worker-memory-bytes", type=int, default=0, help="the host memory the worker may hold (0: no cap)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # and what the worker's candidates detach stays below us (eval/proc/lifetime.py)
    become_subreaper()
    args = _args(argv)
    sys.stdout.flush()
    ctrl = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    faulthandler.enable(all_threads=True)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)

    def send(msg: dict[str, Any]) -> None:
        ctrl.write(json.dumps(msg) + "\n")
        ctrl.flush()

    spec = WorkerSpec(args.backend, args.build_dir, args.threads, isolate=args.isolate_worker, fd_channel=True,
                      hidden=tuple(args.hide), disk_bytes=args.worker_disk_bytes,
                      memory_bytes=args.worker_memory_bytes)
    worker = WorkerProcess(spec, spares=args.worker_spares)  # candidates per process: EvalConfig.worker_candidates
    if spec.isolate:  # what it builds (cpu_cpp; a build in ModelNew's __init__) is made outside (eval/build/builder.py)
        worker.on_build = functools.partial(_serve_build, spec)
    started: list[BaseException | None] = []

    def start_worker() -> None:  # beside our own start: torch, the device, its facts
        try:
            worker.start()
            started.append(None)
        except BaseException as e:
            started.append(e)

    begun = time.perf_counter()
    laps: dict[str, float] = {}

    def lap(name: str) -> None:
        laps[name] = round(time.perf_counter() - begun - sum(laps.values()), 3)

    starter = threading.Thread(target=start_worker, name="stark-worker-start", daemon=True)
    starter.start()
    try:
        import torch

        from stark_ray.eval.backends import get_backend
        from stark_ray.eval.judge.judge import Judge
        from stark_ray.eval.judge.sol import device_peaks
        from stark_ray.eval.proc.garbage import collect

        lap("judge_imports_s")
        backend = get_backend(args.backend)
        backend.prepare_judge(args.threads)
        torch.set_grad_enabled(False)
        lap("judge_prepare_s")
        hello = backend.hardware_info()
        peaks = device_peaks(backend.device, hello)  # before the free memory is read: the probe gives its back
        hello["peaks"] = peaks.describe() if peaks is not None else None  # what each speed of light is made of
        lap("device_info_s")
    except BaseException as e:  # a host problem (no GPU): the service reports the log's last lines
        traceback.print_exc()
        print(f"judge start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        worker.close()
        os._exit(3)
    starter.join()
    lap("worker_wait_s")
    if started and started[0] is not None:
        hello["worker_error"] = str(started[0])
    worker_phases = worker.hello.get("start_phases")
    if isinstance(worker_phases, dict):
        laps.update({f"worker_{k}": v for k, v in worker_phases.items() if isinstance(v, int | float)})
    hello["start_phases"] = laps
    free = torch.cuda.mem_get_info()[0] if backend.device == "cuda" else 0
    judge = Judge(backend, worker, free, peaks)
    collect()  # what start-up made is frozen: the collection after each candidate scans only its objects
    send({"hello": hello})
    ahead: threading.Thread | None = None
    for line in sys.stdin:
        if ahead is not None:  # the worker is the judge's again
            ahead.join()
            ahead = None
        if not line.strip():
            continue
        answer = judge.handle(WorkerRequest.from_json(line), send)
        sys.stdout.flush()
        sys.stderr.flush()
        send(answer)
        if not answer["healthy"]:
            break
        # where the candidate's worker retired, the next one starts now, while the caller builds; in a thread, so
        # that the next request is read meanwhile (a long one waits in no full pipe)
        ahead = threading.Thread(target=worker.start_ahead, name="stark-start-ahead", daemon=True)
        ahead.start()
    if ahead is not None:
        ahead.join()
    worker.close()
    ctrl.close()
    os._exit(0)


if __name__ == "__main__":
    main()
