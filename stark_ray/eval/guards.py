"""Guards against candidates that cheat or break the evaluator, beyond plain output comparison.

- :class:`TorchFingerprint`: the identity of every public callable of torch, ``torch.nn.functional``,
  ``torch.Tensor`` and of the evaluator's own comparison code, taken before the candidate is imported and
  checked after; a candidate that replaces one (to make the reference match it, or to fake a comparison) is
  rejected and its worker replaced.
- :func:`output_problem`: outputs must be plain tensors on the reference's device that share no memory with
  the inputs.
- :func:`poison`: fills memory the allocator will hand out next with 0xFF bytes (NaN in every float format),
  so outputs that a kernel leaves partly unwritten fail the comparison.
- :func:`kernel_names` / :func:`own_kernel_names`: which kernels a call launched (profiler), against the
  kernel names the candidate's own source defines; none of its own launched means ``no_kernel``.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch

from stark_ray.eval.inputs import map_tensors

_WATCHED_MODULES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special", "torch.cuda",
                    "torch.testing", "stark_ray.eval.compare", "stark_ray.eval.correctness",
                    "stark_ray.eval.timing", "stark_ray.eval.guards", "stark_ray.eval.inputs")
_WATCHED_CLASSES = (torch.Tensor, torch.nn.Module, torch.cuda.Event)


_VOLATILE = {"__dict__", "__doc__", "__weakref__", "__module__", "__annotations__", "__qualname__",
             "__abstractmethods__", "__parameters__", "__orig_bases__"}


def _members(obj: Any) -> Iterable[tuple[str, Any]]:
    """A class's attributes along its MRO, dunders included (``Tensor.__add__`` can be patched too), read raw:
    getattr would bind a new method object each time. A module's public and private names, dunders excluded."""
    is_class = isinstance(obj, type)
    for name in dir(obj):
        if name in _VOLATILE or (not is_class and name.startswith("__")):
            continue
        try:
            yield name, inspect.getattr_static(obj, name) if is_class else getattr(obj, name)
        except Exception:
            continue


class TorchFingerprint:
    """The identity of the callables candidates could monkeypatch. Taken once; compared after each candidate.

    Take it after ``import torch._dynamo``: importing it (torch.compile does) replaces ``torch.manual_seed``.
    """

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        for modname in _WATCHED_MODULES:
            module = sys.modules.get(modname)
            if isinstance(module, ModuleType):
                for name, value in _members(module):
                    if callable(value) and not isinstance(value, ModuleType):
                        self.ids[f"{modname}.{name}"] = id(value)
        for cls in _WATCHED_CLASSES:
            for name, value in _members(cls):
                if callable(value) or isinstance(value, property):
                    self.ids[f"{cls.__module__}.{cls.__qualname__}.{name}"] = id(value)

    def changed(self) -> list[str]:
        """Names whose object is no longer the one seen at the fingerprint (new names do not count)."""
        now = TorchFingerprint.__new__(TorchFingerprint)
        now.ids = {}
        TorchFingerprint.__init__(now)
        return sorted(k for k, v in self.ids.items() if now.ids.get(k, v) != v)


def _storage_span(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        storage = t.untyped_storage()
    except Exception:
        return None
    start = storage.data_ptr()
    return (start, start + storage.nbytes()) if storage.nbytes() else None


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(value, found.append)
    return found


def output_problem(out: Any, inputs: list[Any], device: torch.device | str) -> str | None:
    """Why an output cannot be accepted as it is (or None): a tensor subclass, the wrong device, or memory
    shared with an input."""
    spans = [s for t in _tensors(inputs) if (s := _storage_span(t)) is not None]
    for i, t in enumerate(_tensors(out)):
        name = "output" if i == 0 and isinstance(out, torch.Tensor) else f"output tensor {i}"
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            return f"{name} is a {type(t).__name__}, not a plain torch.Tensor"
        if t.device.type != torch.device(device).type:
            return f"{name} is on {t.device}, expected {torch.device(device).type}"
        span = _storage_span(t)
        if span is not None and any(span[0] < e and s < span[1] for s, e in spans):
            return f"{name} shares memory with an input (it must be a new tensor)"
    return None


def poison(nbytes: Iterable[int], device: str) -> None:
    """Fill blocks the size of the expected outputs (and one block of their total) with 0xFF and free them:
    the caching allocator hands those blocks out next, so unwritten output elements read as NaN (or -1)."""
    sizes = [n for n in nbytes if n > 0]
    if not sizes:
        return
    blocks = [torch.empty(n, dtype=torch.uint8, device=device).fill_(255) for n in [*sizes, *sizes, sum(sizes)]]
    del blocks


def nbytes_of(value: Any) -> list[int]:
    return [t.numel() * t.element_size() for t in _tensors(value)]


def snapshot(value: Any) -> Any:
    """A copy of the outputs taken right away on the current stream (a race with other streams shows)."""
    return map_tensors(value, lambda t: t.detach().clone())


# -- kernels -----------------------------------------------------------------------------------------------------
_KERNEL_DEFS = (
    re.compile(r"__global__\s[^(;{]*?\b(\w+)\s*\("),  # CUDA (after removing __launch_bounds__(...))
    re.compile(r"@triton\.(?:jit|autotune|heuristics)[\s\S]*?\ndef\s+(\w+)\s*\("),  # Triton (decorators stacked)
)


def defined_kernels(source: str) -> set[str]:
    """Kernel names a candidate's source defines (CUDA ``__global__`` functions, ``@triton.jit`` functions)."""
    names: set[str] = set()
    source = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", source)
    for pattern in _KERNEL_DEFS:
        names.update(m.group(1) for m in pattern.finditer(source))
    names.discard("void")
    return names


def kernel_launches(fn: Callable[..., Any], args: list[Any]) -> list[tuple[str, int | None]]:
    """(name, stream) of each GPU kernel one call launches (torch profiler, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    launches = []
    for evt in prof.events():
        device_type = getattr(evt, "device_type", None)
        if device_type is not None and "CUDA" in str(device_type):
            stream = getattr(evt, "device_resource_id", None)
            launches.append((str(evt.name), int(stream) if isinstance(stream, int) else None))
    return launches


def own_kernel_names(launched: Iterable[str], defined: set[str]) -> set[str]:
    """The launched kernels that are the candidate's own: their name contains one it defines as a word."""
    own = set()
    for name in launched:
        if any(re.search(rf"(?<!\w){re.escape(d)}(?!\w)", name) for d in defined):
            own.add(name)
    return own
