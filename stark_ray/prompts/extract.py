"""Pull the candidate Python module out of a model reply (:func:`extract_code`).

Which code is taken, in order:

1. ``<think>…</think>`` sections are set aside; code found outside them wins. Only when the answer holds no
   usable code is the thinking searched (with a warning).
2. Every fenced block (``` or ~~~) whose tag is Python-like (``python``, ``py``, ``python3``, none, …) is a
   candidate; a block with another tag (``cpp``, ``text``…) is a candidate only when it parses as Python and
   imports, defines or assigns something. CRLF is normalised, common indentation is removed and, when the
   code only fails because of mixed tabs, leading tabs are expanded.
3. A Python block that does not parse is repaired when possible: a fence line inside a Python string may have
   closed the block early (then a later closing fence is tried), or the model opened a new block without
   closing the previous one (then the block is cut at the inner fence).
4. Among the candidates that parse, the **last** one defining ``class ModelNew`` wins (models revise; a later
   full module supersedes an earlier draft). If that block reads names that it never binds (``torch``,
   ``fused_ext``…) and earlier parsing blocks bind them, those earlier blocks are prepended — the model split
   one module into "kernels" and "model" blocks. If no single block defines ``ModelNew`` but all Python blocks
   joined in order parse and do, the join wins (a class split across blocks). If a block that does not parse
   holds ``class ModelNew``, its syntax error is reported. Otherwise the longest parsing candidate wins, with
   a warning.
5. With no fenced Python at all, the reply itself is tried as bare code: first the whole text, then from the
   first line that starts like Python (``import``, ``from … import``, ``class``, ``def``, ``@``) with trailing
   prose lines dropped one at a time.
6. Nothing parses: a structured error. ``status`` is ``truncated`` when the chosen block never closes (the
   reply was cut), ``syntax`` when it closes but does not parse, ``no_code`` when there is no Python at all.

The function never raises: any input string yields a :class:`ParseOutcome`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

from stark_ray.prompts import pycode
from stark_ray.prompts.fences import (
    C_TAGS,
    PYTHON_TAGS,
    Block,
    find_blocks,
    inner_fence,
    later_closes,
    normalise_newlines,
    strip_thinking,
)

STATUS_OK = "ok"
STATUS_NO_CODE = "no_code"
STATUS_SYNTAX = "syntax"
STATUS_TRUNCATED = "truncated"
_TRIM_LIMIT = 60  # trailing prose lines tried away from bare code


@dataclass(frozen=True)
class ParseOutcome:
    """``code`` parses with ``ast.parse`` whenever it is not None; ``error`` is one line when it is None."""

    code: str | None
    error: str | None = None
    warnings: tuple[str, ...] = ()
    status: str = STATUS_OK

    @property
    def ok(self) -> bool:
        return self.code is not None and self.error is None


@dataclass
class _Candidate:
    code: str
    tree: ast.Module | None
    error: str | None
    index: int  # order of appearance
    closed: bool = True
    python_tag: bool = True
    warnings: list[str] = field(default_factory=list)


def extract_code(reply: str, *, prefer: str = "python") -> ParseOutcome:
    """The candidate module in ``reply`` (see the module docstring for the rules).

    ``prefer`` names the language wanted. ``"python"`` (the default) applies all the rules above. Any other
    tag (``"cpp"``, ``"cuda"``…) returns the last block of that language family as text, unchecked.
    """
    if not isinstance(reply, str):
        return ParseOutcome(None, "the reply is not text", status=STATUS_NO_CODE)
    try:
        return _extract(reply, prefer.lower().strip())
    except Exception as exc:  # a safety net: the rules above are written not to raise
        return ParseOutcome(None, f"parser failure ({type(exc).__name__}); please resend the code",
                            status=STATUS_NO_CODE)


def _extract(reply: str, prefer: str) -> ParseOutcome:
    answer, thinking = strip_thinking(normalise_newlines(reply))
    extract = _from_text if prefer in PYTHON_TAGS else _other_language
    outcome = extract(answer, prefer)
    if outcome.ok or not thinking.strip():
        return outcome
    fallback = extract(thinking, prefer)
    if fallback.ok:
        return replace(fallback, warnings=(*fallback.warnings, "code taken from the thinking section"))
    if outcome.status == STATUS_NO_CODE and fallback.status != STATUS_NO_CODE:
        return replace(fallback, error=f"{fallback.error} (inside the thinking section)")
    return outcome


def _other_language(text: str, prefer: str) -> ParseOutcome:
    lines = text.split("\n")
    family = C_TAGS if prefer in C_TAGS else frozenset({prefer})
    blocks = [b for b in find_blocks(lines) if b.tag in family]
    if not blocks:
        return ParseOutcome(None, f"no ```{prefer} code block found in the reply", status=STATUS_NO_CODE)
    block = blocks[-1]
    code = pycode.tidy(block.content(lines))
    if not block.closed:
        return ParseOutcome(code, None, ("the last code block never closes",), STATUS_OK)
    return ParseOutcome(code)


def _parse_lenient(code: str) -> tuple[str, ast.Module | None, str | None, list[str]]:
    tree, err = pycode.parse(code)
    if tree is not None or "\t" not in code:
        return code, tree, err, []
    for width in (4, 8):
        expanded = pycode.expand_leading_tabs(code, width)
        t2, _ = pycode.parse(expanded)
        if t2 is not None:
            return expanded, t2, None, [f"leading tabs expanded to {width} spaces"]
    return code, None, err, []


def _candidate(lines: list[str], block: Block, index: int) -> _Candidate | None:
    python_tag = block.tag in PYTHON_TAGS or block.tag == ""
    code, tree, err, notes = _parse_lenient(pycode.tidy(block.content(lines)))
    if tree is not None:
        if not tree.body or (not python_tag and not pycode.has_statements(tree)):
            return None
        if not python_tag:
            notes.append(f"a block tagged {block.tag!r} holds the Python code")
        return _Candidate(code, tree, None, index, block.closed, python_tag, notes)
    repaired = _repair(lines, block, index, python_tag)
    if repaired is not None:
        return repaired
    if python_tag or "ModelNew" in code or pycode.CODE_START.search(code):
        return _Candidate(code, None, err, index, block.closed, python_tag, notes)
    return None


def _repair(lines: list[str], block: Block, index: int, python_tag: bool) -> _Candidate | None:
    ends = later_closes(lines, block) if block.closed else []
    inner = inner_fence(lines, block)
    tries = [(end, "a fence line inside a Python string was read as text") for end in ends]
    if inner is not None:
        tries.append((inner, "an unclosed block was cut where the next fence opens"))
    for end, note in tries:
        code, tree, _, notes = _parse_lenient(pycode.tidy("\n".join(lines[block.start:end])))
        if tree is not None and tree.body and (python_tag or pycode.has_statements(tree)):
            return _Candidate(code, tree, None, index, True, python_tag, [*notes, note])
    return None


def _join(parts: list[_Candidate]) -> tuple[str, ast.Module | None]:
    code = "\n\n".join(c.code.rstrip("\n") for c in parts) + "\n"
    tree, _ = pycode.parse(code)
    return code, tree


def _with_helpers(best: _Candidate, earlier: list[_Candidate]) -> _Candidate:
    if best.tree is None:
        return best
    missing = pycode.free_names(best.tree)
    if not missing:
        return best
    helpers = [c for c in earlier if c.tree is not None and pycode.defined_names(c.tree) & missing]
    if not helpers:
        return best
    code, tree = _join([*helpers, best])
    if tree is None or not pycode.defines_model_new(tree):
        return best
    note = f"joined {len(helpers) + 1} code blocks (the ModelNew block uses names defined earlier)"
    return _Candidate(code, tree, None, best.index, True, True, [*best.warnings, note])


def _choose(cands: list[_Candidate]) -> ParseOutcome | None:
    good = [c for c in cands if c.tree is not None]
    with_model = [c for c in good if c.tree is not None and pycode.defines_model_new(c.tree)]
    if with_model:
        best = with_model[-1]
        best = _with_helpers(best, [c for c in good if c.index < best.index and c not in with_model])
        return ParseOutcome(best.code, None, tuple(best.warnings))
    python_blocks = [c for c in cands if c.python_tag]
    if len(python_blocks) >= 2:
        code, tree = _join(python_blocks)
        if tree is not None and pycode.defines_model_new(tree):
            return ParseOutcome(code, None, (f"joined {len(python_blocks)} code blocks into one module",))
    broken_model = [c for c in cands if c.tree is None and "class ModelNew" in c.code]
    if broken_model:
        return _failure(broken_model)  # the block that matters does not parse: say so
    if good:
        best = max(reversed(good), key=lambda c: len(c.code))
        return ParseOutcome(best.code, None, (*best.warnings, "no code block defines class ModelNew"))
    return None


def _failure(cands: list[_Candidate]) -> ParseOutcome:
    named = [c for c in cands if "ModelNew" in c.code]
    worst = (named or sorted(cands, key=lambda c: len(c.code)))[-1]
    if not worst.closed:
        return ParseOutcome(None, f"truncated reply: the last code block never closes and its code does not "
                                  f"parse ({worst.error})", tuple(worst.warnings), STATUS_TRUNCATED)
    return ParseOutcome(None, f"the code block does not parse as Python ({worst.error})",
                        tuple(worst.warnings), STATUS_SYNTAX)


def _from_text(text: str, _prefer: str) -> ParseOutcome:
    lines = text.split("\n")
    blocks = find_blocks(lines)
    cands = [c for i, b in enumerate(blocks) if (c := _candidate(lines, b, i)) is not None]
    chosen = _choose(cands)
    if chosen is not None:
        return chosen
    if cands:
        return _failure(cands)
    outside = list(lines)
    for b in blocks:
        for j in range(b.open_line, min(b.end + 1, len(lines))):
            outside[j] = ""
    return _bare(outside, tags=sorted({b.tag or "untagged" for b in blocks}))


def _bare(lines: list[str], tags: list[str]) -> ParseOutcome:
    """A reply with no fenced Python: maybe it is all code, or prose around unfenced code."""
    whole = pycode.tidy("\n".join(lines))
    code, tree, err, notes = _parse_lenient(whole)
    if tree is not None and pycode.has_statements(tree):
        return ParseOutcome(code, None, (*notes, "the reply has no code fences; took it whole"))
    starts = [i for i, line in enumerate(lines) if pycode.CODE_START.match(line)]
    if starts:
        segment = lines[starts[0]:]
        last_err = err
        for cut in range(min(len(segment), _TRIM_LIMIT)):
            if cut and not segment[len(segment) - cut].strip():
                continue  # dropping a blank line changes nothing
            part = segment[: len(segment) - cut]
            code, tree, last_err, notes = _parse_lenient(pycode.tidy("\n".join(part)))
            if tree is not None and pycode.has_statements(tree):
                note = "the reply has no code fences; took the code between the prose"
                return ParseOutcome(code, None, (*notes, note))
        return ParseOutcome(None, f"unfenced code in the reply does not parse as Python ({last_err})",
                            status=STATUS_SYNTAX)
    found = f" (found blocks tagged: {', '.join(tags)})" if tags else ""
    return ParseOutcome(None, f"no Python code found in the reply{found}; send the complete module in one "
                              f"```python block", status=STATUS_NO_CODE)
