"""The TreeMemory actor: one per run, owning every task's tree and policy (a shell over search.memory).

Its state is rebuilt from the run's Parquet rows whenever it starts on a run directory that has some: after
a restart (``max_restarts``) and for ``--resume`` alike. Every attached node is written (attempts row and its
LLM calls) before ``add`` returns, so what a restart restores is everything it acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.records import EvalResult, Node
from stark_ray.search.memory import Ticket, TreeMemory, UnknownParent, make_task_search
from stark_ray.search.tree import Tree
from stark_ray.store.read import load_trees
from stark_ray.store.run_store import RunStore


@dataclass(frozen=True)
class TaskSpec:
    """What the memory needs to open a task: its prompt facts and, for a new tree, the reference's result."""

    info: TaskInfo
    reference: EvalResult | None  # None: the tree must already be in the run directory (resume)


@ray.remote
class TreeMemoryActor:
    def __init__(self, root: str, run_id: str, specs: list[TaskSpec], search: SearchConfig,
                 agents: AgentConfig) -> None:
        self.store = RunStore(root, run_id, flush_rows=256, flush_s=1.0, fsync=False)
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
        self.store.record_node(task, node)
        self.store.record_usage(task, node.id, step.usage)
        self.store.flush()  # acknowledged means written: a restart restores it

    async def next(self, task: str) -> Ticket | None:
        return self.memory.next(task)

    async def next_many(self, limit: int, exclude: list[str] | None = None) -> list[Ticket]:
        return self.memory.next_many(limit, exclude or ())

    async def add(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> Node | None:
        """The new node, or None when the ticket's node was lost with a restart (the work is dropped)."""
        try:
            return self.memory.add(ticket, step, result)
        except UnknownParent:
            return None

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


def _recorded_trees(run_dir: str) -> dict[str, Tree]:
    try:
        return load_trees(run_dir)
    except FileNotFoundError:
        return {}


def _pid() -> int:
    import os

    return os.getpid()
