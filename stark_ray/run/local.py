"""The local executor: one task, optimized in this process, no Ray (for tests and debugging).

It wires the core together — task, evaluator, LLM client, tree, policy, team — runs Algorithm 1, streams every
attempt and LLM call to Parquet, keeps ``best_kernel.py`` current, and writes ``summary.json``; an interrupted or
failed run still leaves both, with its status. Its run directory is the Ray executor's, file for file
(:mod:`stark_ray.run.directory`): ``run.json`` included, so it resumes (with either executor) and is analysed the
same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.evaluator import make_evaluator
from stark_ray.eval.judge.sol import reference_lines
from stark_ray.eval.tasks import Task
from stark_ray.llm.base import LLMClient
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import Node, attempt_schema, llm_call_schema
from stark_ray.run.directory import (
    new_run_dir,
    recorded_usage,
    run_record,
    task_summary,
    write_atomic,
    write_run_file,
    write_task_end,
)
from stark_ray.run.reporter import Reporter
from stark_ray.run.resume import record_changes
from stark_ray.run.summary import STATUS_FAILED, STATUS_FINISHED, STATUS_INTERRUPTED, RunSummary
from stark_ray.search.loop import search
from stark_ray.search.policy import make_policy
from stark_ray.search.runoff import Runoff, contenders, runoff
from stark_ray.search.team import make_team
from stark_ray.search.tree import Tree
from stark_ray.store.compact import compact_finished
from stark_ray.store.location import Location, locate
from stark_ray.store.parquet import PartWriter
from stark_ray.store.read import load_trees
from stark_ray.store.run_store import attempt_row, llm_call_rows

EXECUTOR = "local"  # as run.json and the summaries name it


class Run:
    """The run directory of one task as this process writes it: Parquet rows as they happen, the best kernel.
    A new run writes its ``run.json`` and the reference's row; a resumed one adds part files beside the recorded
    ones and counts what its earlier calls spent."""

    def __init__(self, run_dir: Location, task: Task, tree: Tree, usage: UsageTotals | None = None) -> None:
        self.dir = run_dir
        self.id = run_dir.name
        self.task = task.name
        self.attempts = PartWriter(self.dir, "attempts", task.name, attempt_schema(), flush_rows=1)
        self.calls = PartWriter(self.dir, "llm_calls", task.name, llm_call_schema(), flush_rows=8)
        self.usage = usage or UsageTotals()
        self.best = tree.best()

    @classmethod
    def new(cls, out: str | Path | Location, task: Task, tree: Tree, record: dict[str, Any]) -> Run:
        run = cls(new_run_dir(out, task.name), task, tree)
        write_run_file(run.dir, record)
        run.attempts.append(attempt_row(run.id, task.name, tree.root))
        return run

    def record(self, node: Node, step: AgentResult, tree: Tree) -> None:
        """The node's LLM calls, then its attempts row, each on disk before this returns."""
        for u in step.usage:
            self.usage.add(u)
        for row in llm_call_rows(self.id, self.task, node.id, step.usage):  # the Ray store's rows, same function
            self.calls.append(row)
        self.calls.flush()
        self.attempts.append(attempt_row(self.id, self.task, node))
        best = tree.best()
        if best is not None and best is not self.best:
            self.best = best
            write_atomic(self.dir / "best_kernel.py", best.source)

    def close(self) -> None:
        """Write what is buffered, then compact the task's part files (one file per table)."""
        self.attempts.close()
        self.calls.close()
        compact_finished(self.dir, self.task)


def optimize(task: Task, client: LLMClient, search_cfg: SearchConfig, agent_cfg: AgentConfig,
             eval_cfg: EvalConfig, out: str | Path | Location, reporter: Reporter | None = None,
             evaluator_factory: Callable[[Task, EvalConfig], Any] = make_evaluator,
             resume: str | Path | Location | None = None) -> RunSummary:
    """Run STARK on one task; with ``resume`` (a run directory of this task, made by either executor; ``out``
    is then its parent), continue its recorded search to ``search_cfg.budget``. Raises TaskError when the
    reference itself cannot be evaluated (before any new run directory exists); any later exception (Ctrl-C
    included) propagates after the run directory is complete."""
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    reporter.phase(f"starting the {eval_cfg.backend} evaluator, then timing the reference")
    with evaluator_factory(task, eval_cfg.hiding(out)) as evaluator:  # generated code never sees the run's files
        reference = evaluator.reference()  # validates the task: TaskError when its forward fails
        if resume is None:
            tree = Tree.with_reference(task.source, reference)
            run = Run.new(out, task, tree, run_record([task], search_cfg, agent_cfg, eval_cfg, EXECUTOR))
        else:
            run_dir = locate(resume)
            record_changes(run_dir, search_cfg)  # a raised budget: the next resume keeps it
            tree = load_trees(run_dir).get(task.name) or Tree.with_reference(task.source, reference)
            run = Run(run_dir, task, tree, recorded_usage(run_dir)[task.name])
        info = TaskInfo(name=task.name, reference_source=task.source, backend=eval_cfg.backend,
                        hardware=evaluator.hardware_description(), device=evaluator.device_kind(),
                        light=reference_lines(tree.nodes[0].result, eval_cfg))
        policy = make_policy(search_cfg)
        team = make_team(client, agent_cfg, search_cfg, info)

        def on_attempt(node: Node, step: AgentResult) -> None:
            run.record(node, step, tree)
            reporter.attempt(node, step, tree, run.usage)

        status = STATUS_FAILED
        final: Runoff | None = None
        reporter.start(task, search_cfg.budget, tree)
        try:
            search(tree, policy, team, evaluator.evaluate, search_cfg.budget, search_cfg.seed, on_attempt,
                   search_cfg.stop_at_sol)
            status = STATUS_FINISHED  # the search's; its runoff, after it, can only name the best
            if contenders(tree, search_cfg.runoff):
                reporter.phase(f"runoff: the top {len(contenders(tree, search_cfg.runoff))} evaluated again side "
                               "by side")
                try:
                    final = runoff(tree, search_cfg.runoff, lambda sources: [evaluator.evaluate(s) for s in sources])
                except Exception as e:  # the evaluator's failure, not a candidate's: the search's best stands
                    final = Runoff([], None, f"the evaluator failed: {type(e).__name__}: {e}"[:300])
        except KeyboardInterrupt:
            if status == STATUS_FINISHED:  # stopped in the runoff: the search stays finished, its best stands
                final = Runoff([], None, "interrupted (Ctrl-C)")
            else:
                status = STATUS_INTERRUPTED
            raise
        finally:
            run.close()
            summary = task_summary(task, tree, run.dir, run.id, status, time.monotonic() - t0, search_cfg,
                                   agent_cfg, eval_cfg, run.usage, EXECUTOR, final)
            write_task_end(run.dir, tree, summary)
            reporter.finish(summary)
    return summary
