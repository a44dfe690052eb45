"""Where an evaluation's seconds went: named laps, said in one line of its log (``evaluator time: checks 0.412 s,
timing 1.030 s``). Observations for people and the sweep (``benchmarks/kernelbench_sweep.py`` reads them back),
never a verdict."""

from __future__ import annotations

import time


class Laps:
    """Laps of one evaluation, each from the end of the one before (or from :meth:`mark`)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, float]] = []
        self._since = time.perf_counter()

    def mark(self) -> None:
        """The next lap starts now."""
        self._since = time.perf_counter()

    def lap(self, name: str) -> None:
        """A lap ends now."""
        now = time.perf_counter()
        self.items.append((name, now - self._since))
        self._since = now

    def add(self, name: str, seconds: float) -> None:
        """A lap timed elsewhere (the next starts now)."""
        self.items.append((name, seconds))
        self.mark()

    def line(self, label: str = "evaluator time") -> str:
        return f"{label}: " + ", ".join(f"{name} {s:.3f} s" for name, s in self.items)
