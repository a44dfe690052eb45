"""The house rules, read off the source (docs/architecture.md): the core never imports Ray, no module imports
another's private names, the modules import each other without a cycle, and no module grows past 400 lines (the
ones still over are named below and may only shrink)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "stark_ray"
CORE = ("search", "agents", "prompts", "llm", "eval", "store")
MAX_LINES = 400
# modules over MAX_LINES today, with their size when this list was made: each is to be split (issue 18); a module
# may not grow past its figure, and one that shrinks under MAX_LINES leaves the list
STILL_OVER: dict[str, int] = {"eval/judge/judge.py": 404, "run/ray_driver.py": 556}  # its imports, one package deeper


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, name: str) -> list[tuple[str, list[str], bool]]:
    """(module imported, names taken from it, at the module's top level) for each import in ``path``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            found.append((base, [a.name for a in node.names], id(node) in top))
    return found


def test_the_core_never_imports_ray() -> None:
    offenders = [f"{name} imports {mod}" for name, path in modules().items()
                 if name.split(".")[1:2] and name.split(".")[1] in CORE
                 for mod, _, _ in imports(path, name) if mod == "ray" or mod.startswith("ray.")]
    assert offenders == []


def test_no_module_imports_another_modules_private_names() -> None:
    mods = modules()
    offenders = []
    for name, path in mods.items():
        for mod, names, _ in imports(path, name):
            if not mod.startswith("stark_ray"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__") and f"{mod}.{n}" not in mods:
                    offenders.append(f"{name} imports {mod}.{n}")
    assert offenders == []


def test_the_modules_import_each_other_without_a_cycle() -> None:
    """At module level (an import inside a function runs when it is called, after both modules are loaded)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for mod, names, top in imports(path, name):
            if not top or not mod.startswith("stark_ray"):
                continue
            deps |= {f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods} or ({mod} if mod in mods else set())
        graph[name] = deps - {name}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*trail[trail.index(dep):], dep] if dep in trail else [node, dep])
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ that imports its own modules is not a cycle of two modules
    cycles = [c for c in cycles if not all(x == c[0] or x.startswith(c[0] + ".") or c[0].startswith(x + ".")
                                           for x in c)]
    assert cycles == []


def test_no_module_is_over_400_lines_but_the_ones_named_and_those_only_shrink() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {k: v for k, v in sizes.items() if v > MAX_LINES}
    grown = {k: (v, STILL_OVER.get(k)) for k, v in over.items() if v > STILL_OVER.get(k, MAX_LINES)}
    assert grown == {}, "over 400 lines (or grown past its figure in STILL_OVER): split it"
    shrunk = sorted(k for k in STILL_OVER if sizes.get(k, 0) <= MAX_LINES)
    assert shrunk == [], "now within 400 lines: take it out of STILL_OVER"
