"""Orchestration overhead of the Ray runtime: zero-latency scripted LLM replies and an instant evaluator.

Two measurements, on one local Ray started by this script (``ray.init(num_cpus=--cpus)``, no dashboard):

1. Search iterations per second through the actors. The real driver, ``run_ray(RayRun(...))``, runs ``--tasks``
   copies of ``examples/tasks/1_LeakyReluScale.py`` (``SearchConfig(budget=--budget, parallel=--parallel)``)
   with the real TreeMemory actor, the real agent calls (AgentWorker actors: plan + code / debug agents, prompt
   rendering, anchor validation, parsing) and the real Parquet store. Only two things are stand-ins: the LLM
   (:func:`scripted_client`: a :class:`~stark_ray.llm.scripted.ScriptedClient` whose replies are computed
   from the prompt at once) and the GPU work (:class:`InstantEvaluator`: an actor with EvaluatorActor's
   methods that returns a plausible ``EvalResult`` at once — correct or not and its speedup derived from a hash
   of the source). A warm-up run (``--warmup-budget``, same tasks) starts the Ray worker processes first; the
   figure is attempts recorded per second over the driver's loop (from ``on_started``, after the actors and
   references are up, to the last attempt), and every attempt is checked to be in Parquet
   (``stark_ray.store.read.attempt_rows``). Ray start-up and the run's start and finish phases are reported
   apart. Goal: >= 200 iterations/s. Beside the figure, where the loop's time goes: CPU seconds per process role
   over the loop (driver, memory actor, evaluator, agent workers, raylet, gcs; from /proc), attempts per second
   of the loop, and per remote method the time spent in the callee (from ``ray.timeline()``).

2. TreeMemory call latency under ``--callers`` concurrent callers (default 64). A ``TreeMemoryActor`` made
   directly (one task per caller), and each caller repeats ``next`` then ``add`` (an AgentResult with two
   LLM usages and an instant EvalResult, so every ``add`` writes an attempts row and two llm_calls rows, as in
   a run). Callers are threads in this process issuing ``ray.get(actor.<method>.remote(...))`` (``--mode
   thread``, the default) or asyncio coroutines awaiting the object refs (``--mode async``). Reported: p50 /
   p99 latency of ``next`` and ``add`` and the calls/s the actor sustains; beside them, for reference, the
   same callers against a trivial async actor (Ray's round-trip floor here) and the in-process service time
   of one ``next`` / ``add`` of the TreeMemory core (no Ray), split into search work and the Parquet sink, and
   of ``next`` as one task's tree grows (``--tree-sizes``).

Run:  python benchmarks/orchestration.py [--tasks 32] [--budget 24] [--parallel 2] [--callers 64] [--calls 20]
                                         [--mode thread|async] [--only all|throughput|latency] [--cpus N]
                                         [--json F] [--profile F]
``--profile F`` writes a cProfile of the driver's measured run to F and prints where the driver's time goes.
The defaults take about 1.5 minutes on a 2-core machine. Other work on the machine moves every figure here
(the load average before and after is printed and kept).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import hashlib
import json
import os
import platform
import pstats
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _p in (str(REPO), str(BENCH_DIR)):  # stark_ray without installing it; this module for Ray's workers
    if _p not in sys.path:
        sys.path.insert(0, _p)

import ray  # noqa: E402
from scripted_plans import plan_reply, prompt_tag  # noqa: E402

from stark_ray.actors.tree_memory import TaskSpec, TreeMemoryActor, write_specs  # noqa: E402
from stark_ray.agents.base import AgentResult, TaskInfo  # noqa: E402
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig  # noqa: E402
from stark_ray.eval.tasks import Task, load_task  # noqa: E402
from stark_ray.llm.base import LLMRequest  # noqa: E402
from stark_ray.llm.scripted import ScriptedClient  # noqa: E402
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, EvalResult, LLMUsage, Node  # noqa: E402
from stark_ray.run.placement import connect, disconnect  # noqa: E402
from stark_ray.run.reporter import Reporter  # noqa: E402
from stark_ray.search.memory import TreeMemory, make_task_search  # noqa: E402
from stark_ray.search.tree import Tree  # noqa: E402
from stark_ray.store.location import Location, locate  # noqa: E402
from stark_ray.store.run_store import RunStore  # noqa: E402

GOAL_ITERATIONS_S = 200.0
TASK_FILE = REPO / "examples" / "tasks" / "1_LeakyReluScale.py"
HARDWARE = "instant evaluator (orchestration benchmark): no device, results made up at once"
REF_MS = 1.0
FAIL_ONE_IN = 4  # about one candidate in four fails its correctness check (so debug agents run too)


# --- the stand-ins: scripted LLM content and an instant evaluator -----------------------------------------------

_CANDIDATE = """import torch
import torch.nn as nn
import torch.nn.functional as F

