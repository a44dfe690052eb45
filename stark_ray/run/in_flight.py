"""How many expansions a run keeps in flight (agent calls plus evaluations outstanding, over all tasks).

A fixed cap starves a large cluster: with 20-60 s LLM calls and 64 in flight, a campaign makes at most 1-3 attempts a
second, however many GPUs wait. By Little's law, keeping ``E`` evaluators busy needs about ``E x (agent_s + eval_s)
/ eval_s`` expansions in flight, with ``agent_s`` the time of an agent step and ``eval_s`` an evaluator's time per
candidate. :class:`InFlightCap` measures both as the run goes (moving averages) and derives the cap from them,
with a margin for their spread, never below :data:`FLOOR` (the former fixed default, which small runs and
instant stand-ins are tuned for) and never above :data:`CEILING` (the agent workers' threads are sized for it).
``--max-in-flight N`` (``[run] max_in_flight``) fixes it instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOOR = 64  # the derived cap's least value
CEILING = 512  # its greatest: the agent workers take this many calls at once between them
MARGIN = 1.5  # over Little's law: agent and evaluation times spread, and a queue at the evaluators is cheap
WEIGHT = 0.2  # of each new sample in the moving averages


@dataclass
class InFlightCap:
    """The run's cap on expansions in flight: ``fixed``, or derived from what the run measures."""

    fixed: int | None  # --max-in-flight; None: derived
    evaluators: int = 1
    agent_s: float | None = None  # moving average of an agent step's seconds
    eval_s: float | None = None  # moving average of an evaluator's seconds per candidate

    @property
    def ceiling(self) -> int:
        """The most it can ever be (what the agent pool is sized for)."""
        return self.fixed if self.fixed is not None else CEILING

    @property
    def value(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.agent_s is None or not self.eval_s:
            return FLOOR
        need = self.evaluators * (self.agent_s + self.eval_s) / self.eval_s * MARGIN
        return max(FLOOR, min(CEILING, math.ceil(need)))

    def agent_done(self, seconds: float) -> None:
        self.agent_s = _average(self.agent_s, seconds)

    def evaluated(self, seconds: float | None) -> None:
        if seconds is not None and seconds > 0:
            self.eval_s = _average(self.eval_s, seconds)


def _average(mean: float | None, sample: float) -> float:
    sample = max(0.0, sample)
    return sample if mean is None else (1 - WEIGHT) * mean + WEIGHT * sample
