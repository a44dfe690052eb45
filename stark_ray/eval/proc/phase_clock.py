"""How long a conversation with a worker may last: one time limit per phase, moving only forward."""

from __future__ import annotations

import time
from collections.abc import Callable

from stark_ray.eval.wire.protocol import PHASE_SETUP, PHASE_START, PHASES

START_TIMEOUT_S = 180.0  # a worker's start: interpreter, torch, CUDA context, device probe

class PhaseClock:
    """Which phase a conversation is in, since when, and until when it may last (``limits`` per phase)."""

    def __init__(self, limits: dict[str, float], default_s: float = START_TIMEOUT_S, phase: str = PHASE_SETUP,
                 on_enter: Callable[[str], None] | None = None) -> None:
        self.limits = limits
        self.default_s = default_s
        self.on_enter = on_enter
        self.spent: dict[str, float] = {}
        self.phase = phase
        self.started = time.monotonic()
        # what no phase change can move: a worker that says it moves on (or back) gets no more than all phases
        self.final = self.started + sum(limits.get(p, default_s) for p in PHASES if p != PHASE_START)
        self.deadline = min(self.started + limits.get(phase, default_s), self.final)
        if on_enter is not None:
            on_enter(phase)

    def enter(self, phase: str) -> None:
        """Move on to ``phase`` (its own time limit starts now). Only forward, in the order of PHASES: the same
        phase again, an earlier one or an unknown name changes nothing (the worker says it, and it runs hostile
        code)."""
        order = {p: i for i, p in enumerate(PHASES)}
        if phase not in order or order[phase] <= order.get(self.phase, -1):
            return
        self.close()
        self.phase, self.started = phase, time.monotonic()
        self.deadline = min(self.started + self.limits.get(phase, self.default_s), self.final)
        if self.on_enter is not None:
            self.on_enter(phase)

    def close(self) -> None:
        now = time.monotonic()
        self.spent[self.phase] = self.spent.get(self.phase, 0.0) + now - self.started
        self.started = now

    def limit(self) -> float:
        return self.limits.get(self.phase, self.default_s)
