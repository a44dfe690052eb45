"""Backends by name: one module each (a :class:`Backend` subclass and the prompt text beside it, ``<module>.txt``).

Each is imported only when asked for, so the parent never pays for the others. :data:`BUILT_IN` names the ones
this package ships; :func:`register_backend` adds another by its import path (``"package.module:Class"``), and
such a path is a backend name too (``--backend mypkg.kernels:MyBackend``). The evaluator's own processes (the judge,
the workers) are given the path, not the name, so they need no registration of their own.

What a backend needs of the evaluator's processes (variables passed, caches made private, toolchain paths kept
visible in the jail, how its kernels read in a candidate's text) the sandbox takes from :func:`declared`: those
of every backend offered in the process, whichever backend it runs.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from stark_ray.eval.backends.base import Backend, Package

# name -> "module:Class", imported when first asked for
BUILT_IN: dict[str, str] = {
    "cpu_cpp": "stark_ray.eval.backends.cpu_cpp:CpuCppBackend",
    "cuda": "stark_ray.eval.backends.cuda:CudaBackend",
    "cuda_nvrtc": "stark_ray.eval.backends.cuda_nvrtc:CudaNvrtcBackend",
    "triton": "stark_ray.eval.backends.triton:TritonBackend",
}
_REGISTRY: dict[str, str] = dict(BUILT_IN)
T = TypeVar("T")


def register_backend(name: str, path: str | type[Backend]) -> None:
    """Offer the backend class at ``path`` (``"package.module:Class"``, or the class itself) under ``name``."""
    ref = path if isinstance(path, str) else f"{path.__module__}:{path.__qualname__}"
    if ":" not in ref or "<locals>" in ref:
        raise ValueError(f"register_backend({name!r}, ...): give an importable 'package.module:Class', not {ref!r}")
    _REGISTRY[name] = ref


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def known_backend(name: str) -> bool:
    """A registered name, or an import path ``package.module:Class`` (checked when the backend is first made)."""
    return name in _REGISTRY or ":" in name


def backend_path(name: str) -> str:
    """The import path of the backend offered as ``name`` (what the evaluator's processes are given)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        return name
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(available_backends())}")


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name`` (a registered name, or an import path ``package.module:Class``). ValueError, one
    line, for a name not registered or a path that does not import a Backend: the check of a backend's name (the
    command line makes it on ``--backend`` before any work)."""
    module_name, _, cls_name = backend_path(name).partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"backend {name!r}: cannot import {module_name}:{cls_name} ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ValueError(f"backend {name!r}: {module_name}:{cls_name} is not a Backend")
    return cls


def get_backend(name: str) -> Backend:
    """A new instance of backend ``name`` (a registered name, or an import path ``package.module:Class``)."""
    return backend_class(name)()


def offered(also: str | type[Backend] | None = None) -> tuple[type[Backend], ...]:
    """The classes of every backend offered in this process (built in and registered; one that cannot be imported
    is left out, and fails where it is used) and of ``also`` (the backend a process runs, which may be known to
    it by its import path only), each once."""
    classes = []
    for name in _REGISTRY:
        try:
            classes.append(backend_class(name))
        except ValueError:
            continue
    if also is not None:
        classes.append(also if isinstance(also, type) else backend_class(also))
    return tuple(dict.fromkeys(classes))


@dataclass(frozen=True)
class Declared:
    """What the backends of :func:`offered` declare for the evaluator's processes, together (:class:`Backend`)."""

    env_prefixes: tuple[str, ...]  # the parent's variables so named pass (eval/proc/sandbox_env.py)
    caches: tuple[tuple[str, str], ...]  # (variable, directory name): private per process and per candidate
    toolchain_vars: tuple[str, ...]  # the paths they name stay visible in the jail (eval/proc/jail.py)
    kernel_definitions: tuple[str, ...]  # regexes naming the kernels a candidate's text defines

    @property
    def cache_vars(self) -> tuple[str, ...]:
        return tuple(variable for variable, _ in self.caches)


def declared(also: str | type[Backend] | None = None) -> Declared:
    """What every backend offered here and ``also`` (a name, an import path or a class) declare, each item once."""
    path = also if also is None or isinstance(also, str) else f"{also.__module__}:{also.__qualname__}"
    return _declared(tuple(_REGISTRY.items()), path if path is None else backend_path(path))


@functools.cache
def _declared(registry: tuple[tuple[str, str], ...], also: str | None) -> Declared:
    classes = offered(also)  # ``registry``: the key, so that a backend registered later is seen
    return Declared(env_prefixes=_union(c.env_prefixes for c in classes), caches=_union(c.caches for c in classes),
                    toolchain_vars=_union(c.toolchain_vars for c in classes),
                    kernel_definitions=_union(c.kernel_definitions for c in classes))


def _union(groups: Iterable[tuple[T, ...]]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(x for group in groups for x in group))


__all__ = ["BUILT_IN", "Backend", "Declared", "Package", "available_backends", "backend_class", "backend_path",
           "declared", "get_backend", "known_backend", "offered", "register_backend"]
