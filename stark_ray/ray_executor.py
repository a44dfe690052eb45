"""The Ray executor: the driver of a run whose state lives in actors.

One TreeMemory actor owns every task's tree and policy; agent calls are stateless calls to a few threaded
AgentWorker actors; one Evaluator actor per GPU (or one on the CPU) evaluates. The driver only moves work along:
it asks the memory for expansions, launches their agent calls, sends each candidate to its task's evaluator
(tasks are spread round-robin over the evaluators; a task's reference is timed on the same GPU as its
candidates), and hands results back (``add_next``: the attempt, and in the same round trip the work that takes
its place) — never waiting on one call: whatever finishes first is handled (``ray.wait``), with a cap on the
work in flight.

A run directory holds ``run.json`` (settings and task sources, enough for ``--resume``), the Parquet rows the
memory writes, and, when the run ends, ``summary.json`` and ``best_kernel.py`` for each task (one task: at
the top; several: under ``tasks/<name>/``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from stark_ray.actors.evaluator import EvaluatorActor, evaluator_options
from stark_ray.actors.tree_memory import TaskSpec, TreeMemoryActor
from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.campaign import CapTracker
from stark_ray.eval.service import EvaluatorError
from stark_ray.eval.tasks import TaskError
from stark_ray.llm.base import LLMError
from stark_ray.llm.usage import UsageTotals
from stark_ray.optimize import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_INTERRUPTED,
    Reporter,
    RunSummary,
    new_run_dir,
    write_atomic,
)
from stark_ray.ray_run import (
    STATUS_CAPPED,
    RayRun,
    connect,
    default_evaluators,
    one_line,
    recorded_tasks,
)
from stark_ray.records import STAGE_CRASH, EvalResult, Node
from stark_ray.run_files import (
    RUN_FILE,
    RunError,
    recorded_usage,
    run_record,
    task_summary,
)
from stark_ray.search.memory import Ticket, no_candidate
from stark_ray.search.tree import Tree
from stark_ray.tasks.agents import AGENT_CPUS, AGENT_WORKERS, agent_pool

log = logging.getLogger(__name__)
_AGENT, _EVAL, _ADD, _NEXT = "agent", "eval", "add", "next"
_UNSET: Any = object()  # a ref's value not fetched yet


@dataclass
class _Work:
    """What an object ref the driver waits on stands for."""

    kind: str  # _AGENT | _EVAL | _ADD (memory.add_next) | _NEXT (memory.next_many)
    ticket: Ticket | None = None  # the expansion (agent, eval, add)
    step: AgentResult | None = None  # its agent step (eval, add)
    which: int = -1  # the agent worker (agent) or the evaluator (eval)
    limit: int = 0  # tickets asked for (add, next): room kept for them until they come back


class _Driver:
    def __init__(self, run: RayRun, reporter: Reporter, embedded: bool = False) -> None:
        self.run, self.reporter = run, reporter
        self.embedded = embedded  # a local Ray this run started: no autoscaler will add GPUs
        self.tasks = {t.name: t for t in run.tasks}
        self.usage: dict[str, UsageTotals] = {t.name: UsageTotals() for t in run.tasks}
        self.mirror: dict[str, Tree] = {}
        self.best: dict[str, int | None] = {}
        self.pending: dict[Any, _Work] = {}  # object ref -> what it is
        self.working = 0  # tickets with an agent call or an evaluation outstanding
        self.reserved = 0  # tickets asked of the memory (add_next, next_many) and not come back yet
        self.dirty = True  # the memory may hold work that no request has offered: ask with next_many
        self.asking = False  # a next_many is outstanding (at most one)
        self.orphans: dict[str, dict[int, list[Node]]] = {}  # task -> parent -> nodes waiting for it (mirror)
        self.home: dict[str, int] = {}  # task -> its evaluator (round-robin over the tasks)
        self.spend = CapTracker(run.caps)
        self.capped: dict[str, str] = {}  # task -> why no new LLM calls are made for it
        self._caps_unchecked = True  # the caps are checked against what a resumed run spent before
        self._last_progress = 0.0
        self.phases: dict[str, float] = {}  # seconds of each start phase (logged; benchmarks read them)
        self.agents: list[Any] = []  # the AgentWorker actors
        self.agent_load: list[int] = []  # calls outstanding on each
        self._start_agents()  # now: their processes start (and import) while the evaluators and references do

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        run = self.run
        cls = run.evaluator_cls or EvaluatorActor
        n = run.evaluators or default_evaluators(run.eval)
        opts = evaluator_options(run.eval)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if self.embedded and opts.get("num_gpus") and n > gpus:  # else the actors would wait forever
            raise RunError(f"{n} evaluators need {n} GPUs and this machine has {gpus}")
        cpus = float(ray.cluster_resources().get("CPU", 0))
        if opts.get("num_cpus") and cpus - n * opts["num_cpus"] < AGENT_CPUS:  # a 1-CPU machine: leave agents room
            opts["num_cpus"] = max(0.0, (cpus - AGENT_CPUS) / n)
        token = uuid.uuid4().hex[:6]  # a resumed run's actors must not collide with a dying driver's
        t0 = time.monotonic()
        self.evaluators = [cls.options(name=f"stark-eval-{token}-{i}", **opts).remote(run.eval) for i in range(n)]
        # every evaluator starts its device worker now, at once (the first one's answer describes the hardware)
        hardware = ray.get([e.hardware_description.remote() for e in self.evaluators])[0]
        self.phases["evaluators_s"] = time.monotonic() - t0
        specs = []
        self.infos: dict[str, TaskInfo] = {}
        for task in run.tasks:
            self.infos[task.name] = TaskInfo(name=task.name, reference_source=task.source,
                                             backend=run.eval.backend, hardware=hardware)
            self.home[task.name] = len(self.home) % n  # its reference and its candidates: the same GPU
        # every reference is checked (all evaluators at once) before a run directory exists; a resumed run needs
        # them only for tasks whose tree has no row yet (killed before its reference was written)
        recorded = set(recorded_tasks(run.resume)) if run.resume is not None else set()
        pending = {t.name: self.evaluators[self.home[t.name]].reference.remote(t) for t in run.tasks
                   if t.name not in recorded}
        for task in run.tasks:
            reference = self._reference(pending[task.name]) if task.name in pending else None
            specs.append(TaskSpec(self.infos[task.name], reference))
        self.phases["references_s"] = time.monotonic() - t0 - self.phases["evaluators_s"]
        t1 = time.monotonic()
        if run.resume is not None:
            self.dir = run.resume
        else:
            base = run.tasks[0].name if len(run.tasks) == 1 else "campaign"
            self.dir = new_run_dir(run.out, base) if run.run_id is None else run.out / run.run_id
            self.dir.mkdir(parents=True, exist_ok=True)
            record = run_record(run.tasks, run.search, run.agents, run.eval)
            write_atomic(self.dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
        self.run_id = self.dir.name
        # on the driver's node: the run directory it writes is the driver's (a GPU worker may be scaled away)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.memory = TreeMemoryActor.options(name=f"stark-memory-{self.run_id}-{token}", max_restarts=-1,
                                              max_task_retries=-1, num_cpus=0, scheduling_strategy=here).remote(
            str(self.dir.parent), self.run_id, specs, run.search, run.agents)
        for name in self.tasks:
            if run.resume is not None:  # what the earlier part of the run spent counts against the caps
                recorded = recorded_usage(self.dir, name)
                self.spend.add(name, recorded.cost_usd, recorded.input_tokens + recorded.output_tokens)
            tree = Tree.from_records(ray.get(self.memory.snapshot.remote(name)))
            self.mirror[name] = tree
            best = tree.best()
            self.best[name] = best.id if best else None
            self.reporter.start(self.tasks[name], run.search.budget, tree.root)
        self.phases["memory_s"] = time.monotonic() - t1
        log.info("run %s started: %s", self.run_id, ", ".join(f"{k} {v:.2f}" for k, v in self.phases.items()))

    def _reference(self, ref: Any) -> EvalResult:
        try:
            return ray.get(ref)
        except RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, TaskError | EvaluatorError):
                raise type(cause)(str(cause)) from None  # one line, as the local executor says it
            raise

    # -- the loop --------------------------------------------------------------------------------------------
    # Nothing here blocks on one call: every agent call, evaluation, ``add`` and ``next_many`` is an object ref in
    # ``pending``, and the one ``ray.wait`` below hands whichever finished first to ``_done``. An ``add`` also asks
    # for new expansions (``add_next``: the memory selects right after attaching), so a finished attempt and the
    # work that replaces it take one round trip; a separate ``next_many`` (at most one outstanding) is sent only
    # when the memory may hold work that no request has offered yet (``dirty``).
    def loop(self) -> None:
        while True:
            self._ask()
            self._progress(final=not self.pending)
            if not self.pending:
                return
            refs = list(self.pending)
            ready = ray.wait(refs, num_returns=len(refs), timeout=0)[0]  # all that have finished, or
            if not ready:
                ready = ray.wait(refs, num_returns=1, timeout=1.0)[0]  # the first to finish
            try:
                values: list[Any] = ray.get(ready)  # one call for all
            except Exception:  # one of them failed: each is fetched on its own, handled as its kind says
                values = [_UNSET] * len(ready)
            for ref, value in zip(ready, values, strict=True):
                self._done(ref, value)

    def _start_agents(self) -> None:
        """The agent workers, on the driver's node: one per CPU the evaluators leave (at least one, at most
        AGENT_WORKERS), each taking its share of ``max_in_flight`` calls at once."""
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = max(1, min(AGENT_WORKERS, cpus - (self.run.evaluators or 1)))
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)  # the driver's
        self.agents = agent_pool(n, -(-self.run.max_in_flight // n), self.run.agents, self.run.search,
                                 self.run.client_factory, scheduling_strategy=here)
        self.agent_load = [0] * n

    def _progress(self, final: bool = False) -> None:
        now = time.monotonic()
        report = getattr(self.reporter, "status", None)
        if report is None or (now - self._last_progress < 0.5 and not final):
            return
        self._last_progress = now
        running = {w.ticket.task for w in self.pending.values() if w.ticket is not None}
        report({
            "tasks": len(self.tasks), "running": len(running),
            "done": sum(1 for n, tree in self.mirror.items() if n not in running and
                        (tree.evaluated >= self.run.search.budget or n in self.capped)),
            "attempts": sum(t.evaluated for t in self.mirror.values()),
            "correct": sum(1 for t in self.mirror.values() for n in t if n.correct and not n.is_root),
            "best": {n: b.result.speedup for n, t in self.mirror.items() if (b := t.best()) is not None},
            "cost": self.spend.total.cost, "tokens": self.spend.total.tokens,
            "evaluators": len(self.evaluators),
            "evaluating": sum(1 for w in self.pending.values() if w.kind == _EVAL),
            "capped": dict(self.capped),
        })

    def _room(self) -> int:
        """Expansions that may still be started: ``max_in_flight`` less the agent calls and evaluations
        outstanding and the tickets asked of the memory and not come back yet."""
        return self.run.max_in_flight - self.working - self.reserved

    def _exclude(self) -> list[str] | None:
        """The tasks the memory must not hand out work for (capped: no new LLM calls), or None when that is
        every task."""
        if self._caps_unchecked:  # the spend a resumed run starts with
            self._caps_unchecked = False
            self._spent(*self.tasks)
        return None if len(self.capped) == len(self.tasks) else sorted(self.capped)

    def _spent(self, *names: str) -> None:
        """``names`` have spent more: which caps are reached now (a campaign cap stops every task)."""
        if self.spend.campaign_reason():
            names = tuple(self.tasks)
        for name in names:
            if name not in self.capped and (reason := self.spend.task_reason(name)):
                self.capped[name] = reason

    def _ask(self) -> None:
        """One ``next_many`` when the memory may hold work no request has offered yet, and there is room."""
        room = self._room()
        if not self.dirty or self.asking or room <= 0 or (exclude := self._exclude()) is None:
            return
        ref = self.memory.next_many.remote(room, exclude)
        self.pending[ref] = _Work(_NEXT, limit=room)
        self.reserved += room
        self.asking, self.dirty = True, False

    def _launch(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            if ticket.task in self.capped:  # its cap was reached while the memory was asked: no new LLM call
                self.memory.release.remote(ticket)
                continue
            which = min(range(len(self.agents)), key=self.agent_load.__getitem__)  # the least busy worker
            ref = self.agents[which].run.remote(ticket.request, self._info(ticket.task))
            self.pending[ref] = _Work(_AGENT, ticket, which=which)
            self.agent_load[which] += 1
            self.working += 1

    def _info(self, name: str) -> TaskInfo:
        return self.infos[name]

    def _done(self, ref: Any, value: Any = _UNSET) -> None:
        """``ref`` has finished (``value``: what it holds, when already fetched)."""
        work = self.pending.pop(ref)
        if work.kind == _AGENT:
            assert work.ticket is not None
            self.agent_load[work.which] -= 1
            try:
                step: AgentResult = ray.get(ref) if value is _UNSET else value
            except RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, LLMError) and cause.fatal:
                    raise LLMError(str(cause), cause.kind) from None  # every further call would fail alike
                step = AgentResult(None, error=f"the agent task failed: {one_line(e)}")
            except RayError as e:
                step = AgentResult(None, error=f"the agent task failed: {one_line(e)}")
            # the calls are spent now: the caps see them before any further work is asked for
            self.spend.add(work.ticket.task, sum(u.cost_usd for u in step.usage),
                           sum(u.input_tokens + u.output_tokens for u in step.usage))
            self._spent(work.ticket.task)
            if step.ok and step.source:
                which = self.home[work.ticket.task]
                eref = self.evaluators[which].evaluate.remote(self.tasks[work.ticket.task], step.source)
                self.pending[eref] = _Work(_EVAL, work.ticket, step, which)
            else:
                self._add(work.ticket, step, no_candidate(step))
        elif work.kind == _EVAL:
            assert work.ticket is not None and work.step is not None
            try:
                result = ray.get(ref) if value is _UNSET else value
            except RayActorError:
                result = EvalResult.failed(STAGE_CRASH, "the evaluator actor died while evaluating this candidate "
                                           "(it is restarted; this candidate is not run again)")
            except RayError as e:
                result = EvalResult.failed(STAGE_CRASH, f"evaluation failed: {one_line(e)}")
            self._add(work.ticket, work.step, result)
        elif work.kind == _ADD:
            assert work.ticket is not None and work.step is not None
            node, tickets = ray.get(ref) if value is _UNSET else value
            self._came_back(work, tickets)
            if node is not None:  # None: its parent was lost with a memory restart: the work is redone
                self._attached(work.ticket.task, node, work.step)
            self._launch(tickets)
        else:
            self.asking = False
            tickets = ray.get(ref) if value is _UNSET else value
            self._came_back(work, tickets)
            self._launch(tickets)

    def _came_back(self, work: _Work, tickets: list[Ticket]) -> None:
        """The room kept for a request is free again; the memory may hold more work when the request got all
        it asked for, or selected nothing after its attach (asked for nothing)."""
        self.reserved -= work.limit
        if len(tickets) >= work.limit:
            self.dirty = True

    def _add(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> None:
        """Hand an attempt to the memory, asking in the same call for the work that may take its place."""
        self.working -= 1
        exclude = self._exclude()
        limit = max(0, self._room()) if exclude is not None else 0
        ref = self.memory.add_next.remote(ticket.slim(), step, result, limit, exclude or [])
        self.pending[ref] = _Work(_ADD, ticket, step, limit=limit)
        self.reserved += limit
        if limit > 0:
            self.dirty = False  # the memory selects after this attach: whatever was there is offered

    def _attached(self, name: str, node: Node, step: AgentResult) -> None:
        """A node the memory acknowledged (written): the driver's mirror, usage, best_kernel.py, the reporter."""
        tree = self.mirror[name]
        waiting = self.orphans.setdefault(name, {})
        attached: list[Node] = []
        if node.id not in tree.nodes and node.parent is not None:
            if node.parent in tree.nodes:
                todo = [node]
                while todo:  # with it, the nodes whose acknowledgement reached the driver before it
                    n = todo.pop()
                    if n.id not in tree.nodes:
                        tree._attach(replace(n, children=[]))
                        attached.append(tree[n.id])
                        todo += waiting.pop(n.id, [])
            else:  # its parent's acknowledgement has not been handled yet (one commit wrote both)
                waiting.setdefault(node.parent, []).append(node)
        usage = self.usage[name]
        for u in step.usage:
            usage.add(u)
        best_id = self.best[name]
        # the leaderboard's first: the best only changes when a node just attached beats it
        best = min((n for n in attached if n.correct), key=lambda n: (n.score, n.id), default=None)
        if best is not None and (best_id is None or (best.score, best.id) < (tree[best_id].score, best_id)):
            self.best[name] = best.id
            write_atomic(self._task_dir(name) / "best_kernel.py", best.source)
        self.reporter.attempt(node, step, tree, usage)

    def _task_dir(self, name: str) -> Path:
        d = self.dir if len(self.tasks) == 1 else self.dir / "tasks" / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- end -------------------------------------------------------------------------------------------------
    def finish(self, status: str, wall_s: float) -> list[RunSummary]:
        summaries = []
        for name, task in self.tasks.items():
            try:
                tree = Tree.from_records(ray.get(self.memory.snapshot.remote(name)))
            except RayError:
                tree = self.mirror[name]
            capped = status == STATUS_FINISHED and name in self.capped and tree.evaluated < self.run.search.budget
            summary = task_summary(task, tree, self.dir, self.run_id, STATUS_CAPPED if capped else status, wall_s,
                                   self.run.search, self.run.eval, self._usage_of(name))
            if capped:
                summary.settings["stopped_by"] = self.capped[name]
            write_atomic(self._task_dir(name) / "summary.json", json.dumps(asdict(summary), indent=2) + "\n")
            best = tree.best()
            if best is not None:
                write_atomic(self._task_dir(name) / "best_kernel.py", best.source)
            self.reporter.finish(summary)
            summaries.append(summary)
        return summaries

    def _usage_of(self, name: str) -> UsageTotals:
        """A fresh run's calls are the ones this driver saw; a resumed run's earlier ones are in the rows."""
        return recorded_usage(self.dir, name) if self.run.resume is not None else self.usage[name]

    def close(self) -> None:
        for ref, work in list(self.pending.items()):  # stopped early: the agent calls are not waited for
            if work.kind == _AGENT:
                with contextlib.suppress(RayError, TypeError, ValueError):
                    ray.cancel(ref)
        for agent in self.agents:  # their calls still running are dropped with them
            with contextlib.suppress(RayError, ValueError):
                ray.kill(agent, no_restart=True)
        for actor in [*getattr(self, "evaluators", []), getattr(self, "memory", None)]:
            if actor is None:
                continue
            with contextlib.suppress(RayError, TimeoutError):
                ray.get(actor.close.remote(), timeout=30)
            ray.kill(actor, no_restart=True)


def run_ray(run: RayRun, reporter: Reporter | None = None,
            on_started: Callable[[Path], None] | None = None) -> list[RunSummary]:
    """Run (or resume) a search on Ray. Raises TaskError before any run directory exists when a reference
    cannot be evaluated, RunError for a bad resume; after that, every exit (Ctrl-C included) leaves the run
    directory complete: rows, summary.json, best_kernel.py."""
    reporter = reporter or Reporter()
    on_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    started = connect(run.address, run.runtime_env)
    if callable(on_term):  # Ray's core installs its own SIGTERM handler (it aborts): the caller's comes back
        signal.signal(signal.SIGTERM, on_term)
    try:
        driver = _Driver(run, reporter, embedded=started)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    t0 = time.monotonic()
    try:
        driver.start()
        if on_started is not None:
            on_started(driver.dir)
        status = STATUS_FAILED
        try:
            driver.loop()
            status = STATUS_FINISHED
        except KeyboardInterrupt:
            status = STATUS_INTERRUPTED
            raise
        finally:
            summaries = driver.finish(status, time.monotonic() - t0)
        return summaries
    finally:
        driver.close()
        closing = getattr(reporter, "close", None)
        if callable(closing):
            closing()
        if started:
            ray.shutdown()
