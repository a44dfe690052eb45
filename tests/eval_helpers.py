"""Verdict helpers for tests of the evaluator's machinery on a busy 2-core box."""

from __future__ import annotations

from stark_ray.records import REJECTING_FLAGS, EvalResult

TIMING_NOISE_FLAGS = frozenset({"suspicious"})  # a speedup above 2x the judge's own clock could not confirm


def passed(r: EvalResult) -> bool:
    """Correct and timed, flagged for nothing but timing noise. A test of restarts, spares, isolation or guards
    evaluates an honest candidate to see the machinery still works; on a loaded 2-core machine the worker's timing
    can overstate its speedup past 2x and the judge's clock then flags it ``suspicious`` — rightly, and beside that
    test's point. Tests about timing and its flags check ``ok`` and the flags themselves."""
    return (r.compiled and r.passed_checks and r.runtime_ms is not None
            and set(r.flags) & set(REJECTING_FLAGS) <= TIMING_NOISE_FLAGS)


def ended(r: EvalResult) -> int:
    """1 where the judge ended ``r``'s worker after it for a figure of record other than the worker's claim (the
    judge's, or a noisy gain's low end: on a busy host, an honest candidate's too), else 0: a test that counts
    worker starts counts these as well."""
    from stark_ray.eval.judge.judge import WORKER_ENDED

    return int(WORKER_ENDED in (r.log or ""))
