"""Timing: reference and candidate measured in the same process and run, interleaved, on rotating inputs.

A :class:`Timer` runs one call and returns a :class:`Sample`. On the CPU that is ``time.perf_counter`` around
the call. On a GPU (:class:`CudaTimer`) the L2 cache is flushed first, CUDA events bracket the call on the
current stream (``ms``), and a third event recorded after a device-wide synchronize (``synced_ms``) also
counts work the call left running on other streams. The speedup uses ``ms`` unless a candidate leaves work
behind on another stream (see :func:`leaves_work_behind`: its gaps against the reference's, round by round); then
both sides use ``synced_ms``.

Several input sets are made once and rotated, each call getting its own clone (so a candidate cannot
memoise across calls by address or content), and every timed output of the candidate is compared with the
reference's output for the same inputs in the same round (``check``).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from stark_ray.eval.measure.compare import flatten_outputs
from stark_ray.eval.measure.inputs import clone_all, make_inputs, nbytes_of, snapshot
from stark_ray.eval.measure.noise import median_error
from stark_ray.eval.measure.process_state import ProcessState

TIMING_SEED_OFFSET = 10_000  # timing inputs are fresh: seeds apart from the correctness trials'
WALL_SEED_OFFSET = 20_000  # and the wall-clock re-measurement of a large speedup uses fresh ones again
INPUT_SETS = 4  # input sets rotated through the timing rounds
GPU_WARMUP_MS = 50.0  # on a GPU, warm-up lasts at least this long (wall clock): the clocks ramp up
MAX_WARMUP_ROUNDS = 1000
HEAD_START_US = 300.0  # GPU time queued before a timed call's start event, while the host launches it ...
HEAD_START_LAUNCHES = 2.0  # ... or this many times the host's launch time of the slowest function timed ...
MAX_HEAD_START_US = 20_000.0  # ... up to this
MIN_TIMED_ROUNDS = 40  # timing may stop early (at a precision asked for) only after this many rounds ...
PRECISION_EVERY = 10  # ... checked every this many


@dataclass(frozen=True)
class Sample:
    ms: float  # the call, on the current stream (CPU: wall time)
    synced_ms: float  # the call until the whole device was idle again (CPU: same as ms)
    out: Any = None
    host_ms: float | None = None  # GPU: the host's time to launch the call (until it returned)


class Timer(Protocol):
    def __call__(self, fn: Callable[..., Any], args: list[Any]) -> Sample:
        """Run ``fn(*args)`` once and measure it."""
        ...


class CpuTimer:
    def __call__(self, fn: Callable[..., Any], args: list[Any]) -> Sample:
        t0 = time.perf_counter()
        out = fn(*args)
        ms = (time.perf_counter() - t0) * 1e3
        return Sample(ms, ms, out)


PERSISTING_L2_LIMIT = 0x06  # cudaLimitPersistingL2CacheSize


class PersistingL2:
    """The L2's persisting set-aside put back as this process had it, and its persisting lines reset to normal, so
    that the flush that follows empties the cache as it does for everyone. Without it, a candidate that gives its
    data a persisting access-policy window keeps it in the set-aside across the flush, from one timed call to the
    next (a known way to beat an L2 flush: on an H100 a 24 MB weight read in 11.5 us instead of 21), and a
    set-aside it enlarged is L2 the reference then does without. Made once, before any candidate runs in the
    process; the CUDA runtime's own functions, called through ctypes."""

    def __init__(self, lib: Any) -> None:
        import ctypes

        self._ctypes = ctypes
        self.reset_lines = lib.cudaCtxResetPersistingL2Cache
        self.reset_lines.restype, self.reset_lines.argtypes = ctypes.c_int, []
        self.get_limit = lib.cudaDeviceGetLimit
        self.get_limit.restype = ctypes.c_int
        self.get_limit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        self.set_limit = lib.cudaDeviceSetLimit
        self.set_limit.restype, self.set_limit.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]
        self.initial = self.limit()

    def limit(self) -> int | None:
        value = self._ctypes.c_size_t(0)
        return int(value.value) if self.get_limit(self._ctypes.byref(value), PERSISTING_L2_LIMIT) == 0 else None

    def __call__(self) -> None:
        if self.initial is not None and self.limit() != self.initial:
            self.set_limit(PERSISTING_L2_LIMIT, self.initial)
        self.reset_lines()


_L2_GUARD: list[PersistingL2 | None] = []  # made once per process: its set-aside as the process had it then


