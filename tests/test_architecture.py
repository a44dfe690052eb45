"""The house rules, read off the source (docs/architecture.md, "Rules of the house"):

- the core never imports Ray;
- the trust boundary: the judge (``eval/judge/``) and the worker (``eval/worker/``) never import each other, not
  even through a third module, and what both use (``eval/measure/``, ``eval/wire/``) imports neither;
- ``config`` imports nothing of the package but ``records`` (names of policies and backends are checked by their
  registries), so the trusted judge process never loads the search;
- no module imports another's private names or reaches another module's private attribute, and no class's methods
  live in more than one module (no mixin that works on state its subclass defines);
- the modules import each other without a cycle, imports inside functions included;
- the driver reaches its first LLM call without importing torch;
- a package holds at most MAX_MODULES modules; a module past SOFT_LINES lines is a warning, not a failure (split by
  meaning, never to meet a count).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "stark_ray"
CORE = ("search", "agents", "prompts", "llm", "eval", "store")
MAX_MODULES = 15
SOFT_LINES = 600
JUDGE, WORKER = "stark_ray.eval.judge", "stark_ray.eval.worker"
SHARED = ("stark_ray.eval.measure", "stark_ray.eval.wire")
# private attributes of other libraries that a module of ours also happens to define (torch.Tensor._version)
FOREIGN_PRIVATE = {"_version"}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def imports(path: Path, name: str, typing: bool = False) -> list[tuple[str, list[str], bool]]:
    """(module imported, names taken from it, at the module's top level) for each import in ``path`` that runs, and
    with ``typing`` those under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = set(map(id, tree.body))
    never = set() if typing else _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in never:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, [], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            found.append((base, [a.name for a in node.names], id(node) in top))
    return found


def graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (an imported name that is a module counts as that module);
    with ``typing``, the imports for type checking too."""
    mods = modules()
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for mod, names, _ in imports(path, name, typing):
            if not mod.startswith("stark_ray"):
                continue
            deps |= {f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods} or ({mod} if mod in mods else set())
        out[name] = deps - {name}
    return out


def reach(start: str, g: dict[str, set[str]]) -> set[str]:
    """Every module ``start`` loads when it runs (importing ``a.b.c`` loads ``a`` and ``a.b`` too)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        for dep in g.get(node, ()):
            parts = dep.split(".")
            todo += [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
    return seen


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# -- the layers ----------------------------------------------------------------------------------------------------
def test_the_core_never_imports_ray() -> None:
    offenders = [f"{name} imports {mod}" for name, path in modules().items()
                 if name.split(".")[1:2] and name.split(".")[1] in CORE
                 for mod, _, _ in imports(path, name) if mod == "ray" or mod.startswith("ray.")]
    assert offenders == []


def test_the_judge_and_the_worker_never_import_each_other() -> None:
    """The trust boundary, as the imports draw it: no module of the judge loads one of the worker's, directly or
    through any other module, and the other way round; what both use loads neither."""
    g = graph()
    assert f"{JUDGE}.main" in g and f"{WORKER}.main" in g, "the judge and the worker are packages, each its process"
    crossings = []
    for name in g:
        loaded = reach(name, g)
        if inside(name, JUDGE):
            crossings += [f"{name} loads {m}" for m in sorted(loaded) if inside(m, WORKER)]
        if inside(name, WORKER):
            crossings += [f"{name} loads {m}" for m in sorted(loaded) if inside(m, JUDGE)]
        if any(inside(name, s) for s in SHARED):
            crossings += [f"{name} loads {m}" for m in sorted(loaded) if inside(m, JUDGE) or inside(m, WORKER)]
    assert crossings == []


def test_config_imports_only_records() -> None:
    """The trusted judge process loads the configuration: it must not bring the search tree or the backends."""
    name = "stark_ray.config"
    ours = {mod for mod, _, _ in imports(modules()[name], name) if mod.startswith("stark_ray")}
    assert ours <= {"stark_ray.records"}, sorted(ours)


# -- names -----------------------------------------------------------------------------------------------------
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


def _defined(tree: ast.Module) -> set[str]:
    """Every name a module defines: at its top level, as an attribute of a class of its own (methods, class
    attributes) or of an instance (``self.x = ...``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def test_no_module_reaches_a_private_name_of_another_module() -> None:
    """``other._step(...)``: a private name is its module's own. A module may use ``x._name`` only where it defines
    ``_name`` itself; names of other libraries (``torch._C``, ``sys._getframe``) are not ours to judge."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules().items()}
    defined = {name: _defined(tree) for name, tree in trees.items()}
    ours = set().union(*defined.values())
    offenders = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if node.attr in defined[name] or node.attr not in ours or node.attr in FOREIGN_PRIVATE:
                continue
            owners = sorted(m for m, d in defined.items() if node.attr in d)
            offenders.append(f"{name}:{node.lineno} reaches {ast.unparse(node)} (defined in {', '.join(owners)})")
    assert offenders == []


def _classes() -> Iterator[tuple[str, ast.ClassDef]]:
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield name, node


def _own_attributes(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: its methods, its class-level names with a value (a bare annotation only in a
    dataclass: elsewhere it is a stub standing in for what another class sets), what its methods set on ``self``."""
    names: set[str] = set()
    dataclass = any("dataclass" in ast.unparse(d) for d in cls.decorator_list)
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and (stmt.value or dataclass):
            names.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            names.add(node.attr)
    return names


def test_no_class_has_its_methods_in_more_than_one_module() -> None:
    """A base class of ours is whole on its own: every ``self.x`` its methods read is defined by it or by its own
    bases. A mixin that works on what its subclass defines (the Ray driver's, joined by ``Any``-typed stubs) is
    one class spread over several modules."""
    classes: dict[str, tuple[str, ast.ClassDef]] = {}
    for module, cls in _classes():
        classes.setdefault(cls.name, (module, cls))

    def known(cls: ast.ClassDef, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """What ``cls`` and its bases define; None where a base is not ours (its attributes are unknown here)."""
        names = _own_attributes(cls)
        for base in cls.bases:
            base_name = ast.unparse(base).split("[")[0].rsplit(".", 1)[-1]
            if base_name in ("ABC", "Protocol", "Generic", "object", "Exception", "NamedTuple"):
                continue
            if base_name not in classes or base_name in seen:
                return None
            more = known(classes[base_name][1], seen | {cls.name})
            if more is None:
                return None
            names |= more
        return names

    bases_of_others = {ast.unparse(b).rsplit(".", 1)[-1] for _, c in _classes() for b in c.bases}
    offenders = []
    for name, (module, cls) in sorted(classes.items()):
        if name not in bases_of_others or any(ast.unparse(b).endswith("Protocol") for b in cls.bases):
            continue
        defined = known(cls)
        if defined is None:
            continue
        read = {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(node.ctx, ast.Load)}
        missing = sorted(read - defined)
        if missing:
            offenders.append(f"{module}.{name} reads {', '.join(missing)}, defined only by a subclass")
    assert offenders == []


# -- shape -----------------------------------------------------------------------------------------------------
def test_the_modules_import_each_other_without_a_cycle() -> None:
    """Imports inside functions count (they run when called), and those for type checking: a circle among them is
    a circle of ideas."""
    g = graph(typing=True)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*trail[trail.index(dep):], dep] if dep in trail else [node, dep])
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    # a package's __init__ that imports its own modules is not a cycle of two modules
    cycles = [c for c in cycles if not all(x == c[0] or x.startswith(c[0] + ".") or c[0].startswith(x + ".")
                                           for x in c)]
    assert cycles == []


def test_a_package_holds_at_most_fifteen_modules() -> None:
    counts: dict[Path, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            counts[path.parent] = counts.get(path.parent, 0) + 1
    crowded = {str(p.relative_to(PACKAGE.parent)): n for p, n in counts.items() if n > MAX_MODULES}
    assert crowded == {}, "a package is a layer or a process: find the idea that groups some of these"


def test_long_modules_are_named_not_failed() -> None:
    """A module past SOFT_LINES lines is said (pytest's warnings summary), never a failure: split by meaning."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > SOFT_LINES}
    for module, n in sorted(long.items()):
        warnings.warn(f"{module} has {n} lines (over {SOFT_LINES}): is it still one idea?", stacklevel=1)


def test_the_driver_reaches_its_first_llm_call_without_importing_torch() -> None:
    """Torch is the evaluator's processes' (4-8 s to import on a busy host): the driver's path to the first prompt —
    the CLI, either executor, the team and the lines the prompts state under the hardware — never loads it."""
    code = ("import sys, stark_ray.cli.optimize, stark_ray.run.local, stark_ray.run.ray_driver, stark_ray.search.team\n"
            "from stark_ray.config import EvalConfig\n"
            "from stark_ray.prompts.terms import reference_lines\n"
            "from stark_ray.records import EvalResult\n"
            "assert 'Tolerance' in reference_lines(EvalResult(sol_ms=1.0, sol_bound='memory', math_modes='tf32 off'),"
            " EvalConfig())\n"
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, timeout=120).returncode == 0
