"""The drift check: the reference's time beside a candidate against its time alone.

The worker times the reference and the candidate interleaved, in the process the candidate runs in, which can slow
the reference without patching anything (``torch.set_num_threads(1)`` as ``forward`` returns, a spinning thread,
work left running). The judge knows the reference's time alone (``JudgeTask.alone_ms``, measured in a worker no
candidate had run in); where the reference ran more than REF_DRIFT slower than that beside a candidate claiming a
gain, the claim is measured by the judge's clock, strictly (:mod:`stark_ray.eval.judgement`).

The two times are measured at different moments, and on a shared host a burst of other work during either one
decides the check (CI, four test processes on two cores: the reference alone at 1.8x its quiet time, and a 1.0x
candidate that left one thread to its reference accepted at 1.65x). So the judge also times a few calls of its own
copy of the reference (:func:`pace`) just before and after the alone timing (its pace then: the slower of the two)
and again just before and after the candidate's timing, the worker stopped (its pace now: the slower of those), and
scales the alone time by now/then where the host is faster now (:func:`scaled`) — never up: what the judge's clock
sees can only make the check stricter, and a burst during the candidate's timing shows in its pace now as one during
the alone timing does in its pace then.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.inputs import clone_all, make_inputs
from stark_ray.eval.trials import JudgeTask, synchronize

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


def scaled(alone_ms: float, then_s: float | None, now_s: float | None) -> float:
    """``alone_ms`` times ``now_s / then_s`` where the host is faster now, never longer than ``alone_ms``."""
    if then_s is None or now_s is None or then_s <= 0 or now_s <= 0:
        return alone_ms
    return alone_ms * min(1.0, now_s / then_s)


class DriftCheck:
    """One candidate's drift check; ``measure`` is the judge's pace of the reference with the worker stopped.
    Made just before the worker times the candidate (its first pace now, where the task has a yardstick)."""

    def __init__(self, task: JudgeTask, measure: Callable[[], float | None]) -> None:
        self.task = task
        self.measure = measure
        self.before = measure() if task.alone_ms is not None and task.alone_pace_s is not None else None

    def yardstick(self, ref_ms: float, speedup: float) -> float | None:
        """The reference's time alone to hold ``ref_ms`` against (None: none known), scaled to the host's pace now
        where a claimed gain would otherwise pass."""
        alone = self.task.alone_ms
        if alone is None or speedup <= 1.0 or ref_ms > REF_DRIFT * alone or self.before is None:
            return alone
        return scaled(alone, self.task.alone_pace_s, slower(self.before, self.measure()))

    def note(self, ref_ms: float, alone: float) -> str:
        scale = "" if alone == self.task.alone_ms else \
            f" (its {self.task.alone_ms:.4g} ms then, scaled to the host's pace now)"
        return (f"the reference ran at {ref_ms:.4g} ms beside this candidate, {ref_ms / alone:.2f}x its "
                f"{alone:.4g} ms alone{scale}: its speedup is measured by the judge's clock")
