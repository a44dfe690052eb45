"""Render tree nodes for a prompt, and a whole context window under a character limit.

A node is shown with its header (id, parent, depth, agent), its instruction, its observations (stage, error,
runtime, speedup, share of the speed of light, flags with the judge's lines, the judge's lines on how it measured
it; for the selected node and the reference, where its one call's GPU time went, kernel by kernel), a log excerpt
when it failed, and its code — the shortest of the full source, a unified diff against the selected node (whose
code the prompt shows) and one against its parent, cut at 6,000 (``FULL``) or 2,500 (``CODE``) characters with a
line saying how much was cut. Nodes whose code the prompt shows elsewhere (the selected node and the reference,
normally) get a pointer instead of their code, and no log excerpt (the prompt shows the selected node's log with
its code where it matters). Nothing is left out silently: a clipped instruction, a cut code or log, a node shown
without them, and the nodes not shown at all each say so.

Detail levels, from most to least: ``FULL`` (code + log excerpt up to 1500 characters), ``CODE`` (code + log
excerpt up to 300), ``BRIEF`` (no code, no log — a line says they were cut — instruction clipped).
:func:`render_window` keeps the window under ``limit`` characters and is deterministic:

1. the selected node i and the root are always shown, at the most detail that fits (root first degraded);
2. the others are ordered by priority — children of i first (what was already tried from i), then correct
   nodes fastest first, then the rest, i's siblings first; ties keep the caller's order — and added at ``BRIEF``
   while they fit in half of the characters left (coverage);
3. the shown others are then upgraded, in priority order, to ``FULL`` or else ``CODE`` when the upgrade fits
   (detail);
4. more others are added at ``BRIEF`` while they fit; the rest are dropped and counted in a footer;
5. a last guard cuts the text if it is still too long (only possible with absurdly small limits).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping

from stark_ray.eval.measure.noise import interval
from stark_ray.records import AGENT_REFERENCE, Node, excerpt

FULL, CODE, BRIEF = 0, 1, 2
_LOG_CHARS = {FULL: 1500, CODE: 300, BRIEF: 0}
_INSTRUCTION_CHARS = {FULL: 2000, CODE: 1200, BRIEF: 300}
# of one node's code (its diff or its source) at each level: one long diff (13.4k characters) took half a window
_CODE_CHARS = {FULL: 6000, CODE: 2500, BRIEF: 0}
BRIEF_NOTE = "Code and log: not shown (cut to fit the window)."
_SEP = "\n\n"
_FOOTER_RESERVE = 90
# the selected node's and the reference's profile of one call (eval/measure/kernel_times.py), where the device has one
KERNELS_LINE = "Kernels in one call (GPU profile): "
NCU_LINE = "Nsight Compute, top kernel "  # how eval/ncu.py's counters begin (its reasons for none are not shown)
JUDGE_LINE = "Judge: "  # a line of the judge's on how it measured the result (EvalResult.notes): the selected node's
JUDGE_LINES = 4  # only, in room kept for them (JUDGE_ROOM), so that whether the judge measured again (the run's noise)
JUDGE_ROOM = JUDGE_LINES * (len(JUDGE_LINE) + 301)  # never changes which other nodes a window shows, or how


def fenced(text: str, lang: str = "") -> str:
    """``text`` in a code fence longer than any backtick run inside it."""
    runs = [len(m.group(0)) for m in re.finditer(r"`{3,}", text)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def clip(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 15)].rstrip() + " ...[clipped]"


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=2)
    return "\n".join(lines)


def _spread(cv: float | None) -> str:
    """The timed calls' spread (std / mean) as a number only: a word that came and went with the noise would make
    the same step's prompt differ between runs (replays match prompts up to their numbers)."""
    return "" if cv is None or not math.isfinite(cv) else f" (calls vary by {_decimal(100 * cv, 2)}%)"


def _light(fraction: float | None) -> str:
    """How close a runtime comes to the task's speed of light (the task section says what that is); replays match
    prompts with and without it alike (llm/replay.py)."""
    return "" if fraction is None or not math.isfinite(fraction) else (
        f", {_decimal(100 * fraction, 2)}% of the speed of light")


def _errors(max_abs: float | None, rel: float | None) -> str:
    """Its largest error against the reference over the trials, and the normalized one (the task section says the
    tolerance); replays match prompts with and without it alike (llm/replay.py)."""
    if max_abs is None or rel is None or not (math.isfinite(max_abs) and math.isfinite(rel)):
        return ""
    return f"; its error against the reference at most {max_abs:.2g} (normalized {rel:.2g})"


def _decimal(x: float, digits: int) -> str:
    """``x`` to about ``digits`` significant digits, never in exponent form (a spread of 120% reads as 120, not
    1.2e+02)."""
    if x == 0:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _fmt_ms(ms: float | None) -> str:
    return "n/a" if ms is None or not math.isfinite(ms) else f"{_decimal(ms, 4)} ms"


