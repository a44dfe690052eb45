"""Dynamic context windows, rebuilt at every step (STARK.md, "Dynamic context windows").

    plan(i)  = {i, root} ∪ D(i) ∪ top-r(C)
    code(i)  = {i, root} ∪ D(i) ∪ {j : p(j) ∈ S(i)}
    debug(i) = {i, root} ∪ S(i)

Each function returns the members in a fixed order: i, the root, then the rest by id (for the plan window the
leaderboard entries come in leaderboard order). ``max_nodes`` bounds the count on deep or wide trees, keeping
i and the root and the most recent others; the prompt renderer then bounds the characters.
"""

from __future__ import annotations

from stark_ray.records import Node
from stark_ray.search.tree import Tree


def _window(tree: Tree, i: Node, rest: list[Node], max_nodes: int | None) -> list[Node]:
    seen = {i.id, 0}
    head = [i] if i.is_root else [i, tree.root]
    others: list[Node] = []
    for n in rest:
        if n.id not in seen:
            seen.add(n.id)
            others.append(n)
    if max_nodes is not None and len(head) + len(others) > max_nodes:
        keep = max(0, max_nodes - len(head))
        # keep the most recent others, but preserve the order they came in
        recent = set(sorted((n.id for n in others), reverse=True)[:keep])
        others = [n for n in others if n.id in recent]
    return head + others


def plan_window(tree: Tree, i: Node, top_r: int, max_nodes: int | None = None) -> list[Node]:
    return _window(tree, i, tree.leaderboard(top_r) + tree.children(i.id), max_nodes)


def code_window(tree: Tree, i: Node, max_nodes: int | None = None) -> list[Node]:
    cousins = [c for s in tree.siblings(i.id) for c in tree.children(s.id)]
    return _window(tree, i, sorted(tree.children(i.id) + cousins, key=lambda n: n.id), max_nodes)


def debug_window(tree: Tree, i: Node, max_nodes: int | None = None) -> list[Node]:
    return _window(tree, i, tree.siblings(i.id), max_nodes)
