"""The driver's per-tick work at campaign scale: the live view's figures and ``next_many``, kept up to date as nodes
come (this code) against counting them over every task and node (what the code before did, written out here as
its definition), side by side in one process.

- **live status**: ``RunMirror.status`` (twice a second in the Ray driver) on N tasks x 30 attempts, a few tasks
  running; the old way summed attempts, accepted nodes and bests over every tree.
- **next_many**: ``TreeMemory.next_many(limit)`` with N tasks of which half have finished and 64 expansions are in
  flight; the old way walked every task on every call.

Run:  python benchmarks/driver_scale.py [--tasks 250 2500] [--budget 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.records import AGENT_PLAN_CODE, STAGE_CORRECTNESS, STAGE_OK, EvalResult
from stark_ray.run.mirror import RunMirror, status_from_scratch
from stark_ray.search.memory import Ticket, TreeMemory, make_task_search
from stark_ray.search.tree import Tree
from stark_ray.store.location import locate


def result(rng: random.Random) -> EvalResult:
    if rng.random() < 0.4:
        return EvalResult.failed(STAGE_CORRECTNESS, "outputs differ")
    speedup = rng.uniform(0.5, 4.0)
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=1 / speedup, ref_runtime_ms=1.0, speedup=speedup,
                      stage=STAGE_OK)


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def live_status(n_tasks: int, budget: int, rng: random.Random) -> tuple[float, float]:
    names = [f"t{i}" for i in range(n_tasks)]
    mirror = RunMirror(names)
    with tempfile.TemporaryDirectory() as tmp:
        mirror.dir = locate(tmp)
        for name in names:
            root = result(rng)
            truth = Tree.with_reference("ref", root)
            mirror.load(name, Tree.with_reference("ref", root))
            for _ in range(budget):
                node = truth.add(rng.choice(list(truth.nodes)), "s", AGENT_PLAN_CODE, result(rng))
                mirror.attach(name, node, AgentResult("s"))
        running = set(names[:64])
        kept, counted = mirror.status(running, budget, set()), status_from_scratch(mirror.trees, running, budget, set())
        assert {k: kept[k] for k in counted} == counted
        new = median_ms(lambda: mirror.status(running, budget, set()), 50)
        old = median_ms(lambda: status_from_scratch(mirror.trees, running, budget, set()), 5)
    return old, new


def walk_all(memory: TreeMemory, limit: int) -> list[Ticket]:
    out: list[Ticket] = []
    for search in memory.searches.values():
        while len(out) < limit and not search.finished and (ticket := search.next()) is not None:
            out.append(ticket)
    return out


def next_many(n_tasks: int, budget: int) -> tuple[float, float]:
    memory = TreeMemory()
    for i in range(n_tasks):
        tree = Tree.with_reference("class Model: ...", result(random.Random(i)))
        info = TaskInfo(f"t{i}", "class Model: ...", "cpu_cpp")
        memory.open(make_task_search(f"t{i}", tree, SearchConfig(budget=budget), AgentConfig(), info))
    rng = random.Random(0)
    for search in list(memory.searches.values())[: n_tasks // 2]:  # half of them finished
        while (t := search.next()) is not None:
            search.add(t, AgentResult("s", "i"), result(rng))
    memory.next_many(64)  # 64 in flight, one on each of the first open tasks
    times_new, times_old = [], []
    for _ in range(200):
        t0 = time.perf_counter()
        got = memory.next_many(1)
        times_new.append((time.perf_counter() - t0) * 1000)
        for t in got:
            memory.release(t)
        t0 = time.perf_counter()
        got = walk_all(memory, 1)
        times_old.append((time.perf_counter() - t0) * 1000)
        for t in got:
            memory.release(t)
    return statistics.median(times_old), statistics.median(times_new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[250, 2500])
    ap.add_argument("--budget", type=int, default=30)
    args = ap.parse_args()
    print(f"{'tasks':>6} {'status old ms':>14} {'status new ms':>14} {'ratio':>7} {'next_many old ms':>17} "
          f"{'next_many new ms':>17} {'ratio':>7}")
    for n in args.tasks:
        s_old, s_new = live_status(n, args.budget, random.Random(n))
        m_old, m_new = next_many(n, args.budget)
        print(f"{n:>6} {s_old:>14.3f} {s_new:>14.3f} {s_old / s_new:>7.0f} {m_old:>17.3f} {m_new:>17.3f} "
              f"{m_old / m_new:>7.0f}")


if __name__ == "__main__":
    main()
