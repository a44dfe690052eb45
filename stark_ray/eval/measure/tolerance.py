"""What an output must meet to equal the reference's: tolerances by dtype, in presets (no torch here: the driver
states them in the agents' prompts without importing it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    max_rel_err: float


# Per output dtype: (atol, rtol, max normalized error ||out - ref|| / ||ref||). float32 keeps KernelBench's
# allclose tolerance (1e-2) but bounds the normalized error at 1e-3: float32 arithmetic (fast-math included)
# lands far below it and TF32 near 3e-4, while an output that is off everywhere by a little, or all zeros on a
# task whose outputs are tiny, fails. Half types get room for their rounding.
TOLERANCE_PRESETS: dict[str, dict[str, Tolerance]] = {
    "default": {
        "float64": Tolerance(1e-5, 1e-5, 1e-5),
        "float32": Tolerance(1e-2, 1e-2, 1e-3),
        "float16": Tolerance(1e-2, 1e-2, 5e-3),
        "bfloat16": Tolerance(2e-2, 2e-2, 1e-2),
        # integers and booleans (an argmax, a mask) exactly: rtol 1e-2 let an index of 500 be off by 5
        "integer": Tolerance(0.0, 0.0, 0.0),
        "other": Tolerance(1e-2, 1e-2, 1e-3),
    },
    # paper-comparable: KernelBench's atol = rtol = 1e-2 for every dtype; the normalized bound stays (at 1e-2)
    # so that all-zero outputs on tiny-magnitude tasks still fail
    "kernelbench": {"other": Tolerance(1e-2, 1e-2, 1e-2)},
}


@dataclass(frozen=True)
class Tolerances:
    """Tolerances by output dtype (a preset), with optional overrides for every dtype; ``factor`` widens all."""

    preset: str = "default"
    atol: float | None = None
    rtol: float | None = None
    max_rel_err: float | None = None
    factor: float = 1.0

    def for_dtype(self, dtype: Any) -> Tolerance:
        """For a torch dtype, or its name (``float32``)."""
        table = TOLERANCE_PRESETS[self.preset]
        name = str(dtype).removeprefix("torch.")
        integer = not name.startswith(("float", "bfloat", "complex"))
        base = table.get(name) or (integer and table.get("integer")) or table["other"]
        f = self.factor
        return Tolerance(f * (base.atol if self.atol is None else self.atol),
                         f * (base.rtol if self.rtol is None else self.rtol),
                         f * (base.max_rel_err if self.max_rel_err is None else self.max_rel_err))

    def describe(self) -> str:
        """One line for the prompts: what an output must meet, per dtype (``float32: atol 0.01, rtol 0.01,
        normalized error <= 0.001; ...``)."""
        parts = []
        for name in ("float32", "float16", "bfloat16", "float64"):
            t = self.for_dtype(name)
            parts.append(f"{name}: atol {t.atol:g}, rtol {t.rtol:g}, normalized error <= {t.max_rel_err:g}")
        exact = self.for_dtype("int64")
        parts.append("integers and booleans exactly" if exact.atol == exact.rtol == 0 else
                     f"integers: atol {exact.atol:g}, rtol {exact.rtol:g}")
        return "; ".join(parts)

    def widened(self, factor: float) -> Tolerances:
        return Tolerances(self.preset, self.atol, self.rtol, self.max_rel_err, self.factor * factor)

    @staticmethod
    def of(cfg: Any) -> Tolerances:
        """From an EvalConfig (tolerance, atol, rtol, max_rel_err)."""
        return Tolerances(cfg.tolerance, cfg.atol, cfg.rtol, cfg.max_rel_err)
