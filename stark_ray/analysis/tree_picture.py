"""A picture of one task's search tree: every attempt a node (its marker the agent that wrote it, its colour what
the evaluation made of it), an edge from each parent to its children, the path from the reference to the best
candidate drawn bold, and the speedup beside each accepted node.

The layout is the classic tidy one: leaves side by side in the order of their ids under their parents, each parent
centred over its children, depth downwards. Drawn on a matplotlib Figure with the Agg canvas (no pyplot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stark_ray.records import AGENT_DEBUG, AGENT_PLAN_CODE, AGENT_REFERENCE, AGENT_SINGLE

# what became of an attempt -> (legend label, colour); the order is the legend's
OUTCOMES: dict[str, tuple[str, str]] = {
    "reference": ("reference", "#333333"),
    "accepted": ("accepted", "#2ca02c"),
    "rejected": ("passed the checks, rejected (flag)", "#ff7f0e"),
    "wrong": ("wrong output", "#d62728"),
    "build": ("did not parse or build", "#9e9e9e"),
    "failed": ("crashed, raised or timed out", "#9467bd"),
}
MARKERS: dict[str, tuple[str, str]] = {  # agent -> (marker, legend label)
    AGENT_REFERENCE: ("s", "reference"),
    AGENT_PLAN_CODE: ("o", "plan + code"),
    AGENT_DEBUG: ("^", "debug"),
    AGENT_SINGLE: ("D", "single agent"),
}
LABEL_ALL_UP_TO = 60  # nodes: beyond this only the best path's speedups are written


@dataclass(frozen=True)
class PictureNode:
    id: int
    parent: int | None
    agent: str
    outcome: str  # a key of OUTCOMES
    speedup: float | None  # an accepted node's


def outcome_of(row: Mapping[str, Any]) -> str:
    """A ``judged`` row's outcome: accepted, rejected (passed the checks but flagged), wrong, build (parse, compile),
    failed (runtime, crash, timeout, untimed)."""
    if row.get("seq") == 0 or row.get("agent") == AGENT_REFERENCE:
        return "reference"
    if row.get("accepted"):
        return "accepted"
    failure = str(row.get("failure") or "")
    if failure.startswith("rejected"):
        return "rejected"
    if failure == "correctness":
        return "wrong"
    if failure in ("parse", "compile"):
        return "build"
    return "failed"


def nodes_of(rows: Sequence[Mapping[str, Any]]) -> list[PictureNode]:
    """One task's ``judged`` rows as picture nodes (node_id, parent_id, agent, accepted, failure, speedup, seq)."""
    out = []
    for r in rows:
        outcome = outcome_of(r)
        s = r.get("speedup")
        out.append(PictureNode(int(r["node_id"]), None if r.get("parent_id") is None else int(r["parent_id"]),
                               str(r.get("agent") or ""), outcome,
                               float(s) if outcome == "accepted" and s is not None else None))
    return out


def layout(nodes: Sequence[PictureNode]) -> dict[int, tuple[float, float]]:
    """Node id -> (x, depth): leaves at 0, 1, 2, ... in depth-first order (children by id), a parent centred over
    its first and last child. A node whose parent is missing hangs from the top, as a root of its own."""
    ids = {n.id for n in nodes}
    children: dict[int | None, list[int]] = {}
    for n in sorted(nodes, key=lambda n: n.id):
        children.setdefault(n.parent if n.parent in ids else None, []).append(n.id)
    pos: dict[int, tuple[float, float]] = {}
    next_leaf = 0.0
    # iterative post-order (a search can be thousands of nodes deep in a debug chain: no recursion)
    for root in children.get(None, []):
        stack: list[tuple[int, int, bool]] = [(root, 0, False)]
        while stack:
            node, depth, expanded = stack.pop()
            kids = children.get(node, [])
            if not kids:
                pos[node] = (next_leaf, float(depth))
                next_leaf += 1.0
            elif expanded:
                pos[node] = ((pos[kids[0]][0] + pos[kids[-1]][0]) / 2, float(depth))
            else:
                stack.append((node, depth, True))
                stack.extend((k, depth + 1, False) for k in reversed(kids))
    return pos


