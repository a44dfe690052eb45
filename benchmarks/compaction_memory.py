"""The end of a campaign's compaction: its peak memory at 250 and 1,000 tasks, against the code before.

A stand-in run directory is written through the product's own RunStore, as a campaign's driver writes it: per task
30 attempts, each with 2 LLM calls, one part file per flush (``flush_rows=1``: the many small files a long campaign
leaves, ~70 KB each: a candidate's source and scaffold of ~12k characters, a log of ~8k). Then ``compact_run``
rewrites it in a child process, whose peak resident memory (``ru_maxrss``) is read; ``--before DIR`` runs the same
compaction with the stark_ray of another checkout (e.g. a worktree of the commit before) on a copy of the same run,
side by side.

    python benchmarks/compaction_memory.py --tasks 250 1000 [--before /tmp/old-checkout]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ATTEMPTS, CALLS = 30, 2
CHILD = """
import resource, sys, time
from stark_ray.store.compact import compact_run
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the imports'
t0 = time.perf_counter()
done = compact_run(sys.argv[1])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(time.perf_counter() - t0, peak, base, done.describe())
"""


def text(rng: random.Random, chars: int) -> str:
    """Code-like text that compresses about as little as real candidates' (names, numbers)."""
    letters = "abcdefghijklmnopqrstuvwxyz_0123456789"
    return " ".join("".join(rng.choices(letters, k=rng.randint(2, 12))) for _ in range(chars // 8))


def write_run(root: Path, tasks: int) -> Path:
    from stark_ray.records import STAGE_OK, EvalResult, LLMUsage, Node
    from stark_ray.store.run_store import RunStore

    rng = random.Random(0)
    with RunStore(root, "run", flush_rows=1, background=False, fsync=False) as store:
        for t in range(tasks):
            task = f"task_{t:04d}"
            for seq in range(ATTEMPTS + 1):
                node = Node(id=seq, parent=None if seq == 0 else seq - 1, depth=seq, source=text(rng, 12_000),
                            agent="reference" if seq == 0 else "plan+code", scaffold=text(rng, 12_000),
                            instruction=text(rng, 1_500),
                            result=EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0, stage=STAGE_OK,
                                              log=text(rng, 8_000)))
                usage = [] if seq == 0 else [LLMUsage("plan", "openai", "gpt-4o", 9000, 2000) for _ in range(CALLS)]
                store.record(task, node, usage)
    return root / "run"


def compact(run_dir: Path, code: Path) -> tuple[float, float, float, str]:
    """(seconds, peak resident MB, MB after the imports, what it did) of compact_run in a child using the stark_ray
    in ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(run_dir)], env=env, capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=3)
    return float(out[0]), int(out[1]) / 1024, int(out[2]) / 1024, out[3].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--before", type=Path, help="a checkout whose stark_ray compacts a copy, side by side")
    args = parser.parse_args()
    print(f"{'tasks':>6}  {'files':>7}  {'MB on disk':>10}  {'code':<8}  {'seconds':>8}  {'peak RSS MB':>11}  "
          f"{'of it imports':>13}")
    for tasks in args.tasks:
        with tempfile.TemporaryDirectory(prefix="stark-compact-", dir="/var/tmp") as tmp:
            started = time.perf_counter()
            run = write_run(Path(tmp) / "a", tasks)
            files = [p for p in run.rglob("*.parquet")]
            mb = sum(p.stat().st_size for p in files) / 2**20
            print(f"(wrote {len(files)} files in {time.perf_counter() - started:.0f} s)", file=sys.stderr)
            rows = []
            if args.before is not None:
                shutil.copytree(run, Path(tmp) / "b" / "run")
                rows.append(("before", compact(Path(tmp) / "b" / "run", args.before)))
            rows.append(("today", compact(run, ROOT)))
            for label, (seconds, peak, base, _) in rows:
                print(f"{tasks:>6}  {len(files):>7}  {mb:>10.0f}  {label:<8}  {seconds:>8.1f}  {peak:>11.0f}  "
                      f"{base:>13.0f}")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
