"""Backends by name: one module each (a :class:`Backend` subclass and the prompt text beside it, ``<module>.txt``).

Each is imported only when asked for, so the parent never pays for the others. :data:`BUILT_IN` names the ones
this package ships; :func:`register_backend` adds another by its import path (``"package.module:Class"``), and
such a path is a backend name too (``--backend mypkg.kernels:MyBackend``). The evaluator's own processes (the judge,
the workers) are given the path, not the name, so they need no registration of their own.
"""

from __future__ import annotations

import importlib

from stark_ray.eval.backends.base import Backend

# name -> "module:Class", imported when first asked for
BUILT_IN: dict[str, str] = {
    "cpu_cpp": "stark_ray.eval.backends.cpu_cpp:CpuCppBackend",
    "cuda": "stark_ray.eval.backends.cuda:CudaBackend",
    "cuda_nvrtc": "stark_ray.eval.backends.cuda_nvrtc:CudaNvrtcBackend",
    "triton": "stark_ray.eval.backends.triton:TritonBackend",
}
_REGISTRY: dict[str, str] = dict(BUILT_IN)


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


__all__ = ["BUILT_IN", "Backend", "available_backends", "backend_class", "backend_path", "get_backend",
           "known_backend", "register_backend"]