def describe_result(node: Node, judged: bool = True) -> str:
    """One or two lines of observations (``judged``: with the judge's lines on how it measured the result)."""
    r = node.result
    if node.is_root or node.agent == AGENT_REFERENCE:
        line = (f"Result: the reference (PyTorch), runtime {_fmt_ms(r.runtime_ms)}{_spread(r.runtime_cv)}, timed "
                "alone at the start (each candidate is timed beside the reference again, in its own evaluation)"
                f"{_light(r.sol_fraction)}")
    elif r.accepted:
        line = f"Result: correct; runtime {_fmt_ms(r.runtime_ms)}{_spread(r.runtime_cv)}"
        if r.ref_runtime_ms is not None:
            line += f", the reference {_fmt_ms(r.ref_runtime_ms)}{_spread(r.ref_runtime_cv)} beside it"
        if r.speedup is not None:
            line += f": speedup {_decimal(r.speedup, 3)}x"
            if r.speedup_err is not None:  # always where known: a prompt's shape does not change with the noise
                line += f" ({interval(r.speedup_err)}, 95%)"
        line += _light(r.sol_fraction) + _errors(r.max_abs_err, r.rel_err)
    else:
        line = f"Result: failed at stage {r.stage!r}: {clip(r.error or 'no error message', 300)}"
        if r.max_abs_err is not None:
            line += f" (max abs error {r.max_abs_err:.3g})"
    if r.flags:
        line += f"\nFlags: {', '.join(r.flags)}"
    for finding in (r.findings or "").splitlines():  # the judge's line for a flag it explains: by how much, why
        line += f"\nFlag {clip(finding, 400)}"
    for note in (r.notes or "").splitlines()[:JUDGE_LINES] if judged else ():  # re-timed, confirmed, capped
        line += f"\n{JUDGE_LINE}{clip(note, 300)}"
    return line


def _header(node: Node, selected: bool) -> str:
    tags = []
    if selected:
        tags.append("selected")
    if node.is_root:
        tags.append("reference")
    tag = f" ({', '.join(tags)})" if tags else ""
    parent = "" if node.parent is None else f"child of node {node.parent}, "
    return f"## Node {node.id}{tag} — {parent}depth {node.depth}, by {node.agent}"


def _code_part(node: Node, bases: list[tuple[int, str]], elsewhere: bool, limit: int) -> str:
    """The node's code: the shortest of its source and its diffs against ``bases`` (node id, source: the selected
    node's, then its parent's), cut at ``limit`` characters with a line saying so."""
    if elsewhere:
        return "Code: shown in full elsewhere in this prompt."
    if not node.source.strip():
        return "Code: none (the agent produced no candidate)."
    head, body, lang = "Code:", node.source, "python"
    for base_id, base_source in bases:
        if base_id == node.id:
            continue
        diff = unified_diff(base_source, node.source, f"node {base_id}", f"node {node.id}")
        if not diff:
            return f"Code: identical to node {base_id}."
        if len(diff) < len(body):
            head, body, lang = f"Code (diff against node {base_id}):", diff, "diff"
    if len(body) > limit:
        cut = body[:limit].rsplit("\n", 1)[0]
        return f"{head}\n{fenced(cut, lang)}\n[{len(body) - len(cut):,} more characters of this code cut to fit]"
    return f"{head}\n{fenced(body, lang)}"


def render_node(node: Node, *, level: int = FULL, parent_source: str | None = None, selected: bool = False,
                code_elsewhere: bool = False, base: tuple[int, str] | None = None, judged: bool = False) -> str:
    """One node at the given detail level (see the module docstring); ``base``: the selected node (id, source),
    which its code may be shown as a diff against."""
    parts = [_header(node, selected)]
    if node.instruction.strip():
        parts.append(f"Instruction: {clip(node.instruction, _INSTRUCTION_CHARS[level])}")
    parts.append(describe_result(node, judged))
    if (selected or node.is_root) and level != BRIEF and node.result.kernels:
        parts.append(f"{KERNELS_LINE}{clip(node.result.kernels, 800)}")
    if selected and level != BRIEF and (node.result.profile or "").startswith(NCU_LINE):  # counted (--profile ncu)
        parts.append(clip(node.result.profile or "", 500))
    log_chars = 0 if code_elsewhere else _LOG_CHARS[level]
    if log_chars and not node.result.accepted and node.result.log.strip():
        parts.append(f"Log excerpt:\n{fenced(excerpt(node.result.log, log_chars), 'text')}")
    if level != BRIEF:
        bases = [] if base is None else [base]
        if parent_source is not None and node.parent is not None:
            bases.append((node.parent, parent_source))
        parts.append(_code_part(node, bases, code_elsewhere, _CODE_CHARS[level]))
    elif not code_elsewhere and (node.source.strip() or (not node.result.accepted and node.result.log.strip())):
        parts.append(BRIEF_NOTE)
    return "\n".join(parts)


