"""The terms a candidate is judged by, as the agents' prompts state them under the hardware: the task's speed of
light (:mod:`stark_ray.eval.judge.sol`), the math modes its reference computes in (the precision contract,
:mod:`stark_ray.eval.judge.precision`) and the tolerance by dtype. Nothing here imports torch: the driver writes
these lines, and importing torch there for them took 4-8 s of a run's first minute."""

from __future__ import annotations

from typing import Any

from stark_ray.eval.judge.sol import light_line
from stark_ray.eval.measure.tolerance import Tolerances


def precision_line(result: Any) -> str:
    """The line for a task whose reference ``result`` states its math modes ("" without them)."""
    modes = getattr(result, "math_modes", None)
    if not modes:
        return ""
    return (f"Precision: the reference computes in its own dtypes (math modes: {modes}); a candidate "
            "whose error is far above the reference's own (TF32 or half-precision arithmetic on float32 data, an "
            "approximation) is accepted where the tolerance allows it but flagged reduced_precision")


def reference_lines(result: Any, cfg: Any = None) -> str:
    """What the prompts show under the hardware from a task's reference ``result``: its speed of light, the math
    modes its figures were computed under (each where known) and, with the evaluation's ``cfg``, the tolerance
    every output is held to."""
    tolerance = (f"Tolerance: every output against the reference's, element by element (|out - ref| <= atol + rtol "
                 f"x |ref|) and as a whole (||out - ref|| / ||ref||), by its dtype: {Tolerances.of(cfg).describe()}"
                 if cfg is not None else "")
    return "\n".join(line for line in (light_line(result), precision_line(result), tolerance) if line)
