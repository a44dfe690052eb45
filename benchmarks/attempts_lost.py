"""Attempts lost to the machine: a recorded real-model search replayed quiet, then beside busy processes; every
attempt whose verdict the load changed is one the machine, not the model's code, decided.

The replay (a cassette of real model replies, ``--cassette``) writes the same candidates in the same order whatever
the machine does, as long as their verdicts stay the same: the quiet run's verdicts are the reference, and a replay
under load is compared with it attempt by attempt (its stage, and whether it was accepted). A difference is counted,
with the verdict's first line: a build that ran out of time, an evaluator lost, memory, a candidate flagged by the
judge's clock (`suspicious`, `unconfirmed`) on a loaded host; and a replay that left the recorded path (the cassette
did not hold a prompt) says the search took another turn because of one. Goal (issue 42): none, on a loaded 2-core
host and on a GPU. The product is the real CLI in a process of its own, with its real evaluator.

    python benchmarks/attempts_lost.py [--busy 0 2 4] [--runs 1] [--executor ray|local]
    python benchmarks/attempts_lost.py --backend cuda --cassette examples/cassettes/2_FusedSwishScaleClamp_cuda.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "2_FusedSwishScaleClamp.py"
CASSETTE = ROOT / "examples" / "cassettes" / "2_FusedSwishScaleClamp.jsonl"
LIMIT_S = 3600


def replay(args: argparse.Namespace, out: Path, build_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """One replay through the CLI: its attempts (seq > 0, in order), its summary, its wall seconds."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(COLUMNS="160", RAY_AUTH_MODE="disabled")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "stark_ray.cli", "optimize", str(args.task), "--cassette",
                           str(args.cassette), "--budget", str(args.budget), "--seed", str(args.seed), "--backend",
                           args.backend, "--executor", args.executor, "--out", str(out), "--build-dir", str(build_dir),
                           "-q"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    wall = time.monotonic() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"attempts_lost: the run failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    [run] = [d for d in out.iterdir() if d.is_dir()]
    import duckdb

    rows = duckdb.sql(f"SELECT seq, agent, stage, flags, error, speedup FROM '{run}/attempts/*/*.parquet' "
                      "WHERE seq > 0 ORDER BY seq").fetchall()
    attempts = [{"seq": r[0], "agent": r[1], "stage": r[2], "flags": r[3] or "", "error": (r[4] or "").split("\n")[0],
                 "speedup": r[5]} for r in rows]
    return attempts, json.loads((run / "summary.json").read_text()), wall


def verdict(a: dict[str, Any]) -> tuple[str, bool]:
    """What an attempt's verdict was, as compared: its stage, and whether it stands accepted (no rejecting flag)."""
    rejected = any(f in a["flags"].split(",") for f in ("suspicious", "no_kernel", "unordered_stream"))
    return a["stage"], a["stage"] == "ok" and not rejected


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", type=Path, default=TASK)
    p.add_argument("--cassette", type=Path, default=CASSETTE)
    p.add_argument("--backend", default="cpu_cpp")
    p.add_argument("--executor", default="ray", choices=["ray", "local"])
    p.add_argument("--budget", type=int, default=5)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--busy", type=int, nargs="+", default=[0, 2, 4], help="spinning processes beside a replay "
                                                                           "(the first: the reference run)")
    p.add_argument("--runs", type=int, default=1, help="replays per busy level")
    args = p.parse_args()
    print(f"{args.cassette.name}, {args.backend}, {args.executor}, budget {args.budget}; host {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    baseline: list[tuple[str, bool]] | None = None
    lost_total = 0
    with tempfile.TemporaryDirectory(prefix="stark-lost-") as tmp:
        for busy in args.busy:
            for i in range(args.runs if baseline is not None else 1):
                spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
                try:
                    out = Path(tmp) / f"busy{busy}-{i}"
                    attempts, summary, wall = replay(args, out, Path(tmp) / f"build{busy}-{i}")  # builds from empty
                finally:
                    for s in spinners:
                        s.kill()
                seen = [verdict(a) for a in attempts]
                figures = ", ".join(f"{a['stage']}{'' if v[1] or a['stage'] != 'ok' else ' (rejected)'}"
                                    for a, v in zip(attempts, seen, strict=True))
                print(f"busy {busy}, run {i + 1}: {wall:.0f} s, best {summary.get('best_speedup')}, replay "
                      f"mismatches {summary.get('replay_mismatches', 0)}: {figures}", flush=True)
                if baseline is None:
                    baseline = seen
                    continue
                lost = [a for a, v, b in zip(attempts, seen, baseline, strict=False) if v != b]
                lost_total += len(lost) + int(summary.get("replay_mismatches", 0) > 0)
                for a in lost:
                    print(f"  lost: attempt {a['seq']} ({a['agent']}): {a['stage']} [{a['flags']}] {a['error'][:200]}")
                if summary.get("replay_mismatches"):
                    print(f"  left the recorded path: {summary['replay_mismatches']} prompt(s) the cassette does "
                          "not hold")
    print(json.dumps({"lost": lost_total, "busy": args.busy, "runs": args.runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
