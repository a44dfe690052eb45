"""How far a timed speedup can be trusted.

The worker times the reference and the candidate interleaved, one call of each per round, so each round gives a
pair measured under the same conditions. The ratio of a pair (reference / candidate) is the speedup that round
saw; a host whose load comes and goes moves both calls of a round together, so these ratios spread far less
than either side's own times. The speedup's uncertainty is the standard error of the median of those ratios
(from their median absolute deviation: a few late calls do not make a tight measurement look loose), relative to
the median. A measurement whose uncertainty is above :data:`NOISY` is measured once more by the judge, and
:func:`kept` says which of the two stands; one still above it is said to be noisy wherever the speedup is shown.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NOISY = 0.05  # a relative standard error of the speedup above this (a 95% interval wider than about ±10%)
Z95 = 1.96  # a 95% interval is this many standard errors either side


def median_error(samples: Sequence[float]) -> float:
    """The relative standard error of the median of ``samples`` (1.4826 MAD / sqrt(n), times sqrt(pi / 2) for
    the median's efficiency); inf when it cannot be told (fewer than 2 samples, a median of 0)."""
    if len(samples) < 2:
        return math.inf
    m = statistics.median(samples)
    if not m > 0:
        return math.inf
    mad = statistics.median(abs(x - m) for x in samples)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(samples)) / m


def speedup_error(ref_ms: Sequence[float], new_ms: Sequence[float]) -> float:
    """The relative standard error of the speedup from the calls timed in pairs (``ref_ms[k]`` and ``new_ms[k]``
    in the same round); inf when it cannot be told."""
    if len(ref_ms) != len(new_ms) or len(ref_ms) < 2:
        return math.inf
    ratios = [r / n for r, n in zip(ref_ms, new_ms, strict=True) if n > 0]
    return median_error(ratios) if len(ratios) == len(ref_ms) else math.inf


def is_noisy(err: float | None) -> bool:
    """A speedup known less well than :data:`NOISY` (an error that could not be told is not said to be noisy)."""
    return err is not None and math.isfinite(err) and err > NOISY


def interval(err: float) -> str:
    """``±9%`` (a 95% interval) from a relative standard error."""
    if not math.isfinite(err):
        return "±?"
    pct = 100 * Z95 * err
    return f"±{pct:.0f}%" if pct >= 10 else f"±{pct:.1f}%"


@dataclass(frozen=True)
class Measured:
    """One timing of a candidate against the reference, as the worker reported it."""

    ref_ms: float  # medians
    new_ms: float
    ref_cv: float  # std / mean
    new_cv: float
    error: float  # the speedup's relative standard error (inf when the pairs were not reported)
    ref_min_ms: float | None = None  # the reference's fastest call (the drift check's other reading)

    @property
    def speedup(self) -> float:
        return self.ref_ms / self.new_ms if self.new_ms > 0 else math.inf


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"not a time: {value!r}")
    return float(value)


def _samples(stats: dict[str, Any]) -> list[float]:
    raw = stats.get("samples")
    if not isinstance(raw, list) or len(raw) > 1_000_000:
        return []
    return [_time(v) for v in raw]


def measured(timed: dict[str, Any]) -> Measured:
    """The worker's ``timed`` answer read; ValueError (or KeyError, TypeError) when it is malformed."""
    ref, new = timed["ref"], timed["new"]
    ref_ms, new_ms = _time(ref["median"]), _time(new["median"])
    ref_cv = _time(ref["std"]) / max(_time(ref["mean"]), 1e-12)
    new_cv = _time(new["std"]) / max(_time(new["mean"]), 1e-12)
    ref_min = _time(ref["min"]) if ref.get("min") is not None else None
    return Measured(ref_ms, new_ms, ref_cv, new_cv, speedup_error(_samples(ref), _samples(new)), ref_min)


def kept(first: Measured, second: Measured) -> Measured:
    """Which of two timings of one candidate stands, the second taken because the first was noisy: the second where
    it is steady; where it is noisy too, the one with the lower speedup (a busy host's noise inflates a ratio as
    readily as it deflates it: on a loaded 2-core box an honest 1.0x read 1.51x, then 2.67x, and the larger, kept
    for being the tighter, was flagged ``suspicious`` by the judge's clock, which measured 0.92x). A claim held to
    the lower of two readings cannot grow by a second draw. A second one whose error is unknown (no pairs
    reported) is no steadier: the lower stands."""
    if math.isfinite(second.error) and not is_noisy(second.error):
        return second
    return second if second.speedup < first.speedup else first