def best_path(nodes: Sequence[PictureNode]) -> list[int]:
    """Ids from the root to the accepted node of highest speedup (the lowest id among equals); empty without one."""
    accepted = [n for n in nodes if n.outcome == "accepted" and n.speedup is not None]
    if not accepted:
        return []
    best = max(accepted, key=lambda n: (n.speedup, -n.id))
    parent = {n.id: n.parent for n in nodes}
    path, at, seen = [], best.id, set()
    while at is not None and at not in seen:
        seen.add(at)
        path.append(at)
        at = parent.get(at)
    return path[::-1]


def tree_picture(nodes: Sequence[PictureNode], path: Path, title: str) -> Path:
    """Draw the tree of ``nodes`` into the PNG ``path``; returns it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    pos = layout(nodes)
    width = max((x for x, _ in pos.values()), default=0.0) + 1
    depth = max((d for _, d in pos.values()), default=0.0) + 1
    fig = Figure(figsize=(min(max(6.0, 0.32 * width + 2.5), 30.0), min(max(3.5, 0.7 * depth + 1.8), 24.0)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    path_ids = best_path(nodes)
    on_path = set(path_ids)
    by_id = {n.id: n for n in nodes}
    for n in nodes:
        if n.parent in pos:
            (x0, y0), (x1, y1) = pos[n.parent], pos[n.id]
            bold = n.id in on_path and n.parent in on_path
            ax.plot([x0, x1], [y0, y1], color="#d4a017" if bold else "#b0b0b0", linewidth=3.2 if bold else 0.9,
                    zorder=1 if not bold else 2, solid_capstyle="round")
    size = 90 if len(nodes) <= LABEL_ALL_UP_TO else 40
    for agent, (marker, _) in MARKERS.items():
        for outcome, (_, colour) in OUTCOMES.items():
            group = [n for n in nodes if (n.agent if n.agent in MARKERS else AGENT_PLAN_CODE) == agent
                     and n.outcome == outcome]
            if group:
                ax.scatter([pos[n.id][0] for n in group], [pos[n.id][1] for n in group], s=size, marker=marker,
                           c=colour, edgecolors=["#d4a017" if n.id in on_path else "white" for n in group],
                           linewidths=1.6, zorder=3)
    for n in nodes:
        if len(nodes) <= LABEL_ALL_UP_TO:  # the node's id, to find its row (node_id) in stark sql
            ax.annotate(str(n.id), pos[n.id], xytext=(-7, -2), textcoords="offset points", fontsize=6,
                        color="#555555", ha="right", va="top", zorder=4)
        if n.speedup is None or (len(nodes) > LABEL_ALL_UP_TO and n.id not in on_path):
            continue
        text = "inf" if math.isinf(n.speedup) else f"{n.speedup:.2f}×"
        ax.annotate(text, pos[n.id], xytext=(6, 4), textcoords="offset points", fontsize=7,
                    fontweight="bold" if n.id in on_path else "normal", zorder=4)
    ax.invert_yaxis()
    ax.set_xticks([])
    ax.set_ylabel("depth")
    ax.yaxis.get_major_locator().set_params(integer=True)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [Line2D([], [], linestyle="", marker="o", markersize=7, color=colour, label=label)
               for key, (label, colour) in OUTCOMES.items() if any(n.outcome == key for n in nodes)]
    agents = {n.agent if n.agent in MARKERS else AGENT_PLAN_CODE for n in nodes}
    handles += [Line2D([], [], linestyle="", marker=marker, markersize=7, color="#555555", label=label)
                for agent, (marker, label) in MARKERS.items() if agent in agents and agent != AGENT_REFERENCE]
    if path_ids:
        best = by_id[path_ids[-1]]
        handles.append(Line2D([], [], color="#d4a017", linewidth=3, label=f"path to the best ({best.speedup:.2f}×)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    accepted = sum(n.outcome == "accepted" for n in nodes)
    ax.set_title(f"{title}: {len(nodes) - 1} attempts, {accepted} accepted", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
