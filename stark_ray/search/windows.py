"""Dynamic context windows, rebuilt at every step (STARK.md, "Dynamic context windows").

    plan(i)  = {i, root} ∪ D(i) ∪ top-r(C)
    code(i)  = {i, root} ∪ D(i) ∪ {j : p(j) ∈ S(i)}
    debug(i) = {i, root} ∪ S(i)

Each function returns the members: i, the root, then the rest (leaderboard order, then children, for the plan
window; by id otherwise). The windows are exact; what bounds a prompt on deep or wide trees is the renderer
(``prompts/render.py``), which fits a window into ``window_chars`` characters.
"""

from __future__ import annotations

from stark_ray.records import Node
from stark_ray.search.tree import Tree


def _window(tree: Tree, i: Node, rest: list[Node]) -> list[Node]:
    seen = {i.id, 0}
    head = [i] if i.is_root else [i, tree.root]
    others: list[Node] = []
    for n in rest:
        if n.id not in seen:
            seen.add(n.id)
            others.append(n)
    return head + others


def plan_window(tree: Tree, i: Node, top_r: int) -> list[Node]:
    return _window(tree, i, tree.leaderboard(top_r) + tree.children(i.id))


def code_window(tree: Tree, i: Node) -> list[Node]:
    cousins = [c for s in tree.siblings(i.id) for c in tree.children(s.id)]
    return _window(tree, i, sorted(tree.children(i.id) + cousins, key=lambda n: n.id))


def debug_window(tree: Tree, i: Node) -> list[Node]:
    return _window(tree, i, tree.siblings(i.id))
