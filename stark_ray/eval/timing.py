"""Timing: reference and candidate measured in the same process and run, interleaved, on fresh inputs.

A :class:`Timer` measures one call in milliseconds; the CPU timer wraps ``time.perf_counter`` around the call.
A device backend supplies its own (CUDA events with a device-wide sync before the end event) — the
interleaving, warm-up and statistics here stay the same.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from stark_ray.eval.inputs import clone_all, make_inputs

TIMING_SEED_OFFSET = 10_000  # timing inputs are fresh: seeds apart from the correctness trials'


class Timer(Protocol):
    def __call__(self, fn: Callable[..., Any], args: list[Any]) -> float:
        """Run ``fn(*args)`` once and return its duration in milliseconds."""
        ...


class CpuTimer:
    def __call__(self, fn: Callable[..., Any], args: list[Any]) -> float:
        t0 = time.perf_counter()
        out = fn(*args)
        t1 = time.perf_counter()
        del out
        return (t1 - t0) * 1e3


@dataclass(frozen=True)
class Stats:
    median: float
    mean: float
    std: float
    min: float
    n: int
    samples: tuple[float, ...] = ()

    @staticmethod
    def of(samples: list[float] | tuple[float, ...]) -> Stats:
        return Stats(statistics.median(samples), statistics.fmean(samples),
                     statistics.stdev(samples) if len(samples) > 1 else 0.0, min(samples), len(samples),
                     tuple(samples))

    def describe(self) -> str:
        return f"median {self.median:.4g} ms, mean {self.mean:.4g} ms, std {self.std:.3g} ms, n {self.n}"


def time_interleaved(fns: list[Callable[..., Any]], get_inputs: Callable[[], Any], timer: Timer,
                     warmup: int, trials: int, seed: int, device: str = "cpu") -> list[Stats]:
    """Time each of ``fns`` ``trials`` times, round-robin, the order rotating every round to cancel drift and
    cache warmth; every round draws fresh inputs and gives each function its own clone."""
    samples: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.no_grad():
            for r in range(warmup + trials):
                inputs = make_inputs(get_inputs, seed + TIMING_SEED_OFFSET + r, device=device)
                clones = [clone_all(inputs) for _ in fns]
                for i in order:
                    ms = timer(fns[i], clones[i])
                    if r >= warmup:
                        samples[i].append(ms)
                order = order[1:] + order[:1]
                del inputs, clones
    finally:
        if was_enabled:
            gc.enable()
    return [Stats.of(s) for s in samples]
