"""A campaign on one GPU against the same campaign on two: wall time, GPU busy time, attempts.

Each configuration runs in a fresh subprocess with its own embedded Ray (``run_ray(RayRun(...))``, the driver
``stark campaign`` uses) over every task file given (default: all of ``examples/tasks``), with the same search
settings, seed and scripted replies (:mod:`kernel_replies`: real kernels, built, checked and timed; only the LLM is
a stand-in). ``--gpus 1 2`` runs one evaluator actor, then two (``evaluators=N``; the machine must have N GPUs).
Reported per configuration: wall time of the whole run (imports, Ray start, actors, references, search,
summaries) with its start phases, time of the search loop alone, attempts, accepted attempts, and per GPU (the
``device`` column of the rows) the number of evaluations and the sum of their ``eval_s`` (busy time); then the
ratio of wall times. Goal: two GPUs >= 1.8x faster than one.

Run (GPU machine):  python benchmarks/campaign_scaling.py [--gpus 1 2] [--budget 8] [--parallel 2]
                    [--backend cuda_nvrtc] [--tasks examples/tasks/*.py] [--keep DIR] [--json F]
``--keep DIR`` keeps each campaign directory under DIR (for ``stark report``).

KernelBench at its own sizes (issue 15's real campaign): ``--kernelbench DIR --subset representative --levels 1
--memory-budget 40 --backend cuda --report`` runs the representative level-1 tasks (named ``level1/...``, as
``stark campaign --kernelbench`` names them; a task that cannot fit the budget is skipped with one line), with the
same scripted replies (a task without a hand-written kernel gets its reference as ``ModelNew``: built, checked,
timed, flagged ``no_kernel``), prints the evaluator's time per candidate and times ``stark report`` on the run.

``--llm-latency S`` makes every scripted reply take S seconds (real models take 5-30 s); ``--max-in-flight N`` fixes
the expansions in flight (default: derived as the run goes). ``--simulate S`` runs on any machine, the CPU too:
each evaluator a stand-in device busy S seconds per candidate (:mod:`simulated_device`: it sleeps, one candidate at
a time), with instant-style replies, so that ``--gpus 1 2 4 8`` measures whether the driver, the TreeMemory actor,
the agents and the dispatch keep 8 devices fed: per configuration attempts/s, each device's busy share of the
search loop and its idle gaps, and the speedup and efficiency against one device (goal at 8: 7.2x, 90%).

    python benchmarks/campaign_scaling.py --simulate 1 --llm-latency 2 --gpus 1 2 4 8 --budget 6 --parallel 4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _p in (str(REPO), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

GOAL = 1.8


def idle(windows: list[tuple[float, float]], start: float, end: float) -> dict[str, float]:
    """Where a device sat idle during the search loop, from its evaluations' (start, end) wall-clock windows
    (the end is when the memory recorded the row: a few ms late): before the first, in gaps between, after the
    last."""
    if not windows:
        return {"idle_head_s": end - start, "idle_gaps_s": 0.0, "idle_tail_s": 0.0, "largest_gap_s": 0.0}
    gaps, reach = [], windows[0][1]
    for a, b in windows[1:]:
        if a > reach:
            gaps.append(a - reach)
        reach = max(reach, b)
    return {"idle_head_s": max(0.0, windows[0][0] - start), "idle_gaps_s": sum(gaps),
            "idle_tail_s": max(0.0, end - reach), "largest_gap_s": max(gaps, default=0.0)}


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One campaign in this process (called in a subprocess by :func:`main`)."""
    t0 = time.monotonic()
    from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
    from stark_ray.eval.tasks import load_task
    from stark_ray.records import Node
    from stark_ray.run.placement import connect
    from stark_ray.run.ray_driver import RayRun, run_ray
    from stark_ray.store.read import attempt_rows

    if args.kernelbench:  # named level{N}/..., as `stark campaign --kernelbench` names them
        from stark_ray.eval import kernelbench

        tasks = kernelbench.load(kernelbench.select(args.kernelbench, levels=args.levels, subset=args.subset))
    elif args.simulate is not None:  # the same small task, many times (the stand-ins never run it)
        from orchestration import write_tasks

        tasks = write_tasks(Path(args.out) / "tasks", args.sim_tasks)
    else:
        tasks = [load_task(Path(p)) for p in args.tasks]
    path = os.pathsep.join(p for p in (str(REPO), str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path}
    sim_dir = Path(args.out) / "devices"
    import simulated_device as sim
    from kernel_replies import kernel_client

    evaluator_cls, client_factory = None, partial(kernel_client, args.backend, args.llm_latency)
    if args.simulate is not None:
        sim_dir.mkdir(parents=True, exist_ok=True)
        env |= {sim.DIR_ENV: str(sim_dir), sim.HOLD_ENV: str(args.simulate), sim.LATENCY_ENV: str(args.llm_latency)}
        evaluator_cls, client_factory = sim.SimulatedDevice, sim.latent_client
    phases: dict[str, float] = {"imports_s": time.monotonic() - t0}
    t_ray = time.monotonic()
    # what run_ray does for an embedded Ray, timed apart; stand-in devices need no CPU of their own: Ray is told of
    # enough for every evaluator and the agents
    connect(None, runtime_env={"env_vars": env}, num_cpus=(args.one + 8) if args.simulate is not None else None)
    phases["ray_init_s"] = time.monotonic() - t_ray
    started_log: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: started_log.append(record.getMessage())  # type: ignore[method-assign]
    driver_log = logging.getLogger("stark_ray.run")  # the driver's modules (ray_driver: "run ... started")
    driver_log.addHandler(handler)
    driver_log.setLevel(logging.INFO)
    started: list[float] = []
    dirs: list[Path] = []

    walls: list[float] = []

    def on_started(run_dir: Any) -> None:  # a stark_ray.store.location.Location
        started.append(time.monotonic())
        walls.append(time.time())
        dirs.append(run_dir)

    backend = "cpu_cpp" if args.simulate is not None else args.backend
    summaries = run_ray(RayRun(tasks, SearchConfig(budget=args.budget, seed=args.seed, parallel=args.parallel),
                               AgentConfig(), EvalConfig(backend=backend, memory_budget_gb=args.memory_budget),
                               Path(args.out) / "runs",
                               run_id=f"campaign-{args.one}gpu", evaluators=args.one,
                               max_in_flight=args.max_in_flight, client_factory=client_factory,
                               evaluator_cls=evaluator_cls),
                        on_started=on_started)
    end = time.monotonic()
    end_wall = time.time()
    rows = attempt_rows(dirs[0])
    per_device: dict[str, dict[str, Any]] = defaultdict(lambda: {"evaluations": 0, "busy_s": 0.0, "windows": []})
    for r in rows:
        d = per_device[r["device"] or "?"]
        d["evaluations"] += 1
        d["busy_s"] += r["eval_s"] or 0.0
        if r["seq"] > 0 and r["recorded_at"] is not None and r["eval_s"]:
            done = r["recorded_at"].timestamp() if hasattr(r["recorded_at"], "timestamp") else r["recorded_at"]
            d["windows"].append((done - r["eval_s"], done))
    if args.simulate is not None:  # each stand-in's own busy windows (the rows name a task's home evaluator)
        per_device = {f"device {i}": {"evaluations": len(w), "busy_s": sum(b - a for a, b in w), "windows": w}
                      for i, w in enumerate(sim.busy_windows(sim_dir).values())}
    for d in per_device.values():
        d.update(idle(sorted(d.pop("windows")), walls[0], end_wall))
    return {
        "gpus": args.one, "wall_s": end - t0, "loop_s": end - started[0], "start_s": started[0] - t0,
        "attempts": sum(s.attempts for s in summaries), "tasks": len(summaries),
        "accepted": sum(1 for r in rows if r["seq"] > 0 and Node.from_record(r).accepted),
        "candidate_s": sorted(r["eval_s"] for r in rows if r["seq"] > 0 and r["eval_s"] is not None),
        "finished": all(s.status == "finished" for s in summaries),
        "best": {s.task: s.best_speedup for s in summaries},
        "devices": dict(per_device), "run_dir": str(dirs[0]), "phases": phases, "driver_log": started_log,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cuda_nvrtc")
    ap.add_argument("--tasks", nargs="+", default=sorted(str(p) for p in (REPO / "examples" / "tasks").glob("*.py")))
    ap.add_argument("--kernelbench", default=None, help="a KernelBench checkout: its tasks instead of --tasks")
    ap.add_argument("--subset", default="all", help="all | representative (with --kernelbench)")
    ap.add_argument("--levels", type=int, nargs="+", default=None, help="KernelBench levels (with --kernelbench)")
    ap.add_argument("--memory-budget", type=float, default=None, help="GB for one evaluation (EvalConfig)")
    ap.add_argument("--report", action="store_true", help="`stark report` on each run, timed")
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--llm-latency", type=float, default=0.0, help="seconds each scripted reply takes")
    ap.add_argument("--max-in-flight", type=int, default=None, help="expansions in flight (default: derived)")
    ap.add_argument("--simulate", type=float, default=None, metavar="SECONDS",
                    help="stand-in devices, each busy this long per candidate (any machine; see the docstring)")
    ap.add_argument("--sim-tasks", type=int, default=16, help="tasks of a --simulate campaign")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: run one configuration
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return 0

    what = (f"KernelBench {args.subset} levels {args.levels or 'all'}" if args.kernelbench
            else f"{args.sim_tasks} tasks, stand-in devices busy {args.simulate:g} s a candidate"
            if args.simulate is not None else f"{len(args.tasks)} tasks")
    print(f"campaign scaling: {what}, budget {args.budget}, parallel {args.parallel}, max in flight "
          f"{args.max_in_flight or 'derived'}, LLM replies {args.llm_latency:g} s each, backend "
          f"{'(stand-in)' if args.simulate is not None else args.backend}, seed {args.seed}; configurations: "
          f"{args.gpus} device(s)", flush=True)
    results = []
    for n in args.gpus:
        out = Path(tempfile.mkdtemp(prefix=f"stark-scaling-{n}-"))
        cmd = [sys.executable, __file__, "--one", str(n), "--out", str(out), "--budget", str(args.budget),
               "--parallel", str(args.parallel), "--seed", str(args.seed), "--backend", args.backend,
               "--tasks", *args.tasks, "--subset", args.subset]
        if args.kernelbench:
            cmd += ["--kernelbench", args.kernelbench, *(["--levels", *map(str, args.levels)] if args.levels else [])]
        if args.memory_budget is not None:
            cmd += ["--memory-budget", str(args.memory_budget)]
        cmd += ["--llm-latency", str(args.llm_latency), "--sim-tasks", str(args.sim_tasks)]
        if args.max_in_flight is not None:
            cmd += ["--max-in-flight", str(args.max_in_flight)]
        if args.simulate is not None:
            cmd += ["--simulate", str(args.simulate)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"{n} GPU(s): failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        res = json.loads(line[len("RESULT "):])
        results.append(res)
        res["attempts_per_s"] = res["attempts"] / res["loop_s"] if res["loop_s"] > 0 else 0.0
        busy = [d["busy_s"] / res["loop_s"] for d in res["devices"].values()] if res["loop_s"] > 0 else []
        res["busy_share_mean"] = sum(busy) / len(busy) if busy else 0.0
        print(f"{n} GPU(s): wall {res['wall_s']:.1f} s (start {res['start_s']:.1f} s, search loop {res['loop_s']:.1f}"
              f" s), {res['attempts']} attempts over {res['tasks']} tasks ({res['attempts_per_s']:.2f}/s in the "
              f"loop), {res['accepted']} accepted, devices busy {res['busy_share_mean']:.0%} of the loop on average, "
              f"finished={res['finished']}", flush=True)
        print(f"    start: {res['phases']}; {'; '.join(res['driver_log'])}", flush=True)
        cand = res["candidate_s"]
        if cand:
            print(f"    per candidate (the evaluator's eval_s): median {cand[len(cand) // 2]:.2f} s, p95 "
                  f"{cand[min(len(cand) - 1, int(0.95 * len(cand)))]:.2f} s, max {cand[-1]:.2f} s", flush=True)
        if args.report:
            began = time.monotonic()
            rep = subprocess.run([sys.executable, "-m", "stark_ray.cli", "report", res["run_dir"]],
                                 capture_output=True, text=True)
            res["report_s"] = time.monotonic() - began
            print(f"    stark report: exit {rep.returncode} in {res['report_s']:.1f} s "
                  f"{(rep.stdout or rep.stderr).strip().splitlines()[-1:] }", flush=True)
        for dev, d in sorted(res["devices"].items()):
            print(f"    {dev}: {int(d['evaluations'])} evaluations, busy {d['busy_s']:.1f} s "
                  f"({d['busy_s'] / res['loop_s']:.0%} of the loop); idle {d['idle_head_s']:.1f} s before the first, "
                  f"{d['idle_gaps_s']:.1f} s between (largest {d['largest_gap_s']:.2f} s), {d['idle_tail_s']:.1f} s "
                  "after the last", flush=True)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(res["run_dir"], args.keep / Path(res["run_dir"]).name, dirs_exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
    by_n = {r["gpus"]: r for r in results}
    summary: dict[str, Any] = {"machine": platform.node(), "date": datetime.now(timezone.utc).isoformat(),
                               "settings": {k: v for k, v in vars(args).items() if k not in ("one", "out", "keep",
                                                                                        "json")},
                               "results": results}
    if 1 in by_n and 2 in by_n:
        ratio = by_n[1]["wall_s"] / by_n[2]["wall_s"]
        loop_ratio = by_n[1]["loop_s"] / by_n[2]["loop_s"]
        summary.update(ratio=ratio, loop_ratio=loop_ratio)
        print(f"two GPUs vs one: wall {ratio:.2f}x, search loop {loop_ratio:.2f}x (goal >= {GOAL}x: "
              f"{'met' if ratio >= GOAL else 'NOT met'})", flush=True)
    if 1 in by_n:  # each configuration against one device: the search loop's attempts/s (the same attempts)
        base = by_n[1]["attempts_per_s"]
        for n, r in sorted(by_n.items()):
            speedup = r["attempts_per_s"] / base if base > 0 else 0.0
            r.update(speedup=speedup, efficiency=speedup / n)
            print(f"{n} device(s): {speedup:.2f}x one device's attempts/s, efficiency {speedup / n:.0%} (goal 90%: "
                  f"{'met' if speedup / n >= 0.9 else 'NOT met'}), devices busy {r['busy_share_mean']:.0%} (goal "
                  f"90%)", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
