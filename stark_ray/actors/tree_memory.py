"""The TreeMemory actor: one per run, owning every task's tree and policy (a shell over search.memory).

Its state is rebuilt from the run's Parquet rows whenever it starts on a run directory that has some: after
a restart (``max_restarts``) and for ``--resume`` alike. Every attached node is written (attempts row and its
LLM calls) before ``add`` returns, so what a restart restores is everything it acknowledged.

Writes are group commits: an ``add`` attaches its node and buffers its rows at once, then waits for the next
commit, which first lets every call already queued on the actor's event loop run (so the adds of one burst
share it) and then writes all buffered rows in a thread (the event loop keeps serving calls meanwhile). An add
returns only after a commit that started after its rows were buffered has finished: acknowledged still means
written. Selection may meanwhile pick a node whose commit is still running; should the actor die before it is
written, a ticket cut from it is refused later (``UnknownParent``), as for any node lost with a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import ray

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.records import EvalResult, Node
from stark_ray.search.memory import Ticket, TreeMemory, UnknownParent, make_task_search
from stark_ray.search.tree import Tree
from stark_ray.store.compact import Compactor, whole_run_compacted
from stark_ray.store.location import Location
from stark_ray.store.read import load_trees
from stark_ray.store.run_store import RunStore


@dataclass(frozen=True)
class TaskSpec:
    """What the memory needs to open a task: its prompt facts and, for a new tree, the reference's result."""

    info: TaskInfo
    reference: EvalResult | None  # None: the tree must already be in the run directory (resume)


SPECS_FILE = "memory.json"  # in the run directory: what the actor is made from, read again at each restart


def write_specs(run_dir: Location, specs: list[TaskSpec]) -> None:
    """The tasks' specs where the memory actor reads them. Not constructor arguments: Ray keeps large arguments
    (hundreds of tasks) in its object store, where a restarted actor could not find them again."""
    data = [{"info": asdict(s.info), "reference": None if s.reference is None else asdict(s.reference)}
            for s in specs]
    run_dir.join(SPECS_FILE).write_text(json.dumps({"tasks": data}))


def read_specs(run_dir: Location) -> list[TaskSpec]:
    data = json.loads(run_dir.join(SPECS_FILE).read_text())["tasks"]
    return [TaskSpec(TaskInfo(**t["info"]), None if t["reference"] is None else EvalResult(**t["reference"]))
            for t in data]


FLUSH_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)  # 15.5 s of retries before the adds waiting for a flush fail
COMMIT_INTERVAL_S = 0.2  # a commit starts at least this long after the one before: the adds meanwhile share it
log = logging.getLogger(__name__)


class GroupCommit:
    """Calls of one event loop that share a ``flush``: :meth:`wait` returns once a flush that began after the
    call has finished (it raises what that flush raised). One flush runs at a time, in a thread (the event loop
    keeps serving calls meanwhile); the calls that arrive while it runs all wait for the next one, so the busier
    the actor, the more rows each flush writes. A flush that fails with an OSError is tried again after each of
    ``retry_delays``; the calls waiting for it fail only when the last try does. Commits start at least
    ``interval`` seconds apart, so a steady stream of adds is written in batches, not a file per add."""

    def __init__(self, flush: Callable[[], None], retry_delays: tuple[float, ...] = FLUSH_RETRY_DELAYS,
                 interval: float = COMMIT_INTERVAL_S) -> None:
        self.flush = flush
        self.retry_delays = retry_delays  # seconds before each retry of a flush that failed with an OSError
        self.interval = interval
        self._started = -float("inf")  # loop time the last commit began writing
        self._next: asyncio.Future[None] | None = None  # the commit rows buffered now will be written by
        self._running: asyncio.Future[None] | None = None  # the commit whose flush runs now
        self.commits = 0  # flushes started (tests, figures)

    async def wait(self) -> None:
        if self._next is None:
            self._next = asyncio.ensure_future(self._commit(self._running))
        await asyncio.shield(self._next)

    async def _commit(self, previous: asyncio.Future[None] | None) -> None:
        await asyncio.sleep(0)  # the calls already queued on the loop buffer their rows and join this commit
        if previous is not None:
            await asyncio.wait([previous])  # one flush at a time (its outcome is its own callers')
        loop = asyncio.get_running_loop()
        wait = self._started + self.interval - loop.time()
        if wait > 0:  # the adds of the next moments join this commit
            await asyncio.sleep(wait)
        self._started = loop.time()
        self._next, self._running = None, self._next  # rows buffered from here on wait for the next commit
        self.commits += 1
        try:
            for delay in (*self.retry_delays, None):
                try:
                    await asyncio.to_thread(self.flush)  # a failed flush keeps its rows: a retry writes them
                    return
                except OSError as e:  # the store (a disk, an object store): often transient
                    if delay is None:
                        raise
                    log.warning("writing the run's rows failed (%s); trying again in %.1f s", e, delay)
                    await asyncio.sleep(delay)
        finally:
            self._running = None


