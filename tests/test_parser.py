"""Reply parsing: fuzzing (never raises), round-trips through realistic wrappings, anchors, and a corpus."""

from __future__ import annotations

import ast
import json
import keyword
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stark_ray.prompts.anchors import strip_anchors
from stark_ray.prompts.parser import (
    check_no_anchors,
    extract_code,
    extract_plan_line,
    find_markers,
    insert_anchors,
    parse_plan,
    validate_scaffold,
)

REPLIES = Path(__file__).parent / "data" / "replies"
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ------------------------------------------------------------------------------------------
IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
SAFE_TEXT = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd", "Zs"), max_codepoint=0x24F),
                    max_size=30)
PROSE_LINE = st.text(st.characters(blacklist_characters="`~<>\r\n\\\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
                                   blacklist_categories=("Cs", "Cc")), max_size=60)
TOKENS = st.sampled_from([
    "```", "```python", "```py\n", "~~~", "~~~python", "````", "```cpp", "\n", "\r\n", "\r", "\t", "    ",
    "<think>", "</think>", "Thinking:", "class ModelNew(nn.Module):\n    pass\n", "import torch\n",
    "def forward(self, x):\n", "return x\n", '"""', "'''", "#", "//", "<<<IMPROVE BEGIN 1>>>",
    "<<<IMPROVE END 1>>>", "<<< improve begin 2 >>>", "<<<IMPROVE BEGIN>>>", "INSTRUCTION 1:",
    "**Instruction 2:**", "## Instructions\n1. ", "PLAN: ", "x = (", ")", "\x00", "\ufeff", "é", "🙂",
])
SOUP = st.one_of(st.text(max_size=400), st.lists(st.one_of(TOKENS, SAFE_TEXT), max_size=60).map("".join))


@st.composite
def modules(draw: st.DrawFn) -> str:
    """A small valid Python module that defines ModelNew, sometimes with C++ source in a string."""
    names = draw(st.lists(IDENT, min_size=1, max_size=5, unique=True))
    lines = ["import torch", "import torch.nn as nn", ""]
    if draw(st.booleans()):
        n = draw(st.integers(0, 99))
        lines += ['src = r"""', "#include <torch/extension.h>", "// a comment in C++",
                  f"int f(int x) {{ return x + {n}; }}", '"""', ""]
    for name in names:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            lines.append(f"{name}_v = {draw(st.integers(-1000, 1000))}")
        elif kind == 1:
            lines += [f"def {name}_f(x):", f"    return x * {draw(st.integers(0, 9))}", ""]
        else:
            text = draw(SAFE_TEXT).replace('"', "")
            lines.append(f'{name}_s = "{text}"')
    lines += ["", "class ModelNew(nn.Module):", "    def __init__(self):", "        super().__init__()", "",
              "    def forward(self, x):", f"        return x + {draw(st.integers(0, 9))}"]
    return "\n".join(lines)


@st.composite
def wrapped(draw: st.DrawFn) -> tuple[str, str]:
    """(reply, code): the code in a fenced block among prose, thinking, decoy blocks, CRLF..."""
    code = draw(modules())
    fence = draw(st.sampled_from(["```", "~~~", "````"]))
    tag = draw(st.sampled_from(["python", "py", "python3", "Python", "", "cpp", "PYTHON", "py3", "python "]))
    indent = draw(st.sampled_from(["", "", "  ", "    "]))
    body = "\n".join(indent + line if line else line for line in code.split("\n"))
    block = f"{indent}{fence}{tag}\n{body}\n{indent}{fence}"
    parts = [draw(PROSE_LINE) for _ in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()):
        draft = "```python\nclass ModelNew:\n    draft = 1\n```"
        parts.insert(0, f"<think>\n{draw(PROSE_LINE)}\n{draft}\n</think>")
    if draw(st.booleans()):
        parts.append("```cpp\n__global__ void k(float* x) { x[threadIdx.x] = 0.f; }\n```")
    if draw(st.booleans()):
        parts.append("```python\nimport torch\n\nclass Model(torch.nn.Module):\n    pass\n```")
    parts.append(block)
    parts += [draw(PROSE_LINE) for _ in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()):
        parts.append("```bash\npip install torch\n```")
    head, tail = draw(st.sampled_from(["", " ", "\n\n"])), draw(st.sampled_from(["", "\n", "  \n"]))
    reply = head + "\n\n".join(parts) + tail
    if draw(st.booleans()):
        reply = reply.replace("\n", "\r\n")
    return reply, code


