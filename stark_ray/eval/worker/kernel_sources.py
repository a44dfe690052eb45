"""The kernels a candidate defines, from what it handed to a compiler — not from a regex over its Python text.

Installed in the worker before any candidate is imported, :class:`KernelSources` records what goes to
``cpp_extension.load_inline`` (its ``cuda_sources`` and ``cpp_sources``, the strings after Python built them: a
module may assemble its CUDA source from escaped one-line strings) and ``cpp_extension.load`` (the files' contents),
to ``torch.cuda._compile_kernel`` (NVRTC: the source and the kernel's name), and what a backend adds
(:meth:`stark_ray.eval.backends.base.Backend.record_kernels`: the kernels of a DSL whose kernels are Python functions,
by :meth:`KernelSources.record_names`). :meth:`names` gives the kernel names the profile of a call is matched against
(``no_kernel``). A candidate that compiles by some other way (a subprocess, ctypes) has nothing recorded: its Python
text is read instead (:func:`python_kernel_names`, with the backends' ``kernel_definitions``).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_GLOBAL = re.compile(r"__global__\s[^(;{]*?\b(\w+)\s*\(")  # CUDA (after removing __launch_bounds__(...))


def cuda_kernel_names(source: str) -> set[str]:
    """The ``__global__`` functions a CUDA source defines."""
    source = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", source)
    return {m.group(1) for m in _GLOBAL.finditer(source)} - {"void"}


def python_kernel_names(source: str, definitions: Iterable[str] = ()) -> set[str]:
    """What a candidate's Python text seems to define (the fallback when nothing was recorded): its ``__global__``
    functions, and the names the regular expressions ``definitions`` find (their first group; the backends'
    ``kernel_definitions``, :func:`stark_ray.eval.backends.declared`)."""
    return cuda_kernel_names(source) | {m.group(1) for d in definitions for m in re.finditer(d, source)}


def _texts(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        return [str(v) for v in value]
    except TypeError:
        return [str(value)]


class KernelSources:
    """What candidates hand to compilers in this process, since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.cuda: list[str] = []  # CUDA/C++ source texts
        self.named: set[str] = set()  # kernel names given as such (NVRTC's kernel_name, a DSL's functions)

    def reset(self) -> None:
        self.cuda, self.named = [], set()

    @property
    def recorded(self) -> bool:
        return bool(self.cuda or self.named)

    def names(self) -> set[str]:
        found = set(self.named)
        for text in self.cuda:
            found |= cuda_kernel_names(text)
        return found

    # -- the hooks ----------------------------------------------------------------------------------------------
    def install(self) -> None:
        """Record from now on what reaches the compilers in this process (the entry points are wrapped once, after
        the build cache wrapped load_inline; a later recorder takes over from an earlier one)."""
        _ACTIVE[:] = [self]
        from torch.utils import cpp_extension

        cpp_extension.load_inline = _recording(cpp_extension.load_inline, "_inline")
        cpp_extension.load = _recording(cpp_extension.load, "_files")
        import torch

        compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
        if compile_kernel is not None:
            torch.cuda._compile_kernel = _recording(compile_kernel, "_nvrtc")

    def record_names(self, owner: Any, attribute: str,
                     name_of: Callable[[tuple[Any, ...], dict[str, Any]], object]) -> None:
        """Record from now on, as kernel names, what ``name_of(args, kwargs)`` gives for each call of
        ``owner.attribute`` (a string; anything else is passed over): for a DSL whose kernels are Python functions,
        its decorator or its kernel class's constructor. Wrapped once per process; the names go to the active
        recorder."""

        def record(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            name = name_of(args, kwargs)
            if isinstance(name, str) and _ACTIVE:
                _ACTIVE[-1].named.add(name)

        original = getattr(owner, attribute)
        if getattr(original, "__stark_sources__", False):
            return
        wrapped = KernelSources._wrap(original, record)
        wrapped.__stark_sources__ = True  # type: ignore[attr-defined]
        setattr(owner, attribute, wrapped)

    @staticmethod
    def _wrap(original: Callable[..., Any], record: Callable[[tuple[Any, ...], dict[str, Any]], None]
              ) -> Callable[..., Any]:
        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            with contextlib.suppress(Exception):  # recording never breaks a build
                record(args, kwargs)
            return original(*args, **kwargs)

        return recorded

    def _inline(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # load_inline(name, cpp_sources, cuda_sources=None, ...)
        self.cuda += _texts(kwargs.get("cpp_sources", args[1] if len(args) > 1 else None))
        self.cuda += _texts(kwargs.get("cuda_sources", args[2] if len(args) > 2 else None))

    def _files(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # load(name, sources, ...)
        for path in _texts(kwargs.get("sources", args[1] if len(args) > 1 else None)):
            try:
                self.cuda.append(Path(path).read_text(errors="replace"))
            except OSError:
                continue

    def _nvrtc(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # _compile_kernel(kernel_source, kernel_name, ...)
        self.cuda += _texts(kwargs.get("kernel_source", args[0] if args else None))
        name = kwargs.get("kernel_name", args[1] if len(args) > 1 else None)
        if isinstance(name, str):
            self.named.add(name)


_ACTIVE: list[KernelSources] = []  # the recorder the wrapped entry points report to


def _recording(original: Callable[..., Any], method: str) -> Callable[..., Any]:
    """``original`` wrapped to report its arguments to the active recorder's ``method`` (once per function)."""
    if getattr(original, "__stark_sources__", False):
        return original

    def record(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if _ACTIVE:
            getattr(_ACTIVE[-1], method)(args, kwargs)

    wrapped = KernelSources._wrap(original, record)
    wrapped.__stark_sources__ = True  # type: ignore[attr-defined]
    return wrapped


def own_kernel_names(launched: list[str], defined: set[str]) -> set[str]:
    """The launched kernels that are the candidate's own: their name contains one it defines as a word."""
    own = set()
    for name in launched:
        if any(re.search(rf"(?<!\w){re.escape(d)}(?!\w)", name) for d in defined):
            own.add(name)
    return own


LIBRARY_SHARE = 0.5  # a candidate with kernels of its own whose GPU time is mostly in kernels not its own ...
ARITHMETIC_SHARE = 0.25  # ... or at least this much in a library's matrix-product or convolution kernels
# the names of cuBLAS/cuBLASLt, CUTLASS and cuDNN's matrix-product, convolution and attention kernels
LIBRARY_ARITHMETIC = re.compile(r"gemm|xmma|nvjet|cutlass|cudnn|conv|winograd|fmha|flash_fwd|flash_bwd", re.I)
NOT_CODE = ("Memcpy", "Memset")  # what a profile lists beside kernels: copies and fills


def library_compute(launches: list[Any], own: set[str]) -> str | None:
    """The line for a candidate with kernels of its own whose profiled call spent LIBRARY_SHARE of its kernels' GPU
    time in kernels not its own, or ARITHMETIC_SHARE in a library's matrix-product or convolution kernels: a
    library doing the work behind a kernel of its own (None: its own kernels did it, or it has none: that is
    ``no_kernel``). A float32 GEMM in float16 behind two cast kernels of its own spent 51% in cuBLAS on an H100: its
    casts are memory-bound, the half-precision product fast. ``launches``: the call's kernels (``name``,
    ``start_us``, ``end_us``)."""
    ms: dict[str, float] = {}
    for k in launches:
        if not str(k.name).startswith(NOT_CODE):
            ms[k.name] = ms.get(k.name, 0.0) + max(0.0, (k.end_us - k.start_us) / 1e3)
    total = sum(ms.values())
    library = {name: t for name, t in ms.items() if name not in own}
    arithmetic = sum(t for name, t in library.items() if LIBRARY_ARITHMETIC.search(name))
    if not own or total <= 0 or (sum(library.values()) < LIBRARY_SHARE * total
                                 and arithmetic < ARITHMETIC_SHARE * total):
        return None
    top = sorted(library, key=lambda n: -library[n])[:3]
    return (f"{sum(library.values()) / total:.0%} of its kernels' GPU time in one call went to kernels not of its "
            f"own ({'; '.join(n[:80] for n in top)}): a library does {'the arithmetic' if arithmetic else 'most of'} "
            f"the work, its own kernels {1 - sum(library.values()) / total:.0%}")