# variant {tag}


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.negative_slope) * self.scale
"""


def instant_reply(request: LLMRequest) -> str:
    """A valid reply for any role, computed from the prompt alone (the same in every worker process)."""
    if request.role == "plan":
        return plan_reply(request)
    tag = prompt_tag(request)
    return f"Done.\n\n```python\n{_CANDIDATE.format(tag=tag)}```\n"


def scripted_client() -> ScriptedClient:
    """The run's ``client_factory``: module level, so Ray pickles it by reference (workers import this file)."""
    return ScriptedClient({}, model="scripted-instant", default=instant_reply)


def instant_result(source: str) -> EvalResult:
    """A plausible result at once: failing one time in FAIL_ONE_IN, else correct with a speedup of 0.5-3.0x, all
    derived from a hash of the source."""
    digest = hashlib.sha256(source.encode()).digest()
    if digest[0] % FAIL_ONE_IN == 0:
        return EvalResult(compiled=True, passed_checks=False, stage=STAGE_CORRECTNESS, max_abs_err=0.5, rel_err=0.2,
                          error="output mismatch: max_abs_err 0.5 (instant evaluator)",
                          log="trial 1: 1024 of 4194304 elements differ", eval_s=0.0)
    speedup = 0.5 + int.from_bytes(digest[1:3], "big") / 65535 * 2.5
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=REF_MS / speedup, ref_runtime_ms=REF_MS,
                      speedup=speedup, stage=STAGE_OK, compile_s=0.0, eval_s=0.0, runtime_cv=0.01,
                      ref_runtime_cv=0.01)


def reference_result() -> EvalResult:
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=REF_MS, ref_runtime_ms=REF_MS, speedup=1.0,
                      stage=STAGE_OK, runtime_cv=0.01, ref_runtime_cv=0.01)


class _Instant:
    """EvaluatorActor's methods without the GPU work."""

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg
        self.instance = uuid.uuid4().hex  # this process of the actor (a restart is another)

    def reference(self, task: Task) -> EvalResult:
        return reference_result()

    def evaluate(self, task: Task, source: str) -> EvalResult:
        return instant_result(source)

    def hardware(self) -> dict[str, Any]:
        return {"description": HARDWARE, "class": HARDWARE, "start_phases": {}, "instance": self.instance,
                "node": ray.get_runtime_context().get_node_id()}

    def activity(self) -> dict[str, tuple[str, float]]:
        return {}

    def where(self) -> dict[str, Any]:
        """As EvaluatorActor.where: which process answers; no note of a candidate it died running."""
        return {"pid": os.getpid(), "instance": self.instance, "died_running": None,
                "node": ray.get_runtime_context().get_node_id()}

    def close(self) -> None:
        pass


@ray.remote
class InstantEvaluator(_Instant):
    """EvaluatorActor's methods without the GPU work. No resources here: the driver sets them (.options)."""


@ray.remote
class OverBudgetEvaluator(_Instant):
    """The stand-in evaluator, for which a task whose name holds ``_Big`` does not fit the memory budget."""

    def reference(self, task: Task) -> EvalResult:
        if "_Big" in task.name:
            from stark_ray.eval.measure.memory import OverBudget

            raise OverBudget(f"task {task.name} needs 52.0 GB; budget 40.0 GB (inputs 17.18 GB, ...)")
        return reference_result()


@ray.remote
class EchoActor:
    """A trivial async actor: the round trip of a Ray actor call on this machine, for comparison."""

    async def ping(self, payload: Any) -> Any:
        return payload


# --- figures ----------------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def latency_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values]
    if not ms:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "mean_ms": 0.0, "max_ms": 0.0}
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3),
            "mean_ms": round(sum(ms) / len(ms), 3), "max_ms": round(max(ms), 3)}


ROLES = ("driver", "memory actor", "evaluator actor", "agent workers", "raylet", "gcs", "other ray")


