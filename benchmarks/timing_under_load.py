"""How a busy host moves the evaluator's timing of a launch-bound forward, and what a head start does about it.

For each task given (default: the launch-bound ``7_TinyConvNet`` and the GPU-bound ``2_FusedSwishScaleClamp``),
the reference is timed against itself with the evaluator's own ``time_interleaved`` and ``CudaTimer`` (L2 flush,
events, device-wide sync), ``--repeats`` times, for each head start (``--heads``: a fixed one in µs, or ``auto``,
the evaluator's: fitted to the warm-up's host launch time), first on an idle host, then with ``--load`` processes
spinning on the CPU (a campaign's compile pool, agents and other workers). Printed per configuration: the host
launch time of one forward (median), the median runtime of each repeat, their spread, and the median CV within a
repeat.

Run (GPU machine): python benchmarks/timing_under_load.py [--tasks examples/tasks/7_TinyConvNet.py ...]
                   [--heads 0 300 auto] [--load 16] [--repeats 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def launch_us(model: Any, sets: list[list[Any]]) -> float:
    """Median host time of one forward call, without waiting for the GPU (the launches alone)."""
    import torch

    from stark_ray.eval.measure.inputs import clone_all

    samples = []
    with torch.no_grad():
        for r in range(30):
            args = clone_all(sets[r % len(sets)])
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(*args)
            samples.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
    return statistics.median(samples[5:])


def measure(path: Path, heads: list[str], repeats: int, trials: int) -> list[dict[str, Any]]:
    import torch

    from stark_ray.eval.loader import import_source
    from stark_ray.eval.measure.timing import GPU_WARMUP_MS, CudaTimer, make_input_sets, time_interleaved
    from stark_ray.eval.tasks import build_reference

    module = import_source(path.read_text(), f"probe_{path.stem}", Path("/tmp"), f"{path.stem}.py")
    model, _ = build_reference(module, path.stem, 0)
    model = model.to("cuda") if hasattr(model, "to") else model
    sets = make_input_sets(module.get_inputs, 0, "cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    host = launch_us(model, sets)
    rows = []
    for head in heads:
        timer = CudaTimer(l2) if head == "auto" else CudaTimer(l2, float(head), fit=False)
        medians, cvs = [], []
        for _ in range(repeats):
            t = time_interleaved([model, model], sets, timer, 3, trials, None, GPU_WARMUP_MS)[0]
            medians.append(t.stats.median)
            cvs.append(t.stats.cv)
        rows.append({"task": path.stem, "head": head, "head_us": round(t.head_us or 0.0, 1),
                     "launch_us": round(host, 1),
                     "medians_ms": [round(m, 5) for m in medians],
                     "spread": (max(medians) - min(medians)) / min(medians),
                     "cv_median": statistics.median(cvs)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", type=Path, default=[REPO / "examples/tasks/7_TinyConvNet.py",
                                                                REPO / "examples/tasks/2_FusedSwishScaleClamp.py"])
    ap.add_argument("--heads", nargs="+", default=["0", "300", "auto"])
    ap.add_argument("--load", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: list[dict[str, Any]] = []
    for load in (0, args.load):
        stop = mp.Event()
        procs = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(load)]
        for p in procs:
            p.start()
        try:
            for path in args.tasks:
                for row in measure(path, args.heads, args.repeats, args.trials):
                    row["load"] = load
                    out.append(row)
                    print(f"load {load:>3}  {row['task']:<24} head {row['head']:>4} ({row['head_us']:>7.1f} us)  "
                          f"launch {row['launch_us']:>7.1f} us  medians {row['medians_ms']}  spread "
                          f"{100 * row['spread']:.1f}%  cv {100 * row['cv_median']:.1f}%", flush=True)
        finally:
            stop.set()
            for p in procs:
                p.join()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
