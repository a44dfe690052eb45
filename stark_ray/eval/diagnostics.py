"""Turn exceptions, compiler output and crash dumps into what an agent can act on: one line, plus a log."""

from __future__ import annotations

import ast
import re

from stark_ray.records import LOG_LIMIT, excerpt

LINE_LIMIT = 300  # characters of a one-line error

# gcc/clang/nvcc diagnostics: "file:line:col: error: message" or "file(line): error: message"
_COMPILER_ERROR = re.compile(r"^(?P<loc>\S[^\n]*?(?::\d+(?::\d+)?|\(\d+\))): (?:fatal )?error: (?P<msg>.+)$",
                             re.MULTILINE)
_LINKER_ERROR = re.compile(r"^.*(?:undefined reference to|undefined symbol:|ld returned|cannot find -l).*$",
                           re.MULTILINE)
_NOISE = (
    re.compile(r"^\[\d+/\d+\] "),  # ninja echoing a command
    re.compile(r"^\S*(?:c\+\+|g\+\+|gcc|clang\+\+|nvcc|ld)(?:-\d+)? .* -o \S+\s*$"),  # a compiler command
    re.compile(r"^Extension modules: "),  # faulthandler's list of loaded C extensions
    re.compile(r"^\[stark-ray\] "),  # the evaluator's own notes
)
_BUILD_PATH = re.compile(r"(?:/[^\s:'\"]+)?/(main\.cpp|cuda\.cu|candidate\.py|task\.py)\b")
_INLINE_NOTE = ("(main.cpp is '#include <torch/extension.h>', then cpp_sources, then the generated "
                "bindings: its line N is line N-1 of cpp_sources)")


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def describe_exception(exc: BaseException) -> str:
    """``Type: first line of the message`` — never more than one line."""
    message = one_line(str(exc))
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def first_compiler_error(output: str) -> str | None:
    """The first compiler (or linker) error in a build log, as one line, or None if there is none."""
    m = _COMPILER_ERROR.search(output)
    if m:
        loc = m.group("loc").rsplit("/", 1)[-1]  # main.cpp:12:5, not the absolute build path
        return one_line(f"{loc}: error: {m.group('msg')}")
    m = _LINKER_ERROR.search(output)
    if m:
        return one_line(m.group(0))
    return None


def clean_log(output: str) -> str:
    """Drop command lines and other noise; shorten build and sandbox paths to bare file names."""
    lines = [ln for ln in output.replace("\r\n", "\n").split("\n") if not any(p.match(ln) for p in _NOISE)]
    return _BUILD_PATH.sub(r"\1", "\n".join(lines)).strip("\n")


def compiler_log(output: str, limit: int = LOG_LIMIT) -> str:
    """An excerpt of a build log for the debug agent, from just before its first error."""
    text = clean_log(output)
    lines = text.split("\n")
    first = next((i for i, ln in enumerate(lines) if "error:" in ln), None)
    if first is not None and len(text) > limit:  # keep the "In function ..." context of the first error
        text = "\n".join(lines[max(0, first - 3):])
    if "main.cpp" in text:
        text = f"{_INLINE_NOTE}\n{text}"
    return excerpt(text, limit)


_DUMP_START = re.compile(r"^(?:Fatal Python error|Current thread|Thread 0x|Stack \(most recent)",
                         re.MULTILINE)
_CANDIDATE_FRAME = re.compile(r'File "(?:[^"]*/)?candidate\.py", line (?P<line>\d+) in (?P<fn>\S+)')


def crash_location(log: str) -> str | None:
    """``candidate.py:LINE in FN``: the innermost candidate frame of faulthandler's first stack dump."""
    start = _DUMP_START.search(log)
    if start is None:
        return None
    m = _CANDIDATE_FRAME.search(log, start.start())
    return f"candidate.py:{m.group('line')} in {m.group('fn')}" if m else None


# a process building: torch's cpp_extension, a compiler process, NVRTC, or the evaluator's own build machinery (the
# build cache, a precompiled header another build is making)
_BUILD_FRAMES = re.compile(r'File "[^"]*(?:cpp_extension|subprocess|nvrtc|ninja|stark_ray/eval/build/(?:pch|cache|'
                           r'builder))[^"]*"')


def was_building(log: str) -> str | None:
    """When the process's first stack dump shows it building (waiting on a compiler, NVRTC, or a header another
    build is making): what it printed before the dump (the compiler's own output); else None."""
    start = _DUMP_START.search(log)
    if start is None:
        return None
    nxt = _DUMP_START.search(log, start.end())
    dump = log[start.start(): nxt.start() if nxt else len(log)]
    if not _BUILD_FRAMES.search(dump):
        return None
    return log[: start.start()]


def forward_location(source: str) -> str | None:
    """``candidate.py:LINE in forward``: where ``ModelNew.forward`` begins in a candidate's source, if it parses.

    The fallback for a crash whose dump names no candidate line: when two threads of a kernel fault at once, the
    second ends the process while faulthandler is still writing the first one's dump."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "forward":
                    return f"candidate.py:{item.lineno} in forward"
    return None
