"""Where one KernelBench task's device memory goes, process by process, over one evaluation on a GPU.

The task's reference, then the sweep's candidate (the reference's own forward as ``ModelNew``), with every claim
sent to the judge's confirmation where ``--confirm`` (as ``kernelbench_sweep.py --confirm``), under a memory budget;
``nvidia-smi`` samples each process's device memory every 50 ms meanwhile. Prints the result's log, the evaluator's
peak, and the timeline: a line each time a process's memory moved by half a GB or more (seconds since the
evaluation began), the device's total beside it, and between them the judge's steps (``STARK_MEMORY_TRACE``: what
the judge did then, its own memory, and what the worker said it held). For a row of the sweep whose peak went past
its budget.

    python benchmarks/memory_timeline.py --kernelbench .kb level1/48_Mean_reduction_over_a_dimension --budget 40 \
        --confirm
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kernelbench_sweep import CANDIDATE

GB = 1e9


class Timeline:
    """Each process's device memory (MiB), sampled by ``nvidia-smi --query-compute-apps`` every 50 ms."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, str, float]] = []  # (seconds, pid, MiB)
        self.start = time.monotonic()
        self.proc = subprocess.Popen(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits", "-lms", "50"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            pid, _, used = line.partition(",")
            try:
                self.samples.append((time.monotonic() - self.start, pid.strip(), float(used)))
            except ValueError:
                continue

    def lines(self, since: float, marks: Sequence[tuple[float, str]] = ()) -> list[str]:
        """A line each time a process moved by 0.5 GB or more (after ``since``), with every process's last; the
        judge's ``marks`` ((seconds, what)) between them, indented."""
        last: dict[str, float] = {}
        shown: dict[str, float] = {}
        out = []
        pending = sorted(m for m in marks if m[0] >= since)
        for at, pid, mib in self.samples:
            while pending and pending[0][0] <= at:
                when, what = pending.pop(0)
                out.append(f"{when - since:8.2f} s      judge: {what}")
            last[pid] = mib
            if at < since or abs(mib - shown.get(pid, 0.0)) * 2**20 < 0.5 * GB:
                continue
            shown[pid] = mib
            now = ", ".join(f"{p} {m * 2**20 / GB:.1f}" for p, m in sorted(last.items()))
            out.append(f"{at - since:8.2f} s  {now} GB")
        out += [f"{when - since:8.2f} s      judge: {what}" for when, what in pending]
        return out

    def stop(self) -> None:
        self.proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", help="e.g. level1/48_Mean_reduction_over_a_dimension")
    p.add_argument("--kernelbench", type=Path, default=Path("../shared/kernelbench"))
    p.add_argument("--budget", default="40", help="GB, or default")
    p.add_argument("--confirm", action="store_true", help="every claim through the judge's confirmation")
    args = p.parse_args()

    from stark_ray.config import EvalConfig
    from stark_ray.eval.measure.memory import TRACE_ENV
    from stark_ray.eval.service import EvalService
    from stark_ray.eval.tasks import load_task

    path = args.kernelbench / "KernelBench" / f"{args.task}.py"
    if not path.exists():
        raise SystemExit(f"memory_timeline: no task file {path}")
    task = load_task(path)
    cfg = EvalConfig(backend="cuda", memory_budget_gb=None if args.budget == "default" else float(args.budget),
                     confirm_above=0.0 if args.confirm else EvalConfig.confirm_above,
                     defences_off=("own_kernel",) if args.confirm else ())
    trace = Path(tempfile.mkdtemp()) / "judge_steps.tsv"
    os.environ[TRACE_ENV] = str(trace)  # the judge's process inherits it
    try:
        timeline = Timeline()
    except OSError:
        raise SystemExit("memory_timeline: needs nvidia-smi (run it on a GPU machine)") from None
    try:
        with EvalService(cfg) as service:
            reference = service.reference(task)
            print(f"reference: accepted {reference.accepted}, peak {reference.peak_memory_gb} GB")
            began = time.monotonic() - timeline.start
            result = service.evaluate(task, task.source + CANDIDATE)
        time.sleep(0.2)
    finally:
        timeline.stop()
    print(f"candidate: stage {result.stage}, flags {result.flags}, peak {result.peak_memory_gb} GB, "
          f"error {result.error}")
    print(result.log)
    print("timeline (seconds since the candidate's evaluation began; GB per process id):")
    marks = []
    if trace.exists():
        for line in trace.read_text().splitlines():
            when, _, rest = line.partition("\t")
            with contextlib.suppress(ValueError):
                marks.append((float(when) - timeline.start, rest.replace("\t", ": ")))
    print("\n".join(timeline.lines(began, marks)))


if __name__ == "__main__":
    main()
