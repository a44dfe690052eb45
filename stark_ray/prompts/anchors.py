"""Span anchors of grounded instructions: ``<<<IMPROVE BEGIN k>>>`` … ``<<<IMPROVE END k>>>``.

Marker syntax
    ``<<<IMPROVE BEGIN k>>>`` and ``<<<IMPROVE END k>>>`` with k a positive integer. Matching ignores case and
    tolerates extra spaces inside the brackets (``<<< improve  begin 2 >>>``). Anything else that starts
    with ``<<<`` followed by ``IMPROVE`` is a *malformed* marker (``<<<IMPROVE BEGIN>>>``,
    ``<<<IMPROVE START 1>>>``).

What stripping removes (:func:`strip_anchors`)
    1. A *marker line* — a line holding nothing but whitespace, optionally one comment opener (``#``,
       ``//``, ``/*``, ``*`` or ``--``), one or more markers, and optionally a closing ``*/`` — is deleted
       together with its newline. This is the form the prompts ask for: ``# <<<IMPROVE BEGIN 1>>>`` in Python,
       ``// <<<IMPROVE BEGIN 1>>>`` in C++/CUDA source held in a Python string.
    2. On any other line, a trailing comment that holds only markers (``x = 1  # <<<IMPROVE END 1>>>``)
       or a ``/* marker */`` comment is deleted with the whitespace before it; then every remaining marker is
       deleted with the spaces that follow it (``foo(<<<IMPROVE BEGIN 1>>>a)`` -> ``foo(a)``). A line changed
       this way loses its trailing whitespace.
    Nothing else is touched, so the result is the parent code again whenever the plan agent only added
    markers.

Comparing a scaffold with its parent (:func:`same_code`)
    Both texts get LF line endings, each line loses its trailing whitespace, and blank lines are dropped; the
    remaining lines must be identical (leading indentation matters: it is Python syntax).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARK = r"<<<[ \t]*IMPROVE[ \t]+(?:BEGIN|END)[ \t]+\d{1,9}[ \t]*>>>"
MARKER = re.compile(r"<<<[ \t]*IMPROVE[ \t]+(BEGIN|END)[ \t]+(\d{1,9})[ \t]*>>>", re.IGNORECASE)
REMNANT = re.compile(r"\bIMPROVE[ \t]+(?:BEGIN|END)\b")  # marker words left behind without the brackets
LOOSE = re.compile(r"<<<[ \t]*IMPROVE\b[^\n]{0,40}?>>>|<<<[ \t]*IMPROVE\b", re.IGNORECASE)
_MARKER_LINE = re.compile(
    rf"^[ \t]*(?:(?:#|//|/\*|\*|--)[ \t]*)?(?:{_MARK}[ \t]*)+(?:\*/[ \t]*)?$", re.IGNORECASE)
# No pattern starts with a whitespace run, so searching a long line stays linear.
_TRAILING_COMMENT = re.compile(rf"(?:#|//)[ \t]*(?:{_MARK}[ \t]*)+$", re.IGNORECASE)
_BLOCK_COMMENT = re.compile(rf"/\*[ \t]*(?:{_MARK}[ \t]*)+\*/[ \t]?", re.IGNORECASE)
_INLINE = re.compile(rf"{_MARK}[ \t]*", re.IGNORECASE)


@dataclass(frozen=True)
class Marker:
    kind: str  # "BEGIN" or "END"
    k: int
    line: int  # 1-based line of the text it was found in
    text: str


def normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def find_markers(text: str) -> list[Marker]:
    """Well-formed markers in order of appearance."""
    out: list[Marker] = []
    for n, line in enumerate(normalise(text).split("\n"), start=1):
        for m in MARKER.finditer(line):
            out.append(Marker(m.group(1).upper(), int(m.group(2)), n, m.group(0)))
    return out


def find_malformed(text: str) -> list[tuple[int, str]]:
    """(line, text) of every ``<<<IMPROVE…`` occurrence that is not a well-formed marker, and of marker words
    left without their brackets (``# IMPROVE BEGIN 1``)."""
    out: list[tuple[int, str]] = []
    for n, line in enumerate(normalise(text).split("\n"), start=1):
        cleaned = MARKER.sub("", line)
        out.extend((n, m.group(0)) for m in LOOSE.finditer(cleaned))
        out.extend((n, m.group(0)) for m in REMNANT.finditer(LOOSE.sub("", cleaned)))
    return out


def has_markers(text: str) -> bool:
    return MARKER.search(text) is not None or LOOSE.search(text) is not None


def strip_line(line: str) -> str | None:
    """One line with its markers removed; None when the whole line goes (see the module docstring)."""
    if MARKER.search(line) is None:
        return line
    if _MARKER_LINE.match(line):
        return None
    line = _TRAILING_COMMENT.sub("", line).rstrip() if _TRAILING_COMMENT.search(line) else line
    line = _BLOCK_COMMENT.sub("", line)
    line = _INLINE.sub("", line)
    return line.rstrip()


def strip_anchors(text: str) -> str:
    """``text`` without its markers (LF line endings)."""
    kept = [s for s in (strip_line(line) for line in normalise(text).split("\n")) if s is not None]
    return "\n".join(kept)


def comparable_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) pairs used to compare code: trailing whitespace and blank lines dropped."""
    out: list[tuple[int, str]] = []
    for n, line in enumerate(normalise(text).split("\n"), start=1):
        body = line.rstrip()
        if body:
            out.append((n, body))
    return out


def _clip(s: str, n: int = 80) -> str:
    s = s.strip()
    return s if len(s) <= n else s[: n - 3] + "..."


def first_difference(code: str, parent: str) -> str | None:
    """None when ``code`` equals ``parent`` whitespace-tolerantly; otherwise a one-line description."""
    a, b = comparable_lines(code), comparable_lines(parent)
    for (_, got), (pn, want) in zip(a, b, strict=False):
        if got != want:
            return f"parent line {pn} should read {_clip(want)!r} but the scaffold has {_clip(got)!r}"
    if len(a) > len(b):
        return f"the scaffold adds text after the end of the parent code: {_clip(a[len(b)][1])!r}"
    if len(a) < len(b):
        pn, want = b[len(a)]
        return f"the scaffold stops before parent line {pn} ({_clip(want)!r}); keep the whole parent code"
    return None


def same_code(code: str, parent: str) -> bool:
    return first_difference(code, parent) is None


def balance_error(markers: list[Marker]) -> str | None:
    """Each anchor k must have exactly one BEGIN followed by one END; anchors may not nest or overlap."""
    if not markers:
        return ("the scaffold has no anchors; wrap each region to change in "
                "<<<IMPROVE BEGIN k>>> ... <<<IMPROVE END k>>> marker lines")
    open_k: int | None = None
    seen: set[int] = set()
    for m in markers:
        if m.k < 1:
            return f"anchor numbers must be positive integers, line {m.line} has {m.text!r}"
        if m.kind == "BEGIN":
            if open_k is not None:
                return (f"anchor {m.k} begins at line {m.line} inside anchor {open_k}; "
                        "anchors may not nest or overlap")
            if m.k in seen:
                return f"anchor {m.k} begins twice (again at line {m.line}); use each number once"
            open_k = m.k
            seen.add(m.k)
        elif open_k is None:
            return f"<<<IMPROVE END {m.k}>>> at line {m.line} has no matching BEGIN before it"
        elif m.k != open_k:
            return f"<<<IMPROVE END {m.k}>>> at line {m.line} while anchor {open_k} is still open"
        else:
            open_k = None
    if open_k is not None:
        return f"anchor {open_k} is never closed; add <<<IMPROVE END {open_k}>>>"
    return None


def anchor_ids(markers: list[Marker]) -> list[int]:
    return sorted({m.k for m in markers})


def insert_anchors(code: str, spans: dict[int, tuple[int, int]], comment: str = "#") -> str:
    """Wrap 0-based line ranges ``[start, end)`` of ``code`` in marker lines (used by tests and examples).

    Spans must not overlap; an empty span (start == end) is an insertion point. Markers take the indentation
    of the first wrapped line (or of the line they precede).
    """
    lines = normalise(code).split("\n")
    begins: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for k, (start, end) in sorted(spans.items(), key=lambda kv: kv[1]):
        begins.setdefault(start, []).append(k)
        ends.setdefault(end, []).append(k)
    out: list[str] = []
    for i in range(len(lines) + 1):
        ref = lines[i] if i < len(lines) else ""
        indent = ref[: len(ref) - len(ref.lstrip())]
        for k in ends.get(i, []):
            if k not in begins.get(i, []):
                out.append(f"{indent}{comment} <<<IMPROVE END {k}>>>")
        for k in begins.get(i, []):
            out.append(f"{indent}{comment} <<<IMPROVE BEGIN {k}>>>")
            if spans[k][1] == i:
                out.append(f"{indent}{comment} <<<IMPROVE END {k}>>>")
        if i < len(lines):
            out.append(lines[i])
    return "\n".join(out)