@ray.remote
class TreeMemoryActor:
    def __init__(self, root: str | Location, run_id: str, search: SearchConfig, agents: AgentConfig) -> None:
        self.store = RunStore(root, run_id, flush_rows=256, flush_s=1.0, fsync=False)
        specs = read_specs(self.store.run_dir)  # from the run directory, at every (re)start
        self.commit = GroupCommit(self.store.flush)
        self.compactor = Compactor(self.store.run_dir)  # finished tasks' part files, in a niced process
        recorded = _recorded_trees(self.store.run_dir)
        self.memory = TreeMemory(sink=self._record)
        self.restored: dict[str, int] = {}
        for spec in specs:
            name = spec.info.name
            tree = recorded.get(name)
            if tree is None:
                if spec.reference is None:
                    raise ValueError(f"task {name}: nothing recorded in {self.store.run_dir} to resume from")
                tree = Tree.with_reference(spec.info.reference_source, spec.reference)
                self.store.record_node(name, tree.root)
            else:
                self.restored[name] = len(tree)
            self.memory.open(make_task_search(name, tree, search, agents, spec.info))
        self.store.flush()

    def _record(self, task: str, node: Node, step: AgentResult) -> None:
        self.store.record(task, node, step.usage)  # buffered: the add waits for the group commit that writes it

    async def next(self, task: str) -> Ticket | None:
        return self.memory.next(task)

    async def next_many(self, limit: int, exclude: list[str] | None = None) -> list[Ticket]:
        return self.memory.next_many(limit, exclude or ())

    async def add(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> Node | None:
        """The new node, or None when the ticket's node was lost with a restart (the work is dropped). Returns
        once the node's rows are written (acknowledged means written: a restart restores it)."""
        node, _ = await self.add_next(ticket, step, result)
        return node

    async def add_next(self, ticket: Ticket, step: AgentResult, result: EvalResult, limit: int = 0,
                       exclude: list[str] | None = None) -> tuple[Node | None, list[Ticket]]:
        """``add``, then up to ``limit`` new expansions over all tasks but ``exclude`` (``next_many``, selected
        right after the attach): one round trip where a driver would make two. The node is None as for ``add``;
        the tickets are handed out only once the node is written."""
        try:
            node: Node | None = self.memory.add(ticket, step, result)
        except UnknownParent:
            node = None
        tickets = self.memory.next_many(limit, exclude or ()) if limit > 0 else []
        if node is not None:
            await self.commit.wait()
            if self.memory.finished(ticket.task):  # its last rows are written: one file per table from now on
                self.compactor.add(ticket.task)
        return node, tickets

    async def release(self, ticket: Ticket) -> None:
        self.memory.release(ticket)

    async def unfinished(self) -> list[str]:
        return self.memory.unfinished()

    async def snapshot(self, task: str) -> list[dict[str, Any]]:
        return self.memory.snapshot(task)

    async def leaderboard(self, task: str, r: int | None = None) -> list[dict[str, Any]]:
        return self.memory.leaderboard(task, r)

    async def status(self) -> dict[str, Any]:
        return {"tasks": self.memory.status(), "restored": dict(self.restored), "pid": _pid()}

    async def close(self) -> None:
        self.store.close()
        # one cut short loses nothing: a campaign's are stopped (the whole run is compacted next); a single task's
        # may as well finish
        await asyncio.to_thread(self.compactor.close, 20, whole_run_compacted(len(self.memory.searches)))


def _recorded_trees(run_dir: Location) -> dict[str, Tree]:
    try:
        return load_trees(run_dir)
    except FileNotFoundError:
        return {}


def _pid() -> int:
    import os

    return os.getpid()
