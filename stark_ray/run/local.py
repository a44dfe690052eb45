"""The local executor: one task, optimized in this process, no Ray (for tests and debugging).

It wires the core together — task, evaluator, LLM client, tree, policy, team — runs Algorithm 1, streams every
attempt and LLM call to Parquet, keeps ``best_kernel.py`` current, and writes ``summary.json``; an interrupted or
failed run still leaves both, with its status. Its run directory is the Ray executor's, file for file
(:mod:`stark_ray.run.directory`): ``run.json`` included, so it resumes (with either executor) and is analysed the
same way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.evaluator import make_evaluator
from stark_ray.eval.tasks import Task
from stark_ray.llm.base import LLMClient
from stark_ray.llm.usage import UsageTotals
from stark_ray.prompts.terms import reference_lines
from stark_ray.records import EvalResult, Node, attempt_schema, llm_call_schema, source_digest
from stark_ray.run.directory import (
    new_run_dir,
    recorded_usage,
    run_record,
    task_summary,
    write_atomic,
    write_run_file,
    write_task_end,
)
from stark_ray.run.reporter import AGENT_WORDS, InFlight, Reporter
from stark_ray.run.resume import record_changes
from stark_ray.run.summary import STATUS_FAILED, STATUS_FINISHED, STATUS_INTERRUPTED, RunSummary
from stark_ray.search.loop import search
from stark_ray.search.policy import make_policy
from stark_ray.search.runoff import Runoff, contenders, runoff
from stark_ray.search.team import Request, Team, make_team
from stark_ray.search.tree import Tree
from stark_ray.store.compact import compact_finished
from stark_ray.store.location import Location, locate
from stark_ray.store.parquet import PartWriter
from stark_ray.store.read import load_trees
from stark_ray.store.run_store import attempt_row, llm_call_rows

EXECUTOR = "local"  # as run.json and the summaries name it
LOOK_S = 1.0  # how often the live view is told what the expansion in flight is doing


class Ahead:
    """A call made in a thread of its own while the run goes on; :meth:`result` waits for it and raises what it
    raised (a daemon thread: an interrupted run does not wait for it)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name="stark-ahead", daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self._value = call()
        except BaseException as e:  # raised where the result is asked for
            self._error = e

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class Watch:
    """The search's team and evaluator, watched: what the one expansion in flight is doing (its agent call, its
    evaluation's step as the evaluator says) is told to a reporter that shows it, from a thread of its own, as the
    Ray driver tells it of each of its own."""

    def __init__(self, task: str, reporter: Reporter, team: Team, evaluator: Any) -> None:
        self.task, self.reporter, self.team, self.evaluator = task, reporter, team, evaluator
        self.now: tuple[int, str, float, str | None] | None = None  # parent, doing, since, the candidate's digest
        self.parent = 0
        self.first: Ahead | None = None  # what must be done before the first evaluation (a resumed run's reference)
        self.step: AgentResult | None = None  # the team's latest step
        self.unattached: AgentResult | None = None  # a step whose candidate got no verdict: its calls were made
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def request(self, tree: Tree, node: Node) -> Request:
        return self.team.request(tree, node)

    def run(self, request: Request) -> AgentResult:
        """The team's step for ``request``."""
        self.parent = request.node.id
        self.now = (request.node.id, AGENT_WORDS.get(request.agent, "agent"), time.monotonic(), None)
        try:
            self.step = self.team.run(request)
            return self.step
        finally:
            self.now = None

    def evaluate(self, source: str) -> EvalResult:
        """The evaluator's verdict on the candidate the last step wrote. Where none comes back (a task that no longer
        serves, the evaluator's failure, Ctrl-C), the step is left :attr:`unattached`: its calls were made."""
        try:
            if self.first is not None:
                self.now = (self.parent, "waiting for the reference to be timed again", time.monotonic(), None)
                self.first.result()
                self.first = None
            self.now = (self.parent, "evaluating", time.monotonic(), source_digest(source))
            return self.evaluator.evaluate(source)
        except BaseException:
            self.unattached = self.step
            raise
        finally:
            self.now = None

    def doing(self) -> list[InFlight]:
        now = self.now
        if now is None:
            return []
        parent, doing, since, digest = now
        seconds = time.monotonic() - since
        if digest is not None:
            with contextlib.suppress(Exception):  # the evaluator's word on its step, where it has one
                doing, seconds = self.evaluator.activity().get(digest, (doing, seconds))
        return [InFlight(self.task, parent, doing, seconds)]

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The reporter told about once a second while the search runs (nothing where it shows no expansions)."""
        if getattr(self.reporter, "shows_expansions", False):
            self._thread = threading.Thread(target=self._tell, name="stark-live-view", daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
                self.reporter.expansions([])

    def _tell(self) -> None:
        while not self._stop.wait(LOOK_S):
            self.reporter.expansions(self.doing())


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
        self.record_calls(node.id, step)
        self.attempts.append(attempt_row(self.id, self.task, node))
        best = tree.best()
        if best is not None and best is not self.best:
            self.best = best
            write_atomic(self.dir / "best_kernel.py", best.source)

    def record_calls(self, node_id: int, step: AgentResult) -> None:
        """A step's LLM calls, on disk before this returns, counted in what the run spent (``node_id``: the attempt
        they were made for; one the run ended before attaching keeps the id it would have had, as a Ray run's
        expansion in flight at a kill does)."""
        for u in step.usage:
            self.usage.add(u)
        for row in llm_call_rows(self.id, self.task, node_id, step.usage):  # the Ray store's rows, same function
            self.calls.append(row)
        self.calls.flush()

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
    reporter.phase(f"starting the {eval_cfg.backend} evaluator, then timing the reference" if resume is None else
                   f"starting the {eval_cfg.backend} evaluator and reading the recorded search (the reference is timed "
                   "again beside the first agent call)")
    with evaluator_factory(task, eval_cfg.hiding(out)) as evaluator:  # generated code never sees the run's files
        checked: Ahead | None = None
        if resume is None:
            reference = evaluator.reference()  # validates the task: TaskError when its forward fails
            tree = Tree.with_reference(task.source, reference)
            run = Run.new(out, task, tree, run_record([task], search_cfg, agent_cfg, eval_cfg, EXECUTOR))
        else:
            started = Ahead(evaluator.hardware_description)  # the evaluator starts while the record is read
            run_dir = locate(resume)
            record_changes(run_dir, search_cfg)  # a raised budget: the next resume keeps it
            recorded = load_trees(run_dir).get(task.name)
            started.result()
            if recorded is None:
                tree = Tree.with_reference(task.source, evaluator.reference())
            else:  # the prompts need only the recorded reference: the task is checked and its reference timed again
                # (the judge's figures stand on it) while the first agent call runs, before the first evaluation
                tree, checked = recorded, Ahead(evaluator.reference)
            run = Run(run_dir, task, tree, recorded_usage(run_dir)[task.name])
        info = TaskInfo(name=task.name, reference_source=task.source, backend=eval_cfg.backend,
                        hardware=evaluator.hardware_description(), device=evaluator.device_kind(),
                        light=reference_lines(tree.nodes[0].result, eval_cfg))
        policy = make_policy(search_cfg)
        watch = Watch(task.name, reporter, make_team(client, agent_cfg, search_cfg, info), evaluator)
        watch.first = checked

        def on_attempt(node: Node, step: AgentResult) -> None:
            run.record(node, step, tree)
            reporter.attempt(node, step, tree, run.usage)

        status = STATUS_FAILED
        final: Runoff | None = None
        reporter.start(task, search_cfg.budget, tree)
        try:
            with watch.running():
                search(tree, policy, watch, watch.evaluate, search_cfg.budget, search_cfg.seed, on_attempt,
                       search_cfg.stop_at_sol)
            if checked is not None:  # a search with nothing left to do still says a task that no longer serves
                checked.result()
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
            if watch.unattached is not None:
                run.record_calls(len(tree.nodes), watch.unattached)
            run.close()
            summary = task_summary(task, tree, run.dir, run.id, status, time.monotonic() - t0, search_cfg,
                                   agent_cfg, eval_cfg, run.usage, EXECUTOR, final)
            write_task_end(run.dir, tree, summary)
            reporter.finish(summary)
    return summary
