"""The Ray executor: the driver of a run whose state lives in actors.

One TreeMemory actor owns every task's tree and policy; agent calls are stateless calls to a few threaded
AgentWorker actors; one Evaluator actor per GPU (or one on the CPU) evaluates. The driver only moves work along:
it asks the memory for expansions, launches their agent calls, sends each candidate to an evaluator
(:mod:`stark_ray.run.dispatch`: a task's reference is timed on its home evaluator; its candidates go to whichever
evaluator of the home's device class has room, each timed against the reference on its own device), and hands
results back (``add_next``: the attempt, and in the same round trip the work that takes its place) — never
waiting on one call: whatever finishes first is handled (``ray.wait``), with a cap on the work in flight.

An evaluator that dies costs what :mod:`stark_ray.run.evaluator_deaths` decides; the driver carries it out. The
live view gets the run's status twice a second, and once a second what each expansion in flight is doing.

A run directory holds ``run.json`` (settings and task sources, for ``--resume``), the memory's Parquet rows, and
each task's ``summary.json`` and ``best_kernel.py`` (:mod:`stark_ray.run.mirror`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayError, RayTaskError

from stark_ray.actors.tree_memory import TaskSpec
from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.eval.backends import get_backend
from stark_ray.eval.measure.memory import OverBudget
from stark_ray.eval.tasks import Task, TaskError
from stark_ray.llm.base import LLMError
from stark_ray.prompts.terms import reference_lines
from stark_ray.records import STAGE_CRASH, EvalResult, source_digest
from stark_ray.run import evaluator_deaths
from stark_ray.run.campaign import CapTracker
from stark_ray.run.directory import RunError, new_run_dir, recorded_usage, run_record, task_summary, write_run_file
from stark_ray.run.dispatch import EvalDispatch
from stark_ray.run.evaluator_deaths import EvaluatorDeaths, Verdict
from stark_ray.run.in_flight import InFlightCap
from stark_ray.run.mirror import RunMirror
from stark_ray.run.placement import (
    STATUS_CAPPED,
    RayRun,
    checked_get,
    connect,
    disconnect,
    one_line,
    recorded_tasks,
    start_agents,
    start_evaluators,
    start_memory,
    stop_actors,
)
from stark_ray.run.reporter import AGENT_WORDS, InFlight, Reporter
from stark_ray.run.resume import record_changes
from stark_ray.run.room import Room
from stark_ray.run.summary import STATUS_FAILED, STATUS_FINISHED, STATUS_INTERRUPTED, RunSummary
from stark_ray.run.work import ADD, AGENT, BACK, EVAL, NEXT, Expansion, Work, ticket_of
from stark_ray.search.memory import Ticket, no_candidate
from stark_ray.search.runoff import Runoff, sitting
from stark_ray.search.tree import Tree
from stark_ray.store.compact import compact_ended, whole_run_compacted
from stark_ray.store.location import Location, locate

log = logging.getLogger(__name__)
RUNOFF_WAIT_S = 3600.0  # the most a run's runoff waits for its evaluations (an evaluator lost with its node)
_UNSET: Any = object()  # a ref's value not fetched yet
EXECUTOR = "ray"  # as run.json and the summaries name it
EVAL_WINDOW = 2  # evaluations sent to one evaluator at a time (one on the device, the next one queued behind it)
ASK_EVERY_S = 0.2  # how often a dead evaluator is asked whether it is back
HOST_MEMORY = ("running low on memory", "NODE_OUT_OF_MEMORY", "memory monitor")  # Ray's words for its monitor's kill


def killed_by_host(e: BaseException) -> bool:
    """Whether Ray says its node's memory monitor killed the actor (an OutOfMemoryError, or an actor's death whose
    message gives that reason)."""
    return isinstance(e, OutOfMemoryError) or any(word in str(e) for word in HOST_MEMORY)


class RayDriver:
    """A run on Ray: :meth:`start` (evaluators, references, run directory, memory), :meth:`loop` (every expansion
    a generator, :meth:`_expansion`, moved along as its calls finish; evaluator deaths carried out by :meth:`_act`
    and :meth:`_mind_the_dead`, the live view by :meth:`_progress`), :meth:`finish` (the summaries), :meth:`close`.
    """

    def __init__(self, run: RayRun, reporter: Reporter, embedded: bool = False) -> None:
        self.run, self.reporter = run, reporter
        self.embedded = embedded  # a local Ray this run started: no autoscaler will add GPUs
        self.tasks: dict[str, Task] = {t.name: t for t in run.tasks}
        self.view = RunMirror(t.name for t in run.tasks)  # the trees as the memory acknowledged them
        self.pending: dict[Any, Work] = {}  # object ref -> what it is
        self.cap = InFlightCap(run.max_in_flight)  # expansions in flight at once: fixed, or derived as the run goes
        self.room = Room(self.cap)
        # which evaluator times which candidate; a backend that builds in the compile pool gets every candidate
        # at once (its builds overlap the device's work)
        self.dispatch: EvalDispatch[Work] = EvalDispatch(
            self.cap.ceiling if get_backend(run.eval.backend).precompile else EVAL_WINDOW)
        self.spend = CapTracker(run.caps)
        self.capped = self.spend.capped  # task -> why no new LLM calls are made for it
        self._caps_unchecked = True  # the caps are checked against what a resumed run spent before
        self._last_progress = 0.0  # when the status was last reported
        self._last_look = 0.0  # when the evaluators were last asked what their candidates go through
        self._looking: dict[Any, int] = {}  # activity() asked and not answered yet -> the evaluator
        self._steps: dict[int, dict[str, tuple[str, float]]] = {}  # each evaluator's last answer
        self.phases: dict[str, float] = {}  # seconds of each start phase (logged; benchmarks read them)
        self.agents = start_agents(run)  # now: they start (and import) while the evaluators and references do
        self.agent_load = [0] * len(self.agents)  # calls outstanding on each
        self.unwritten: str | None = None  # a summary the end of the run could not write (a full disk)
        self.deaths: EvaluatorDeaths[Work] = EvaluatorDeaths(lambda w: w.step.source if w.step else None)
        self.ask_at: dict[int, float] = {}  # a dead evaluator -> when to ask it ``where`` again
        self._nodes_asked = 0.0  # when Ray was last asked which nodes are alive
        # :meth:`start` sets the evaluators, the run directory (dir, run_id), infos and the memory: :meth:`close`,
        # which may follow a start that failed, reads them with getattr

    # -- the start: evaluators, references, run directory, memory --------------------------------------------
    def start(self) -> None:
        """Start the evaluators (each times its tasks' references as soon as its device worker is up) and the
        TreeMemory actor with every task's tree; make the run directory, or reopen the resumed one (what a resumed
        run spent before counts against its caps)."""
        run = self.run
        token = uuid.uuid4().hex[:6]  # a resumed run's actors must not collide with a dying driver's
        t0 = time.monotonic()
        self.evaluators: list[Any] = start_evaluators(run, self.embedded, token)  # the actors' handles
        self.cap.evaluators = len(self.evaluators)
        self.dispatch.place([t.name for t in run.tasks], len(self.evaluators))
        home = self.dispatch.home
        # every evaluator starts its device worker now, at once, and times its tasks' references as soon as that
        # is up. Every reference is checked before a run directory exists; a resumed run needs them only for tasks
        # whose tree has no row yet (killed before its reference was written)
        hardware_refs = [e.hardware.remote() for e in self.evaluators]
        recorded = set(recorded_tasks(run.resume)) if run.resume is not None else set()
        pending = {t.name: self.evaluators[home[t.name]].reference.remote(t) for t in run.tasks
                   if t.name not in recorded}
        self.reporter.phase(f"starting {len(self.evaluators)} {run.eval.backend} evaluator(s), then timing "
                            f"{len(pending)} reference(s)")
        hardware = checked_get(hardware_refs)  # EvaluatorError: this host cannot evaluate (one line)
        self.phases["evaluators_s"] = time.monotonic() - t0
        self.worker_starts: list[Any] = [h["start_phases"] for h in hardware]  # where each device worker's start went
        self.deaths.instances = {i: h.get("instance") for i, h in enumerate(hardware)}
        self.deaths.nodes = {i: h.get("node") for i, h in enumerate(hardware)}
        self.dispatch.share([h["class"] for h in hardware])
        specs = []
        self.infos: dict[str, TaskInfo] = {
            t.name: TaskInfo(name=t.name, reference_source=t.source, backend=run.eval.backend,
                             hardware=hardware[home[t.name]]["description"],
                             device=hardware[home[t.name]].get("device", "")) for t in run.tasks}
        skipped: list[str] = []
        for task in run.tasks:
            try:
                reference = checked_get(pending[task.name]) if task.name in pending else None
            except OverBudget as e:  # this device cannot evaluate it at this budget: a campaign goes on without it
                if len(run.tasks) == 1:
                    raise
                skipped.append(task.name)
                print(f"stark: skipped: {e}", file=sys.stderr, flush=True)
                continue
            specs.append(TaskSpec(self.infos[task.name], reference))
        if skipped:
            self.skip(skipped)
            run = self.run
        self.phases["references_s"] = time.monotonic() - t0 - self.phases["evaluators_s"]
        t1 = time.monotonic()
        if run.resume is not None:
            self.dir = locate(run.resume)
            record_changes(self.dir, run.search)  # a raised budget or another --parallel: the next resume keeps it
        else:
            base = run.tasks[0].name if len(run.tasks) == 1 else "campaign"
            out = locate(run.out)
            self.dir = new_run_dir(out, base) if run.run_id is None else out / run.run_id
            self.dir.mkdir()
            write_run_file(self.dir, run_record(run.tasks, run.search, run.agents, run.eval, EXECUTOR))
        self.run_id = self.dir.name
        self.view.dir = self.dir
        for agent in self.agents:  # their clients made while the memory actor starts (not in the first call)
            agent.warm.remote()
        self.memory = start_memory(run, self.dir, f"stark-memory-{self.run_id}-{token}", specs)
        snapshots = ray.get([self.memory.snapshot.remote(name) for name in self.tasks])
        recorded = recorded_usage(self.dir) if run.resume is not None else None  # all tasks' calls, one read
        for name, snapshot in zip(self.tasks, snapshots, strict=True):
            if recorded is not None:  # what the earlier part of the run spent counts against the caps
                spent = recorded[name]
                self.spend.add(name, spent.cost_usd, spent.input_tokens + spent.output_tokens)
                self.view.usage[name] = spent  # and in the summaries: this part's calls are added as they come
            tree = Tree.from_records(snapshot)
            self.infos[name] = replace(self.infos[name],  # its reference's figures, the tolerance
                                       light=reference_lines(tree.nodes[0].result, self.run.eval))
            self.view.load(name, tree)
            self.reporter.start(self.tasks[name], run.search.budget, tree)
        self.phases["memory_s"] = time.monotonic() - t1
        log.info("run %s started: %s; device workers: %s", self.run_id,
                 ", ".join(f"{k} {v:.2f}" for k, v in self.phases.items()), self.worker_starts)

    def skip(self, names: list[str]) -> None:
        """Go on without these tasks (their references do not fit the memory budget); none left is a TaskError."""
        kept = [t for t in self.run.tasks if t.name not in names]
        if not kept:
            raise TaskError(f"no task fits the memory budget ({len(names)} skipped)")
        self.run = replace(self.run, tasks=kept)
        self.tasks = {t.name: t for t in kept}
        self.view = RunMirror(t.name for t in kept)

    # -- the loop --------------------------------------------------------------------------------------------
    def loop(self) -> None:
        """Every agent call, evaluation, ``add_next`` and ``next_many`` is an object ref in ``pending``; whichever
        finished first goes to ``_done``, whose handler resumes the expansion that waits for it. How much work is
        asked of the memory, and when, is :mod:`stark_ray.run.room`'s to say."""
        while True:
            self._ask()
            self._mind_the_dead()
            idle = (all(w.kind == BACK for w in self.pending.values()) and not self.dispatch.queue
                    and not self.deaths.waiting)
            self._progress(final=idle)
            if idle:  # nothing left but restarted evaluators to hear from: no candidate waits for them
                return
            refs = list(self.pending)
            if not refs:  # every evaluator is restarting: only the next question to one of them is due
                time.sleep(ASK_EVERY_S)
                continue
            ready = ray.wait(refs, num_returns=len(refs), timeout=0)[0]  # all that have finished, or
            if not ready:
                ready = ray.wait(refs, num_returns=1, timeout=1.0)[0]  # the first to finish
            try:
                values: list[Any] = ray.get(ready)  # one call for all
            except Exception:  # one of them failed: each is fetched on its own, handled as its kind says
                values = [_UNSET] * len(ready)
            for ref, value in zip(ready, values, strict=True):
                self._done(ref, value)

    def _exclude(self) -> list[str] | None:
        """The tasks the memory must not hand out work for (capped: no new LLM calls), or None when that is
        every task."""
        if self._caps_unchecked:  # the spend a resumed run starts with
            self._caps_unchecked = False
            self.spend.check(self.tasks, self.tasks)
        return None if len(self.capped) == len(self.tasks) else sorted(self.capped)

    def _ask(self) -> None:
        """One ``next_many`` when the memory may hold work no request has offered yet, and there is room."""
        if (exclude := self._exclude()) is not None and (room := self.room.ask_next()):
            ref = self.memory.next_many.remote(room, exclude)
            self.pending[ref] = Work(NEXT, limit=room, ref=ref)

    def _launch(self, tickets: list[Ticket]) -> None:
        """Start an expansion for each ticket (one whose task was capped while the memory was asked goes back)."""
        for ticket in tickets:
            if ticket.task in self.capped:  # no new LLM call for it
                self.memory.release.remote(ticket)
                continue
            self.room.working += 1
            self._resume(self._expansion(ticket), None)

    def _expansion(self, ticket: Ticket) -> Expansion:
        """One expansion, as :func:`stark_ray.search.loop.search` runs it: the agent step, its candidate's
        evaluation, the attempt handed to the memory — each a call this generator yields (a :class:`Work`) and is
        resumed with the value of, once it has finished (``_resume``; a failure comes back as a failed step or
        result, see the handlers below). The memory selects the work that takes its place in the same round trip.
        """
        step: AgentResult = yield self._call_agent(ticket)
        result: EvalResult = (yield Work(EVAL, ticket, step)) if step.ok and step.source else no_candidate(step)
        self.room.working -= 1
        node, tickets = yield self._add_next(ticket, step, result)
        if node is not None:  # None: its parent was lost with a memory restart: the work is redone
            self.view.attach(ticket.task, node, step)
            self.reporter.attempt(node, step, self.view.trees[ticket.task], self.view.usage[ticket.task])
        self._launch(tickets)

    def _resume(self, expansion: Expansion | None, value: Any) -> None:
        """Resume ``expansion`` with ``value`` (a new one: None); what it waits for next is sent (an evaluation:
        queued for an evaluator with room)."""
        assert expansion is not None
        try:
            awaited = expansion.send(value)
        except StopIteration:
            return
        awaited.expansion = expansion
        if awaited.kind == EVAL:
            self.dispatch.put(ticket_of(awaited).task, awaited)
            self._send_evaluations()
        else:
            self.pending[awaited.ref] = awaited

    def _call_agent(self, ticket: Ticket) -> Work:
        which = min(range(len(self.agents)), key=self.agent_load.__getitem__)  # the least busy worker
        self.agent_load[which] += 1
        return Work(AGENT, ticket, which=which, ref=self.agents[which].run.remote(ticket.request,
                                                                                  self.infos[ticket.task]))

    def _add_next(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> Work:
        """Hand an attempt to the memory, asking in the same call for the work that may take its place."""
        exclude = self._exclude()
        limit = self.room.ask_add(exclude is not None)
        return Work(ADD, ticket, step, limit=limit,
                    ref=self.memory.add_next.remote(ticket.slim(), step, result, limit, exclude or []))

    def _done(self, ref: Any, value: Any = _UNSET) -> None:
        """``ref`` has finished (``value``: what it holds, when already fetched): its kind's handler takes it."""
        work = self.pending.pop(ref)
        handler = {AGENT: self._agent_done, EVAL: self._eval_done, BACK: self._restart_done, ADD: self._add_done,
                   NEXT: self._next_done}[work.kind]
        handler(work, lambda: ray.get(ref) if value is _UNSET else value)

    def _agent_done(self, work: Work, fetch: Callable[[], Any]) -> None:
        """An agent step came back (a failed call: a step without a candidate); its calls count against the caps
        before any further work is asked for."""
        task = ticket_of(work).task
        self.agent_load[work.which] -= 1
        self.cap.agent_done(time.monotonic() - work.since)
        try:
            step: AgentResult = fetch()
        except RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, LLMError) and cause.fatal:
                raise LLMError(str(cause), cause.kind) from None  # every further call would fail alike
            step = AgentResult(None, error=f"the agent task failed: {one_line(e)}")
        except RayError as e:
            step = AgentResult(None, error=f"the agent task failed: {one_line(e)}")
        self.spend.add(task, sum(u.cost_usd for u in step.usage), sum(u.input_tokens + u.output_tokens
                                                                       for u in step.usage))
        self.spend.check([task], self.tasks)
        self._resume(work.expansion, step)

    def _eval_done(self, work: Work, fetch: Callable[[], Any]) -> None:
        """An evaluation came back (its evaluator dead: the deaths decide what becomes of the candidate)."""
        self.dispatch.done(work.which)
        self._send_evaluations()
        try:
            result = fetch()
        except (RayActorError, OutOfMemoryError) as e:  # its evaluator died: the restarted one says whom of its
            # orphans to charge; none where the host's memory monitor killed it
            self._act(work.which, self.deaths.lost(work.which, work, time.monotonic(), host=killed_by_host(e)))
            return
        except RayError as e:
            result = EvalResult.failed(STAGE_CRASH, f"evaluation failed: {one_line(e)}")
        if work.deaths:  # the row keeps what the machine did to it
            result.add_line(f"evaluated again: its evaluator died {work.deaths} time(s) while it was in flight"
                            + (f", {work.host_kills} of them killed by the host's memory monitor (the host's memory, "
                               "not this candidate's)" if work.host_kills else ""))
        self.cap.evaluated(result.eval_s)
        self._resume(work.expansion, result)

    def _restart_done(self, work: Work, fetch: Callable[[], Any]) -> None:
        """A dead evaluator answered ``where`` (or not yet): the deaths decide what its orphans become."""
        try:
            where = fetch()
        except RayActorError:  # asked before Ray knew it had died, or still restarting
            where = None
        answer = (where if isinstance(where, dict) else {}) if where is not None else None
        self._act(work.which, self.deaths.answered(work.which, answer, time.monotonic()))

    def _add_done(self, work: Work, fetch: Callable[[], Any]) -> None:
        """The memory attached an attempt and selected the work that takes its place."""
        try:
            node, tickets = fetch()
        except RayTaskError as e:  # the store failed past the memory's retries: stop, nothing acknowledged lost
            if not isinstance(getattr(e, "cause", None), OSError):
                raise
            raise RunError(f"the run's rows could not be written ({one_line(e.cause)}); every attempt "
                           f"acknowledged so far is recorded: continue with --resume {self.dir}") from None
        self.room.came_back(work.limit, len(tickets), next_many=False)
        self._resume(work.expansion, (node, tickets))

    def _next_done(self, work: Work, fetch: Callable[[], Any]) -> None:
        """The memory's answer to ``next_many``: launch what it selected."""
        tickets = fetch()
        self.room.came_back(work.limit, len(tickets), next_many=True)
        self._launch(tickets)

    def _send_evaluations(self) -> None:
        """The candidates an evaluator has room for now (:mod:`stark_ray.run.dispatch`); the rest wait their turn."""
        for which, work in self.dispatch.ready():
            assert work.step is not None and work.step.source is not None
            work.ref = self.evaluators[which].evaluate.remote(self.tasks[ticket_of(work).task], work.step.source)
            work.which, work.instance, work.since = which, self.deaths.instances.get(which), time.monotonic()
            self.pending[work.ref] = work

    def _alive_nodes(self) -> set[str]:
        return {str(n.get("NodeID")) for n in ray.nodes() if n.get("Alive")}

    def _await_restart(self, which: int) -> None:
        self.pending[self.evaluators[which].where.remote()] = Work(BACK, which=which)

    # -- evaluator deaths: what evaluator_deaths decides, carried out ----------------------------------------
    def _act(self, which: int, verdict: Verdict[Work]) -> None:
        """Carry out what :mod:`stark_ray.run.evaluator_deaths` decided about evaluator ``which``: pause it and ask
        it again, charge a candidate, send candidates again, give it up."""
        if verdict.gone:
            self.cap.evaluators = len(self.evaluators) - len(self.deaths.gone)
            left = [t for t in self.tasks if not set(self.dispatch.peers[t]) - self.deaths.gone
                    and t not in self.capped and self.view.trees[t].evaluated < self.run.search.budget]
            if left:
                raise RunError(f"evaluator {which} died and did not come back within "
                               f"{evaluator_deaths.RESTART_WAIT_S:.0f} s, and no evaluator is left for "
                               f"{len(left)} task(s) ({left[0]}, ...); every attempt acknowledged is recorded: "
                               f"continue with --resume {self.dir}")
            log.warning("evaluator %d died and did not come back: the run goes on without it", which)
        if verdict.pause:
            self.dispatch.pause(which)
            self._await_restart(which)
        if verdict.ask_again:
            self.ask_at[which] = time.monotonic() + ASK_EVERY_S
        for work in verdict.charge:
            host = (f"; {work.host_kills} of its {work.deaths} deaths were the host's memory monitor"
                    if work.host_kills else "")
            self._resume(work.expansion, EvalResult.failed(
                STAGE_CRASH, "the evaluator actor died while evaluating this candidate (it is restarted; this "
                f"candidate is not run again{host})"))
        for work in verdict.resend:
            assert work.ticket is not None
            self.dispatch.put(work.ticket.task, work)
        if verdict.resume:
            log.info("evaluator %d answers again", which)
            self.dispatch.resume(which)
        if verdict.resend or verdict.resume:
            self._send_evaluations()

    def _mind_the_dead(self) -> None:
        """Ask the dead evaluators whose next question is due; send the orphans of those that have not come back
        for a while to their peers (:mod:`stark_ray.run.evaluator_deaths`)."""
        if not self.deaths.dead:
            return
        now = time.monotonic()
        for which in [w for w, at in self.ask_at.items() if at <= now]:
            del self.ask_at[which]
            self._await_restart(which)
        if not self.deaths.late(now) or now - self._nodes_asked < 1.0:
            return
        self._nodes_asked = now  # Ray's GCS is asked at most once a second which nodes are alive
        for which, verdict in self.deaths.overdue(now, self._alive_nodes()).items():
            log.warning("evaluator %d has not come back for %.0f s and its node is gone: its %d candidate(s) go to "
                        "the others", which, evaluator_deaths.MOVE_AFTER_S, len(verdict.resend) + len(verdict.charge))
            self._act(which, verdict)

    # -- the live view ---------------------------------------------------------------------------------------
    def _progress(self, final: bool = False) -> None:
        """The run's status to the reporter, twice a second (``final``: now), and once a second what each
        expansion in flight is doing (:meth:`_in_flight`) when the reporter shows it."""
        now = time.monotonic()
        if now - self._last_progress < 0.5 and not final:
            return
        self._last_progress = now
        if getattr(self.reporter, "shows_expansions", False) and now - self._last_look >= 1.0:
            self._last_look = now
            self.reporter.expansions(self._in_flight(now))
        report = getattr(self.reporter, "status", None)
        if report is None:
            return
        running = {w.ticket.task for w in self.pending.values() if w.ticket is not None}
        running |= {task for task, _ in self.dispatch.queue}
        report({
            **self.view.status(running, self.run.search.budget, set(self.capped)),
            "cost": self.spend.total.cost, "tokens": self.spend.total.tokens,
            "evaluators": len(self.evaluators),
            "evaluating": self.dispatch.running, "waiting": len(self.dispatch.queue),
            "busy": sum(1 for load in self.dispatch.load if load), "in_flight_cap": self.cap.value,
            "capped": dict(self.capped),
        })

    def _in_flight(self, now: float) -> list[InFlight]:
        """What each expansion in flight is doing: its agent call, its wait for an evaluator, or its evaluation's
        step as its evaluator last said. The evaluators are asked without waiting: an answer is used once it has
        come (a busy host answers late; the driver never blocks on it)."""
        answered = ray.wait(list(self._looking), num_returns=len(self._looking), timeout=0)[0] if self._looking else []
        for ref in answered:
            which = self._looking.pop(ref)
            with contextlib.suppress(RayError):
                self._steps[which] = ray.get(ref)
        busy = {w.which for w in self.pending.values() if w.kind == EVAL}
        for which in busy - set(self._looking.values()):
            self._looking[self.evaluators[which].activity.remote()] = which
        steps = {key: step for which in busy for key, step in self._steps.get(which, {}).items()}
        out = []
        for w in self.pending.values():
            if w.ticket is None or w.kind not in (AGENT, EVAL):
                continue
            if w.kind == AGENT:
                out.append(InFlight(w.ticket.task, w.ticket.parent, AGENT_WORDS.get(w.ticket.request.agent, "agent"),
                                    now - w.since))
            else:
                doing, seconds = steps.get(source_digest(w.step.source if w.step else ""), ("evaluating",
                                                                                            now - w.since))
                out.append(InFlight(w.ticket.task, w.ticket.parent, doing, seconds))
        out += [InFlight(task, w.ticket.parent, "waiting for an evaluator", now - w.since)
                for task, w in self.dispatch.queue if w.ticket is not None]
        return out

    # -- end -------------------------------------------------------------------------------------------------
    def finish(self, status: str, wall_s: float) -> list[RunSummary]:
        summaries = []
        t0 = time.monotonic()
        snapshots = {name: self.memory.snapshot.remote(name) for name in self.tasks}  # asked all at once
        usage = self.view.usage  # the calls this driver saw, and a resumed run's earlier ones (read at its start)
        trees: dict[str, Tree] = {}
        for name in self.tasks:
            try:
                trees[name] = Tree.from_records(ray.get(snapshots[name]))
            except RayError:
                trees[name] = self.view.trees[name]
        finals: dict[str, Runoff] = {}
        stopped: KeyboardInterrupt | None = None
        if status == STATUS_FINISHED:
            try:
                finals = self._runoffs(trees)
            except KeyboardInterrupt as e:  # the summaries first, the search's best standing; then it goes on up
                stopped = e
                finals = {name: Runoff([], None, "interrupted (Ctrl-C)") for name in trees}
            except Exception as e:  # a bug or a stand-in's answer: no summary may be lost to the runoff
                log.exception("the runoff failed: every task's search best stands")
                finals = {name: Runoff([], None, f"the runoff failed: {one_line(e)}") for name in trees}
        for name, task in self.tasks.items():
            tree = trees[name]
            capped = status == STATUS_FINISHED and name in self.capped and tree.evaluated < self.run.search.budget
            summary = task_summary(task, tree, self.dir, self.run_id, STATUS_CAPPED if capped else status, wall_s,
                                   self.run.search, self.run.agents, self.run.eval, usage[name], EXECUTOR,
                                   finals.get(name))
            if capped:
                summary.settings["stopped_by"] = self.capped[name]
            try:
                self.view.write_summary(name, tree, summary)
            except OSError as e:  # said once the run has ended (it must not hide why the run stopped)
                self.unwritten = self.unwritten or f"{name}'s summary could not be written ({one_line(e)})"
            self.reporter.finish(summary)
            summaries.append(summary)
        self.phases["finish_s"] = time.monotonic() - t0
        if stopped is not None:
            raise stopped
        return summaries

    def _runoffs(self, trees: dict[str, Tree]) -> dict[str, Runoff]:
        """Every task's runoff (search/runoff.py), the tasks at once: each task's evaluations one after another, in
        the sitting's order, on the evaluator its task was placed on; an evaluator lost meanwhile leaves its tasks'
        search best standing, said."""
        sittings = {name: s for name, tree in trees.items() if (s := sitting(tree, self.run.search.runoff))}
        if not sittings:
            return {}
        self.reporter.phase(f"runoff: the top candidates of {len(sittings)} task(s) evaluated again side by side")
        results: dict[str, list[EvalResult]] = {name: [] for name in sittings}
        lost: dict[str, str] = {}
        in_flight: dict[Any, str] = {}

        def send(name: str) -> None:
            live = [w for w in self.dispatch.peers[name] if w not in self.deaths.gone and w not in self.deaths.dead]
            if not live:
                lost[name] = "no evaluator of its task is alive"
                return
            source = sittings[name].sources[len(results[name])]
            in_flight[self.evaluators[live[0]].evaluate.remote(self.tasks[name], source)] = name

        for name in sittings:
            send(name)
        deadline = time.monotonic() + RUNOFF_WAIT_S
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:  # an evaluator that does not answer (restarting on a node that is gone): given up
                for ref, name in in_flight.items():
                    lost[name] = f"no answer within {RUNOFF_WAIT_S:.0f} s"
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)
                break
            [ref] = ready
            name = in_flight.pop(ref)
            try:
                results[name].append(ray.get(ref))
            except RayError as e:  # the machine's failure: no candidate is judged by it
                lost[name] = f"its evaluator failed: {one_line(e)}"
                log.warning("%s: runoff not held: %s", name, one_line(e))
                continue
            if len(results[name]) < len(sittings[name].order):
                send(name)
        return {name: Runoff([], None, lost[name]) if name in lost else s.decide(results[name])
                for name, s in sittings.items()}

    def close(self) -> None:
        for ref, work in list(self.pending.items()):  # stopped early: the agent calls are not waited for
            if work.kind == AGENT:
                with contextlib.suppress(RayError, TypeError, ValueError):
                    ray.cancel(ref)
        t0 = time.monotonic()
        stop_actors(self.agents, [*getattr(self, "evaluators", []), getattr(self, "memory", None)])
        self.phases["close_s"] = time.monotonic() - t0
        if getattr(self, "dir", None) is not None and whole_run_compacted(len(self.tasks)):  # a few files in all
            compact_ended(self.dir)
        log.info("run %s ended: finish_s %.2f, close_s %.2f", getattr(self, "run_id", "?"),
                 self.phases.get("finish_s", 0.0), self.phases["close_s"])


def run_ray(run: RayRun, reporter: Reporter | None = None,
            on_started: Callable[[Location], None] | None = None) -> list[RunSummary]:
    """Run (or resume) a search on Ray. Raises TaskError before any run directory exists when a reference
    cannot be evaluated, RunError for a bad resume; after that, every exit (Ctrl-C included) leaves the run
    directory complete: rows, summary.json, best_kernel.py."""
    reporter = reporter or Reporter()
    on_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    reporter.phase("starting a private local Ray" if run.address is None else f"joining the Ray cluster {run.address}")
    started = connect(run.address, run.runtime_env)
    if callable(on_term):  # Ray's core installs its own SIGTERM handler (it aborts): the caller's comes back
        signal.signal(signal.SIGTERM, on_term)
    try:
        driver = RayDriver(run, reporter, embedded=started)
    except BaseException:
        if started:
            disconnect()
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
        if driver.unwritten:
            raise RunError(f"{driver.unwritten}; every attempt is recorded: write it again with --resume {driver.dir}")
        return summaries
    finally:
        try:
            driver.close()
        finally:
            closing = getattr(reporter, "close", None)
            if callable(closing):
                closing()
            if started:
                disconnect()
