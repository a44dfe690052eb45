"""Compare a candidate's outputs with the reference's: structure (tuples, lists, dicts key by key), shape, dtype,
NaNs, tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.eval.measure.tolerance import Tolerance, Tolerances


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float = 0.0
    rel_err: float = 0.0  # ||out - ref|| / ||ref|| (0 when both are all zeros, inf when only ref is)
    problem: str = ""  # one line when not ok


@dataclass(frozen=True)
class TensorStub:
    """A candidate's output tensor known only by its description (it did not cross to the judge: its shape, dtype
    or device differ from the slot the reference's output gave it)."""

    shape: tuple[int, ...]
    dtype: str
    device: str


def flatten_outputs(value: Any, prefix: str = "output") -> list[tuple[str, Any]]:
    """(path, leaf) for every tensor and plain value in a (nested) tuple/list/dict, in order; dict items by key."""
    if isinstance(value, list | tuple):
        return [item for i, v in enumerate(value) for item in flatten_outputs(v, f"{prefix}[{i}]")]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in flatten_outputs(v, f"{prefix}[{str(k)!r}]")]
    return [(prefix, value)]



def tensors_of(values: Any) -> list[torch.Tensor]:
    """The tensors of a structure of values, in order."""
    return [v for _, v in flatten_outputs(values, "input") if isinstance(v, torch.Tensor)]

def rebuild_outputs(like: Any, leaves: dict[str, Any], prefix: str = "output") -> Any:
    """``like``'s structure with each tensor replaced by the one at its path in ``leaves`` (:func:`flatten_outputs`
    names the paths)."""
    if isinstance(like, list | tuple):
        items = [rebuild_outputs(v, leaves, f"{prefix}[{i}]") for i, v in enumerate(like)]
        return tuple(items) if isinstance(like, tuple) else items
    if isinstance(like, dict):
        return {k: rebuild_outputs(v, leaves, f"{prefix}[{str(k)!r}]") for k, v in like.items()}
    return leaves[prefix] if isinstance(like, torch.Tensor) else like


def _compare_stub(name: str, out: TensorStub, ref: torch.Tensor) -> Comparison:
    if out.shape != tuple(ref.shape):
        return Comparison(False, math.inf, math.inf, f"{name}: shape {out.shape}, expected {tuple(ref.shape)}")
    expected = str(ref.dtype).removeprefix("torch.")
    if out.dtype != expected:
        return Comparison(False, math.inf, math.inf, f"{name}: dtype torch.{out.dtype}, expected {ref.dtype}")
    return Comparison(False, math.inf, math.inf, f"{name}: on {out.device}, expected {ref.device.type}")


CHUNK = 1 << 26  # elements compared at a time


