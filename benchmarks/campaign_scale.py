"""Campaigns at the scale users run them, with stand-ins: N tasks x budget through the real ``run_ray``.

The campaign is orchestration.py's: copies of ``examples/tasks/1_LeakyReluScale.py``, the real driver, TreeMemory
actor, agent workers and Parquet store, with two stand-ins — scripted LLM replies computed at once and an
evaluator actor that answers at once (``orchestration.scripted_client`` / ``InstantEvaluator``). Then what a user
does with the finished campaign, each in a process of its own as a user runs it:

- the Parquet part files: written by the loop (each task's compacted when it ended) and in the finished campaign
  (after the run's own compaction at its end);
- ``stark sql DIR "SELECT count(*) FROM attempts"``: wall and CPU seconds, peak RSS;
- ``stark report DIR``: wall and CPU seconds, peak RSS;
- ``stark campaign --resume DIR`` of the finished campaign (it says so at once): wall seconds.

Goals (issue 19, for 250 tasks x 30): <= 300 files, count(*) <= 2 s and <= 300 MB, report <= 30 s, resume of the
finished campaign <= 30 s. The load average of the machine is printed beside the figures (other work moves them).

Run:  python benchmarks/campaign_scale.py [--tasks 50 250] [--budget 30] [--cpus 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _p in (str(REPO), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import orchestration  # noqa: E402

from stark_ray.run import ray_driver  # noqa: E402
from stark_ray.run.in_flight import FLOOR as MAX_IN_FLIGHT  # noqa: E402
from stark_ray.store.compact import Compacted, compact_run  # noqa: E402
from stark_ray.store.location import Location  # noqa: E402


def count_files(run_dir: Path) -> int:
    return sum(1 for _ in run_dir.rglob("part-*.parquet"))


def measured(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a command; its wall and CPU seconds and peak RSS (MB), from the kernel's accounting of that child."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "max_rss_mb": round(usage.ru_maxrss / 1024, 1), "rc": code,
            "out": out.strip().splitlines()[-3:], "err": err.strip().splitlines()[-3:]}


def one_campaign(tasks: int, budget: int, work: Path) -> dict[str, Any]:
    task_list = orchestration.write_tasks(work / "tasks", tasks)
    seen: list[Compacted] = []
    at_end: list[int] = []

    def watched(run_dir: Location) -> None:  # the run's own end-of-campaign compaction, counted
        at_end.append(count_files(Path(run_dir.path)))
        seen.append(compact_run(run_dir))

    ray_driver.compact_ended = watched  # type: ignore[assignment]
    t0 = time.perf_counter()
    clock, _, summaries, run_dir = orchestration._run(task_list, budget, 1, MAX_IN_FLIGHT, work / "runs",
                                                      f"scale{tasks}")
    wall = time.perf_counter() - t0
    loop = clock.times[-1] - clock.times[0] if len(clock.times) > 1 else float("nan")
    run = Path(run_dir.path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "unused-the-campaign-is-finished")}
    cli = [sys.executable, "-m", "stark_ray.cli"]
    return {
        "tasks": tasks, "budget": budget, "attempts": sum(s.attempts for s in summaries),
        "finished": all(s.status == "finished" for s in summaries),
        "wall_s": round(wall, 1), "loop_s": round(loop, 1),
        "iterations_per_s": round((len(clock.times) - 1) / loop, 1) if loop == loop and loop > 0 else None,
        "files_at_loop_end": at_end[0] if at_end else None,
        "files_finished": count_files(run),
        "compaction": seen[0].describe() if seen else None,
        "sql_count": measured([*cli, "sql", str(run), "SELECT count(*) FROM attempts"], env),
        "report": measured([*cli, "report", str(run), "--out", str(work / f"report{tasks}")], env),
        "resume_finished": measured([*cli, "campaign", "--resume", str(run)], env),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[50, 250])
    p.add_argument("--budget", type=int, default=30)
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    figures: dict[str, Any] = {"machine": platform.node(), "cpus": os.cpu_count(),
                               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "load_before": os.getloadavg(), "campaigns": []}
    with tempfile.TemporaryDirectory(prefix="stark-scale-") as tmp:
        for n in args.tasks:
            with orchestration.local_ray(args.cpus):
                result = one_campaign(n, args.budget, Path(tmp) / f"n{n}")
            figures["campaigns"].append(result)
            print(json.dumps(result), flush=True)
    figures["load_after"] = os.getloadavg()
    print(f"load average before {figures['load_before']}, after {figures['load_after']}")
    print("| tasks x budget | attempts | loop s (it/s) | files: loop end / finished | count(*) wall / CPU s, RSS MB "
          "| report wall / CPU s, RSS MB | resume (finished) s |")
    print("|---|---|---|---|---|---|---|")
    for c in figures["campaigns"]:
        q, r = c["sql_count"], c["report"]
        print(f"| {c['tasks']} x {c['budget']} | {c['attempts']} | {c['loop_s']} ({c['iterations_per_s']}) | "
              f"{c['files_at_loop_end']} / {c['files_finished']} | {q['wall_s']} / {q['cpu_s']}, {q['max_rss_mb']} | "
              f"{r['wall_s']} / {r['cpu_s']}, {r['max_rss_mb']} | {c['resume_finished']['wall_s']} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
