"""KernelBench-format tasks: a file with ``class Model``, ``get_inputs()`` and ``get_init_inputs()``.

:func:`load_task` checks a file without running it (some tasks allocate large inputs); :func:`check_task`
imports it and runs the reference forward once. Every problem is a :class:`TaskError` with one clear line.
"""

from __future__ import annotations

import ast
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.loader import import_file

REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class TaskError(Exception):
    """A task file that cannot serve as a reference. The message is one line."""


@dataclass(frozen=True)
class Task:
    name: str  # the file stem, e.g. "2_FusedSwishScaleClamp"
    path: Path
    source: str


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def parse_task(source: str, filename: str) -> None:
    """Raise TaskError unless ``source`` parses and defines Model, get_inputs and get_init_inputs."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise TaskError(f"{filename}:{e.lineno}: syntax error: {e.msg}") from None
    missing = [n for n in REQUIRED if n not in _top_level_names(tree)]
    if missing:
        raise TaskError(f"{filename}: missing {', '.join(missing)} at module level "
                        "(a task defines class Model, get_inputs() and get_init_inputs())")


def load_task(path: str | Path) -> Task:
    """Read and statically check one task file. Nothing in it is executed."""
    p = Path(path)
    if not p.exists():
        raise TaskError(f"{p}: no such task file")
    if p.is_dir():
        raise TaskError(f"{p}: is a directory, not a task file (use load_tasks)")
    try:
        source = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TaskError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TaskError(f"{p}: cannot read: not UTF-8 text") from None
    parse_task(source, p.name)
    return Task(name=p.stem, path=p, source=source)


def _natural_key(p: Path) -> tuple[int, str]:
    m = re.match(r"(\d+)", p.name)
    return (int(m.group(1)) if m else 1 << 62, p.name)


def load_tasks(path: str | Path) -> list[Task]:
    """One task file, or every ``*.py`` task in a directory (numeric prefix order: 2_ before 10_)."""
    p = Path(path)
    if not p.is_dir():
        return [load_task(p)]
    files = sorted((f for f in p.glob("*.py") if not f.name.startswith("_")), key=_natural_key)
    if not files:
        raise TaskError(f"{p}: no task files (*.py)")
    return [load_task(f) for f in files]


# --- running the reference (imports torch) -------------------------------------------------------------
def build_reference(module: ModuleType, task_name: str, seed: int) -> tuple[Any, list[Any]]:
    """``Model(*get_init_inputs())`` with the RNG seeded; returns the model and the init inputs it got."""
    import torch

    torch.manual_seed(seed)
    try:
        init_inputs = list(module.get_init_inputs())
    except Exception as e:
        raise TaskError(f"task {task_name}: get_init_inputs() failed: {describe_exception(e)}") from None
    torch.manual_seed(seed)
    try:
        model = module.Model(*init_inputs)
    except Exception as e:
        why = describe_exception(e)
        raise TaskError(f"task {task_name}: Model(*get_init_inputs()) failed: {why}") from None
    if not callable(model):
        raise TaskError(f"task {task_name}: Model(...) is not callable")
    return model, init_inputs


def task_key(source: str, seed: int) -> str:
    """What a process keeps a task's reference under: its source and the seed its parameters were drawn with."""
    import hashlib

    return hashlib.sha256(f"{seed}\0{source}".encode()).hexdigest()


def load_reference(name: str, source: str, seed: int, device: str) -> tuple[ModuleType, Any, list[Any]]:
    """Import a task's source (from a private file under TMPDIR) and build its reference on ``device``: the module,
    the model and the init inputs it got. TaskError, one line, when either fails."""
    import os
    import tempfile

    from stark_ray.eval.loader import import_source

    key = task_key(source, seed)[:12]
    try:  # TMPDIR (each evaluator process has its own), else the system's: never the working directory
        module = import_source(source, f"stark_task_{key}", Path(os.environ.get("TMPDIR") or tempfile.gettempdir()),
                               f"task_{key}.py")
    except Exception as e:
        raise TaskError(f"task {name}: import failed: {describe_exception(e)}") from None
    model, init_inputs = build_reference(module, name, seed)
    if device != "cpu" and hasattr(model, "to"):
        model = model.to(device)
    return module, model, init_inputs


@dataclass
class BuiltReference:
    """A task's reference as a process of the evaluator built it (:func:`load_reference`): the judge's
    (``trials.JudgeTask``) and a worker's (``warm_reference.WarmReference``) add what each keeps of it."""

    name: str
    module: Any
    model: Any
    init_inputs: list[Any]
    device: str
    seed: int

    def get_inputs(self) -> list[Any]:
        return make_task_inputs(self.module, self.name)


def make_task_inputs(module: ModuleType, task_name: str) -> list[Any]:
    try:
        inputs = module.get_inputs()
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":  # the device is full: not the task's fault
            raise
        raise TaskError(f"task {task_name}: get_inputs() failed: {describe_exception(e)}") from None
    if not isinstance(inputs, list | tuple):
        raise TaskError(f"task {task_name}: get_inputs() must return a list, got {type(inputs).__name__}")
    return list(inputs)


def run_reference_once(model: Any, inputs: list[Any], task_name: str) -> Any:
    import torch

    try:
        with torch.no_grad():
            return model(*inputs)
    except Exception as e:
        raise TaskError(f"task {task_name}: reference forward failed: {describe_exception(e)}") from None


def import_task(task: Task, module_name: str = "stark_task") -> ModuleType:
    try:
        return import_file(task.path, module_name)
    except Exception as e:
        raise TaskError(f"task {task.name}: import failed: {describe_exception(e)}") from None


def check_task(task: Task, seed: int = 0) -> Any:
    """Import the task in this process, build the reference, run its forward once; return its output."""
    import torch

    with tempfile.TemporaryDirectory(prefix="stark-task-") as tmp:
        # import from a private copy so that the task file on disk may change or vanish meanwhile
        copy = Task(task.name, Path(tmp) / "task.py", task.source)
        copy.path.write_text(task.source, encoding="utf-8")
        module = import_task(copy, f"stark_task_check_{abs(hash(task.source))}")
    model, _ = build_reference(module, task.name, seed)
    torch.manual_seed(seed)
    return run_reference_once(model, make_task_inputs(module, task.name), task.name)
