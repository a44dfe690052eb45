"""One task, optimized in-process: the local executor behind ``stark optimize``.

It wires the core together — task, evaluator, LLM client, tree, policy, team — runs Algorithm 1, streams
every attempt and LLM call to Parquet, keeps ``best_kernel.py`` current, and writes ``summary.json``; an
interrupted or failed run still leaves both, with its status.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.evaluator import make_evaluator
from stark_ray.eval.tasks import Task
from stark_ray.llm.base import LLMClient
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import Node, attempt_schema, llm_call_schema
from stark_ray.search.loop import search
from stark_ray.search.policy import make_policy
from stark_ray.search.team import make_team
from stark_ray.search.tree import Tree
from stark_ray.store.location import Location, locate
from stark_ray.store.parquet import PartWriter, safe_name
from stark_ray.store.run_store import attempt_row, llm_call_rows

STATUS_FINISHED, STATUS_INTERRUPTED, STATUS_FAILED = "finished", "interrupted", "failed"


@dataclass
class RunSummary:
    task: str
    run_id: str
    run_dir: str
    status: str  # finished | interrupted | failed
    attempts: int
    budget: int
    best_correct: bool
    best_speedup: float | None
    best_node: int | None
    best_runtime_ms: float | None
    best_ref_runtime_ms: float | None  # the reference as timed beside the best candidate
    best_speedup_err: float | None  # its relative standard error (eval/noise.py), where known
    ref_runtime_ms: float | None  # the reference timed alone, at the start
    failures: int
    failures_by_stage: dict[str, int]
    tokens: dict[str, int]
    cost: float  # USD
    llm_calls: int
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    replay_mismatches: int = 0  # replayed calls whose prompt the cassette did not hold (each served in order)


class Reporter:
    """What the CLI shows while a run goes on; the default shows nothing."""

    def phase(self, what: str) -> None:
        """What the run is doing before its search begins (starting Ray, the evaluators, timing references):
        these take tens of seconds."""

    def start(self, task: Task, budget: int, tree: Tree) -> None:
        """A task's search begins: its tree as it stands (the reference only, or a resumed run's attempts)."""
    def attempt(self, node: Node, step: AgentResult, tree: Tree, usage: UsageTotals) -> None: ...
    def finish(self, summary: RunSummary) -> None: ...
    def status(self, stats: dict[str, Any]) -> None:
        """A campaign's figures now (tasks, attempts, spend, evaluators busy): called a few times a second."""

    shows_expansions = False  # True: the driver tells :meth:`expansions` what each expansion in flight is doing

    def expansions(self, doing: list[InFlight]) -> None:
        """The expansions in flight and what each is going through (called about once a second)."""


@dataclass(frozen=True)
class InFlight:
    """One expansion in flight, as the live view shows it."""

    task: str
    parent: int  # the node it expands
    doing: str  # "plan and code agents", "debug agent", "waiting for an evaluator", "building", "timing", ...
    seconds: float  # in that step so far

    def describe(self, with_task: bool = False) -> str:
        where = f"{self.task}: " if with_task else ""
        return f"{where}from node {self.parent}: {self.doing} {self.seconds:.0f} s"


