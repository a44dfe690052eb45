"""The judge's pace of a task's reference: how long one call takes in the judge's own process, now.

The drift check (:data:`judgement.REF_DRIFT`) compares the reference's time beside a candidate with its time alone
(``JudgeTask.alone_ms``), and the two are measured at different moments: on a shared host, a burst of other work
during the alone timing makes the yardstick too long, and a candidate that slows its reference (one thread left
for it) then passes unseen (CI, four test processes on two cores: the reference alone at 1.8x its quiet time, a
1.0x candidate accepted at 1.65x). So the judge times a few calls of its own copy of the reference around the
alone timing and again once the candidate's timing is done (the worker stopped: nothing of the candidate's runs),
and scales the yardstick by how much faster the host is now (:func:`yardstick`). Its pace around the alone timing
is the slower of before and after, and the scale never lengthens the yardstick: what the judge measures can only
make the check stricter.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from stark_ray.eval.trials import JudgeTask, synchronize

CALLS = 5  # at most this many calls (the least counts) ...
MIN_CALLS = 2  # ... at least this many ...
BUDGET_S = 0.25  # ... and no more once this long has passed


def pace(task: JudgeTask, inputs: list[Any]) -> float | None:
    """The least seconds of one call of the reference on ``inputs`` (the caller's to lose: a reference that works in
    place changes them), in this process; None where it fails (the device full, the reference raising)."""
    best = math.inf
    started = time.perf_counter()
    try:
        for i in range(CALLS):
            synchronize(task)
            t0 = time.perf_counter()
            with torch.no_grad():
                task.model(*inputs)
            synchronize(task)
            best = min(best, time.perf_counter() - t0)
            if i + 1 >= MIN_CALLS and time.perf_counter() - started > BUDGET_S:
                break
    except Exception:  # the device full, the reference raising: no pace, the yardstick stays as it was
        return None
    return best if math.isfinite(best) and best > 0 else None


def yardstick(alone_ms: float, then_s: float | None, now_s: float | None) -> float:
    """The reference's time alone scaled to the host's pace now: ``alone_ms`` times ``now_s / then_s`` where the
    host is faster now (a burst lengthened the alone timing), never longer than ``alone_ms``."""
    if then_s is None or now_s is None or then_s <= 0 or now_s <= 0:
        return alone_ms
    return alone_ms * min(1.0, now_s / then_s)