def _priority(others: list[Node], selected: Node) -> list[Node]:
    def key(item: tuple[int, Node]) -> tuple[int, int, float, int, int]:
        index, n = item
        sibling = selected.parent is not None and n.parent == selected.parent
        return (0 if n.parent == selected.id else 1, 0 if n.accepted else 1, n.score if n.accepted else 0.0,
                0 if sibling else 1, index)

    return [n for _, n in sorted(enumerate(others), key=key)]


def _dedupe(nodes: Iterable[Node]) -> list[Node]:
    seen: set[int] = set()
    out: list[Node] = []
    for n in nodes:
        if n.id not in seen:
            seen.add(n.id)
            out.append(n)
    return out


class _Renderer:
    """Caches renderings of one window at each level."""

    def __init__(self, nodes: list[Node], selected: Node, sources: Mapping[int, str],
                 code_elsewhere: frozenset[int]) -> None:
        self.selected = selected
        self.sources = {**{n.id: n.source for n in nodes}, **sources}
        self.code_elsewhere = code_elsewhere
        self.cache: dict[tuple[int, int], str] = {}

    def text(self, node: Node, level: int, judged: bool = False) -> str:
        """The node at ``level``, as sized for the window (without the judge's lines: see JUDGE_ROOM), or, ``judged``,
        as shown (the selected node with them)."""
        if judged:
            parent = self.sources.get(node.parent) if node.parent is not None else None
            base = (self.selected.id, self.selected.source) if self.selected.source.strip() else None
            return render_node(node, level=level, parent_source=parent, selected=True,
                               code_elsewhere=node.id in self.code_elsewhere, base=base, judged=True)
        key = (node.id, level)
        if key not in self.cache:
            parent = self.sources.get(node.parent) if node.parent is not None else None
            base = (self.selected.id, self.selected.source) if self.selected.source.strip() else None
            self.cache[key] = render_node(node, level=level, parent_source=parent,
                                          selected=node.id == self.selected.id,
                                          code_elsewhere=node.id in self.code_elsewhere, base=base)
        return self.cache[key]


def render_window(window: list[Node], selected: Node, limit: int, *, sources: Mapping[int, str] | None = None,
                  code_elsewhere: Iterable[int] = ()) -> str:
    """The window as text of at most ``limit`` characters (see the module docstring for the rules).

    ``sources`` optionally maps node ids to source code for parents outside the window (better diffs);
    ``code_elsewhere`` lists nodes whose code the prompt already shows (they get a pointer instead).
    """
    limit = max(0, limit)
    nodes = _dedupe([selected, *window])
    root = next((n for n in nodes if n.is_root), None)
    head = [selected] if root is None or root.id == selected.id else [selected, root]
    head_ids = {n.id for n in head}
    others = _priority([n for n in nodes if n.id not in head_ids], selected)
    r = _Renderer(nodes, selected, sources or {}, frozenset(code_elsewhere))
    judged = selected.result.accepted and not selected.is_root  # room for its judge's lines, whether it has any
    budget = limit - (_FOOTER_RESERVE if others else 0) - (JUDGE_ROOM if judged else 0)

    levels = {n.id: FULL for n in head}
    for node in reversed(head):  # degrade the root first, then the selected node
        while _size(r, head, levels) > budget and levels[node.id] < BRIEF:
            levels[node.id] += 1
    used = _size(r, head, levels)

    shown: list[Node] = []
    brief_budget = used + (budget - used) // 2  # half of what is left for coverage, half for detail
    used = _add_brief(r, others, shown, levels, used, brief_budget)
    for node in shown:
        for level in (FULL, CODE):
            if budget - used < 120:
                break
            delta = len(r.text(node, level)) - len(r.text(node, BRIEF))
            if used + delta <= budget:
                levels[node.id] = level
                used += delta
                break
    _add_brief(r, others[len(shown):], shown, levels, used, budget)

    parts = [r.text(n, levels[n.id], judged and n.id == selected.id) for n in [*head, *shown]]
    omitted = len(others) - len(shown)
    if omitted:
        plural = "s" if omitted != 1 else ""
        parts.append(f"({omitted} more related attempt{plural} omitted to fit the window)")
    text = _SEP.join(parts)
    if len(text) > limit:
        marker = "\n[window cut to fit]"
        text = text[: max(0, limit - len(marker))] + marker if limit > len(marker) else text[:limit]
    return text


def _add_brief(r: _Renderer, candidates: list[Node], shown: list[Node], levels: dict[int, int], used: int,
               budget: int) -> int:
    """Append candidates at BRIEF, in order, while they fit; return the new size."""
    for node in candidates:
        cost = len(_SEP) + len(r.text(node, BRIEF))
        if used + cost > budget:
            break
        shown.append(node)
        levels[node.id] = BRIEF
        used += cost
    return used


def _size(r: _Renderer, nodes: list[Node], levels: dict[int, int]) -> int:
    return sum(len(r.text(n, levels[n.id])) for n in nodes) + len(_SEP) * max(0, len(nodes) - 1)