# --- never raises ----------------------------------------------------------------------------------------
@FUZZ
@given(SOUP)
def test_extract_code_never_raises_and_code_parses(text: str) -> None:
    out = extract_code(text)
    assert (out.code is None) == (out.error is not None)
    if out.code is not None:
        ast.parse(out.code)
    else:
        assert "\n" not in out.error


@FUZZ
@given(SOUP, SOUP)
def test_plan_parsing_never_raises(text: str, parent: str) -> None:
    out = parse_plan(text, parent)
    assert out.ok == (out.error is None and out.scaffold is not None)
    if out.error is not None:
        assert "\n" not in out.error
    validate_scaffold(text, {1: "x"}, parent)
    check_no_anchors(text)
    strip_anchors(text)
    extract_plan_line(text)
    extract_code(text, prefer="cpp")


def test_non_text_inputs_do_not_raise() -> None:
    assert not extract_code(None).ok  # type: ignore[arg-type]
    assert not parse_plan(b"bytes", "x").ok  # type: ignore[arg-type]


# --- round trips ---------------------------------------------------------------------------------------
@FUZZ
@given(wrapped())
def test_wrapped_code_is_recovered(case: tuple[str, str]) -> None:
    reply, code = case
    out = extract_code(reply)
    assert out.ok, (out.error, reply)
    assert out.code == code + "\n"


@FUZZ
@given(modules(), st.sampled_from(["", "\n", "  \n\n"]), st.booleans())
def test_bare_code_is_recovered(code: str, pad: str, crlf: bool) -> None:
    reply = pad + code + pad
    out = extract_code(reply.replace("\n", "\r\n") if crlf else reply)
    assert out.ok and out.code == code + "\n"


