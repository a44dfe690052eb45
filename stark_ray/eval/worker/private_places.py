"""Where a candidate's process writes by default (home, temporary files, the compilers' caches): the candidate's
own directory while it runs, the worker's own again after it, so that nothing a candidate leaves (a module, a
cache entry) reaches the next candidate of the same worker."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

# and the backends' caches (Backend.caches: eval/backends declared(...).cache_vars), which the caller names
PRIVATE_PLACES = ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME")


def private_places(directory: str, caches: Iterable[str] = ()) -> None:
    """From now on, the places a process writes by default are ``directory`` (``caches``: the variables of the
    backends' caches, beside :data:`PRIVATE_PLACES`)."""
    for name in (*PRIVATE_PLACES, *caches):
        os.environ[name] = directory
    tempfile.tempdir = directory


def places_now(caches: Iterable[str] = ()) -> tuple[dict[str, str | None], str | None]:
    """The places as they are now (``caches`` as for :func:`private_places`), for :func:`restore_places`."""
    return {name: os.environ.get(name) for name in (*PRIVATE_PLACES, *caches)}, tempfile.tempdir


def restore_places(places: tuple[dict[str, str | None], str | None]) -> None:
    """Put back the places :func:`places_now` saw."""
    env, tempdir = places
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = tempdir
