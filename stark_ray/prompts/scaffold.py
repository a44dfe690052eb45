"""The plan agent's reply: an anchored scaffold plus one instruction per anchor, machine-checked.

A plan reply must hold the parent code with anchor marker lines added (``# <<<IMPROVE BEGIN k>>>`` …
``# <<<IMPROVE END k>>>``, see :mod:`stark_ray.prompts.anchors`), normally in one fenced block, and one
``INSTRUCTION k: ...`` per anchor (see :mod:`stark_ray.prompts.instructions`).

:func:`validate_scaffold` rejects, with one line the model can act on: malformed markers; no anchors; an
anchor that does not have exactly one BEGIN followed by one END; nested or overlapping anchors; an anchor
without an instruction (or with an empty one); an instruction naming an anchor the scaffold lacks; and a
scaffold whose text without markers differs from the parent code (compared per line after LF normalisation,
with trailing whitespace and blank lines ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stark_ray.prompts import anchors, pycode
from stark_ray.prompts.fences import (
    find_blocks,
    inner_fence,
    later_closes,
    normalise_newlines,
    strip_thinking,
)
from stark_ray.prompts.instructions import parse_instructions


@dataclass(frozen=True)
class PlanOutcome:
    """``scaffold`` is the best candidate found, set even when ``error`` says why it was rejected."""

    scaffold: str | None
    instructions: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    warnings: tuple[str, ...] = ()
    analysis: str = ""  # what the reply says before its scaffold: the plan agent's reading of the candidate

    @property
    def ok(self) -> bool:
        return self.scaffold is not None and self.error is None and bool(self.instructions)


def validate_scaffold(scaffold: str, instructions: dict[int, str], parent_code: str) -> str | None:
    """None when the scaffold and instructions are consistent with each other and with the parent code."""
    malformed = anchors.find_malformed(scaffold)
    if malformed:
        line, text = malformed[0]
        return (f"malformed anchor marker {text!r} at scaffold line {line}; "
                "write <<<IMPROVE BEGIN k>>> and <<<IMPROVE END k>>> with k a positive integer")
    markers = anchors.find_markers(scaffold)
    error = anchors.balance_error(markers)
    if error is not None:
        return error
    ids = anchors.anchor_ids(markers)
    for k in ids:
        if not instructions.get(k, "").strip():
            return f"anchor {k} has no instruction; add a line 'INSTRUCTION {k}: <what to do in that span>'"
    for k in sorted(instructions):
        if k not in ids:
            have = ", ".join(str(i) for i in ids)
            return f"instruction {k} names anchor {k}, which the scaffold lacks (its anchors: {have})"
    diff = anchors.first_difference(anchors.strip_anchors(scaffold), parent_code)
    if diff is not None:
        return f"the scaffold must be the parent code with only anchor marker lines added: {diff}"
    return None


def check_no_anchors(code: str) -> str | None:
    """None when ``code`` holds no anchor marker (well-formed, malformed, or bare words); else one line."""
    for n, line in enumerate(anchors.normalise(code).split("\n"), start=1):
        hit = anchors.MARKER.search(line) or anchors.LOOSE.search(line) or anchors.REMNANT.search(line)
        if hit is not None:
            return (f"the code still contains the anchor marker {hit.group(0)!r} at line {n}; "
                    "resolve every anchor and delete all markers")
    return None


def parse_plan(reply: str, parent_code: str) -> PlanOutcome:
    """Scaffold and instructions of a plan reply, validated against ``parent_code``; never raises."""
    if not isinstance(reply, str) or not isinstance(parent_code, str):
        return PlanOutcome(None, {}, "the reply is not text")
    try:
        return _parse_plan(reply, parent_code)
    except Exception as exc:  # a safety net: the parsing rules are written not to raise
        return PlanOutcome(None, {}, f"parser failure ({type(exc).__name__}); please resend the plan")


def _parse_plan(reply: str, parent_code: str) -> PlanOutcome:
    answer, _ = strip_thinking(normalise_newlines(reply))
    lines = answer.split("\n")
    found = _locate(lines, parent_code)
    if found is None:
        instructions, _ = parse_instructions(lines)
        return PlanOutcome(None, instructions,
                           "no anchored scaffold found; send the parent code with <<<IMPROVE BEGIN k>>> / "
                           "<<<IMPROVE END k>>> marker lines added, in one ```python block")
    scaffold, used, notes = found
    instructions, error = parse_instructions(lines, used)
    if error is None and not instructions:
        error = "no instructions found; add one line 'INSTRUCTION k: ...' per anchor after the scaffold"
    if error is None:
        error = validate_scaffold(scaffold, instructions, parent_code)
    analysis = "\n".join(lines[:min(used)]).strip() if used else ""
    return PlanOutcome(scaffold, instructions, error, notes, analysis)


def _locate(lines: list[str], parent_code: str) -> tuple[str, set[int], tuple[str, ...]] | None:
    """The scaffold text, the reply lines it occupies, and notes; None when the reply has no anchored code."""
    blocks = [b for b in find_blocks(lines) if anchors.has_markers(b.content(lines))]
    for b in blocks:
        inner = inner_fence(lines, b)
        ends = [b.end, *later_closes(lines, b), *([inner] if inner is not None else [])]
        for end in ends:
            scaffold = pycode.tidy("\n".join(lines[b.start:end]))
            if anchors.same_code(anchors.strip_anchors(scaffold), parent_code):
                notes = () if end == b.end else ("the scaffold block's fences were repaired",)
                return scaffold, set(range(b.open_line, min(end + 1, len(lines)))), notes
    if blocks:
        b = max(reversed(blocks), key=lambda blk: len(anchors.find_markers(blk.content(lines))))
        return pycode.tidy(b.content(lines)), set(range(b.open_line, min(b.end + 1, len(lines)))), ()
    return _unfenced(lines, parent_code)


def _unfenced(lines: list[str], parent_code: str) -> tuple[str, set[int], tuple[str, ...]] | None:
    """Find the scaffold by the parent's first and last lines when the model forgot the fences."""
    wanted = anchors.comparable_lines(parent_code)
    if not wanted:
        return None
    first, last = wanted[0][1].strip(), wanted[-1][1].strip()
    start = next((i for i, line in enumerate(lines) if line.strip() == first), None)
    if start is None:
        return None
    end = next((i for i in range(len(lines) - 1, start - 1, -1) if lines[i].strip() == last), None)
    if end is None:
        return None
    while start > 0 and anchors.strip_line(lines[start - 1]) is None:
        start -= 1
    while end + 1 < len(lines) and anchors.strip_line(lines[end + 1]) is None:
        end += 1
    scaffold = pycode.tidy("\n".join(lines[start:end + 1]))
    if not anchors.has_markers(scaffold):
        return None
    return scaffold, set(range(start, end + 1)), ("the scaffold was not in a code block",)
