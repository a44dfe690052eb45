"""The driver's copy of a run: each task's tree as the memory acknowledged it, its best node (kept in
``best_kernel.py`` as it changes), and the LLM usage of its calls.

Acknowledgements can reach the driver out of order (one group commit writes a node and its child; the child's
``add_next`` may be handled first): a node whose parent is not here yet waits for it.

The live view's figures (:meth:`RunMirror.status`, twice a second) are kept up to date as nodes come, not
counted over every tree: a campaign of thousands of tasks spent half its driver's time recounting them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from stark_ray.agents.base import AgentResult
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import Node
from stark_ray.run.directory import task_dir, write_atomic, write_task_end
from stark_ray.run.summary import RunSummary
from stark_ray.search.tree import Tree
from stark_ray.store.location import Location

log = logging.getLogger(__name__)


class RunMirror:
    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        self.trees: dict[str, Tree] = {}
        self.best: dict[str, int | None] = {}
        self.usage: dict[str, UsageTotals] = {n: UsageTotals() for n in self.names}
        self.orphans: dict[str, dict[int, list[Node]]] = {}  # task -> parent -> nodes waiting for it
        self.dir: Location | None = None  # the run directory, once it exists
        self.attempts = 0  # over all trees, kept with each load and attach (the live view's figures)
        self.accepted = 0
        self._touched: set[str] = set()  # tasks loaded or attached to since the last status
        self._spent: set[str] = set()  # tasks at the budget of the last status
        self._spent_budget: int | None = None

    def load(self, name: str, tree: Tree) -> None:
        """A task's tree as the memory holds it at the start (a resumed run's recorded nodes)."""
        old = self.trees.get(name)
        if old is not None:
            self.attempts -= old.evaluated
            self.accepted -= _accepted(old.nodes.values())
        self.trees[name] = tree
        best = tree.best()
        self.best[name] = best.id if best else None
        self.attempts += tree.evaluated
        self.accepted += _accepted(tree.nodes.values())
        self._touched.add(name)

    def attach(self, name: str, node: Node, step: AgentResult) -> None:
        """A node the memory acknowledged (written), with the agent step that made it."""
        tree = self.trees[name]
        waiting = self.orphans.setdefault(name, {})
        attached: list[Node] = []
        if node.id not in tree.nodes and node.parent is not None:
            if node.parent in tree.nodes:
                todo = [node]
                while todo:  # with it, the nodes whose acknowledgement reached the driver before it
                    n = todo.pop()
                    if n.id not in tree.nodes:
                        tree.attach(replace(n, children=[]))
                        attached.append(tree[n.id])
                        todo += waiting.pop(n.id, [])
            else:  # its parent's acknowledgement has not been handled yet (one commit wrote both)
                waiting.setdefault(node.parent, []).append(node)
        for u in step.usage:
            self.usage[name].add(u)
        self.attempts += len(attached)
        self.accepted += _accepted(attached)
        self._touched.add(name)
        best_id = self.best[name]
        # the leaderboard's first: the best only changes when a node just attached beats it
        best = min((n for n in attached if n.accepted), key=lambda n: (n.score, n.id), default=None)
        if best is not None and (best_id is None or (best.score, best.id) < (tree[best_id].score, best_id)):
            self.best[name] = best.id
            try:
                write_atomic(self.task_dir(name) / "best_kernel.py", best.source)
            except OSError as e:  # a full disk, say: the rows hold it; the end of the run writes it again
                log.warning("task %s: best_kernel.py could not be written (%s)", name, e)

    def task_dir(self, name: str) -> Location:
        """Where a task's summary and best kernel go (:func:`~stark_ray.run.directory.task_dir`)."""
        assert self.dir is not None
        d = task_dir(self.dir, name, len(self.names))
        d.mkdir()
        return d

    def write_summary(self, name: str, tree: Tree, summary: RunSummary) -> None:
        """The end of a task: its ``summary.json`` and the best kernel its summary names."""
        assert self.dir is not None
        write_task_end(task_dir(self.dir, name, len(self.names)), tree, summary)

    def status(self, running: set[str], budget: int, capped: set[str]) -> dict[str, Any]:
        """The live view's figures on the trees: tasks done and running, attempts, accepted ones, best speedups.
        Its cost grows with the tasks, never with the nodes (:func:`status_from_scratch` is its definition)."""
        trees = self.trees
        if budget != self._spent_budget:  # the first call: who has spent it, counted once
            self._spent = {n for n, t in trees.items() if t.evaluated >= budget}
            self._spent_budget = budget
        else:
            self._spent.update(n for n in self._touched if trees[n].evaluated >= budget)
        self._touched.clear()
        running_spent = sum(1 for n in running if n in self._spent)
        capped_only = sum(1 for n in capped if n in trees and n not in self._spent and n not in running)
        return {
            "tasks": len(self.names), "running": len(running),
            "done": len(self._spent) - running_spent + capped_only,
            "attempts": self.attempts, "accepted": self.accepted,
            "best": {n: trees[n][b].result.speedup for n, b in self.best.items() if b is not None},
        }


def status_from_scratch(trees: dict[str, Tree], running: set[str], budget: int, capped: set[str]) -> dict[str, Any]:
    """:meth:`RunMirror.status`'s figures by their definition, counted over every tree and node (tests and
    benchmarks hold the kept figures to it)."""
    return {
        "done": sum(1 for n, t in trees.items() if n not in running and (t.evaluated >= budget or n in capped)),
        "attempts": sum(t.evaluated for t in trees.values()),
        "accepted": sum(1 for t in trees.values() for n in t if n.accepted and not n.is_root),
        "best": {n: b.result.speedup for n, t in trees.items() if (b := t.best()) is not None},
    }


def _accepted(nodes: Iterable[Node]) -> int:
    return sum(1 for n in nodes if n.accepted and not n.is_root)