def persisting_l2_reset() -> PersistingL2 | None:
    """:class:`PersistingL2` on the CUDA runtime this process loaded (None where there is none), made at the first
    call — the worker's device set-up (backends/gpu.py), before any candidate is imported: a guard made later would
    take a set-aside a candidate enlarged at its import for the process's own."""
    if not _L2_GUARD:
        _L2_GUARD.append(_find_l2_guard())
    return _L2_GUARD[0]


def cudart_paths() -> list[str]:
    """Where this process's CUDA runtime is: the libcudart it loaded (/proc/self/maps), then the one the linker
    finds."""
    import ctypes.util

    paths: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    found = ctypes.util.find_library("cudart")
    return [*paths, *([found] if found else [])]


def _find_l2_guard() -> PersistingL2 | None:
    import ctypes

    for path in cudart_paths():
        try:
            return PersistingL2(ctypes.CDLL(path))
        except (OSError, AttributeError):
            continue
    return None


class CudaTimer:
    """CUDA events with an L2 flush before each call and a device-wide sync before the last event.

    Before the flush, the L2's persisting set-aside is put back as the process had it and its lines reset to normal
    (:class:`PersistingL2`): what a candidate kept there is emptied by the flush like the rest of the cache.

    The start event is queued behind the flush and a spin kernel (the head start), so that the host has
    launched the call before the GPU reaches the start event: the window then holds the GPU's work, not the
    Python overhead of launching it (which varies from call to call, and with the load of the host; that is
    what ``triton.testing.do_bench`` hides too, by keeping the queue full). The head start is at least
    ``head_start_us`` and, once :meth:`fit_head_start` has seen the host's launch time of the functions timed
    together, twice that (up to MAX_HEAD_START_US): a launch-bound forward (a chain of small eager ops) is then
    measured by its GPU time, the same on a busy host as on an idle one (measured on an H200: a 0.086 ms
    network whose launches take 0.2–0.3 ms had medians of 0.14–0.20 ms under load with a fixed 300 µs head
    start, 0.085 ms with the fitted one). Launch overhead itself is therefore not counted — on either side.
    """

    def __init__(self, l2_bytes: int, head_start_us: float = HEAD_START_US, fit: bool = True) -> None:
        # twice the L2, at least 64 MB: writing it evicts whatever the previous call left in the cache
        self.flush = torch.empty(max(2 * l2_bytes, 64 << 20), dtype=torch.uint8, device="cuda")
        self.min_head_us = head_start_us
        self.fit = fit  # False: a fixed head start (benchmarks compare the two)
        self.reset_l2 = persisting_l2_reset()
        self.head_us = 0.0
        self.spin_cycles = 0
        self._set_head(head_start_us)

    def _set_head(self, us: float) -> None:
        self.head_us = us
        self.spin_cycles = int(us * cycles_per_us()) if us > 0 else 0

    def fit_head_start(self, launch_ms: float) -> None:
        """Size the head start for calls whose host side takes ``launch_ms`` to launch (a no-op for a fixed head
        start: ``fit=False`` or none at all)."""
        if self.fit and self.min_head_us > 0:
            self._set_head(min(max(self.min_head_us, HEAD_START_LAUNCHES * launch_ms * 1e3), MAX_HEAD_START_US))

    def __call__(self, fn: Callable[..., Any], args: list[Any]) -> Sample:
        start, end, synced = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        if self.reset_l2 is not None:
            self.reset_l2()
        self.flush.zero_()
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)
        start.record()
        t0 = time.perf_counter()
        out = fn(*args)
        host_ms = (time.perf_counter() - t0) * 1e3
        end.record()
        torch.cuda.synchronize()  # device-wide: work the call queued on any stream is done
        synced.record()
        synced.synchronize()
        return Sample(start.elapsed_time(end), start.elapsed_time(synced), out, host_ms)


_CYCLES_PER_US: list[float] = []
MIN_CYCLES_PER_US = 2000.0


def cycles_per_us() -> float:
    """The spin kernel's cycles per microsecond, measured once (best of three), and never taken below 2 GHz: a
    clock still ramping up during the measurement must make the head start longer, never shorter."""
    if not _CYCLES_PER_US:
        cycles, best_ms = 200_000, float("inf")
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            best_ms = min(best_ms, a.elapsed_time(b))
        _CYCLES_PER_US.append(max(cycles / max(best_ms * 1e3, 1.0), MIN_CYCLES_PER_US))
    return _CYCLES_PER_US[0]


