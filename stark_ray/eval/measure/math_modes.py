"""The math modes torch computes a float32 (or half) task in: TF32 for matrix products and for cuDNN convolutions,
reduced-precision reductions in half-precision matrix products. They decide the reference's own precision (torch's
defaults differ between versions: cuDNN's TF32 was on by default for years), so a result states them beside its
precision figures. On a GPU the judge and the worker both switch TF32 off as they set up the device
(``backends/gpu.py``): a float32 reference computes in float32.

Read through torch's C functions, each where this torch has it; a mode that cannot be read (torch raises where its
two TF32 APIs were mixed) reads ``unreadable``. Nothing here writes a mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_C = torch._C


def _first(value: Any) -> Any:
    """A reduced-precision reduction getter's answer: a bool, or (allowed, split-k allowed) in newer torch."""
    return value[0] if isinstance(value, tuple) else value


_MODES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("matmul_tf32", "_get_cublas_allow_tf32", bool),
    ("cudnn_tf32", "_get_cudnn_allow_tf32", bool),
    ("float32_matmul_precision", "_get_float32_matmul_precision", str),
    ("fp16_reduced_reduction", "_get_cublas_allow_fp16_reduced_precision_reduction", lambda v: bool(_first(v))),
    ("bf16_reduced_reduction", "_get_cublas_allow_bf16_reduced_precision_reduction", lambda v: bool(_first(v))),
)


def math_modes() -> dict[str, Any]:
    """Each mode's value now (``"unreadable"`` where torch would not say)."""
    modes: dict[str, Any] = {}
    for name, getter, form in _MODES:
        get = getattr(_C, getter, None)
        if get is None:
            continue
        try:
            modes[name] = form(get())
        except Exception:
            modes[name] = "unreadable"
    return modes


def _on(value: Any) -> str:
    return value if isinstance(value, str) else ("on" if value else "off")


def describe(modes: dict[str, Any], device: str = "cuda") -> str:
    """``matmul TF32 off (float32 precision highest), cuDNN convolution TF32 on, half-precision reductions in
    reduced precision allowed (fp16 on, bf16 on)``; on the CPU only what applies there (``float32 matmul
    precision highest``: "high" or "medium" would let oneDNN use bfloat16)."""
    if device != "cuda":
        return f"float32 matmul precision {modes.get('float32_matmul_precision', 'not known')}"
    parts = []
    if "matmul_tf32" in modes:
        extra = f" (float32 precision {modes['float32_matmul_precision']})" if "float32_matmul_precision" in modes \
            else ""
        parts.append(f"matmul TF32 {_on(modes['matmul_tf32'])}{extra}")
    if "cudnn_tf32" in modes:
        parts.append(f"cuDNN convolution TF32 {_on(modes['cudnn_tf32'])}")
    halves = [f"{k[:4]} {_on(modes[k])}" for k in ("fp16_reduced_reduction", "bf16_reduced_reduction") if k in modes]
    if halves:
        parts.append(f"half-precision matmul reductions in reduced precision ({', '.join(halves)})")
    return ", ".join(parts) or "not known"
