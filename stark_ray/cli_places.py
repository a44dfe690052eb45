"""The places a command is given (``--out``, ``--resume``, ``--record``): checked before any work, each problem one
error line and exit 2. A run directory may be local or a filesystem URI (:mod:`stark_ray.store.location`)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

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


def _oneline(e: OSError) -> str:
    return (e.strerror or " ".join(str(e).split()))[:300]


def _fail(message: str) -> NoReturn:
    from stark_ray.cli import fail  # lazily: cli.py imports this module

    fail(message)