def _role(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "driver"
    for key, role in (("TreeMemoryActor", "memory actor"), ("InstantEvaluator", "evaluator actor"),
                      ("gcs_server", "gcs"), ("raylet", "raylet")):
        if key in cmdline:
            return role
    return "agent workers" if cmdline.startswith("ray::") or "default_worker" in cmdline else "other ray"


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """(role, CPU seconds user + system) of this process and every descendant (Ray's daemons and workers), from
    /proc; {} where there is no /proc."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    procs: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        procs[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[str, float]] = {}
    stack = [os.getpid()]
    while stack:
        pid = stack.pop()
        if pid not in procs:
            continue
        stack.extend(children.get(pid, []))
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmdline = ""
        out[pid] = (_role(pid, cmdline), procs[pid][1])
    return out


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, per role (a process that started in between counts from 0)."""
    out = dict.fromkeys(ROLES, 0.0)
    for pid, (role, seconds) in after.items():
        out[role] += seconds - (before[pid][1] if pid in before else 0.0)
    return {k: round(v, 3) for k, v in out.items()}


@dataclass
class Throughput:
    tasks: int
    budget: int
    parallel: int
    max_in_flight: int
    iterations: int
    loop_s: float
    iterations_s: float
    steady_iterations_s: float  # between the 10th and the 90th percentile of the attempts
    start_s: float  # run_ray's start: evaluator actor, references, memory actor, snapshots
    finish_s: float  # after the last attempt: snapshots, summaries, DuckDB reads, actors closed
    total_s: float
    warmup_s: float
    warmup_iterations: int
    parquet_rows: int
    parquet_ok: bool
    parquet_files: int  # part files the run left (attempts and llm_calls)
    llm_calls: int
    evaluations: int  # attempts that reached the evaluator (the rest failed in the agents)
    accepted_share: float
    goal_met: bool
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds over the loop, per process role
    executed: dict[str, Any] = field(default_factory=dict)  # Ray's timeline: where each call ran, how long
    timeline: list[int] = field(default_factory=list)  # attempts recorded in each second of the loop
    driver_profile: dict[str, Any] = field(default_factory=dict)


class _Clock(Reporter):
    """Marks when each attempt reached the driver (the Reporter hook is called once per attempt), and takes CPU
    snapshots of the process tree when the loop starts and when the last expected attempt arrives."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.times: list[float] = []
        self.accepted = 0
        self.evaluated = 0
        self.cpu: list[dict[int, tuple[str, float]]] = []
        self.wall: list[float] = []  # time.time() at the loop's start and at the last attempt (Ray's timeline)

    def started(self) -> None:
        self.cpu.append(cpu_snapshot())
        self.wall.append(time.time())
        self.times.append(time.perf_counter())  # times[0]: the loop's start

    def attempt(self, node: Node, step: AgentResult, tree: Tree, usage: Any) -> None:
        self.times.append(time.perf_counter())
        self.accepted += int(node.accepted)
        self.evaluated += int(bool(step.ok and step.source))
        if len(self.times) - 1 == self.expected:
            self.wall.append(time.time())
            self.cpu.append(cpu_snapshot())


def write_tasks(directory: Path, n: int) -> list[Task]:
    source = TASK_FILE.read_text()
    directory.mkdir(parents=True, exist_ok=True)
    tasks = []
    for i in range(n):
        path = directory / f"t{i:03d}_LeakyReluScale.py"
        path.write_text(source)
        tasks.append(load_task(path))
    return tasks


def _run(tasks: list[Task], budget: int, parallel: int, max_in_flight: int, out: Path | str, run_id: str,
         profile: cProfile.Profile | None = None,
         clock: _Clock | None = None) -> tuple[_Clock, float, list[Any], Location]:
    """One run_ray; returns the clock (times[0]: the loop's start, then one per attempt; a new one unless given),
    when run_ray was called, the summaries and the run directory."""
    from stark_ray.run.ray_driver import RayRun, run_ray

    this = _self_module()
    run = RayRun(tasks, SearchConfig(budget=budget, parallel=parallel, seed=0), AgentConfig(),
                 EvalConfig(), out, run_id=run_id, max_in_flight=max_in_flight,
                 client_factory=this.scripted_client, evaluator_cls=this.InstantEvaluator)
    clock = clock or _Clock(len(tasks) * budget)
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    try:
        summaries = run_ray(run, clock, on_started=lambda _d: clock.started())
    finally:
        if profile is not None:
            profile.disable()
    return clock, t0, summaries, locate(out) / run_id


def _part_files(run_dir: Location) -> int:
    from stark_ray.store.parquet import part_names

    return sum(len(part_names(d)) for table in ("attempts", "llm_calls") for d in (run_dir / table).subdirs())


def _self_module() -> Any:
    """This file imported under its module name, so that what Ray pickles refers to an importable module."""
    import orchestration

    return orchestration


def measure_throughput(args: argparse.Namespace, work: Path) -> Throughput:
    from stark_ray.store.read import attempt_rows, call_rows

    tasks = write_tasks(work / "tasks", args.tasks)
    in_flight = args.max_in_flight or args.tasks * args.parallel
    w0 = time.perf_counter()
    out = args.out or work / "runs"
    suffix = f"-{uuid.uuid4().hex[:6]}" if args.out else ""  # never continue an earlier run under --out
    warm, _, _, _ = _run(tasks, args.warmup_budget, args.parallel, in_flight, out, "warmup" + suffix)
    warmup_s = time.perf_counter() - w0

    profile = cProfile.Profile() if args.profile else None
    clock, t0, summaries, run_dir = _run(tasks, args.budget, args.parallel, in_flight, out, "measured" + suffix,
                                         profile)
    t_end = time.perf_counter()
    loop_start, times = clock.times[0], clock.times[1:]
    if not times:
        sys.exit("error: the measured run recorded no attempt")
    iterations = len(times)
    loop_s = times[-1] - loop_start
    lo, hi = int(iterations * 0.1), max(int(iterations * 0.9) - 1, int(iterations * 0.1) + 1)
    steady = (hi - lo) / (times[hi] - times[lo]) if iterations > 2 and times[hi] > times[lo] else 0.0
    attempts = sum(s.attempts for s in summaries)
    rows = attempt_rows(run_dir)
    by_task: dict[str, list[int]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(int(r["seq"]))
    complete = all(sorted(by_task.get(t.name, [])) == list(range(args.budget + 1)) for t in tasks)
    parquet_ok = (attempts == iterations == args.tasks * args.budget and len(rows) == iterations + args.tasks
                  and complete)
    rate = iterations / loop_s if loop_s > 0 else 0.0
    result = Throughput(
        tasks=args.tasks, budget=args.budget, parallel=args.parallel, max_in_flight=in_flight, iterations=iterations,
        loop_s=round(loop_s, 3), iterations_s=round(rate, 1), steady_iterations_s=round(steady, 1),
        start_s=round(loop_start - t0, 3), finish_s=round(t_end - times[-1], 3), total_s=round(t_end - t0, 3),
        warmup_s=round(warmup_s, 3), warmup_iterations=len(warm.times) - 1, parquet_rows=len(rows),
        parquet_ok=parquet_ok, parquet_files=_part_files(run_dir),
        llm_calls=len(call_rows(run_dir)), evaluations=clock.evaluated,
        accepted_share=round(clock.accepted / max(iterations, 1), 3), goal_met=rate >= GOAL_ITERATIONS_S,
        cpu_s=cpu_by_role(*clock.cpu) if len(clock.cpu) == 2 else {},
        timeline=[sum(1 for t in times if k <= t - loop_start < k + 1) for k in range(int(loop_s) + 1)])
    if profile is not None:
        profile.dump_stats(args.profile)
        result.driver_profile = driver_breakdown(profile, iterations)
    if len(clock.wall) == 2:
        result.executed = executed_breakdown(*clock.wall)
    return result


def executed_breakdown(start: float, end: float) -> dict[str, Any]:
    """From Ray's timeline, per remote method or task that ran during the loop: calls seen, worker processes that
    ran them, and ms spent in the executing worker per call (mean and p50 of the whole call; means of deserializing
    the arguments, running, storing the outputs). Set beside the driver's round trips, the difference is Ray's
    transport and the callee's queue. {} when the timeline cannot be read. Calls whose events had not reached the
    GCS when their worker was killed (the evaluator's last second) are not seen."""
    time.sleep(2.0)  # task events reach the GCS about once a second
    try:
        events = [e for e in ray.timeline() if e.get("ph") == "X" and "dur" in e]
    except Exception:  # an optional figure: any failure here leaves it out
        return {}
    lo, hi = start * 1e6, end * 1e6
    phases: dict[str, list[tuple[float, float, str]]] = {}
    for e in events:
        if str(e.get("cat", "")).startswith("task:") and not str(e["cat"]).startswith("task::"):
            phases.setdefault(e["tid"], []).append((e["ts"], e["dur"], e["cat"].removeprefix("task:")))
    calls: dict[str, list[dict[str, float]]] = {}
    workers: dict[str, set[str]] = {}
    for e in events:
        cat = str(e.get("cat", ""))
        if not cat.startswith("task::") or not lo <= e["ts"] <= hi:
            continue
        label = ".".join(cat.removeprefix("task::").split(":")[-1].split(".")[-2:])
        call = {"total": e["dur"] / 1000, "deserialize_arguments": 0.0, "execute": 0.0, "store_outputs": 0.0}
        for ts, dur, name in phases.get(e["tid"], []):
            if e["ts"] <= ts <= e["ts"] + e["dur"] and name in call:
                call[name] += dur / 1000
        calls.setdefault(label, []).append(call)
        workers.setdefault(label, set()).add(str(e["tid"]))
    out: dict[str, dict[str, Any]] = {}
    for label, seen in calls.items():
        mean = {k: round(sum(c[k] for c in seen) / len(seen), 3) for k in seen[0]}
        out[label] = {"calls": len(seen), "workers": len(workers[label]), "total_ms": mean["total"],
                      "total_p50_ms": round(percentile([c["total"] for c in seen], 50), 3),
                      "deserialize_arguments_ms": mean["deserialize_arguments"],
                      "deserialize_arguments_p50_ms": round(percentile([c["deserialize_arguments"] for c in seen], 50),
                                                            3),
                      "execute_ms": mean["execute"], "store_outputs_ms": mean["store_outputs"]}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["calls"] * kv[1]["total_ms"]))


def driver_breakdown(profile: cProfile.Profile, iterations: int) -> dict[str, Any]:
    """Where the driver's measured run went: cumulative seconds and calls of its own steps and of the Ray calls
    they make (ray.get, ray.wait, .remote submissions)."""
    stats = pstats.Stats(profile)
    wanted = {
        ("ray_driver.py", "loop"): "driver loop",
        ("ray_driver.py", "_ask"): "_ask (next_many when the memory may hold unoffered work)",
        ("ray_driver.py", "_launch"): "_launch (agent calls submitted)",
        ("ray_driver.py", "_done"): "_done (a call finished: agent, evaluation, add, next)",
        ("ray_driver.py", "_add"): "_add (memory.add_next submitted)",
        ("ray_driver.py", "_attached"): "_attached (mirror, usage, best_kernel.py, reporter)",
        ("ray_driver.py", "start"): "start (actors, references, snapshots)",
        ("ray_driver.py", "finish"): "finish (snapshots, DuckDB reads, summaries)",
        ("worker.py", "get"): "ray.get (all)",
        ("worker.py", "wait"): "ray.wait (all)",
        ("remote_function.py", "_remote"): "agent task submissions",
        ("actor.py", "_actor_method_call"): "actor method submissions",
    }
    out: dict[str, Any] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, func), (_cc, ncalls, _tt, cumtime, _callers) in raw.items():
        for (file_end, name), label in wanted.items():
            if func == name and filename.endswith(file_end):
                prev = out.get(label, {"calls": 0, "cum_s": 0.0})
                out[label] = {"calls": prev["calls"] + ncalls, "cum_s": round(prev["cum_s"] + cumtime, 3)}
    for entry in out.values():
        entry["calls_per_iteration"] = round(entry["calls"] / max(iterations, 1), 2)
        entry["ms_per_iteration"] = round(entry["cum_s"] * 1000 / max(iterations, 1), 3)
    return out


