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

With ``--memory-kill-at F`` the TreeMemory actor's process is killed (SIGKILL) once a share F of the attempts is
in: the campaign must finish with every attempt once (each task's seqs 0..budget, none twice). With ``--kill-at F``
a second campaign runs as a user's ``stark campaign`` does, in a process of its own with its own private Ray; that
process group (driver and Ray) is killed at F, and a new process resumes it: its wall time (Python, Ray's start,
reading the rows, the remaining attempts, the end) beside the remaining attempts at the first campaign's rate.

Goals (issue 19, for 250 tasks x 30): <= 300 files, count(*) <= 2 s and <= 300 MB, report <= 30 s, resume of the
finished campaign <= 30 s, resume after a kill at 50% <= 30 s over the remaining work, the memory actor's SIGKILL
survived. The load average of the machine is printed beside the figures (other work moves them).

Run:  python benchmarks/campaign_scale.py [--tasks 50 250] [--budget 30] [--cpus 2] [--memory-kill-at 0.4]
      [--kill-at 0.5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
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
from stark_ray.store.read import attempt_rows  # noqa: E402


def count_files(run_dir: Path) -> int:
    return sum(1 for _ in run_dir.rglob("part-*.parquet"))


# started by a small process of its own: a child forked from this one (which holds a whole campaign's driver) would
# count this process's pages in its peak RSS until it execs
_SHIM = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
         "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
         "print('rusage', u.ru_utime + u.ru_stime, u.ru_maxrss, file=sys.stderr); sys.exit(rc)")


def measured(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a command; its wall and CPU seconds and peak RSS (MB), from the kernel's accounting of that child (of
    a small shim process)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-S", "-c", _SHIM, *argv], capture_output=True, env=env, cwd=REPO,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    lines = proc.stderr.strip().splitlines()
    _, cpu, rss = lines[-1].split() if lines and lines[-1].startswith("rusage ") else ("", "nan", "nan")
    return {"wall_s": round(wall, 2), "cpu_s": round(float(cpu), 2), "max_rss_mb": round(float(rss) / 1024, 1),
            "rc": proc.returncode, "out": proc.stdout.strip().splitlines()[-3:], "err": lines[-4:-1]}


def every_attempt_once(run_dir: Path | Location, tasks: int, budget: int) -> bool:
    """Each task's attempts rows are seqs 0..budget, none twice (one read of the finished run)."""
    seqs: dict[str, list[int]] = {}
    for row in attempt_rows(run_dir):
        seqs.setdefault(row["task"], []).append(row["seq"])
    return len(seqs) == tasks and all(sorted(v) == list(range(budget + 1)) for v in seqs.values())


def kill_memory_at(clock: orchestration._Clock, share: float, run_id: str, out: dict[str, Any]) -> threading.Thread:
    """A thread that SIGKILLs the TreeMemory actor's process once ``share`` of the attempts are in, then times
    Ray's restart of it (until a new process answers)."""
    import ray

    def go() -> None:
        while len(clock.times) - 1 < share * clock.expected:
            time.sleep(0.05)
        name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if str(a["name"]).startswith(f"stark-memory-{run_id}"))
        memory = ray.get_actor(name, namespace=ray.get_runtime_context().namespace)
        pid = ray.get(memory.status.remote())["pid"]
        out["killed_after"] = len(clock.times) - 1
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while (status := ray.get(memory.status.remote(), timeout=600))["pid"] == pid:
            time.sleep(0.1)
        out["restart_s"] = round(time.perf_counter() - t0, 2)
        out["restored_attempts"] = sum(status["restored"].values())

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def one_campaign(tasks: int, budget: int, work: Path, memory_kill_at: float | None = None) -> dict[str, Any]:
    task_list = orchestration.write_tasks(work / "tasks", tasks)
    seen: list[Compacted] = []
    at_end: list[int] = []

    def watched(run_dir: Location) -> None:  # the run's own end-of-campaign compaction, counted
        at_end.append(count_files(Path(run_dir.path)))
        seen.append(compact_run(run_dir))

    ray_driver.compact_ended = watched  # type: ignore[assignment]
    killed: dict[str, Any] = {}
    clock = orchestration._Clock(tasks * budget)
    if memory_kill_at is not None:
        kill_memory_at(clock, memory_kill_at, f"scale{tasks}", killed)
    t0 = time.perf_counter()
    clock, _, summaries, run_dir = orchestration._run(task_list, budget, 1, MAX_IN_FLIGHT, work / "runs",
                                                      f"scale{tasks}", clock=clock)
    wall = time.perf_counter() - t0
    loop = clock.times[-1] - clock.times[0] if len(clock.times) > 1 else float("nan")
    run = Path(run_dir.path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "unused-the-campaign-is-finished")}
    cli = [sys.executable, "-m", "stark_ray.cli"]
    return {
        "tasks": tasks, "budget": budget, "attempts": sum(s.attempts for s in summaries),
        "finished": all(s.status == "finished" for s in summaries),
        "every_attempt_once": every_attempt_once(run, tasks, budget),
        "memory_killed": killed or None,
        "wall_s": round(wall, 1), "loop_s": round(loop, 1),
        "iterations_per_s": round((len(clock.times) - 1) / loop, 1) if loop == loop and loop > 0 else None,
        "files_at_loop_end": at_end[0] if at_end else None,
        "files_finished": count_files(run),
        "compaction": seen[0].describe() if seen else None,
        "sql_count": measured([*cli, "sql", str(run), "SELECT count(*) FROM attempts"], env),
        "report": measured([*cli, "report", str(run), "--out", str(work / f"report{tasks}")], env),
        "resume_finished": measured([*cli, "campaign", "--resume", str(run)], env),
    }


