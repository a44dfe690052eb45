"""Where one call's GPU time goes: its kernels, grouped by name, with their time and launches.

The worker profiles one call of the candidate (and of the reference) before timing it (:mod:`stark_ray.eval.
streams`: the same profile that finds its streams). :func:`kernel_times` groups that profile's kernels by name;
:func:`to_message` sends the largest few to the judge, which reads them back with :func:`from_message` and keeps one
line (:func:`describe`) in ``EvalResult.kernels`` for the prompts, ``stark eval`` and the attempts table.

The figures come from the process that ran the candidate, so a candidate can forge them: they are shown to the
agents as an observation, never used for a verdict or a score. :func:`from_message` takes only well-formed entries
(names cut, numbers finite and non-negative, at most :data:`TOP` of them); anything else reads as no breakdown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stark_ray.records import one_line

TOP = 6  # kernels named; the rest are summed up
NAME_CHARS = 90  # a kernel's name as shown (a C++ template instance's can run to thousands)


class Timed(Protocol):  # a profiled kernel (streams.Launch)
    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class KernelTime:
    name: str
    ms: float  # GPU time of all its launches in the call
    launches: int


@dataclass(frozen=True)
class Breakdown:
    kernels: list[KernelTime]  # the largest first, at most TOP
    launches: int  # every kernel launch of the call
    ms: float  # the GPU time of all of them (overlapping kernels counted each)


def kernel_times(launches: Iterable[Timed]) -> Breakdown:
    """One call's kernels grouped by name, the most time first."""
    ms: dict[str, float] = {}
    count: dict[str, int] = {}
    total = 0
    for k in launches:
        spent = max(0.0, (k.end_us - k.start_us) / 1e3)
        ms[k.name] = ms.get(k.name, 0.0) + spent
        count[k.name] = count.get(k.name, 0) + 1
        total += 1
    ordered = sorted(ms, key=lambda name: (-ms[name], name))
    return Breakdown([KernelTime(n, ms[n], count[n]) for n in ordered], total, sum(ms.values()))


def to_message(b: Breakdown) -> dict[str, Any]:
    """The breakdown as the worker sends it: the :data:`TOP` largest kernels and the totals."""
    return {"kernels": [[k.name[:NAME_CHARS], k.ms, k.launches] for k in b.kernels[:TOP]], "launches": b.launches,
            "kernel_ms": b.ms}


def _count(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 10**9 else None


def _ms(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    value = float(x)
    return value if math.isfinite(value) and 0 <= value < 1e9 else None


def from_message(msg: Any) -> Breakdown | None:
    """A worker's breakdown, if well formed (None otherwise: no breakdown is shown)."""
    if not isinstance(msg, dict) or not isinstance(msg.get("kernels"), list):
        return None
    launches, total = _count(msg.get("launches")), _ms(msg.get("kernel_ms"))
    if launches is None or total is None:
        return None
    kernels = []
    for entry in msg["kernels"][:TOP]:
        if not (isinstance(entry, Sequence) and len(entry) == 3 and isinstance(entry[0], str)):
            return None
        ms, count = _ms(entry[1]), _count(entry[2])
        if ms is None or count is None:
            return None
        kernels.append(KernelTime(one_line(entry[0], NAME_CHARS), ms, count))
    return Breakdown(kernels, launches, total)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es"


def describe(b: Breakdown) -> str:
    """One line: launches and GPU time per call, then each kernel's share (the largest first)."""
    if not b.launches:
        return "no kernel launched"
    head = f"{_plural(b.launches, 'launch')}, {b.ms:.4g} ms of GPU time"
    parts = []
    for k in b.kernels[:TOP]:
        share = f"{k.ms / b.ms:.0%}, " if b.ms > 0 else ""
        parts.append(f"{k.name} {k.ms:.4g} ms ({share}{_plural(k.launches, 'launch')})")
    shown = sum(k.launches for k in b.kernels[:TOP])
    if b.launches > shown:
        rest = max(0.0, b.ms - sum(k.ms for k in b.kernels[:TOP]))
        parts.append(f"{_plural(b.launches - shown, 'other launch')} {rest:.4g} ms")
    return f"{head}: " + "; ".join(parts)


_ENTRY = re.compile(r"(.+?) \d[\d.e+-]* ms \(")
COPIES = ("Memcpy", "Memset")  # what the profiler lists beside kernels: copies and fills, not code to count


def top_kernel(described: str | None) -> str | None:
    """The kernel (not a copy or a fill) that took the most time, from a :func:`describe` line (None: none)."""
    _, found, entries = (described or "").partition("ms of GPU time: ")
    for entry in entries.split("; ") if found else []:
        m = _ENTRY.match(entry)
        if m and not m.group(1).startswith(COPIES):
            return m.group(1)
    return None