# --- anchors -------------------------------------------------------------------------------------------
@st.composite
def anchored(draw: st.DrawFn) -> tuple[str, str, dict[int, str]]:
    """(parent, scaffold, instructions) with 1..4 anchors at random line ranges."""
    code = draw(modules())
    n = len(code.split("\n"))
    k = draw(st.integers(1, 4))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=2 * k, max_size=2 * k)))
    spans = {k + 1: (cuts[2 * k], cuts[2 * k + 1]) for k in range(len(cuts) // 2)}
    comment = draw(st.sampled_from(["#", "# ", "//"]))
    scaffold = insert_anchors(code, spans, comment=comment.strip())
    instructions = {k: f"do thing {k} " + draw(SAFE_TEXT).strip() for k in spans}
    return code, scaffold, instructions


def _reply(scaffold: str, instructions: dict[int, str], style: str) -> str:
    if style == "bold":
        lines = [f"**Instruction {k}:** {v}" for k, v in instructions.items()]
    elif style == "list":
        lines = ["## Instructions"] + [f"{k}. {v}" for k, v in instructions.items()]
    else:
        lines = [f"INSTRUCTION {k}: {v}" for k, v in instructions.items()]
    return "Analysis first.\n\n```python\n" + scaffold + "\n```\n\n" + "\n".join(lines) + "\n"


@FUZZ
@given(anchored(), st.sampled_from(["plain", "bold", "list"]), st.booleans())
def test_anchored_scaffold_validates_and_parses(case: tuple[str, str, dict[int, str]], style: str,
                                                crlf: bool) -> None:
    parent, scaffold, instructions = case
    assert validate_scaffold(scaffold, instructions, parent) is None
    assert strip_anchors(scaffold) == parent
    reply = _reply(scaffold, instructions, style)
    out = parse_plan(reply.replace("\n", "\r\n") if crlf else reply, parent)
    assert out.ok, out.error
    assert out.instructions == {k: v.strip() for k, v in instructions.items()}
    assert {m.k for m in find_markers(out.scaffold or "")} == set(instructions)


@FUZZ
@given(anchored())
def test_instruction_for_missing_anchor_is_rejected(case: tuple[str, str, dict[int, str]]) -> None:
    parent, scaffold, instructions = case
    extra = max(instructions) + 1
    error = validate_scaffold(scaffold, {**instructions, extra: "ghost"}, parent)
    assert error is not None and f"anchor {extra}" in error


@FUZZ
@given(anchored())
def test_anchor_without_instruction_is_rejected(case: tuple[str, str, dict[int, str]]) -> None:
    parent, scaffold, instructions = case
    k = min(instructions)
    rest = {i: v for i, v in instructions.items() if i != k}
    error = validate_scaffold(scaffold, rest, parent)
    assert error is not None and f"anchor {k} has no instruction" in error


@FUZZ
@given(anchored(), st.data())
def test_edited_code_line_is_rejected(case: tuple[str, str, dict[int, str]], data: st.DataObject) -> None:
    parent, scaffold, instructions = case
    lines = scaffold.split("\n")
    editable = [i for i, line in enumerate(lines) if line.strip() and not find_markers(line)]
    i = data.draw(st.sampled_from(editable))
    how = data.draw(st.sampled_from(["append", "delete", "insert"]))
    if how == "append":
        lines[i] += "  # edited"
    elif how == "delete":
        del lines[i]
    else:
        lines.insert(i, "extra = 1")
    error = validate_scaffold("\n".join(lines), instructions, parent)
    assert error is not None and "parent code" in error


@FUZZ
@given(anchored(), st.data())
def test_unbalanced_anchors_are_rejected(case: tuple[str, str, dict[int, str]], data: st.DataObject) -> None:
    parent, scaffold, instructions = case
    lines = scaffold.split("\n")
    markers = [i for i, line in enumerate(lines) if find_markers(line)]
    i = data.draw(st.sampled_from(markers))
    if data.draw(st.booleans()):
        del lines[i]
    else:
        lines.insert(i, lines[i])
    assert validate_scaffold("\n".join(lines), instructions, parent) is not None


@FUZZ
@given(modules())
def test_scaffold_without_anchors_is_rejected(code: str) -> None:
    error = validate_scaffold(code, {}, code)
    assert error is not None and "no anchors" in error
    assert not parse_plan(f"```python\n{code}\n```\nINSTRUCTION 1: x", code).ok


def test_nested_and_crossed_anchors_are_rejected() -> None:
    parent = "a = 1\nb = 2\nc = 3\n"
    nested = ("# <<<IMPROVE BEGIN 1>>>\na = 1\n# <<<IMPROVE BEGIN 2>>>\nb = 2\n# <<<IMPROVE END 2>>>\n"
              "# <<<IMPROVE END 1>>>\nc = 3\n")
    crossed = ("# <<<IMPROVE BEGIN 1>>>\na = 1\n# <<<IMPROVE BEGIN 2>>>\nb = 2\n# <<<IMPROVE END 1>>>\n"
               "# <<<IMPROVE END 2>>>\nc = 3\n")
    backwards = "# <<<IMPROVE END 1>>>\na = 1\n# <<<IMPROVE BEGIN 1>>>\nb = 2\nc = 3\n"
    twice = ("# <<<IMPROVE BEGIN 1>>>\na = 1\n# <<<IMPROVE END 1>>>\n# <<<IMPROVE BEGIN 1>>>\nb = 2\n"
             "# <<<IMPROVE END 1>>>\nc = 3\n")
    for scaffold in (nested, crossed, backwards, twice):
        assert validate_scaffold(scaffold, {1: "x", 2: "y"}, parent) is not None
    zero = "# <<<IMPROVE BEGIN 0>>>\na = 1\n# <<<IMPROVE END 0>>>\nb = 2\nc = 3\n"
    assert "positive" in (validate_scaffold(zero, {0: "x"}, parent) or "")
    malformed = "# <<<IMPROVE BEGIN>>>\na = 1\n# <<<IMPROVE END 1>>>\nb = 2\nc = 3\n"
    assert "malformed" in (validate_scaffold(malformed, {1: "x"}, parent) or "")


# --- anchor stripping rules ----------------------------------------------------------------------------
@pytest.mark.parametrize(("line", "expected"), [
    ("# <<<IMPROVE BEGIN 1>>>", None),
    ("    // <<<IMPROVE END 12>>>", None),
    ("<<< improve  begin 3 >>>", None),
    ("  /* <<<IMPROVE BEGIN 1>>> */", None),
    ("# <<<IMPROVE END 1>>> <<<IMPROVE BEGIN 2>>>", None),
    ("x = 1  # <<<IMPROVE END 1>>>", "x = 1"),
    ("int i = 0; // <<<IMPROVE BEGIN 4>>>", "int i = 0;"),
    ("    <<<IMPROVE BEGIN 1>>> x = 1", "    x = 1"),
    ("foo(<<<IMPROVE BEGIN 1>>>a, b<<<IMPROVE END 1>>>)", "foo(a, b)"),
    ("a /* <<<IMPROVE BEGIN 2>>> */ + b", "a + b"),
    ("x = 1  # keep <<<IMPROVE END 1>>>", "x = 1  # keep"),
    ("no markers here  ", "no markers here  "),
])
def test_strip_line_rules(line: str, expected: str | None) -> None:
    from stark_ray.prompts.anchors import strip_line

    assert strip_line(line) == expected


def test_whitespace_tolerant_comparison() -> None:
    parent = "import torch\n\n\ndef f(x):\n    return x\n"
    scaffold = ("import torch   \r\n\r\ndef f(x):\r\n    # <<<IMPROVE BEGIN 1>>>\r\n    return x\t\r\n"
                "# <<<IMPROVE END 1>>>")
    assert validate_scaffold(scaffold, {1: "go"}, parent) is None
    indented = scaffold.replace("    return x", "        return x")
    assert validate_scaffold(indented, {1: "go"}, parent) is not None  # indentation is Python syntax


def test_check_no_anchors() -> None:
    assert check_no_anchors("x = 1\n# improve the beginning\n") is None
    assert "line 2" in (check_no_anchors("x = 1\n# <<<IMPROVE BEGIN 1>>>\n") or "")
    assert check_no_anchors("x = 1  # <<<improve end 3>>>") is not None
    assert check_no_anchors("// <<<IMPROVE BEGIN>>>") is not None
    assert check_no_anchors("# IMPROVE END 2") is not None


def test_plan_line() -> None:
    assert extract_plan_line("intro\n**PLAN:** fuse the ops\n```python\nPLAN: no\n```") == "fuse the ops"
    assert extract_plan_line("```python\nPLAN: inside code\n```") is None
    assert extract_plan_line("Plan: tile it") == "tile it"


def test_unfenced_plan_is_found_by_the_parent() -> None:
    parent = "import torch\n\ndef f(x):\n    return x + 1\n"
    reply = ("Here is the plan.\nimport torch\n\ndef f(x):\n    # <<<IMPROVE BEGIN 1>>>\n    return x + 1\n"
             "    # <<<IMPROVE END 1>>>\n\nINSTRUCTION 1: vectorize\n")
    out = parse_plan(reply, parent)
    assert out.ok, out.error
    assert out.instructions == {1: "vectorize"}


def test_instruction_with_code_snippet_and_prose_label() -> None:
    parent = "a = 1\nb = 2\n"
    reply = ("Instruction 1 wraps the first line (prose, not a label).\n```python\n# <<<IMPROVE BEGIN 1>>>\n"
             "a = 1\n# <<<IMPROVE END 1>>>\nb = 2\n```\nINSTRUCTION 1: replace with\n```python\n"
             "INSTRUCTION 2: not a label inside code\na = 2\n```\n")
    out = parse_plan(reply, parent)
    assert out.ok, out.error
    assert "not a label inside code" in out.instructions[1]


def test_duplicate_instruction_is_rejected() -> None:
    parent = "a = 1\n"
    reply = ("```python\n# <<<IMPROVE BEGIN 1>>>\na = 1\n# <<<IMPROVE END 1>>>\n```\n"
             "INSTRUCTION 1: x\nINSTRUCTION 1: y\n")
    out = parse_plan(reply, parent)
    assert not out.ok and "twice" in (out.error or "")


def test_prefer_other_language() -> None:
    reply = "```cuda\n__global__ void k() {}\n```\n```python\nimport torch\n```"
    out = extract_code(reply, prefer="cpp")
    assert out.ok and "__global__" in (out.code or "")
    assert not extract_code("```python\nx = 1\n```", prefer="cuda").ok


# --- corpus of realistic replies -------------------------------------------------------------------------
CORPUS = json.loads((REPLIES / "expected.json").read_text(encoding="utf-8"))


def test_corpus_is_big_enough() -> None:
    assert sum(1 for e in CORPUS.values() if e["kind"] == "code") >= 12
    assert sum(1 for e in CORPUS.values() if e["kind"] == "plan") >= 4
    assert all((REPLIES / name).exists() for name in CORPUS)


@pytest.mark.parametrize("name", sorted(n for n, e in CORPUS.items() if e["kind"] == "code"))
def test_corpus_code_reply(name: str) -> None:
    expected = CORPUS[name]
    text = (REPLIES / name).read_bytes().decode("utf-8")
    out = extract_code(text)
    assert out.status == expected["status"], out
    if out.code is not None:
        ast.parse(out.code)
    for s in expected.get("contains", []):
        assert s in (out.code or ""), s
    for s in expected.get("absent", []):
        assert s not in (out.code or ""), s
    if "error" in expected:
        assert expected["error"] in (out.error or "")
    if "warning" in expected:
        assert any(expected["warning"] in w for w in out.warnings), out.warnings


@pytest.mark.parametrize("name", sorted(n for n, e in CORPUS.items() if e["kind"] == "plan"))
def test_corpus_plan_reply(name: str) -> None:
    expected = CORPUS[name]
    parent = (REPLIES / expected["parent"]).read_text(encoding="utf-8")
    out = parse_plan((REPLIES / name).read_text(encoding="utf-8"), parent)
    assert out.ok == expected["ok"], out.error
    if out.ok:
        assert strip_anchors(out.scaffold or "").split() == parent.split()
        assert sorted(out.instructions) == sorted(int(k) for k in expected["instructions"])
        for k, s in expected["instructions"].items():
            assert s in out.instructions[int(k)]
    else:
        assert expected["error"] in (out.error or "")


def test_pathological_lines_stay_fast() -> None:
    """No pattern backtracks quadratically on long runs of one character. Counted in this process's CPU seconds, not
    the wall clock's (a loaded CI box took 5.9 s of wall time for what takes a fraction of a second of CPU): a
    quadratic pattern over 20,000 characters costs far more CPU than the bound, a busy host none."""
    import time

    sp = " " * 20_000
    cases = [sp + "x", "INSTRUCTION" + sp + "x", "Instructions" + sp + "x", "PLAN" + sp + "x",
             "x" + sp + "<<<IMPROVE END 1>>>" + sp + "y", "#" + sp + "<<<IMPROVE BEGIN 1>>>" + sp + "q",
             "/*" + sp + "<<<IMPROVE BEGIN 1>>>" + sp + "x", "<think>" * 5000, "```\n" * 5000,
             "```python\n" + "x = '''\n```\n" * 300, "<<<" + sp + "IMPROVE" + sp]
    start = time.process_time()
    for text in cases:
        extract_code(text)
        parse_plan(text, "x = 1\n")
        validate_scaffold(text, {1: "a"}, "x = 1\n")
        check_no_anchors(text)
        extract_plan_line(text)
    assert time.process_time() - start < 5.0