# --- TreeMemory latency ------------------------------------------------------------------------------------------
def _usage(role: str) -> LLMUsage:
    return LLMUsage(role=role, provider="scripted", model="scripted-instant", input_tokens=3000, output_tokens=400,
                    latency_s=0.0)


def _step(task: str, i: int) -> AgentResult:
    source = _CANDIDATE.format(tag=f"{task}-{i}")
    return AgentResult(source, "1. Fuse the chain into a single pass over the input.", None, None,
                       [_usage("plan"), _usage("code")])


def _specs(n: int) -> list[TaskSpec]:
    source = TASK_FILE.read_text()
    return [TaskSpec(TaskInfo(f"m{i:03d}", source, "cpu_cpp", HARDWARE), reference_result()) for i in range(n)]


@dataclass
class Latency:
    mode: str
    callers: int
    calls_per_caller: int
    next: dict[str, float]
    add: dict[str, float]
    calls: int
    wall_s: float
    calls_s: float
    none_tickets: int
    echo: dict[str, float]
    echo_calls_s: float
    service_next_ms: float  # in-process TreeMemory core, no Ray
    service_add_ms: float  # of which the Parquet sink:
    service_sink_ms: float
    service_calls_s: float  # the bound the actor's one thread sets: 2 calls / (next + add)
    next_ms_by_tree_size: dict[int, float]  # in-process next of one task, mean over the 10 nodes before the size


