"""Fenced code blocks in a model reply, found line by line.

A fence opens on a line made of optional indentation, three or more backticks or tildes, and an optional
info string (``python``, ``py title="x"``, ``cpp``). It closes on a line holding only the same fence
character, at least as many times, and optional whitespace. Unlike CommonMark, any indentation is accepted
(models indent fences inside list items). A fence that never closes runs to the end of the text and is
marked ``closed=False`` (the reply was probably truncated).

Everything here is plain text processing: it never raises on any ``str``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_OPEN = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)$")
_THINK_TAG = re.compile(r"<(/?)(?:think|thinking|reasoning)>", re.IGNORECASE)

PYTHON_TAGS = frozenset({"python", "py", "python3", "py3", "ipython", "ipython3", "python2", "pytorch",
                         "torch"})
C_TAGS = frozenset({"c", "cpp", "c++", "cxx", "cc", "h", "hpp", "cuda", "cu", "cuh"})


@dataclass(frozen=True)
class Block:
    """One fenced block: ``lines[start:end]`` of the normalised text is its content."""

    tag: str  # normalised language tag, "" when the fence had none
    fence: str  # the opening fence itself, e.g. "```" or "~~~~"
    open_line: int  # index of the opening fence line
    start: int  # first content line
    end: int  # one past the last content line (the closing fence line, or len(lines))
    closed: bool

    def content(self, lines: list[str]) -> str:
        return "\n".join(lines[self.start:self.end])


def normalise_newlines(text: str) -> str:
    """CRLF and lone CR become LF; a leading byte-order mark goes."""
    return text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")


def normalise_tag(info: str) -> str:
    """``Python title="x"`` -> ``python``; ``{.cpp}`` -> ``cpp``; ``python:model.py`` -> ``python``."""
    info = info.strip().lstrip("{").lstrip(".").lower()
    match = re.match(r"[a-z0-9_+#-]*", info)
    return match.group(0) if match else ""


def strip_thinking(text: str) -> tuple[str, str]:
    """Split a reply into (answer, thinking), in one linear pass over the tags.

    ``<think>…</think>`` sections (also ``<thinking>``, ``<reasoning>``) go to the thinking. A closing tag
    without an opening one (some APIs drop the opening tag) sends everything before it to the thinking. An
    opening tag that never closes sends everything after it to the thinking. Nested opening tags inside a
    thinking section are ignored. The thinking is returned so a caller can fall back to it when the answer
    holds no code.
    """
    answer: list[str] = []
    thinking: list[str] = []
    pos = 0
    open_at: int | None = None
    for m in _THINK_TAG.finditer(text):
        closing = bool(m.group(1))
        if not closing and open_at is None:
            answer.append(text[pos:m.start()])
            open_at = m.end()
        elif closing and open_at is not None:
            thinking.append(text[open_at:m.start()])
            answer.append("\n")
            open_at, pos = None, m.end()
        elif closing:  # a stray closing tag: what came before was thinking
            thinking.append("".join(answer) + text[pos:m.start()])
            answer, pos = [], m.end()
    if open_at is not None:
        thinking.append(text[open_at:])
    else:
        answer.append(text[pos:])
    return "".join(answer), "\n".join(thinking)


def _is_close(line: str, fence: str) -> bool:
    body = line.strip()
    return len(body) >= len(fence) and body[0] == fence[0] and body == fence[0] * len(body)


def find_blocks(lines: list[str]) -> list[Block]:
    """All top-level fenced blocks, in order."""
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if match is None or (match.group("fence")[0] == "`" and "`" in match.group("info")):
            i += 1
            continue
        fence = match.group("fence")
        j = i + 1
        while j < len(lines) and not _is_close(lines[j], fence):
            j += 1
        closed = j < len(lines)
        blocks.append(Block(normalise_tag(match.group("info")), fence, i, i + 1, j, closed))
        i = j + 1
    return blocks


def later_closes(lines: list[str], block: Block, limit: int = 24) -> list[int]:
    """Line indices after ``block.end`` that could also close it (nearest first, at most ``limit``).

    Used to repair a block cut short by a fence line that sat inside a Python string.
    """
    out: list[int] = []
    for j in range(block.end + 1, len(lines)):
        if _is_close(lines[j], block.fence):
            out.append(j)
            if len(out) >= limit:
                break
    return out


def inner_fence(lines: list[str], block: Block) -> int | None:
    """The first line inside ``block`` that looks like a fence (an unclosed block followed by a new one)."""
    for j in range(block.start, block.end):
        if _OPEN.match(lines[j]) is not None:
            return j
    return None
