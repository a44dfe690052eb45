"""Small facts about a piece of Python source, all computed with ``ast`` and all exception-safe."""

from __future__ import annotations

import ast
import builtins
import re
import textwrap

_BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__doc__", "__builtins__", "__spec__"}
_LEADING_TABS = re.compile(r"^[ \t]+", re.MULTILINE)
CODE_START = re.compile(r"^(?:import\s+\w|from\s+[\w.]+\s+import\b|class\s+\w|def\s+\w|async\s+def\s|@\w|#!)")


def parse(code: str) -> tuple[ast.Module | None, str | None]:
    """(tree, None) when ``code`` parses, else (None, one-line reason)."""
    try:
        return ast.parse(code), None
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno else "somewhere"
        return None, f"SyntaxError at {where}: {exc.msg}"
    except (ValueError, MemoryError, RecursionError, OverflowError) as exc:
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"


def has_statements(tree: ast.Module) -> bool:
    """True when the module imports, defines or assigns something (not just a bare expression or comments)."""
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
             ast.AnnAssign)
    return any(isinstance(node, kinds) for node in tree.body)


def defines_model_new(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body)


def source_defines_model_new(code: str) -> bool:
    tree, _ = parse(code)
    return tree is not None and defines_model_new(tree)


def defined_names(tree: ast.Module) -> set[str]:
    """Every name the module binds anywhere (a generous over-approximation)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


def free_names(tree: ast.Module) -> set[str]:
    """Names the module reads but never binds and that are not builtins (``torch`` without its import)."""
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - defined_names(tree) - _BUILTINS


def expand_leading_tabs(code: str, width: int) -> str:
    return _LEADING_TABS.sub(lambda m: m.group(0).expandtabs(width), code)


def tidy(code: str) -> str:
    """Remove common indentation, surrounding blank lines and trailing spaces; end with one newline."""
    code = textwrap.dedent(code)
    lines = code.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return ""
    lines[-1] = lines[-1].rstrip()
    return "\n".join(lines) + "\n"