def _threads(callers: int, body: Callable[[int], None]) -> float:
    """Run ``body(i)`` for every caller in its own thread, all released at once; the wall time."""
    barrier = threading.Barrier(callers + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            body(i)
        except BaseException as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(callers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def _coroutines(callers: int, body: Callable[[int], Any]) -> float:
    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(body(i) for i in range(callers)))
        return time.perf_counter() - t0

    return asyncio.run(main())


def measure_latency(args: argparse.Namespace, work: Path) -> Latency:
    n, calls = args.callers, args.calls
    specs = _specs(n)
    search = SearchConfig(budget=calls, parallel=1, seed=0)
    (work / "memory" / "latency").mkdir(parents=True, exist_ok=True)
    write_specs(locate(work / "memory" / "latency"), specs)
    actor = TreeMemoryActor.options(num_cpus=0).remote(  # type: ignore[attr-defined]  # Ray's decorator
        str(work / "memory"), "latency", search, AgentConfig())
    ray.get(actor.unfinished.remote())  # constructed
    nexts: list[list[float]] = [[] for _ in range(n)]
    adds: list[list[float]] = [[] for _ in range(n)]
    nones = [0] * n

    def one(i: int) -> tuple[AgentResult, EvalResult]:
        """The step and result caller i's next add sends (made outside the timed calls)."""
        step = _step(specs[i].info.name, len(adds[i]))
        return step, instant_result(step.source or "")

    if args.mode == "thread":
        def caller(i: int) -> None:
            name = specs[i].info.name
            for _ in range(calls):
                t0 = time.perf_counter()
                ticket = ray.get(actor.next.remote(name))
                nexts[i].append(time.perf_counter() - t0)
                if ticket is None:
                    nones[i] += 1
                    continue
                step, result = one(i)
                t2 = time.perf_counter()
                ray.get(actor.add.remote(ticket, step, result))
                adds[i].append(time.perf_counter() - t2)

        wall = _threads(n, caller)
    else:
        async def acaller(i: int) -> None:
            name = specs[i].info.name
            for _ in range(calls):
                t0 = time.perf_counter()
                ticket = await actor.next.remote(name)
                nexts[i].append(time.perf_counter() - t0)
                if ticket is None:
                    nones[i] += 1
                    continue
                step, result = one(i)
                t2 = time.perf_counter()
                await actor.add.remote(ticket, step, result)
                adds[i].append(time.perf_counter() - t2)

        wall = _coroutines(n, acaller)
    ray.get(actor.close.remote())
    ray.kill(actor)
    all_next = [v for vs in nexts for v in vs]
    all_add = [v for vs in adds for v in vs]
    total = len(all_next) + len(all_add)
    echo, echo_rate = _echo(args)
    svc_next, svc_add, svc_sink = _service_time(work / "inproc", min(n, 16), calls)
    return Latency(mode=args.mode, callers=n, calls_per_caller=calls, next=latency_ms(all_next),
                   add=latency_ms(all_add), calls=total, wall_s=round(wall, 3), calls_s=round(total / wall, 1),
                   none_tickets=sum(nones), echo=echo, echo_calls_s=echo_rate,
                   service_next_ms=round(svc_next * 1000, 3), service_add_ms=round(svc_add * 1000, 3),
                   service_sink_ms=round(svc_sink * 1000, 3),
                   service_calls_s=round(2 / (svc_next + svc_add), 1) if svc_next + svc_add > 0 else 0.0,
                   next_ms_by_tree_size=_next_by_tree_size(args.tree_sizes))


def _echo(args: argparse.Namespace) -> tuple[dict[str, float], float]:
    """The same callers and number of calls against a trivial async actor."""
    n, calls = args.callers, 2 * args.calls
    echo = EchoActor.options(num_cpus=0).remote()  # type: ignore[attr-defined]
    ray.get(echo.ping.remote(None))
    lat: list[list[float]] = [[] for _ in range(n)]
    payload = "x" * 100

    if args.mode == "thread":
        def caller(i: int) -> None:
            for _ in range(calls):
                t0 = time.perf_counter()
                ray.get(echo.ping.remote(payload))
                lat[i].append(time.perf_counter() - t0)

        wall = _threads(n, caller)
    else:
        async def acaller(i: int) -> None:
            for _ in range(calls):
                t0 = time.perf_counter()
                await echo.ping.remote(payload)
                lat[i].append(time.perf_counter() - t0)

        wall = _coroutines(n, acaller)
    ray.kill(echo)
    flat = [v for vs in lat for v in vs]
    return latency_ms(flat), round(len(flat) / wall, 1)


def _service_time(root: Path, tasks: int, calls: int) -> tuple[float, float, float]:
    """Mean seconds of one next, one add (sink included) and of the sink alone, in this process, with the store
    set up as the TreeMemory actor sets it up (flush every add, no fsync)."""
    specs = _specs(tasks)
    store = RunStore(str(root), "service", flush_rows=256, flush_s=1.0, fsync=False)
    sink_s: list[float] = []

    def sink(task: str, node: Node, step: AgentResult) -> None:
        t0 = time.perf_counter()
        store.record(task, node, step.usage)
        store.flush()
        sink_s.append(time.perf_counter() - t0)

    memory = TreeMemory(sink=sink)
    search = SearchConfig(budget=calls, parallel=1, seed=0)
    for spec in specs:
        tree = Tree.with_reference(spec.info.reference_source, reference_result())
        store.record_node(spec.info.name, tree.root)
        memory.open(make_task_search(spec.info.name, tree, search, AgentConfig(), spec.info))
    store.flush()
    next_s: list[float] = []
    add_s: list[float] = []
    for i in range(calls):
        for spec in specs:
            t0 = time.perf_counter()
            ticket = memory.next(spec.info.name)
            t1 = time.perf_counter()
            next_s.append(t1 - t0)
            if ticket is None:
                continue
            step = _step(spec.info.name, i)
            result = instant_result(step.source or "")
            t2 = time.perf_counter()
            memory.add(ticket, step, result)
            add_s.append(time.perf_counter() - t2)
    store.close()
    return (sum(next_s) / max(len(next_s), 1), sum(add_s) / max(len(add_s), 1),
            sum(sink_s) / max(len(sink_s), 1))


def _next_by_tree_size(sizes: list[int]) -> dict[int, float]:
    """Mean ms of TaskSearch.next (policy selection and context windows, no Ray, no store) over the 10 nodes
    before each size, for one task whose tree grows to the largest size."""
    if not sizes:
        return {}
    spec = _specs(1)[0]
    tree = Tree.with_reference(spec.info.reference_source, reference_result())
    state = make_task_search("size", tree, SearchConfig(budget=max(sizes), seed=0), AgentConfig(), spec.info)
    took: list[float] = []
    for i in range(max(sizes)):
        t0 = time.perf_counter()
        ticket = state.next()
        took.append(time.perf_counter() - t0)
        if ticket is None:
            break
        step = _step("size", i)
        state.add(ticket, step, instant_result(step.source or ""))
    return {n: round(sum(took[max(0, n - 10):n]) * 1000 / len(took[max(0, n - 10):n]), 3)
            for n in sizes if n <= len(took)}


# --- command line ------------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one clear line, not the usage block
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(description="Ray runtime orchestration overhead (scripted replies, instant evaluator).")
    p.add_argument("--tasks", type=int, default=32, help="task copies run at once (default 32)")
    p.add_argument("--budget", type=int, default=24, help="attempts per task in the measured run (default 24)")
    p.add_argument("--parallel", type=int, default=2, help="expansions in flight per task (default 2)")
    p.add_argument("--max-in-flight", type=int, default=0, help="RayRun.max_in_flight (default tasks x parallel)")
    p.add_argument("--warmup-budget", type=int, default=2, help="attempts per task of the warm-up run (default 2)")
    p.add_argument("--callers", type=int, default=64, help="concurrent TreeMemory callers (default 64)")
    p.add_argument("--calls", type=int, default=20, help="next+add rounds per caller (default 20)")
    p.add_argument("--mode", choices=("thread", "async"), default="thread",
                   help="callers as driver threads (ray.get) or asyncio coroutines (await ref); default thread")
    p.add_argument("--tree-sizes", default="25,100,200",
                   help="tree sizes at which to time the in-process next of one task (default 25,100,200; '' skips)")
    p.add_argument("--only", choices=("all", "throughput", "latency"), default="all")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2,
                   help="ray.init(num_cpus=...); default the machine's cores (>= 2: the evaluator holds one)")
    p.add_argument("--out", help="root of the runs of [1]: a directory or a URI such as s3://bucket/prefix?... "
                                 "(default: a temporary directory)")
    p.add_argument("--json", type=Path, help="write the figures to this file")
    p.add_argument("--profile", type=Path, help="write a cProfile of the driver's measured run here")
    args = p.parse_args(argv)
    try:
        args.tree_sizes = sorted({int(v) for v in args.tree_sizes.split(",") if v.strip()})
    except ValueError:
        p.error(f"--tree-sizes takes comma-separated integers, got {args.tree_sizes!r}")
    checks = [(args.tasks >= 1, "--tasks must be >= 1"), (args.budget >= 1, "--budget must be >= 1"),
              (args.parallel >= 1, "--parallel must be >= 1"),
              (args.max_in_flight >= 0, "--max-in-flight must be >= 0"),
              (args.warmup_budget >= 1, "--warmup-budget must be >= 1"),
              (args.callers >= 1, "--callers must be >= 1"), (args.calls >= 1, "--calls must be >= 1"),
              (all(1 <= n <= 2000 for n in args.tree_sizes), "--tree-sizes must be between 1 and 2000"),
              (args.cpus >= 2, "--cpus must be >= 2 (the evaluator actor of a CPU backend holds one CPU and the "
                               "agent tasks need the rest)")]
    for path in (args.json, args.profile):
        if path is not None:
            checks.append((path.parent.is_dir(), f"cannot write {path}: no directory {path.parent}"))
    for ok, message in checks:
        if not ok:
            p.error(message)
    return args


