"""What the runoff (stark_ray/search/runoff.py) changes in the best a search names, measured on the real evaluator.

Three candidates of one task whose true order is known by construction — the reference's own computation, and the same
with a sleep of ``--gaps`` of the reference's runtime added to each call (default 5% and 10%: as close as candidates
of one search often are) — are each evaluated ``--rounds`` times by the real evaluator (cpu_cpp, the task
examples/tasks/1_LeakyReluScale.py), in mirrored order round after round. From those real figures, many searches are
resampled: a search names its best from one evaluation of each candidate (what the leaderboard holds); the runoff from
the geometric mean of two more evaluations of each, as ``search/runoff.py`` does. It prints, for both, how often the
named candidate is the truly fastest and how far the named figure lies above that candidate's mean over every round
(the winner's curse). The runoff's own rounds are taken minutes apart here, not in one sitting: if anything, that
makes it look worse than it is.

    python benchmarks/runoff_effect.py [--rounds 8] [--gaps 0.05 0.10] [--draws 4000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stark_ray.analysis.metrics import geomean
from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from scripted_replies import SLOWER  # noqa: E402

TASK = ROOT / "examples" / "tasks" / "1_LeakyReluScale.py"


def candidate(sleep_s: float) -> str:
    """The reference's own computation, with a sleep of ``sleep_s`` added to each call (tests/scripted_replies.py's
    SLOWER, its sleep changed)."""
    return SLOWER.replace("time.sleep(0.08)", f"time.sleep({sleep_s!r})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--gaps", type=float, nargs="+", default=[0.05, 0.10])
    p.add_argument("--draws", type=int, default=4000)
    args = p.parse_args()
    if args.rounds < 3:
        print("runoff_effect: --rounds must be at least 3 (one for the search, two for the runoff)", file=sys.stderr)
        return 2
    task = load_task(TASK)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as build, EvalService(EvalConfig(backend="cpu_cpp", build_dir=build)) as svc:
        ref_ms = svc.reference(task).runtime_ms or 1.0
        sources = [candidate(round(g * ref_ms / 1000, 6)) for g in (0.0, *args.gaps)]
        figures: list[list[float]] = [[] for _ in sources]
        for r in range(args.rounds):
            order = range(len(sources)) if r % 2 == 0 else reversed(range(len(sources)))
            for i in order:
                result = svc.evaluate(task, sources[i])
                if not result.accepted or not result.speedup:
                    print(f"runoff_effect: candidate {i} not accepted in round {r}: {result.stage}: {result.error}",
                          file=sys.stderr)
                    return 1
                figures[i].append(result.speedup)
    rng = random.Random(0)
    names = ["reference's computation", *(f"+{g:.0%} sleep" for g in args.gaps)]
    means = [statistics.fmean(f) for f in figures]
    print(f"task {task.name}, cpu_cpp, reference {ref_ms:.2f} ms alone; {args.rounds} evaluations of each candidate "
          f"in {time.monotonic() - started:.0f} s")
    for name, f, m in zip(names, figures, means, strict=True):
        spread = statistics.stdev(f) / m if len(f) > 1 else 0.0
        print(f"  {name:<24} mean {m:.3f}x  spread {spread:.1%}  [{', '.join(f'{v:.2f}' for v in f)}]")
    fastest = 0  # by construction: the others add a sleep to the same computation
    picks = {"search (one evaluation each)": [0, 0.0], "runoff (two more, geometric mean)": [0, 0.0]}
    for _ in range(args.draws):
        one, two = [], []
        for f in figures:
            i, j, k = rng.sample(range(len(f)), 3)
            one.append(f[i])
            two.append(geomean([f[j], f[k]]) or 0.0)
        for key, shown in zip(picks, (one, two), strict=True):
            named = max(range(len(shown)), key=shown.__getitem__)
            picks[key][0] += named == fastest
            picks[key][1] += shown[named] / means[named] - 1
    print(f"\n{args.draws} resampled searches     named the fastest   named figure above its mean")
    for key, (right, bias) in picks.items():
        print(f"  {key:<34} {right / args.draws:>7.1%}   {bias / args.draws:>+10.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
