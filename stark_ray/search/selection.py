"""What the tree policies may select, kept up to date as nodes attach: O(1) amortised per attach and per choice.

:class:`Selection` holds, for one tree and one set of rules (:class:`~stark_ray.search.policy.Rules`), the
selectable leaves in tree order and the selectable accepted nodes best first — the two lists the policies choose
from — without walking the tree. It is built once from the whole tree, then told of every attach
(:meth:`~stark_ray.search.tree.Tree.watch`). What changes with an attach:

- the parent stops being a leaf; it may become *full* (``n_child_max`` children) or, for the root, throttled;
- the parent may become *dead* (more than ``n_child`` children, nothing accepted below): its whole subtree leaves
  both lists (walked once; a dead branch is never selected, so it rarely grows again);
- an accepted node marks its ancestors as having something accepted below (walking up until one already does),
  which may bring a dead one back to life, and its subtree with it.

Which nodes are *static-ok* (accepted, or failed and repairable: its debug chain and candidate are fixed when it
attaches) never changes. :func:`~stark_ray.search.policy.selectable_from_scratch` is the definition this keeps equal
to (tests/test_search_policy.py checks both after every attach of random trees).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from stark_ray.records import Node

if TYPE_CHECKING:
    from stark_ray.search.tree import Tree


class Selection:
    """Selectable leaves (ids ascending) and selectable accepted nodes ((score, id) ascending) of one tree."""

    def __init__(self, tree: Tree, n_root: int, n_child: int, max_debug_chain: int, n_child_max: int) -> None:
        self.tree = tree
        self.n_root, self.n_child, self.n_child_max = n_root, n_child, n_child_max
        self.max_debug_chain = max_debug_chain
        self.chain: dict[int, int] = {}  # repairs in a row that led to each node
        self.accepted_below: set[int] = set()  # nodes with an accepted node strictly below
        self.dead: set[int] = set()
        self.dead_above: dict[int, int] = {}  # dead nodes among each node's ancestors and itself
        self.leaves: list[int] = []
        self.board: list[tuple[float, int]] = []
        self._build()

    def _build(self) -> None:
        """The state of the whole tree as it is, in two passes (parents have smaller ids than their children)."""
        order = sorted(self.tree, key=lambda n: n.id)
        for node in reversed(order):
            if node.parent is not None and (node.accepted or node.id in self.accepted_below):
                self.accepted_below.add(node.parent)
        nodes = self.tree.nodes
        for node in order:
            parent = None if node.parent is None else nodes[node.parent]
            self.chain[node.id] = 0 if parent is None or parent.accepted else self.chain[parent.id] + 1
            if not node.is_root and len(node.children) > self.n_child and node.id not in self.accepted_below:
                self.dead.add(node.id)
            self.dead_above[node.id] = (0 if parent is None else self.dead_above[parent.id]) + (node.id in self.dead)
            if self.selectable(node):
                if not node.children:
                    self.leaves.append(node.id)
                if node.accepted:
                    self.board.append((node.score, node.id))
        self.board.sort()

    # -- queries ------------------------------------------------------------------------------------------------
    def selectable(self, node: Node) -> bool:
        return self._static_ok(node) and self.dead_above.get(node.id, 0) == 0 and not self._capped(node)

    def leaf_nodes(self) -> list[Node]:
        nodes = self.tree.nodes
        return [nodes[i] for i in self.leaves]

    def board_nodes(self) -> list[Node]:
        nodes = self.tree.nodes
        return [nodes[i] for _, i in self.board]

    # -- updates ------------------------------------------------------------------------------------------------
    def attached(self, node: Node) -> None:
        """``node`` was just attached (its parent's children include it)."""
        nodes = self.tree.nodes
        parent = None if node.parent is None else nodes[node.parent]
        self.chain[node.id] = 0 if parent is None or parent.accepted else self.chain[parent.id] + 1
        self.dead_above[node.id] = 0 if parent is None else self.dead_above[parent.id]
        if parent is not None:
            self._discard_leaf(parent.id)
            if self._capped(parent):
                self._discard_board(parent)
        if self._offered(node):
            self._add(node)
        if node.accepted and parent is not None:
            self._mark_accepted_above(node)
        if parent is not None:
            self._check_dead(parent)

    def _mark_accepted_above(self, node: Node) -> None:
        nodes = self.tree.nodes
        up = node.parent
        while up is not None and up not in self.accepted_below:
            self.accepted_below.add(up)
            if up in self.dead:  # alive again, and its subtree with it
                self.dead.discard(up)
                self._shift_subtree(nodes[up], -1)
            up = nodes[up].parent

    def _check_dead(self, node: Node) -> None:
        dead = (not node.is_root and len(node.children) > self.n_child and node.id not in self.accepted_below)
        if dead and node.id not in self.dead:
            self.dead.add(node.id)
            self._shift_subtree(node, +1)

    def _shift_subtree(self, top: Node, by: int) -> None:
        """Add ``by`` to the dead count of ``top`` and every node below it, moving those whose count leaves or
        reaches zero out of or into the lists."""
        nodes = self.tree.nodes
        stack = [top]
        while stack:
            n = stack.pop()
            was = self.dead_above[n.id] == 0
            self.dead_above[n.id] += by
            now = self.dead_above[n.id] == 0
            if was and not now:
                self._remove(n)
            elif now and not was and self._offered(n):
                self._add(n)
            stack.extend(nodes[c] for c in n.children)

    # -- the lists ----------------------------------------------------------------------------------------------
    def _static_ok(self, node: Node) -> bool:
        if node.accepted:
            return True
        return (not node.is_root and self.tree.has_candidate(node)
                and self.chain[node.id] < self.max_debug_chain)

    def _capped(self, node: Node) -> bool:
        if node.is_root:
            return len(node.children) >= self.n_root
        return bool(self.n_child_max) and len(node.children) >= self.n_child_max

    def _offered(self, node: Node) -> bool:
        return self.selectable(node)

    def _add(self, node: Node) -> None:
        if not node.children:
            i = bisect.bisect_left(self.leaves, node.id)
            if i == len(self.leaves) or self.leaves[i] != node.id:
                self.leaves.insert(i, node.id)
        if node.accepted:
            key = (node.score, node.id)
            i = bisect.bisect_left(self.board, key)
            if i == len(self.board) or self.board[i] != key:
                self.board.insert(i, key)

    def _remove(self, node: Node) -> None:
        self._discard_leaf(node.id)
        self._discard_board(node)

    def _discard_leaf(self, node_id: int) -> None:
        i = bisect.bisect_left(self.leaves, node_id)
        if i < len(self.leaves) and self.leaves[i] == node_id:
            del self.leaves[i]

    def _discard_board(self, node: Node) -> None:
        if not node.accepted:
            return
        key = (node.score, node.id)
        i = bisect.bisect_left(self.board, key)
        if i < len(self.board) and self.board[i] == key:
            del self.board[i]
