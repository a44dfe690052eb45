"""Helpers shared by the benchmark scripts: importing sources from files, building a task's models, comparing."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ATOL = 1e-2
RTOL = 1e-2
MAX_REL_ERR = 1e-2
NO_GPU = "error: no CUDA GPU visible (torch.cuda.is_available() is False); run this on the GPU machine"


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a fresh module. Triton's @jit needs the source on disk, so candidates are files."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def import_source(source: str, directory: Path, module_name: str) -> ModuleType:
    path = directory / f"{module_name}.py"
    path.write_text(source, encoding="utf-8")
    return import_file(path, module_name)


def build_models(task: ModuleType, cand: ModuleType, seed: int, device: str) -> tuple[Any, Any]:
    """(reference, candidate) models with the RNG seeded before each, as KernelBench does: same parameters."""
    import torch

    torch.manual_seed(seed)
    init_inputs = list(task.get_init_inputs())
    torch.manual_seed(seed)
    ref = task.Model(*init_inputs).to(device)
    torch.manual_seed(seed)
    new = cand.ModelNew(*init_inputs).to(device)
    return ref.eval(), new.eval()


def task_inputs(task: ModuleType, seed: int, device: str, scale: float = 1.0) -> list[Any]:
    """``get_inputs()`` under ``seed`` (drawn on the CPU, as the task writes it), floats scaled, moved."""
    import torch

    torch.manual_seed(seed)
    out = []
    for v in task.get_inputs():
        if isinstance(v, torch.Tensor):
            v = v * scale if scale != 1.0 and v.is_floating_point() else v
            v = v.to(device)
        out.append(v)
    return out


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float
    rel_err: float
    problem: str = ""


def compare(out: Any, ref: Any, atol: float = ATOL, rtol: float = RTOL, max_rel: float | None = None) -> Comparison:
    """Shape and dtype, then ``allclose(atol, rtol)``; with ``max_rel`` also ||out - ref|| / ||ref|| < max_rel."""
    import torch

    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        return Comparison(False, math.inf, math.inf, f"output is {type(out).__name__}, expected a tensor")
    if out.shape != ref.shape:
        return Comparison(False, math.inf, math.inf, f"shape {tuple(out.shape)} != {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Comparison(False, math.inf, math.inf, f"dtype {out.dtype} != {ref.dtype}")
    o, r = out.detach().double(), ref.detach().double()
    diff = (o - r).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    norm = float(r.norm())
    rel = float((o - r).norm()) / norm if norm > 0 else float((o - r).norm())
    if not torch.allclose(out, ref, atol=atol, rtol=rtol):
        return Comparison(False, max_abs, rel, f"not allclose (max_abs_err {max_abs:.3g})")
    if max_rel is not None and not rel < max_rel:
        return Comparison(False, max_abs, rel, f"relative error {rel:.3g} >= {max_rel:g}")
    return Comparison(True, max_abs, rel)


def require_gpu() -> None:
    """Exit with one clear line when no CUDA GPU is visible."""
    try:
        import torch
    except ImportError:
        sys.exit("error: torch is not installed")
    if not torch.cuda.is_available():
        sys.exit(NO_GPU)
