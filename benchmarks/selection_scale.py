"""Selection as one task's tree grows: the time of one ε-greedy ``select`` right after an attach, at 100 to 5,000
nodes (issue 19's goal: <= 1 ms at 5,000).

A tree grows by the policy's own choices (seeded): each selected node gets a child that is accepted 60% of the
time (a runtime drawn from 1-20 ms against a 10 ms reference) and fails its checks otherwise. The time of each
``select`` is taken right after the attach before it (what a search pays: selection state kept until the tree
grows is rebuilt or updated then). ``--repo`` runs the same measurement against other checkouts of stark-ray (e.g.
an older commit, in a ``git worktree``), each in a process of its own, for a side-by-side figure.

Run:  python benchmarks/selection_scale.py [--sizes 100 1000 2500 5000] [--repo PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, random, statistics, sys, time
from stark_ray.config import SearchConfig
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, EvalResult
from stark_ray.search.policy import EpsilonGreedy, Rules
from stark_ray.search.tree import Tree

sizes = json.loads(sys.argv[1])
def ok(ms): return EvalResult(compiled=True, **{FIELD: True}, runtime_ms=ms, ref_runtime_ms=10.0, speedup=10.0 / ms,
                              stage=STAGE_OK)
def bad(): return EvalResult.failed(STAGE_CORRECTNESS, "outputs differ", "log")
t = Tree.with_reference("class Model: ...", ok(10.0))
rng, draw = random.Random(0), random.Random(1)
policy = EpsilonGreedy(0.3, Rules(n_root=5, n_child=3, max_debug_chain=2))
out, window = {}, []
while len(t) <= max(sizes) + 10:
    t0 = time.perf_counter()
    node = policy.select(t, rng)
    window.append(time.perf_counter() - t0)
    t.add(node.id, "class ModelNew: ...", "plan+code", ok(draw.uniform(1, 20)) if draw.random() < 0.6 else bad())
    if len(t) - 1 in sizes:
        out[len(t) - 1] = statistics.median(window[-10:]) * 1e3
print(json.dumps(out))
"""


def measure(repo: Path, sizes: list[int]) -> dict[str, float]:
    fields = (repo / "stark_ray" / "records.py").read_text()
    field = "passed_checks" if "passed_checks: bool" in fields else "correct"  # before the rename of session 19
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", MEASURE.replace("FIELD", repr(field)), json.dumps(sizes)],
                          env=env, capture_output=True, text=True, check=True, cwd=repo)
    return json.loads(proc.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 2500, 5000])
    p.add_argument("--repo", type=Path, nargs="*", default=[], help="other checkouts to measure beside this one")
    args = p.parse_args()
    rows = {str(r): measure(r, args.sizes) for r in [REPO, *args.repo]}
    print("| checkout | " + " | ".join(f"{n} nodes" for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for repo, figures in rows.items():
        print(f"| {repo} | " + " | ".join(f"{figures[str(n)]:.3f} ms" for n in args.sizes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