def new_run_dir(out: str | Path | Location, task_name: str) -> Location:
    """A new run directory ``<task>-<UTC time>`` (``-2``, ``-3``, ... when taken) under ``out``, a local
    directory or a filesystem URI (created when absent). On a remote filesystem, where a name cannot be taken
    atomically, the name ends with four random hex digits so that drivers started in the same second differ."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    root = locate(out)
    base = f"{safe_name(task_name)}-{stamp}" + ("" if root.local else f"-{uuid.uuid4().hex[:4]}")
    root.mkdir()
    for n in range(1, 1000):
        run_dir = root / (base if n == 1 else f"{base}-{n}")
        try:
            run_dir.make_new()
            return run_dir
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory name for {base} under {root}")


def write_atomic(path: Path | Location, text: str) -> None:
    """Write a small file whole (a reader never sees part of it), locally or on a filesystem URI."""
    locate(path).write_text(text)


class Run:
    """The run directory of one task: Parquet rows as they happen, the best kernel, the summary."""

    def __init__(self, out: str | Path | Location, task: Task, tree: Tree) -> None:
        self.dir = new_run_dir(out, task.name)
        self.id = self.dir.name
        self.common = {"run_id": self.id, "task": task.name}
        self.attempts = PartWriter(self.dir, "attempts", task.name, attempt_schema(), flush_rows=1)
        self.calls = PartWriter(self.dir, "llm_calls", task.name, llm_call_schema(), flush_rows=8)
        self.usage = UsageTotals()
        self.best: Node | None = None
        self.attempts.append(attempt_row(self.id, task.name, tree.root))

    def record(self, node: Node, step: AgentResult, tree: Tree) -> None:
        task = self.common["task"]
        self.attempts.append(attempt_row(self.id, task, node))
        for u in step.usage:
            self.usage.add(u)
        for row in llm_call_rows(self.id, task, node.id, step.usage):  # the Ray store's rows, same function
            self.calls.append(row)
        best = tree.best()
        if best is not None and best is not self.best:
            self.best = best
            write_atomic(self.dir / "best_kernel.py", best.source)

    def close(self) -> None:
        self.attempts.close()
        self.calls.close()


def summary_of(task: str, run_id: str, run_dir: str, tree: Tree, status: str, budget: int, usage: UsageTotals,
               settings: dict[str, Any], wall_s: float) -> RunSummary:
    """A task's summary from its tree and what its LLM calls cost (either executor)."""
    best = tree.best()
    return RunSummary(
        task=task, run_id=run_id, run_dir=run_dir, status=status, attempts=tree.evaluated,
        budget=budget, best_correct=best is not None,
        best_speedup=best.result.speedup if best else None, best_node=best.id if best else None,
        best_runtime_ms=best.result.runtime_ms if best else None,
        best_ref_runtime_ms=best.result.ref_runtime_ms if best else None,
        best_speedup_err=best.result.speedup_err if best else None,
        ref_runtime_ms=tree.root.result.runtime_ms, failures=tree.failures(),
        failures_by_stage=dict(Counter(n.result.stage for n in tree if not n.is_root and not n.correct)),
        tokens={"input": usage.input_tokens, "output": usage.output_tokens}, cost=round(usage.cost_usd, 6),
        llm_calls=usage.calls, wall_s=round(wall_s, 2), settings=settings,
        replay_mismatches=usage.replay_mismatches,
    )


def summarize(run: Run, task: Task, tree: Tree, status: str, settings: dict[str, Any], wall_s: float,
              budget: int) -> RunSummary:
    return summary_of(task.name, run.id, str(run.dir), tree, status, budget, run.usage, settings, wall_s)


def optimize(task: Task, client: LLMClient, search_cfg: SearchConfig, agent_cfg: AgentConfig,
             eval_cfg: EvalConfig, out: str | Path | Location, reporter: Reporter | None = None,
             evaluator_factory: Callable[[Task, EvalConfig], Any] = make_evaluator) -> RunSummary:
    """Run STARK on one task. Raises TaskError when the reference itself cannot be evaluated (before any run
    directory exists); any later exception (Ctrl-C included) propagates after the run directory is complete."""
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    settings = {"search": asdict(search_cfg), "agents": _public(asdict(agent_cfg)), "eval": asdict(eval_cfg)}
    reporter.phase(f"starting the {eval_cfg.backend} evaluator, then timing the reference")
    with evaluator_factory(task, eval_cfg.hiding(out)) as evaluator:  # generated code never sees the run's files
        reference = evaluator.reference()  # validates the task: TaskError when its forward fails
        tree = Tree.with_reference(task.source, reference)
        run = Run(out, task, tree)
        info = TaskInfo(name=task.name, reference_source=task.source, backend=eval_cfg.backend,
                        hardware=evaluator.hardware_description())
        policy = make_policy(search_cfg.policy, search_cfg.ablation, search_cfg.epsilon, search_cfg.n_root,
                             search_cfg.n_child, search_cfg.max_debug_chain, search_cfg.k)
        team = make_team(client, agent_cfg, search_cfg, info)

        def on_attempt(node: Node, step: AgentResult) -> None:
            run.record(node, step, tree)
            reporter.attempt(node, step, tree, run.usage)

        status = STATUS_FAILED
        reporter.start(task, search_cfg.budget, tree)
        try:
            search(tree, policy, team, evaluator.evaluate, search_cfg.budget, search_cfg.seed,
                   on_attempt)
            status = STATUS_FINISHED
        except KeyboardInterrupt:
            status = STATUS_INTERRUPTED
            raise
        finally:
            run.close()
            summary = summarize(run, task, tree, status, settings, time.monotonic() - t0, search_cfg.budget)
            write_atomic(run.dir / "summary.json", json.dumps(asdict(summary), indent=2) + "\n")
            reporter.finish(summary)
    return summary


def _public(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "prices" or v}