@dataclass(frozen=True)
class Stats:
    median: float
    mean: float
    std: float
    min: float
    n: int
    samples: tuple[float, ...] = ()

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean)."""
        return self.std / self.mean if self.mean > 0 else 0.0

    @staticmethod
    def of(samples: Sequence[float]) -> Stats:
        return Stats(statistics.median(samples), statistics.fmean(samples),
                     statistics.stdev(samples) if len(samples) > 1 else 0.0, min(samples), len(samples),
                     tuple(samples))

    def describe(self) -> str:
        return (f"median {self.median:.4g} ms, mean {self.mean:.4g} ms, std {self.std:.3g} ms, "
                f"cv {100 * self.cv:.2f}%, n {self.n}")


@dataclass(frozen=True)
class Timing:
    """One function's timing: on its stream, and until the device was idle."""

    stats: Stats
    synced: Stats
    head_us: float | None = None  # GPU: the head start the calls were timed with
    hosts: tuple[float, ...] = ()  # GPU: each timed call's host time to launch (until it returned), ms

    @property
    def late(self) -> int:
        """Timed calls whose host side outlasted the head start (the device idle before the call's end was
        recorded): their gaps do not include waking from the sync, the others' do."""
        return sum(h * 1e3 > self.head_us for h in self.hosts) if self.head_us else 0

    @property
    def gap_ms(self) -> float:
        """The shortest time between a call's end on its stream and the device going idle (what the note says;
        the verdict compares the gaps round by round: :func:`gap_over_reference`)."""
        return min(s - m for s, m in zip(self.synced.samples, self.stats.samples, strict=True))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection inside a measurement (collected once before it)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def make_input_sets(get_inputs: Callable[[], Any], seed: int, device: str, count: int = INPUT_SETS,
                    offset: int = TIMING_SEED_OFFSET) -> list[list[Any]]:
    return [make_inputs(get_inputs, seed + offset + k, device=device) for k in range(count)]


Check = Callable[[Any, Any], str | None]  # (candidate output, reference output) -> problem or None


KEEP_CHECKED_BYTES = 1 << 30  # checked outputs kept per function, over all input sets


def identical(a: Any, b: Any) -> bool:
    """Bit-for-bit equal (nested) outputs; NaNs never are, which only costs a full check."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and a.device == b.device and bool(torch.equal(a, b)))
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(identical, a, b))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


class TimingMismatch(Exception):
    """A timed output differed from the reference's for the same inputs (memoised, racy, input-dependent)."""


class OddOutput(TimingMismatch):
    """A timed output that is not plain tensors in plain containers."""


