"""What a fresh worker per candidate costs back to back, by the number of hot spares (EvalConfig.worker_spares).

Each candidate runs in a worker process of its own (``worker_candidates`` 1, a GPU's default). A restart costs a
whole interpreter start (torch imported, and dynamo on a GPU: 2 s on this 2-core box, 7-9 s on the GPU machine) unless a
spare waits ready. The KernelBench sweep asks back to back — a task's reference, then one candidate, then the next
task's — and with one spare each start waited for it: the reference's step went from 1.2 s to 7.2 s (H200, session
27). Here, side by side in one run, for each setting of ``worker_spares``: the example tasks twice over, each a
reference then the reference's own forward as the candidate, as the sweep does; seconds of each step as the caller
waits for it (a fresh EvalService per setting, its first task left out: the judge's own start). On the CPU backends
the spares are switched on by hand (they have none by default).

    python benchmarks/worker_turnover.py                       # cpu_cpp, spares 0 1 3
    python benchmarks/worker_turnover.py --backend cuda        # the GPU machine
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CANDIDATE = "\n\nclass ModelNew(Model):  # the reference's own forward\n    pass\n"


def one_setting(backend: str, spares: int, rounds: int, per_worker: int = 1) -> dict[str, object]:
    from stark_ray.config import EvalConfig
    from stark_ray.eval.service import EvalService
    from stark_ray.eval.tasks import load_task

    # the example tasks sized for a CPU (10 and 11 are GPU-sized: a CPU reference of 11_GemmSum runs past its limit)
    tasks = [load_task(p) for p in sorted((ROOT / "examples" / "tasks").glob("[1-9]_*.py"))]
    cfg = EvalConfig(backend=backend, worker_candidates=per_worker, worker_spares=spares)
    refs: list[float] = []
    cands: list[float] = []
    began = time.perf_counter()
    with EvalService(cfg, spare=spares > 0) as service:
        for n, task in enumerate(tasks * rounds):
            t0 = time.perf_counter()
            service.reference(task, cfg)
            t1 = time.perf_counter()
            result = service.evaluate(task, task.source + CANDIDATE, cfg)
            t2 = time.perf_counter()
            if n and result.passed_checks:  # the first: the judge's and its first worker's start
                refs.append(t1 - t0)
                cands.append(t2 - t1)
        kept, misses = service.worker_spares
        starts, promotions = service.worker_starts, service.worker_promotions
    label = spares if per_worker == 1 else f"{spares}, {per_worker} per worker"
    return {"spares": label, "kept": kept, "misses": misses, "starts": starts, "promotions": promotions,
            "ref_median": statistics.median(refs), "cand_median": statistics.median(cands),
            "pair_p90": sorted(r + c for r, c in zip(refs, cands, strict=True))[int(0.9 * len(refs))],
            "wall": time.perf_counter() - began, "n": len(refs)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cpu_cpp")
    p.add_argument("--spares", type=int, nargs="+", default=[0, 1, 3])
    p.add_argument("--rounds", type=int, default=2, help="times over the example tasks")
    p.add_argument("--kept", type=int, default=0, help="also a row with one worker serving this many candidates "
                                                      "(no spare): 64 is what the CPU backends did before")
    args = p.parse_args(argv)
    rows = [one_setting(args.backend, s, args.rounds) for s in args.spares]
    if args.kept:
        rows.append(one_setting(args.backend, 0, args.rounds, args.kept))
    print(f"\n{args.backend}: reference then candidate, back to back, a fresh worker per candidate")
    print("spares (most / kept, misses) | starts (promoted) | reference s | candidate s | pair p90 s | wall s (n)")
    base = rows[0]["ref_median"]
    for r in rows:
        print(f"{r['spares']} / {r['kept']}, {r['misses']} | {r['starts']} ({r['promotions']}) | "
              f"{r['ref_median']:.2f} ({float(r['ref_median']) / float(base):.2f}x of spares {rows[0]['spares']}) | "
              f"{r['cand_median']:.2f} | {r['pair_p90']:.2f} | {r['wall']:.1f} ({r['n']})")


if __name__ == "__main__":
    main()
