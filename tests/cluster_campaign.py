"""A campaign on a simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head with no GPU and worker
nodes with one logical GPU each), run as a script of its own by ``tests/test_cluster.py`` (the test process holds
the session's Ray; a cluster needs a process that has not joined one).

Real: Ray's nodes, the driver, the TreeMemory actor, the agent workers, the Parquet store on a local path or an
S3-compatible server. Stand-ins: the scripted replies and an evaluator that answers after a short wait
(``NodeEvaluator``: ``benchmarks/orchestration.py``'s instant evaluator that also logs the node it ran on).

    python tests/cluster_campaign.py run RUN_DIR_PARENT WORK [--remove-worker-at N] [--tasks T] [--budget B]
    python tests/cluster_campaign.py resume RUN_DIR WORK

``run`` starts a head and three workers and runs a campaign (run id ``cluster``); with ``--remove-worker-at N`` it
removes a worker node once N attempts are recorded. ``resume`` starts a new cluster (a new head) and continues
the run directory. Each prints one JSON line last: per task its status and attempts, and the nodes that evaluated.
Every attempt the driver acknowledges is printed as ``attempt SEQ`` (a test kills the whole process group,
head included, after some of them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import orchestration  # noqa: E402
import ray  # noqa: E402

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig  # noqa: E402
from stark_ray.eval.tasks import Task  # noqa: E402
from stark_ray.records import EvalResult, source_digest  # noqa: E402
from stark_ray.run import evaluator_deaths  # noqa: E402
from stark_ray.run.reporter import Reporter  # noqa: E402
from stark_ray.store.location import Location, locate  # noqa: E402

NODE_LOG = "STARK_TEST_NODE_LOG"  # the file each evaluation appends "node-id digest" to
EVAL_S = 0.3  # each evaluation's wait: candidates are in flight on every node when one goes


@ray.remote
class NodeEvaluator(orchestration._Instant):
    """The instant evaluator, slower, logging where each candidate ran."""

    def evaluate(self, task: Task, source: str) -> EvalResult:
        time.sleep(EVAL_S)
        with open(os.environ[NODE_LOG], "a") as f:
            f.write(f"{ray.get_runtime_context().get_node_id()} {source_digest(source)}\n")
        return orchestration.instant_result(source)


class Printed(Reporter):
    """Prints every acknowledged attempt (flushed: a test reads them to know when to kill), and counts them."""

    def __init__(self) -> None:
        self.count = 0
        self.reached = threading.Event()
        self.at: int | None = None

    def attempt(self, node: Any, step: Any, tree: Any, usage: Any) -> None:
        self.count += 1
        print(f"attempt {node.id}", flush=True)
        if self.at is not None and self.count >= self.at:
            self.reached.set()


def start_cluster(workers: int) -> Any:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    for _ in range(workers):
        cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    return cluster


def worker_env(work: Path) -> dict[str, Any]:
    """The job's runtime_env: its workers import this checkout and the helpers, and log where they evaluate."""
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")])
    return {"env_vars": {"PYTHONPATH": path, NODE_LOG: str(work / "nodes.log")}}


def the_run(tasks: list[Task], out: str | Location, address: str, budget: int, resume: str | None = None) -> Any:
    from stark_ray.run.placement import RayRun

    # no runoff: every evaluation logged is an attempt's (the test counts them against the budget)
    return RayRun(tasks, SearchConfig(budget=budget, parallel=2, seed=0, runoff=0), AgentConfig(),
                  EvalConfig(backend="cuda"), out, run_id=None if resume else "cluster", resume=resume, address=address,
                  client_factory=orchestration.scripted_client, evaluator_cls=NodeEvaluator)


def outcome(summaries: list[Any], work: Path, removed: str | None, head: str) -> dict[str, Any]:
    log = (work / "nodes.log").read_text().split() if (work / "nodes.log").exists() else []
    nodes = log[0::2]
    return {"tasks": {s.task: {"status": s.status, "attempts": s.attempts} for s in summaries},
            "nodes": sorted(set(nodes)), "evaluations": len(nodes), "removed": removed, "head": head,
            "evaluated_on_removed": sum(1 for n in nodes if n == removed)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["run", "resume"])
    p.add_argument("where")  # run: the run directory's parent (a path or URI); resume: the run directory
    p.add_argument("work", type=Path)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--remove-worker-at", type=int)
    p.add_argument("--move-after", type=float, default=3.0)
    args = p.parse_args(argv)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # the driver gives a lost evaluator's candidates to the others after MOVE_AFTER_S (30 s by default)
    evaluator_deaths.MOVE_AFTER_S = args.move_after
    from stark_ray.run.ray_driver import run_ray
    from stark_ray.run.resume import resumed

    cluster = start_cluster(3)
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
                 runtime_env=worker_env(args.work))
        head = ray.get_runtime_context().get_node_id()
        reporter = Printed()
        if args.mode == "run":
            tasks = orchestration.write_tasks(args.work / "tasks", args.tasks)
            run = the_run(tasks, args.where, cluster.address, args.budget)
        else:
            r = resumed(args.where)
            run = the_run(r.tasks, locate(args.where).parent, cluster.address, r.search.budget, resume=args.where)
        removed: str | None = None
        if args.remove_worker_at is None:
            summaries = run_ray(run, reporter)
        else:
            reporter.at = args.remove_worker_at
            result: dict[str, Any] = {}

            def go() -> None:
                try:
                    result["s"] = run_ray(run, reporter)
                except BaseException as e:
                    result["error"] = repr(e)

            thread = threading.Thread(target=go, daemon=True)
            thread.start()
            while not reporter.reached.wait(0.2):
                if not thread.is_alive():
                    raise SystemExit(f"the campaign ended before the removal: {result}")
            busy = {line.split()[0] for line in (args.work / "nodes.log").read_text().splitlines()}
            victim = next(n for n in cluster.worker_nodes if n.node_id in busy and n.node_id != head)
            removed = victim.node_id
            cluster.remove_node(victim)
            print(f"removed {removed} after {reporter.count} attempts", flush=True)
            thread.join(600)
            if thread.is_alive() or "s" not in result:
                raise SystemExit(f"the campaign did not finish after the node was removed: {result}")
            summaries = result["s"]
        print(json.dumps(outcome(summaries, args.work, removed, head)), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