def time_interleaved(fns: list[Callable[..., Any]], input_sets: list[list[Any]], timer: Timer, warmup: int,
                     trials: int, check: Check | None = None, warmup_ms: float = 0.0,
                     precision: float = 0.0, states: Sequence[ProcessState | None] = ()) -> list[Timing]:
    """Time each of ``fns`` ``trials`` times, round-robin, the order rotating every round to cancel drift and
    cache warmth, after at least ``warmup`` rounds and ``warmup_ms`` of warm-up. Round r uses input set
    r mod len(input_sets), and each call gets its own clone. With ``check``, every output of ``fns[i]``
    (i > 0) is checked against ``fns[0]``'s in the same round — or, cheaper, found bit for bit equal to its
    own output that passed the check on the same input set in an earlier round (kept while small) — and
    ``fns[0]`` runs last in every round (the others rotate before it): a function checked against it never runs
    while its output for the same inputs is held (a copy of it, returned, passed the check at a copy's cost). With
    ``precision`` > 0, timing stops before ``trials`` rounds (after MIN_TIMED_ROUNDS at least) once every
    function's median is known within that relative standard error (:func:`median_error`). ``states[i]``: the
    process state each call of ``fns[i]`` runs in (eval/measure/process_state.py; the loop's own no grad and no
    collector on top), outside its timed region; none: as the calls before left it."""
    ms: list[list[float]] = [[] for _ in fns]
    synced: list[list[float]] = [[] for _ in fns]
    launches: list[list[float]] = [[] for _ in fns]  # warm-up calls' host launch times (GPU)
    hosts: list[list[float]] = [[] for _ in fns]  # the timed calls' (GPU)
    fit = getattr(timer, "fit_head_start", None)
    rotating = list(range(1, len(fns))) if check is not None else list(range(len(fns)))
    r, timed = 0, 0
    checked: dict[tuple[int, int], Any] = {}  # (function, input set) -> an output that passed the check
    inside = [s.but(grad=False, gc=False) if s is not None else None for s in states]
    inside += [None] * (len(fns) - len(inside))
    with _gc_paused(), torch.no_grad():
        started = time.perf_counter()
        while timed < trials:
            warm_ms = (time.perf_counter() - started) * 1e3
            warming = r < warmup or (warm_ms < warmup_ms and r < MAX_WARMUP_ROUNDS)
            inputs = input_sets[r % len(input_sets)]
            outs: list[Any] = [None] * len(fns)
            if not warming and timed == 0 and fit is not None and all(launches):
                fit(max(statistics.median(h) for h in launches))  # one head start for all: the same conditions
            order = [*rotating, 0] if check is not None else rotating
            for i in order:
                state = inside[i]
                with state.around() if state is not None else contextlib.nullcontext():
                    sample = timer(fns[i], clone_all(inputs))
                # kept for the round's check only: the reference timed against itself and torch.compile held three
                # 6 GB outputs at once, one more than the memory plan counts (19_ReLU out of memory at 40 GB)
                outs[i] = sample.out if check is not None else None
                if check is not None and i > 0 and (odd := _not_plain(sample.out)):  # its copy below would run its
                    raise OddOutput(f"timing round {r + 1}: {odd}")  # code after the clock stopped
                if check is not None and i > 0 and not _on_gpu(sample.out):
                    # the candidate's output as it stands when its call returned, before the next call runs: work a
                    # thread of its goes on doing meanwhile (the clock stopped at the return) leaves it unfinished
                    outs[i] = snapshot(sample.out)
                if not warming:
                    ms[i].append(sample.ms)
                    synced[i].append(sample.synced_ms)
                    if sample.host_ms is not None:
                        hosts[i].append(sample.host_ms)
                elif sample.host_ms is not None:
                    launches[i].append(sample.host_ms)
                del sample  # its output lives in outs only: dropped with the round (a 6 GB task's outputs)
            timed += not warming
            if check is not None:
                k = r % len(input_sets)
                for i in range(1, len(fns)):
                    if (i, k) in checked and identical(outs[i], checked[i, k]):
                        continue  # bit for bit what passed the check on these inputs before
                    problem = check(outs[i], outs[0])
                    if problem:
                        raise TimingMismatch(f"timing round {r + 1}: {problem}")
                    if (i, k) not in checked and sum(nbytes_of(outs[i])) * len(input_sets) <= KEEP_CHECKED_BYTES:
                        checked[i, k] = snapshot(outs[i])  # a copy: the candidate may reuse its buffer
            rotating = rotating[1:] + rotating[:1]
            r += 1
            del outs
            if (precision > 0 and timed >= MIN_TIMED_ROUNDS and timed % PRECISION_EVERY == 0
                    and all(median_error(m) <= precision for m in ms)):
                break
    head = getattr(timer, "head_us", None)
    return [Timing(Stats.of(m), Stats.of(s), head, tuple(h)) for m, s, h in zip(ms, synced, hosts, strict=True)]


_READERS = ("__iter__", "__getitem__", "__len__", "keys", "values", "items")


def _builtin_reads(kind: type) -> type | None:
    """The builtin container ``kind`` is read as (tuple, list, dict) where every way of reading it is the builtin's
    own (a namedtuple, torch.max's result; not a subclass whose ``__iter__`` runs code of the candidate's), else
    None."""
    for base in (tuple, list, dict):
        if issubclass(kind, base):
            same = all(getattr(kind, m) is getattr(base, m) for m in _READERS if hasattr(base, m))
            return base if same else None
    return None


def _not_plain(value: Any, path: str = "output") -> str | None:
    """Why an output of a checked function is not plain tensors in containers read as the builtins are (a
    subclass's ``detach``, ``clone`` or ``__iter__`` would run the candidate's own code outside its timed call: its
    work done while the round's copy is made), else None."""
    kind = type(value)
    if isinstance(value, torch.Tensor):
        return None if kind in (torch.Tensor, torch.nn.Parameter) else \
            f"{path} is a {kind.__name__}, not a plain torch.Tensor"
    base = _builtin_reads(kind) if isinstance(value, tuple | list | dict) else None
    if isinstance(value, tuple | list | dict) and base is None:
        return f"{path} is a {kind.__name__}, read by code of its own (not as a tuple, list or dict)"
    if base is dict:
        return next((p for k, v in dict.items(value) if (p := _not_plain(v, f"{path}[{k!r}]"))), None)
    if base is not None:
        return next((p for i, v in enumerate(base.__iter__(value)) if (p := _not_plain(v, f"{path}[{i}]"))), None)
    return None


