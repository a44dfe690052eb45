"""Backends by name. Each is imported only when asked for, so the parent never pays for the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from stark_ray.eval.backends.base import Backend

# name -> "module:Class" (lazily imported) or a factory registered at run time
_REGISTRY: dict[str, str | Callable[[], Backend]] = {
    "cpu_cpp": "stark_ray.eval.backends.cpu_cpp:CpuCppBackend",
    "cuda": "stark_ray.eval.backends.cuda:CudaBackend",
    "cuda_nvrtc": "stark_ray.eval.backends.cuda_nvrtc:CudaNvrtcBackend",
    "triton": "stark_ray.eval.backends.triton:TritonBackend",
}


def register_backend(name: str, factory: str | Callable[[], Backend]) -> None:
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> Backend:
    entry = _REGISTRY.get(name)
    if entry is None:
        known = ", ".join(available_backends())
        raise ValueError(f"backend {name!r} is not available here; available: {known}")
    if isinstance(entry, str):
        module_name, cls_name = entry.split(":")
        factory: Callable[[], Backend] = getattr(importlib.import_module(module_name), cls_name)
    else:
        factory = entry
    return factory()


__all__ = ["Backend", "available_backends", "get_backend", "register_backend"]
