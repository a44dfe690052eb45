"""The drift check: the reference's time beside a candidate against its time alone.

The worker times the reference and the candidate interleaved, in the process the candidate runs in, which can slow
the reference without patching anything or leaving a setting behind (that, eval/measure/process_state.py undoes): a
thread that keeps a core busy, work left running. The judge knows the reference's time alone (``JudgeTask.alone_ms``,
and its fastest call ``alone_min_ms``, measured in a worker no candidate had run in); where the reference ran more than
REF_DRIFT slower than that beside a candidate claiming a gain, by its median or by its fastest call, the claim is
measured by the judge's clock, strictly (:mod:`stark_ray.eval.judge.claim`).

The two times are measured at different moments, and on a shared host a burst of other work during either one
decides the check (CI, four test processes on two cores: the reference alone at 1.8x its quiet time, and a 1.0x
candidate that left one thread to its reference accepted at 1.65x). So the judge also times a few calls of its own
copy of the reference (:func:`pace`) just before and after the alone timing (its pace then: the slower of the two)
and again just before and after the candidate's timing, the worker stopped (its pace now: the slower of those), and
scales the alone time by now/then where the host is faster now (:func:`scale`) — never up: what the judge's clock
sees can only make the check stricter, and a burst during the candidate's timing shows in its pace now as one during
the alone timing does in its pace then.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.judge.trials import JudgeTask, synchronize
from stark_ray.eval.measure.inputs import clone_all, make_inputs

REF_DRIFT = 1.15  # a claimed gain is measured by the judge where the reference ran this much slower than alone
CALLS = 5  # a pace: at most this many calls (the least counts) ...
MIN_CALLS = 2  # ... at least this many ...
BUDGET_S = 0.25  # ... and no more once this long has passed


def pace(task: JudgeTask, cfg: EvalConfig) -> float | None:
    """The least seconds of one call of the reference, in this process, on a set of inputs made for it (the first
    standard trial's values, not its reference outputs: a reference that works in place changes them); None where it
    fails (the device full, the reference raising)."""
    best = math.inf
    started = time.perf_counter()
    try:
        inputs = make_inputs(task.get_inputs, cfg.seed, 1.0, task.device, fresh=task.fresh_inputs)
        if not task.fresh_inputs:  # the task's own tensors, perhaps: a copy to work on
            inputs = clone_all(inputs)
        for i in range(CALLS):
            synchronize(task)
            t0 = time.perf_counter()
            with torch.no_grad():
                task.model(*inputs)
            synchronize(task)
            best = min(best, time.perf_counter() - t0)
            if i + 1 >= MIN_CALLS and time.perf_counter() - started > BUDGET_S:
                break
    except Exception:  # no pace: the yardstick stays as it was
        return None
    return best if math.isfinite(best) and best > 0 else None


def slower(a: float | None, b: float | None) -> float | None:
    """The larger of two paces (None where either is missing)."""
    return max(a, b) if a is not None and b is not None else None


def reading(value: Any) -> float | None:
    """A time as a worker reported it: a positive finite number, else None (no reading)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def scale(then_s: float | None, now_s: float | None) -> float:
    """``now_s / then_s`` where the host is faster now, else 1."""
    if then_s is None or now_s is None or then_s <= 0 or now_s <= 0:
        return 1.0
    return min(1.0, now_s / then_s)


@dataclass(frozen=True)
class Drift:
    """A reference found slowed beside a candidate: the yardstick its time of record falls back to, and why."""

    alone_ms: float
    note: str


class DriftCheck:
    """One candidate's drift check; ``measure`` is the judge's pace of the reference with the worker stopped.
    Made just before the worker times the candidate (its first pace now, where the task has a yardstick).

    Two readings of the reference beside the candidate are held against its two alone: the median, and the fastest
    call. A burst of other work on a shared host moves a median (the alone timing's or this one's) and rarely a
    fastest call, which needs only one quiet moment; a thread that keeps a core busy whenever the candidate is not
    running slows every call of the reference, the fastest too (on CI's busy two cores such a spinner's 1.4x and
    more went unseen by the medians alone)."""

    def __init__(self, task: JudgeTask, measure: Callable[[], float | None]) -> None:
        self.task = task
        self.measure = measure
        self.before = measure() if task.alone_ms is not None and task.alone_pace_s is not None else None

    def slowed(self, ref_ms: float, ref_min_ms: float | None, speedup: float) -> Drift | None:
        """The drift where the reference ran more than REF_DRIFT slower beside the candidate than alone, by either
        reading — against its time alone scaled to the host's pace now where a claimed gain would otherwise
        pass — else None."""
        if self.task.alone_ms is None:
            return None
        factor = 1.0
        if speedup > 1.0 and self._over(ref_ms, ref_min_ms, 1.0) is None and self.before is not None:
            factor = scale(self.task.alone_pace_s, slower(self.before, self.measure()))
        which = self._over(ref_ms, ref_min_ms, factor)
        if which is None:
            return None
        alone = self.task.alone_ms * factor
        scaled_note = "" if factor == 1.0 else " (then, scaled to the host's pace now)"
        if which == "median":
            note = (f"the reference ran at {ref_ms:.4g} ms beside this candidate, {ref_ms / alone:.2f}x its "
                    f"{alone:.4g} ms alone{scaled_note}")
        else:
            low = (self.task.alone_min_ms or 0.0) * factor
            note = (f"the reference's fastest call beside this candidate took {ref_min_ms:.4g} ms, "
                    f"{(ref_min_ms or 0.0) / low:.2f}x its fastest alone, {low:.4g} ms{scaled_note}")
        return Drift(alone, f"{note}: its speedup is measured by the judge's clock")

    def _over(self, ref_ms: float, ref_min_ms: float | None, factor: float) -> str | None:
        """Which reading is over REF_DRIFT times its alone (scaled by ``factor``), if any."""
        alone, low = self.task.alone_ms, self.task.alone_min_ms
        if alone is not None and ref_ms > REF_DRIFT * alone * factor:
            return "median"
        if low is not None and ref_min_ms is not None and ref_min_ms > REF_DRIFT * low * factor:
            return "fastest"
        return None