def _on_gpu(value: Any) -> bool:
    """Whether ``value``'s tensors live on a GPU (the CPU's are snapshot after a candidate's timed call)."""
    return any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for _, t in flatten_outputs(value))


def capture_graph(body: Callable[[], None], mode: str = "global") -> torch.cuda.CUDAGraph | None:
    """``body`` (its kernels) as a CUDA graph, after a warm-up run on a side stream; None when it cannot be captured
    (a host sync inside, an allocation outside torch's allocator, a kernel on an unordered stream, ...). ``mode``:
    the capture's error mode; "thread_local" lets the process's other threads call CUDA meanwhile (the judge's
    device memory sampler), "global" makes any thread's unsafe call fail the capture (a candidate's process)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode=mode):  # type: ignore[arg-type]
            body()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None


def leaves_work_behind(candidate: Timing, reference: Timing) -> bool:
    """Did the candidate's calls leave work running on other streams after returning, in at least half the rounds
    (where its median time would hide that work)? See :func:`gap_over_reference`."""
    return gap_over_reference(candidate, reference) > max(0.004, 0.02 * candidate.stats.median)


@dataclass(frozen=True)
class Looked:
    """A candidate's timing against the reference's, looked at twice where its gaps said work was left running
    (:func:`timed_with_second_look`): the timings whose times are taken (the last), the rounds the gap rule reads
    (both timings' pooled where it was timed twice) and the first timing's own gap (ms; None: timed once)."""

    taken: list[Timing]
    judged: list[Timing]
    first_gap: float | None = None


def timed_with_second_look(timed: Callable[[], list[Timing]]) -> Looked:
    """``timed()`` (the reference first, the candidate second), and once more where its gaps said work was left
    running (:func:`leaves_work_behind`). The gap's noise is the host's wake from the sync and what else the device
    runs meanwhile (another process's context): an honest one-kernel candidate's first timing was 4.77 us over the
    reference's beside the test suite's other processes on an H100 (the rule's margin 4 us), where quiet runs of it
    and a busy host's stayed within -3.9..+0.1 us (``benchmarks/sync_gap.py``). The second timing's times are taken;
    the rule reads the rounds of both, pooled: a gap of the host's in one timing is diluted by the other's rounds,
    work a candidate leaves behind is in both, and a second timing is never a second draw at the flag (left behind
    in the first timing only, half the pooled rounds are over the margin and the median is too)."""
    first = timed()
    if not leaves_work_behind(first[1], first[0]):
        return Looked(first, first)
    second = timed()
    return Looked(second, [pooled(a, b) for a, b in zip(first, second, strict=True)],
                  gap_over_reference(first[1], first[0]))


def pooled(a: Timing, b: Timing) -> Timing:
    """Two timings of one function as one: their rounds in order, the longer head start (fewer rounds counted late)."""
    heads = [h for h in (a.head_us, b.head_us) if h is not None]
    return Timing(Stats.of([*a.stats.samples, *b.stats.samples]), Stats.of([*a.synced.samples, *b.synced.samples]),
                  max(heads) if heads else None, (*a.hosts, *b.hosts))


def gap_over_reference(candidate: Timing, reference: Timing) -> float:
    """By how much the candidate's gap (its call's end on its stream to the device idle) exceeds the reference's,
    round by round: the median of the differences, ms. The two sides' calls of one round run back to back, so a
    stretch of a busy host, which makes the host wake late from the sync and lengthens both sides' gaps, cancels
    out, while work left running on another stream lengthens every call it is left by. (The shortest gaps, compared
    before, differed by 5 us on an H100 between a one-kernel candidate and its reference in a noisy run, one stream
    each; a candidate leaving work behind on all calls but one passed them.) Rounds where the reference's host
    outlasted the head start are left out while at least half the rounds remain: that call found the device idle at
    its sync, so its gap holds no wake from it and would lengthen the difference. The candidate's own late rounds
    are kept: they only shorten its gaps, and it decides them (a host spinning past the head start in every call
    but one would otherwise leave one round to judge)."""
    gaps = [[s - m for s, m in zip(t.synced.samples, t.stats.samples, strict=True)] for t in (candidate, reference)]
    rounds = range(min(map(len, gaps)))
    if not rounds:
        return 0.0

    def late(t: Timing, k: int) -> bool:
        return bool(t.head_us) and k < len(t.hosts) and t.hosts[k] * 1e3 > (t.head_us or 0.0)

    kept = [k for k in rounds if not late(reference, k)]
    if 2 * len(kept) < len(rounds):
        kept = list(rounds)
    return statistics.median(gaps[0][k] - gaps[1][k] for k in kept)
