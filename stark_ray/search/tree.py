"""Tree memory: every evaluated candidate as a node under the reference, plus the leaderboard."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from stark_ray.records import AGENT_REFERENCE, STAGE_PARSE, EvalResult, LLMUsage, Node

T = TypeVar("T")


class Tree:
    """A search tree rooted at the reference implementation (node 0).

    Nodes are only ever added, never changed (observations come with the node), which is what makes the tree
    rebuildable from its records: ``Tree.from_records(t.to_records())`` equals ``t``. What is derived from the
    whole tree (the policy's pruning) is kept by :meth:`memo` until the next node is attached.
    """

    def __init__(self, root: Node) -> None:
        if root.parent is not None or root.id != 0:
            raise ValueError("the root must be node 0 without a parent")
        self.nodes: dict[int, Node] = {0: root}
        self._memo: dict[Hashable, Any] = {}
        self._watchers: dict[Hashable, Any] = {}  # kept up to date by every attach (see watch)
        self._board: list[tuple[float, int]] = []  # (score, id) of the accepted candidates, best first

    @staticmethod
    def with_reference(source: str, result: EvalResult) -> Tree:
        return Tree(Node(id=0, parent=None, depth=0, source=source, agent=AGENT_REFERENCE,
                         instruction="reference implementation", result=result))

    # --- growth ------------------------------------------------------------------------------------------
    def add(self, parent: int, source: str, agent: str, result: EvalResult, instruction: str = "",
            scaffold: str | None = None, usage: Iterable[LLMUsage] = ()) -> Node:
        p = self.nodes[parent]
        calls = list(usage)
        node = Node(
            id=len(self.nodes), parent=parent, depth=p.depth + 1, source=source, agent=agent,
            instruction=instruction, scaffold=scaffold, result=result,
            input_tokens=sum(u.input_tokens for u in calls), output_tokens=sum(u.output_tokens for u in calls),
            cost_usd=sum(u.cost_usd for u in calls),
        )
        self.attach(node)
        return node

    def attach(self, node: Node) -> None:
        """A node made elsewhere (its id, parent and result set), attached as it is: a ValueError where its id is
        taken or its parent missing."""
        if node.id in self.nodes:
            raise ValueError(f"node {node.id} is already in the tree")
        if node.parent not in self.nodes:
            raise ValueError(f"node {node.id} names parent {node.parent}, which is not in the tree")
        self.nodes[node.id] = node
        self.nodes[node.parent].children.append(node.id)
        self._memo.clear()
        if node.accepted:
            bisect.insort(self._board, (node.score, node.id))
        for watcher in self._watchers.values():
            watcher.attached(node)

    def watch(self, key: Hashable, make: Callable[[Tree], T]) -> T:
        """``make(self)``, made once per key and then told of every attach (its ``attached(node)``, called after
        the node is in the tree): state derived from the whole tree and kept up to date incrementally."""
        if key not in self._watchers:
            self._watchers[key] = make(self)
        return self._watchers[key]  # type: ignore[no-any-return]

    def memo(self, key: Hashable, compute: Callable[[Tree], T]) -> T:
        """``compute(self)``, computed once per key until the tree grows (every attach forgets what was kept)."""
        if key not in self._memo:
            self._memo[key] = compute(self)
        return self._memo[key]  # type: ignore[no-any-return]

    # --- queries -----------------------------------------------------------------------------------------
    @property
    def root(self) -> Node:
        return self.nodes[0]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    @property
    def evaluated(self) -> int:
        """Attempts so far (every node but the root), failed agent steps included: the budget counter."""
        return len(self.nodes) - 1

    def children(self, node_id: int) -> list[Node]:
        return [self.nodes[c] for c in self.nodes[node_id].children]

    def siblings(self, node_id: int) -> list[Node]:
        parent = self.nodes[node_id].parent
        if parent is None:
            return []
        return [self.nodes[c] for c in self.nodes[parent].children if c != node_id]

    def ancestors(self, node_id: int) -> list[Node]:
        """Parent, grandparent, ..., root."""
        out = []
        parent = self.nodes[node_id].parent
        while parent is not None:
            out.append(self.nodes[parent])
            parent = self.nodes[parent].parent
        return out

    def descendants(self, node_id: int) -> list[Node]:
        out, stack = [], list(reversed(self.nodes[node_id].children))
        while stack:
            n = self.nodes[stack.pop()]
            out.append(n)
            stack.extend(reversed(n.children))
        return out

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.children]

    def debug_chain(self, node_id: int) -> int:
        """How many repairs in a row led to this node. A node whose parent failed is a repair (the search only
        ever repairs failed nodes), whichever agent wrote it: the debug agent or the single agent."""
        count, node = 0, self.nodes[node_id]
        while node.parent is not None and not self.nodes[node.parent].accepted:
            count += 1
            node = self.nodes[node.parent]
        return count

    def leaderboard(self, r: int | None = None) -> list[Node]:
        """The accepted candidates (the reference excluded), best score (highest speedup) first; ties by age.
        Kept sorted as nodes attach: the first ``r`` cost O(r)."""
        board = self._board if r is None else self._board[:r]
        return [self.nodes[i] for _, i in board]

    def best(self) -> Node | None:
        board = self.leaderboard(1)
        return board[0] if board else None

    def failures(self) -> int:
        return sum(1 for n in self.nodes.values() if not n.is_root and not n.accepted)

    def has_candidate(self, node: Node) -> bool:
        return node.result.stage != STAGE_PARSE and bool(node.source)

    # --- plain records -----------------------------------------------------------------------------------
    def to_records(self) -> list[dict[str, Any]]:
        return [n.to_record() for n in sorted(self.nodes.values(), key=lambda n: n.id)]

    @staticmethod
    def from_records(records: Iterable[dict[str, Any]]) -> Tree:
        nodes = sorted((Node.from_record(r) for r in records), key=lambda n: n.id)
        if [n.id for n in nodes] != list(range(len(nodes))):
            raise ValueError("records must hold nodes 0..n-1 exactly once (the root is node 0)")
        tree = Tree(replace(nodes[0], children=[]))
        for node in nodes[1:]:
            if node.parent is None or not 0 <= node.parent < node.id:
                raise ValueError(f"node {node.id} names parent {node.parent}, which is not an earlier node")
            if node.depth != tree[node.parent].depth + 1:
                raise ValueError(f"node {node.id} has depth {node.depth}, its parent {tree[node.parent].depth}")
            tree.attach(replace(node, children=[]))
        return tree
