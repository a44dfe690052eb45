"""The places a command is given (``--out``, ``--resume``, ``--record``, a KernelBench problem) and the device it asks
for: checked before any work, each problem one error line and exit 2. A run directory may be local or a filesystem
URI (:mod:`stark_ray.store.location`)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from stark_ray.cli.app import fail
from stark_ray.store.location import Location, locate


def writable_dir(path: str | Path, flag: str) -> Location:
    """The directory (local or a filesystem URI), created when absent, where files can be written (on an object
    store a probe object is written and deleted)."""
    return _writable(_location(path, flag), path, flag)


def existing_dir(path: str | Path, flag: str, what: str) -> Location:
    """A directory that must exist and take new files (a resume writes to it), local or a filesystem URI."""
    loc = _location(path, flag)
    try:
        found = loc.is_dir()
    except OSError as e:
        _fail(f"{flag} {path}: cannot read it ({_oneline(e)})")
    if not found:
        _fail(f"{flag} {path}: no such {what}")
    return _writable(loc, path, flag)


def writable_file(path: Path, flag: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        _fail(f"{flag} {path}: cannot write there ({e.strerror or e})")


def _location(text: str | Path, flag: str) -> Location:
    try:
        return locate(text)
    except ValueError as e:
        _fail(f"{flag} {e}")


def _writable(loc: Location, path: str | Path, flag: str) -> Location:
    try:
        loc.check_writable()
    except PermissionError:
        _fail(f"{flag} {path}: the directory is not writable")
    except OSError as e:
        _fail(f"{flag} {path}: cannot write there ({_oneline(e)})")
    return loc


def gpu_first(backend: str, address: str | None, evaluators: int | None = None) -> None:
    """One line at once, before Ray or an evaluator starts, where a GPU backend is asked for on this machine (no
    cluster to join) and it has no CUDA GPU, or fewer than ``evaluators``."""
    from stark_ray.eval.backends import get_backend

    if address is not None or get_backend(backend).device != "cuda":
        return
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if evaluators is not None and evaluators > gpus:
        _fail(f"{evaluators} evaluators need {evaluators} GPUs and this machine has {gpus}")
    if not gpus:
        _fail(f"backend {backend} needs a CUDA GPU and this machine has none (torch {torch.__version__}: "
              "torch.cuda.is_available() is False); run on a GPU host, join a cluster with --address, or choose "
              "--backend cpu_cpp")


def kernelbench_task(root: Path | None, level: int | None, problem: str | None, given: Path | None) -> Path:
    """The file of KernelBench's ``--level``/``--problem`` in ``--kernelbench`` (ids and names as KernelBench's own
    scripts take them); one line where they do not name exactly one."""
    from stark_ray.eval import kernelbench
    from stark_ray.eval.tasks import TaskError

    if given is not None:
        _fail("give the task once: either TASK or --kernelbench with --level and --problem")
    if root is None or level is None or problem is None:
        _fail("a KernelBench task needs --kernelbench DIR, --level N and --problem ID (or a part of its name)")
    by_id = problem.strip().isdigit()
    try:
        refs = kernelbench.select(root.expanduser(), levels=[level], ids=[int(problem)] if by_id else None,
                                  names=None if by_id else [problem])
    except TaskError as e:
        _fail(f"--kernelbench {e}")  # the messages begin with the directory
    wanted = problem.lower()
    exact = [r for r in refs if wanted in (r.name.lower(), r.name.lower().split("_", 1)[-1])]
    if len(refs) > 1 and len(exact) != 1:
        shown = ", ".join(r.name for r in refs[:6]) + (f" and {len(refs) - 6} more" if len(refs) > 6 else "")
        _fail(f"--problem {problem} matches {len(refs)} tasks of level {level}: {shown}; give its id")
    return (exact or refs)[0].path


def _oneline(e: OSError) -> str:
    return (e.strerror or " ".join(str(e).split()))[:300]


def _fail(message: str) -> NoReturn:
    fail(message)
