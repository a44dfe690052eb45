"""The Ray executor: the driver of a run whose state lives in actors.

One TreeMemory actor owns every task's tree and policy; agent calls are stateless Ray tasks; one Evaluator actor
per GPU (or one on the CPU) evaluates. The driver only moves work along: it asks the memory for expansions
(``next``), launches their agent tasks, sends each candidate to its task's evaluator (tasks are spread
round-robin over the evaluators; a task's reference is timed on the same GPU as its candidates), and hands
results back (``add``) — handling whatever finishes first (``ray.wait``), with a cap on the work in flight.

A run directory holds ``run.json`` (settings and task sources, enough for ``--resume``), the Parquet rows the
memory writes, and, when the run ends, ``summary.json`` and ``best_kernel.py`` for each task (one task: at
the top; several: under ``tasks/<name>/``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from stark_ray.actors.evaluator import EvaluatorActor, evaluator_options
from stark_ray.actors.tree_memory import TaskSpec, TreeMemoryActor
from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.campaign import Caps, CapTracker
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.service import EvaluatorError
from stark_ray.eval.tasks import Task, TaskError
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
from stark_ray.store.read import StoreError, load_trees
from stark_ray.tasks.agents import AGENT_CPUS, ClientFactory, expand

log = logging.getLogger(__name__)
STATUS_CAPPED = "capped"  # stopped by a spending cap before its budget
MAX_IN_FLIGHT = 64  # agent calls plus evaluations outstanding at once, over all tasks


@dataclass
class RayRun:
    """What a Ray run is given (and what run.json keeps for a resume)."""

    tasks: list[Task]
    search: SearchConfig
    agents: AgentConfig
    eval: EvalConfig
    out: Path
    run_id: str | None = None  # default: <task>-<time>
    resume: Path | None = None  # an earlier run directory: continue it
    address: str | None = None  # None: an embedded local Ray; "auto" or "ray://...": join a cluster
    evaluators: int | None = None  # default: one per GPU of the cluster now (GPU backends), else one; more than
    # the cluster has wait for the autoscaler to add GPU nodes
    max_in_flight: int = MAX_IN_FLIGHT
    client_factory: ClientFactory | None = None  # scripted replies (tests, benchmarks)
    evaluator_cls: Any = None  # an actor class with reference/evaluate/hardware_description (benchmarks)
    runtime_env: dict[str, Any] | None = None  # for a Ray this run starts or joins
    caps: Caps = field(default_factory=Caps)  # spending limits (campaigns)
    extra: dict[str, Any] = field(default_factory=dict)


def _connect(address: str | None, runtime_env: dict[str, Any] | None = None) -> bool:
    """Join the cluster at ``address``, or start an embedded local Ray (no dashboard, sized to the machine);
    True when this call started it."""
    if ray.is_initialized():
        return False
    logging.getLogger("ray").setLevel(logging.ERROR)  # the CLI's stderr is for one clear line, not Ray's notes
    if address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env=runtime_env)
        return False
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env=runtime_env or _same_code_env())
    return True


def _same_code_env() -> dict[str, Any]:
    """Workers of an embedded Ray import this very stark_ray (not another install on the path)."""
    here = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


class _Driver:
    def __init__(self, run: RayRun, reporter: Reporter, embedded: bool = False) -> None:
        self.run, self.reporter = run, reporter
        self.embedded = embedded  # a local Ray this run started: no autoscaler will add GPUs
        self.tasks = {t.name: t for t in run.tasks}
        self.usage: dict[str, UsageTotals] = {t.name: UsageTotals() for t in run.tasks}
        self.mirror: dict[str, Tree] = {}
        self.best: dict[str, int | None] = {}
        self.pending: dict[Any, tuple[str, Ticket, AgentResult | None, int]] = {}
        self.home: dict[str, int] = {}  # task -> its evaluator (round-robin over the tasks)
        self.spend = CapTracker(run.caps)
        self.capped: dict[str, str] = {}  # task -> why no new LLM calls are made for it
        self._last_progress = 0.0
        self.phases: dict[str, float] = {}  # seconds of each start phase (logged; benchmarks read them)

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        run = self.run
        cls = run.evaluator_cls or EvaluatorActor
        n = run.evaluators or _default_evaluators(run.eval)
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
        recorded = set(_recorded_tasks(run.resume)) if run.resume is not None else set()
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
    def loop(self) -> None:
        while True:
            self._refill()
            self._progress(final=not self.pending)
            if not self.pending:
                return
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=1.0)
            for ref in ready:
                self._done(ref)

    def _progress(self, final: bool = False) -> None:
        now = time.monotonic()
        report = getattr(self.reporter, "status", None)
        if report is None or (now - self._last_progress < 0.5 and not final):
            return
        self._last_progress = now
        running = {t.task for _, t, _, _ in self.pending.values()}
        report({
            "tasks": len(self.tasks), "running": len(running),
            "done": sum(1 for n, tree in self.mirror.items() if n not in running and
                        (tree.evaluated >= self.run.search.budget or n in self.capped)),
            "attempts": sum(t.evaluated for t in self.mirror.values()),
            "correct": sum(1 for t in self.mirror.values() for n in t if n.correct and not n.is_root),
            "best": {n: b.result.speedup for n, t in self.mirror.items() if (b := t.best()) is not None},
            "cost": self.spend.total.cost, "tokens": self.spend.total.tokens,
            "evaluators": len(self.evaluators), "evaluating": sum(1 for k, *_ in self.pending.values() if k == "eval"),
            "capped": dict(self.capped),
        })

    def _refill(self) -> None:
        room = self.run.max_in_flight - len(self.pending)
        if room <= 0:
            return
        for name in self.tasks:
            reason = self.spend.task_reason(name)
            if reason and name not in self.capped:
                self.capped[name] = reason
        if len(self.capped) == len(self.tasks):
            return
        for ticket in ray.get(self.memory.next_many.remote(room, sorted(self.capped))):
            ref = expand.remote(ticket.request, self.run.agents, self.run.search, self._info(ticket.task),
                                self.run.client_factory)
            self.pending[ref] = ("agent", ticket, None, -1)

    def _info(self, name: str) -> TaskInfo:
        return self.infos[name]

    def _done(self, ref: Any) -> None:
        kind, ticket, step, which = self.pending.pop(ref)
        if kind == "agent":
            try:
                step = ray.get(ref)
            except RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, LLMError) and cause.fatal:
                    raise LLMError(str(cause), cause.kind) from None  # every further call would fail alike
                step = AgentResult(None, error=f"the agent task failed: {_one_line(e)}")
            except RayError as e:
                step = AgentResult(None, error=f"the agent task failed: {_one_line(e)}")
            if step.ok and step.source:
                which = self.home[ticket.task]
                eref = self.evaluators[which].evaluate.remote(self.tasks[ticket.task], step.source)
                self.pending[eref] = ("eval", ticket, step, which)
            else:
                self._add(ticket, step, no_candidate(step))
            return
        assert step is not None
        try:
            result = ray.get(ref)
        except RayActorError:
            result = EvalResult.failed(STAGE_CRASH, "the evaluator actor died while evaluating this candidate "
                                       "(it is restarted; this candidate is not run again)")
        except RayError as e:
            result = EvalResult.failed(STAGE_CRASH, f"evaluation failed: {_one_line(e)}")
        self._add(ticket, step, result)

    def _add(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> None:
        node: Node | None = ray.get(self.memory.add.remote(ticket, step, result))
        if node is None:
            return  # its parent was lost with a memory restart: the work is redone
        name = ticket.task
        tree = self.mirror[name]
        if node.id not in tree.nodes and node.parent in tree.nodes:
            tree._attach(replace(node, children=[]))
        usage = self.usage[name]
        for u in step.usage:
            usage.add(u)
        self.spend.add(name, sum(u.cost_usd for u in step.usage),
                       sum(u.input_tokens + u.output_tokens for u in step.usage))
        best = tree.best()
        if best is not None and best.id != self.best[name]:
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
        for ref, (kind, *_rest) in list(self.pending.items()):  # stopped early: the agent calls are not waited for
            if kind == "agent":
                with contextlib.suppress(RayError, TypeError, ValueError):
                    ray.cancel(ref)
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
    started = _connect(run.address, run.runtime_env)
    if callable(on_term):  # Ray's core installs its own SIGTERM handler (it aborts): the caller's comes back
        signal.signal(signal.SIGTERM, on_term)
    driver = _Driver(run, reporter, embedded=started)
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


def _recorded_tasks(run_dir: Path) -> list[str]:
    try:
        return list(load_trees(run_dir))
    except FileNotFoundError:
        return []
    except StoreError as e:
        raise RunError(f"{run_dir}: {e}") from None


def _default_evaluators(cfg: EvalConfig) -> int:
    if evaluator_options(cfg).get("num_gpus"):
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise RunError(f"backend {cfg.backend} needs a GPU and the Ray cluster has none")
        return gpus
    return 1


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]
