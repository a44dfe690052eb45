"""Which kernels one call launches, on which streams, and whether they are ordered with the current stream.

:func:`profile_call` runs the call between two spin kernels on the current stream (torch's profiler, CUDA
activity: names, streams and GPU timestamps): the first spins long enough for the host to have launched the whole
call before it ends; the second is queued after the call returns. A kernel of the call on another stream is

- *ordered* when it starts after the first spin ended (its stream waited for the current stream) and ends before
  the second starts (the current stream waited for it before the call returned);
- *unordered* otherwise: it can run under the head start that precedes a timed call, or after the end event, so
  the timing window misses it — and any consumer of the outputs races with it.

A call with unordered kernels is rejected; one whose kernels use other streams in order is timed without a head
start, up to a device-wide sync, on both sides (:mod:`stark_ray.eval.measure.timing`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

PROFILE_SPIN_US = 2000.0  # the spin ahead of a profiled call: longer than the host needs to launch it
SPIN = "spin_kernel"  # the name torch.cuda._sleep's kernel has in a profile
MARKER_CYCLES = 1000


@dataclass(frozen=True)
class Launch:
    name: str
    stream: int | None
    start_us: float
    end_us: float


@dataclass(frozen=True)
class StreamReport:
    launches: list[Launch]  # the call's kernels (without the two spins)
    current: int | None  # the current stream's id in the profile
    early: list[Launch]  # on another stream, started before the work queued ahead of the call had finished
    late: list[Launch]  # on another stream, still running when the current stream went on after the call
    side_streams: set[int]

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.launches]

    @property
    def unordered(self) -> bool:
        return bool(self.early or self.late)

    def describe_unordered(self) -> str:
        if self.early:
            return (f"kernel {self.early[0].name[:80]} ran on a stream that does not wait for the current stream "
                    "(it started before the work queued ahead of forward had finished)")
        return (f"kernel {self.late[0].name[:80]} ran on another stream that the current stream does not wait for "
                "(it was still running when forward had returned)")


def _kernels(prof: Any) -> list[Launch]:
    found = []
    for evt in prof.events():
        device_type = getattr(evt, "device_type", None)
        if device_type is None or "CUDA" not in str(device_type):
            continue
        stream = getattr(evt, "device_resource_id", None)
        rng = getattr(evt, "time_range", None)
        if rng is None:
            continue
        found.append(Launch(str(evt.name), int(stream) if isinstance(stream, int) else None, float(rng.start),
                            float(rng.end)))
    return sorted(found, key=lambda k: k.start_us)


def warm_profiler() -> None:
    """One profiled no-op, so that the profiler's own first-use set-up happens before the fingerprint."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]):
            torch.empty(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    except Exception:  # no profiler on this host: the profile of a candidate says so
        pass


def profile_call(fn: Callable[..., Any], args: list[Any], spin_cycles: int | None = None) -> StreamReport:
    """Profile ``fn(*args)`` between two spins on the current stream and classify its kernels' streams."""
    from torch.profiler import ProfilerActivity, profile

    from stark_ray.eval.measure.timing import cycles_per_us

    if spin_cycles is None:
        spin_cycles = int(PROFILE_SPIN_US * cycles_per_us())

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        torch.cuda._sleep(spin_cycles)
        fn(*args)
        torch.cuda._sleep(MARKER_CYCLES)
        torch.cuda.synchronize()
    return classify(_kernels(prof))


def classify(kernels: list[Launch]) -> StreamReport:
    """Split a profile (spin, the call's kernels, marker) into ordered and unordered launches."""
    spins = [k for k in kernels if SPIN in k.name]
    if len(spins) < 2:  # the profile lacks our markers: nothing can be said about ordering
        return StreamReport([k for k in kernels if SPIN not in k.name], None, [], [], set())
    head, marker = spins[0], spins[-1]
    current = head.stream
    calls = [k for k in kernels if k is not head and k is not marker]
    side = [k for k in calls if k.stream != current]
    early = [k for k in side if k.start_us < head.end_us]
    late = [k for k in side if k.end_us > marker.start_us and k not in early]
    return StreamReport(calls, current, early, late, {k.stream for k in side if k.stream is not None})