@contextlib.contextmanager
def local_ray(cpus: int) -> Iterator[float]:
    """A local Ray whose workers can import stark_ray and this module; yields its start-up seconds."""
    path = os.pathsep.join(p for p in (str(REPO), str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    connect(None, runtime_env={"env_vars": {"PYTHONPATH": path}}, num_cpus=cpus)  # run_ray's private local Ray
    try:
        yield time.perf_counter() - t0
    finally:
        disconnect()


def report(figures: dict[str, Any]) -> None:
    tp, lat = figures.get("throughput"), figures.get("latency")
    print(f"machine: {figures['machine']['cpus']} CPUs given to Ray ({figures['machine']['cores']} cores), "
          f"Python {figures['machine']['python']}, Ray {figures['machine']['ray']}; "
          f"Ray start-up {figures['ray_start_s']:.2f} s; load average {figures['machine']['load_1m_before']} before, "
          f"{figures['machine']['load_1m_after']} after (this benchmark's own load included)")
    load = figures["machine"]["load_1m_before"]
    if load is not None and load > 0.5 * (figures["machine"]["cores"] or 1):
        print("warning: the machine was busy before the benchmark started; the figures are pessimistic")
    if tp:
        print(f"\n[1] iterations through the actors: {tp['tasks']} tasks x budget {tp['budget']}, parallel "
              f"{tp['parallel']}, max_in_flight {tp['max_in_flight']}")
        print(f"    warm-up run: {tp['warmup_iterations']} attempts in {tp['warmup_s']:.2f} s (worker processes start)")
        print(f"    measured run: start {tp['start_s']:.2f} s | loop {tp['iterations']} attempts in "
              f"{tp['loop_s']:.2f} s | finish {tp['finish_s']:.2f} s | total {tp['total_s']:.2f} s")
        print(f"    iterations/s over the loop: {tp['iterations_s']:.1f} (steady 10-90%: "
              f"{tp['steady_iterations_s']:.1f}); goal >= {GOAL_ITERATIONS_S:.0f}/s: "
              f"{'met' if tp['goal_met'] else 'NOT met'}")
        print(f"    Parquet: {tp['parquet_rows']} attempts rows (references included), {tp['llm_calls']} llm_calls "
              f"rows in {tp['parquet_files']} part files: "
              f"{'all attempts present' if tp['parquet_ok'] else 'MISSING OR EXTRA ROWS'}; "
              f"{tp['evaluations']} evaluated, {tp['accepted_share']:.0%} accepted")
        if tp["cpu_s"]:
            total = sum(tp["cpu_s"].values())
            print(f"    CPU over the loop: {total:.1f} s of {tp['loop_s'] * figures['machine']['cpus']:.1f} available "
                  f"({total * 1000 / max(tp['iterations'], 1):.1f} ms per iteration): " +
                  ", ".join(f"{k} {v:.1f} s" for k, v in tp["cpu_s"].items()))
        print(f"    attempts per second of the loop: {' '.join(str(n) for n in tp['timeline'])}")
        for label, entry in tp.get("executed", {}).items():
            print(f"    executed {label:<26} {entry['calls']:>5} calls seen on {entry['workers']:>2} workers, ms in "
                  f"the callee: mean {entry['total_ms']:.3f} (p50 {entry['total_p50_ms']:.3f}) = arguments "
                  f"{entry['deserialize_arguments_ms']:.3f} (p50 {entry['deserialize_arguments_p50_ms']:.3f}) + run "
                  f"{entry['execute_ms']:.3f} + outputs {entry['store_outputs_ms']:.3f}")
        for label, entry in tp.get("driver_profile", {}).items():
            print(f"    profile  {label:<58} {entry['calls_per_iteration']:>7.2f} calls/it "
                  f"{entry['ms_per_iteration']:>8.3f} ms/it")
    if lat:
        print(f"\n[2] TreeMemory actor, {lat['callers']} concurrent callers ({lat['mode']}), {lat['calls_per_caller']} "
              f"next+add rounds each")
        for name in ("next", "add"):
            s = lat[name]
            print(f"    {name:<4} p50 {s['p50_ms']:8.2f} ms   p99 {s['p99_ms']:8.2f} ms   mean {s['mean_ms']:8.2f} ms "
                  f"  (n={s['n']})")
        print(f"    sustained: {lat['calls_s']:.1f} calls/s ({lat['calls']} calls in {lat['wall_s']:.2f} s); "
              f"tickets refused: {lat['none_tickets']}")
        e = lat["echo"]
        print(f"    trivial async actor, same callers: p50 {e['p50_ms']:.2f} ms p99 {e['p99_ms']:.2f} ms, "
              f"{lat['echo_calls_s']:.1f} calls/s")
        print(f"    in-process TreeMemory core (no Ray): next {lat['service_next_ms']:.3f} ms, add "
              f"{lat['service_add_ms']:.3f} ms (Parquet sink {lat['service_sink_ms']:.3f} ms) -> at most "
              f"{lat['service_calls_s']:.0f} calls/s on the actor's one thread")
        if lat["next_ms_by_tree_size"]:
            print("    in-process next of one task by tree size: " +
                  ", ".join(f"{n} nodes {ms:.2f} ms" for n, ms in lat["next_ms_by_tree_size"].items()))


def _load() -> float | None:
    """The 1-minute load average (other work on the machine skews every figure here), where the OS has one."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": args.cpus, "cores": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__, "platform": platform.platform(), "load_1m_before": _load()},
        "goal_iterations_s": GOAL_ITERATIONS_S,
    }
    work = Path(tempfile.mkdtemp(prefix="stark-orchestration-"))
    try:
        with local_ray(args.cpus) as start_s:
            figures["ray_start_s"] = round(start_s, 3)
            if args.only in ("all", "throughput"):
                figures["throughput"] = asdict(measure_throughput(args, work))
            if args.only in ("all", "latency"):
                figures["latency"] = asdict(measure_latency(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["machine"]["load_1m_after"] = _load()
    report(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    tp = figures.get("throughput")
    return 0 if tp is None or tp["parquet_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

