"""The precision contract: a candidate computes at its task's precision, or says so.

A float32 task answered in TF32, float16 or bfloat16 arithmetic (tensor cores behind two cast kernels: the most
common way real systems' scores are inflated) can pass a float32 tolerance: TF32 and half precision land near
3e-4 of normalized error on a matrix product, under the 1e-3 bound. What tells it apart is the task's own *noise
floor*: the error of the reference's float32 result against the same computation in float64, once per task on the
first standard trial's inputs. Float32 arithmetic of any kind (another order of summation, an online softmax, fast
intrinsics) lands within a small multiple of that floor; a mantissa of 10 or 7 bits lands hundreds of times above
it. A candidate whose error on that trial exceeds :data:`FACTOR` times the floor (and :data:`LEAST`, for tasks
whose float32 result is exact) is flagged ``reduced_precision``: still accepted where the tolerance (the task's
dtype, ``--tolerance``) allows its error, never unsaid.

By the triangle inequality the candidate's error against float64 is within the floor of its error against the
float32 reference, so the trial's own comparison is all a candidate costs; the float64 forward runs once per task
(on the device, where the budget leaves room for a float64 copy of the model and one input set; else the contract
is not checked, and the result says so). Tasks whose outputs are not floating, that compute in float64 already or
that draw random numbers (a dropout: its float64 mask is another) are not checked.

The reference's math modes (TF32 for matrix products and cuDNN convolutions, reduced-precision reductions) are
the judge's and the worker's alike — on a GPU both processes switch TF32 off as they set up the device
(``backends/gpu.py``), so that a float32 reference computes in float32 — and are stated with the result
(:func:`stark_ray.eval.measure.math_modes.describe`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.eval.measure.compare import compare_outputs, flatten_outputs
from stark_ray.eval.measure.inputs import nbytes_of
from stark_ray.eval.measure.memory import GB, TRANSIENT_BYTES, param_bytes
from stark_ray.eval.measure.tolerance import Tolerance

FACTOR = 32.0  # a candidate's error above this many times the reference's own float32 error ...
LEAST = 2.0 ** -17  # ... and above this normalized error (a float32 result that is exact: ReLU, max pooling)
ANY = Tolerance(math.inf, math.inf, math.inf)  # a comparison for its figures only


@dataclass(frozen=True)
class Floor:
    """The reference's own error against float64 on the first standard trial (``error``), or why there is none
    (``why``)."""

    error: float | None
    why: str = ""
    lasting: bool = True  # False: not measured for want of room or memory now (the next request may measure it)

    @property
    def bound(self) -> float | None:
        """The error above which a candidate computes at less than the task's precision."""
        return None if self.error is None else max(FACTOR * self.error, LEAST)

    def describe(self) -> str:
        if self.error is None:
            return f"precision not checked: {self.why}"
        return f"the reference's own float32 error against float64: {self.error:.2g}"


def floating_outputs(out: Any) -> list[torch.Tensor]:
    return [v for _, v in flatten_outputs(out) if isinstance(v, torch.Tensor) and v.is_floating_point()]


def to_double(value: Any) -> Any:
    """``value`` with every floating tensor as float64 (in its structure)."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, list | tuple):
        items = [to_double(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {k: to_double(v) for k, v in value.items()}
    return value


def like(value: Any, ref: Any) -> Any:
    """``value`` (float64) cast back to ``ref``'s dtypes, tensor by tensor."""
    if isinstance(value, torch.Tensor) and isinstance(ref, torch.Tensor):
        return value.to(ref.dtype)
    if isinstance(value, list | tuple) and isinstance(ref, list | tuple):
        items = [like(v, r) for v, r in zip(value, ref, strict=False)]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict) and isinstance(ref, dict):
        return {k: like(v, ref.get(k)) for k, v in value.items()}
    return value


def float64_need(model: torch.nn.Module, inputs: int, work: int) -> int:
    """Device bytes a float64 forward takes beside what is held: the model's copy, one input set and the forward,
    each at twice a float32's size, and the comparison's chunks."""
    return 2 * (param_bytes(model) + inputs + work) + TRANSIENT_BYTES


FLOAT64_LIMIT_S = 20.0  # a floor whose float64 forward would take longer is not measured


def float64_too_slow(alone_ms: float | None, peaks: Any) -> str:
    """Why the task's float64 forward would take too long to measure its floor ("" where it would not): on a device
    whose float64 rate is a small share of its float32 one (an L40S: 1/64), by the reference's time alone
    (``peaks``: the device's :class:`~stark_ray.eval.judge.sol.Peaks`)."""
    if peaks is None or alone_ms is None or "fp64" not in peaks.flops:
        return ""
    slower = peaks.flop_rate("fp32") / max(peaks.flops["fp64"], 1.0)
    estimate_s = alone_ms * slower / 1e3
    return (f"its float64 forward would take about {estimate_s:.0f} s on this device (float64 at 1/{slower:.0f} of "
            "float32)") if estimate_s > FLOAT64_LIMIT_S else ""


def measure_floor(model: torch.nn.Module, inputs: list[Any], ref: Any, seed: int, room: int | None,
                  work: int, draws_random: bool) -> Floor:
    """The task's :class:`Floor`: its reference (``model``) run in float64 on ``inputs`` (the first standard trial's,
    the caller's to lose) against ``ref`` (its float32 output on them). ``room``: device bytes the budget leaves
    (None: no budget)."""
    outs = floating_outputs(ref)
    if not outs:
        return Floor(None, "no floating output")
    if all(o.dtype == torch.float64 for o in outs):
        return Floor(None, "the task computes in float64")
    if draws_random:
        return Floor(None, "the forward draws random numbers (its float64 draws differ)")
    need = float64_need(model, sum(nbytes_of(inputs)), work)
    if room is not None and need > room:
        return Floor(None, f"its float64 forward needs {need / GB:.1f} GB, {room / GB:.1f} GB left in the budget",
                     lasting=False)
    try:
        twin = copy.deepcopy(model).double()
        doubled = to_double(inputs)
        del inputs
        torch.manual_seed(seed)
        with torch.no_grad():
            exact = twin(*doubled)
        del twin, doubled
        c = compare_outputs(ref, like(exact, ref), ANY)
    except torch.OutOfMemoryError:
        return Floor(None, "its float64 forward did not fit in the device's memory", lasting=False)
    except Exception as e:  # an op without a float64 kernel, a model that cannot be copied
        return Floor(None, f"its float64 forward failed ({type(e).__name__}: {str(e)[:120]})")
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if not c.ok or not math.isfinite(c.rel_err):
        return Floor(None, "its float64 result is not comparable with its float32 one")
    return Floor(c.rel_err)


def reduced(error: float | None, floor: Floor) -> str | None:
    """The line for a candidate whose error (on the floor's trial) is beyond the floor's bound (None: within)."""
    bound = floor.bound
    if bound is None or error is None or not math.isfinite(error) or error <= bound:
        return None
    assert floor.error is not None
    times = f"{error / floor.error:.3g}x" if floor.error > 0 else "far above"
    return (f"its normalized error, {error:.2g} (the larger of the first trial's and the one after the timing's), "
            f"is {times} the reference's own float32 error "
            f"against float64 ({floor.error:.2g}; the contract allows {FACTOR:g}x, at least {LEAST:.2g}): "
            "arithmetic of less precision than the task's (TF32, float16 or bfloat16) or an approximation")
