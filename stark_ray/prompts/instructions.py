"""Numbered instructions of a plan reply, and the one-line plan of the single agent.

Instruction format (what the plan prompt asks for)::

    INSTRUCTION 1: Replace the two elementwise ops with one fused kernel ...
    (more lines of instruction 1, until the next label)
    INSTRUCTION 2: ...

Tolerated variants of a label: any case, markdown bold or headings, a list bullet, ``#`` before the number,
and ``:`` ``.`` ``)`` ``-`` or a dash as separator — ``**Instruction 1:**``, ``### Instruction 2``,
``- INSTRUCTION #3 - ...``. Without a separator, bold or heading the line is prose (``Instruction 1 wraps the
loop`` is not a label). ``ANCHOR k:`` labels are used only when no ``INSTRUCTION`` label exists. As a last
resort, a numbered list (``1.`` / ``2)``) right under an ``Instructions`` heading is read the same way.

An instruction runs from its label to the next label, to the scaffold block, to a markdown heading, or to the
end of the text. Lines inside other fenced blocks (a code snippet inside an instruction) are kept as text and
are never read as labels.
"""

from __future__ import annotations

import re

from stark_ray.prompts.fences import find_blocks

# Written so that no two whitespace runs can trade characters (no polynomial backtracking on long lines).
_BOLD = r"(?:\*\*|__)"
_LABEL = re.compile(
    rf"^[ \t]*(?:[-*+][ \t]+)?(?P<head>#{{1,6}}[ \t]*)?(?:{_BOLD}[ \t]*)?"
    r"(?P<word>instruction|anchor)[ \t]*(?:#[ \t]*)?(?P<k>\d{1,9})"
    rf"(?P<tail>.*)$",
    re.IGNORECASE,
)
_TAIL = re.compile(rf"^[ \t]*(?P<bold>{_BOLD})?(?:[ \t]*(?P<sep>[:.)\-–—]))?")
_ITEM = re.compile(r"^[ \t]*(?:\*\*)?(?P<k>\d{1,9})(?:\*\*)?[.)](?:\*\*)?[ \t]+(?P<rest>.*)$")
_MD_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]")
_PLAN = re.compile(rf"^[ \t]*(?:[-*+][ \t]+)?(?:#{{1,6}}[ \t]*)?(?:{_BOLD}[ \t]*)?plan(?P<tail>.*)$",
                   re.IGNORECASE)
_PLAN_TAIL = re.compile(rf"^[ \t]*(?:{_BOLD}[ \t]*)?:")


def _strip_markup(text: str) -> str:
    """Drop the markdown left over from a label: a leading bold marker and colon, an unpaired trailing one."""
    text = text.strip()
    for token in ("**", "__"):
        if text.startswith(token) and text[len(token):len(token) + 1] in ("", " ", "\t", ":"):
            text = text[len(token):].strip()
            break
    text = text.removeprefix(":").strip()
    if text.endswith("**") and text.count("**") % 2 == 1:
        text = text[:-2].rstrip()
    return text


def _is_instructions_heading(line: str) -> bool:
    body = line.strip().lstrip("#").strip().strip("*_").strip().rstrip(":").strip().strip("*_").strip()
    return body.rstrip(":").strip().lower() in ("instructions", "instruction")


Labels = list[tuple[int, int, str]]  # (line index, anchor number, text on the label line)


def _code_lines(lines: list[str]) -> set[int]:
    inside: set[int] = set()
    for b in find_blocks(lines):
        inside.update(range(b.open_line, min(b.end + 1, len(lines))))
    return inside


def _labels(lines: list[str], skip: set[int], word: str) -> Labels:
    out: Labels = []
    for i, line in enumerate(lines):
        if i in skip:
            continue
        m = _LABEL.match(line)
        if m is None or m.group("word").lower() != word:
            continue
        tail = m.group("tail")
        t = _TAIL.match(tail)
        rest = _strip_markup(tail[t.end():] if t else tail)
        heading_alone = m.group("head") is not None and not rest
        if t is not None and (t.group("sep") or t.group("bold") or heading_alone):
            out.append((i, int(m.group("k")), rest))
    return out


def _list_items(lines: list[str], skip: set[int]) -> Labels:
    heads = [i for i, line in enumerate(lines) if i not in skip and _is_instructions_heading(line)]
    if not heads:
        return []
    out: Labels = []
    for i in range(heads[-1] + 1, len(lines)):
        if i in skip:
            continue
        if _MD_HEADING.match(lines[i]):
            break
        m = _ITEM.match(lines[i])
        if m is not None:
            out.append((i, int(m.group("k")), m.group("rest")))
    return out


def _stop(i: int, line: str, stops: set[int], label_lines: set[int]) -> bool:
    return i in stops or i in label_lines or bool(_MD_HEADING.match(line))


def parse_instructions(lines: list[str], stops: set[int] | None = None) -> tuple[dict[int, str], str | None]:
    """Instructions keyed by anchor number, and an error (one line) or None.

    ``stops`` are line indices that end an instruction and are never read (the scaffold block's lines).
    """
    stops = stops or set()
    skip = _code_lines(lines) | stops
    labels = _labels(lines, skip, "instruction") or _labels(lines, skip, "anchor") or _list_items(lines, skip)
    out: dict[int, str] = {}
    label_lines = {i for i, _, _ in labels}
    for i, k, rest in labels:
        if k in out:
            return out, f"instruction {k} is given twice; give exactly one INSTRUCTION {k}: line"
        body = [rest]
        j = i + 1
        while j < len(lines) and not _stop(j, lines[j], stops, label_lines):
            body.append(lines[j])
            j += 1
        out[k] = "\n".join(body).strip()
    return out, None


def extract_plan_line(text: str) -> str | None:
    """The text of the first ``PLAN: ...`` line outside code blocks (whitespace collapsed), or None."""
    lines = text.split("\n")
    skip = _code_lines(lines)
    for i, line in enumerate(lines):
        if i in skip:
            continue
        m = _PLAN.match(line)
        t = _PLAN_TAIL.match(m.group("tail")) if m is not None else None
        if m is not None and t is not None:
            plan = " ".join(_strip_markup(m.group("tail")[t.end():]).replace("**", " ").split())
            return plan[:600] if plan else None
    return None