KILLED = "killed"  # the run id of the campaign that is killed and resumed


class _Printing(orchestration._Clock):
    """The clock, printing the attempts in so far (every tenth) for the parent that decides when to kill."""

    def attempt(self, node: Any, step: Any, tree: Any, usage: Any) -> None:
        super().attempt(node, step, tree, usage)
        if (len(self.times) - 1) % 10 == 0:
            print(len(self.times) - 1, flush=True)


def child(mode: str, work: Path, tasks: int, budget: int, cpus: int) -> int:
    """A campaign (``run``) or its resume (``resume``) as a user's ``stark campaign`` runs it: in this process,
    with a private Ray of its own (a kill of this process group ends both)."""
    from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
    from stark_ray.run.ray_driver import RayRun, run_ray
    from stark_ray.run.resume import resumed

    this = orchestration._self_module()
    out, run_dir = work / "runs", work / "runs" / KILLED
    with orchestration.local_ray(cpus):
        if mode == "run":
            run = RayRun(orchestration.write_tasks(work / "tasks", tasks), SearchConfig(budget=budget, seed=0),
                         AgentConfig(), EvalConfig(), out, run_id=KILLED, max_in_flight=MAX_IN_FLIGHT,
                         client_factory=this.scripted_client, evaluator_cls=this.InstantEvaluator)
        else:
            r = resumed(run_dir)
            run = RayRun(r.tasks, r.search, r.agents, r.eval, out, resume=run_dir, max_in_flight=MAX_IN_FLIGHT,
                         client_factory=this.scripted_client, evaluator_cls=this.InstantEvaluator)
        summaries = run_ray(run, _Printing(tasks * budget))
    print(json.dumps({"finished": all(s.status == "finished" for s in summaries)}), flush=True)
    return 0


def killed_and_resumed(tasks: int, budget: int, work: Path, kill_at: float, cpus: int,
                       rate: float | None) -> dict[str, Any]:
    """The campaign in a process of its own, its process group killed once ``kill_at`` of the attempts are in;
    then a new process resumes it (timed whole, as ``measured`` times a command)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH_DIR), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, str(Path(__file__).resolve()), "--work", str(work), "--tasks", str(tasks), "--budget",
            str(budget), "--cpus", str(cpus), "--child"]
    total = tasks * budget
    t0 = time.perf_counter()
    with open(work / "killed.err", "w") as err:
        proc = subprocess.Popen([*base, "run"], stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                start_new_session=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip().isdigit() and int(line) >= kill_at * total:
                break
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its private Ray
        proc.wait()
    killed_s = time.perf_counter() - t0
    while True:
        try:
            os.killpg(proc.pid, 0)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    run_dir = work / "runs" / KILLED
    recorded = len(attempt_rows(run_dir)) - tasks  # the roots are not attempts
    resume = measured([*base, "resume"], env)
    remaining = total - recorded
    remaining_s = remaining / rate if rate else None
    return {"killed_after_s": round(killed_s, 1), "recorded_at_kill": recorded, "remaining": remaining,
            "resume": resume, "remaining_at_rate_s": round(remaining_s, 1) if remaining_s else None,
            "added_s": round(resume["wall_s"] - remaining_s, 1) if remaining_s else None,
            "every_attempt_once": every_attempt_once(run_dir, tasks, budget)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[50, 250])
    p.add_argument("--budget", type=int, default=30)
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--memory-kill-at", type=float, help="SIGKILL the TreeMemory actor at this share of attempts")
    p.add_argument("--kill-at", type=float, help="also kill a campaign's process at this share, then resume it")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", choices=["run", "resume"], help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.work, args.tasks[0], args.budget, args.cpus)
    figures: dict[str, Any] = {"machine": platform.node(), "cpus": os.cpu_count(),
                               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "load_before": os.getloadavg(), "campaigns": []}
    with tempfile.TemporaryDirectory(prefix="stark-scale-") as tmp:
        for n in args.tasks:
            with orchestration.local_ray(args.cpus):
                result = one_campaign(n, args.budget, Path(tmp) / f"n{n}", args.memory_kill_at)
            if args.kill_at is not None:
                work = Path(tmp) / f"killed{n}"
                work.mkdir()
                result["killed_and_resumed"] = killed_and_resumed(n, args.budget, work, args.kill_at, args.cpus,
                                                                  result["iterations_per_s"])
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
    for c in figures["campaigns"]:
        if c.get("memory_killed"):
            m = c["memory_killed"]
            print(f"{c['tasks']} x {c['budget']}: TreeMemory actor SIGKILLed after {m['killed_after']} attempts, "
                  f"back in {m.get('restart_s')} s with {m.get('restored_attempts')} attempts restored; finished "
                  f"{c['finished']}, every attempt once {c['every_attempt_once']}")
        if c.get("killed_and_resumed"):
            k = c["killed_and_resumed"]
            print(f"{c['tasks']} x {c['budget']}: killed after {k['killed_after_s']} s with {k['recorded_at_kill']} "
                  f"attempts recorded; the resume took {k['resume']['wall_s']} s (rc {k['resume']['rc']}) for "
                  f"{k['remaining']} attempts, {k['remaining_at_rate_s']} s of them at the first campaign's rate: "
                  f"{k['added_s']} s added; every attempt once {k['every_attempt_once']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