def _chunk_figures(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """Extra NaNs, missing NaNs, infinity mismatches, elements not close, max |diff|, sum diff^2, sum ref^2."""
    o = out.to(torch.float64)
    r = ref.to(torch.float64)
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    finite = torch.isfinite(r)
    diff = torch.where(finite, o - r, torch.zeros_like(o))
    return torch.stack([
        (nan_o & ~nan_r).sum().to(torch.float64),
        (~nan_o & nan_r).sum().to(torch.float64),
        ((torch.isposinf(o) != torch.isposinf(r)) | (torch.isneginf(o) != torch.isneginf(r))).sum().to(torch.float64),
        (~torch.isclose(o, r, rtol=tol.rtol, atol=tol.atol, equal_nan=True)).sum().to(torch.float64),
        diff.abs().max(),
        diff.square().sum(),
        torch.where(finite, r, torch.zeros_like(r)).square().sum(),
    ])


_FAST_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _norm(x: torch.Tensor) -> float:
    """The 2-norm at ``x``'s precision (summed in a tree: exact enough for a relative error), again in float64
    where it overflowed."""
    n = float(torch.linalg.vector_norm(x))
    return n if math.isfinite(n) else float(torch.linalg.vector_norm(x, dtype=torch.float64))


def _finite_figures(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[float, float, float, float] | None:
    """Elements not close, max |diff|, ||diff||, ||ref|| in a few passes at the outputs' own precision (float32 at
    least), or None when either side holds a NaN or an infinity (a non-finite |diff| somewhere): those take
    :func:`_chunk_figures`, which tells the cases apart."""
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    not_close, max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0, 0.0
    for i in range(0, out.numel(), CHUNK):
        o, r = out[i:i + CHUNK].to(work), ref[i:i + CHUNK].to(work)
        d = o - r
        del o
        top = float(d.abs_().max())
        if not math.isfinite(top):  # NaN or an infinity on either side (NaN propagates through max)
            return None
        bound = r.abs().mul_(tol.rtol).add_(tol.atol)
        not_close += float(torch.count_nonzero(d > bound))  # (a bool tensor's sum() is several times slower)
        del bound
        diff_sq += _norm(d) ** 2
        ref_sq += _norm(r) ** 2
        max_abs = max(max_abs, top)
    return not_close, max_abs, math.sqrt(diff_sq), math.sqrt(ref_sq)


def _compare_tensor(name: str, out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> Comparison:
    if out.shape != ref.shape:
        return Comparison(False, math.inf, math.inf,
                          f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Comparison(False, math.inf, math.inf, f"{name}: dtype {out.dtype}, expected {ref.dtype}")
    if out.numel() == 0:
        return Comparison(True)
    if out.device != ref.device:
        out = out.to(ref.device)
    # in chunks (a 6 GB output in float64 would need several times its size at once); every figure is reduced on
    # the device (read back per chunk on the fast path, once per tensor on the exact one)
    o_flat, r_flat = out.detach().reshape(-1), ref.detach().reshape(-1)
    finite = _finite_figures(o_flat, r_flat, tol) if ref.dtype in _FAST_DTYPES else None
    if finite is not None:  # the common case: numbers on both sides
        extra_nan = missing_nan = inf_mismatch = 0.0
        not_close, max_abs, diff_norm, ref_norm = finite
    else:
        parts = [_chunk_figures(o_flat[i:i + CHUNK], r_flat[i:i + CHUNK], tol)
                 for i in range(0, o_flat.numel(), CHUNK)]
        stacked = torch.stack(parts)
        counts = stacked[:, :4].sum(dim=0)
        squares = stacked[:, 5:].sum(dim=0).sqrt()
        figures = [*counts.tolist(), float(stacked[:, 4].max()), *squares.tolist()]
        extra_nan, missing_nan, inf_mismatch, not_close, max_abs, diff_norm, ref_norm = figures
    if extra_nan or missing_nan:
        where = "NaN where the reference has a number" if extra_nan else "a number where the reference has NaN"
        return Comparison(False, math.inf, math.inf, f"{name}: {where}")
    if inf_mismatch:
        return Comparison(False, math.inf, math.inf, f"{name}: infinities differ from the reference")
    rel = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    if not_close:
        return Comparison(False, max_abs, rel,
                          f"{name}: values differ (max_abs_err {max_abs:.3g}, rel_err {rel:.3g}; "
                          f"atol {tol.atol:g}, rtol {tol.rtol:g})")
    if ref_norm > 0 and rel > tol.max_rel_err:
        return Comparison(False, max_abs, rel,
                          f"{name}: normalized error {rel:.3g} exceeds {tol.max_rel_err:g} (max_abs_err "
                          f"{max_abs:.3g})")
    return Comparison(True, max_abs, rel)


def _compare_plain(name: str, out: Any, ref: Any, tol: Tolerance) -> Comparison:
    if isinstance(ref, float | int) and isinstance(out, float | int) and not isinstance(ref, bool):
        same = math.isclose(out, ref, rel_tol=tol.rtol, abs_tol=tol.atol) or (
            math.isnan(out) and math.isnan(ref))
    else:
        try:
            same = bool(out == ref)
        except Exception:
            same = False
    if same:
        return Comparison(True)
    return Comparison(False, problem=f"{name}: got {out!r:.60}, expected {ref!r:.60}")


def compare_outputs(out: Any, ref: Any, tol: Tolerance | Tolerances) -> Comparison:
    """Compare a tensor, or a (nested) tuple/list/dict of tensors and plain values, item by item (dicts key by
    key); with :class:`Tolerances`, each tensor by its reference's dtype."""
    outs, refs = flatten_outputs(out), flatten_outputs(ref)
    if len(outs) != len(refs):
        return Comparison(False, math.inf, math.inf, f"returned {len(outs)} outputs, expected {len(refs)}")
    names = [n for n, _ in refs]
    if [n for n, _ in outs] != names:
        if sorted(n for n, _ in outs) != sorted(names):
            return Comparison(False, math.inf, math.inf,
                              f"returned {', '.join(n for n, _ in outs)[:120]}; expected {', '.join(names)[:120]}")
        by_name = dict(outs)
        outs = [(n, by_name[n]) for n in names]  # the same keys, another order: compared key by key
    worst = Comparison(True)
    for (name, o), (_, r) in zip(outs, refs, strict=True):
        if isinstance(r, torch.Tensor):
            if isinstance(o, TensorStub):
                return _compare_stub(name, o, r)
            if not isinstance(o, torch.Tensor):
                return Comparison(False, math.inf, math.inf,
                                  f"{name}: got {type(o).__name__}, expected a tensor")
            c = _compare_tensor(name, o, r, tol.for_dtype(r.dtype) if isinstance(tol, Tolerances) else tol)
        elif isinstance(o, torch.Tensor | TensorStub):
            return Comparison(False, math.inf, math.inf, f"{name}: got a tensor, expected {type(r).__name__}")
        else:
            c = _compare_plain(name, o, r, tol.for_dtype(torch.float32) if isinstance(tol, Tolerances) else tol)
        if not c.ok:
            return c
        worst = Comparison(True, max(worst.max_abs_err, c.max_abs_err), max(worst.rel_err, c.rel_err))
    return worst
