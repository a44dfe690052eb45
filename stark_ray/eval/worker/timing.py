"""The worker's timings: the reference against itself (a task's first step), and a candidate against the reference
(interleaved, on rotating input sets) after a profile of one of its calls — its own kernels (``no_kernel``), their
streams (``unordered_stream``, ``extra_stream``) and where its GPU time goes
(:mod:`stark_ray.eval.measure.kernel_times`).

These run in the worker, beside the candidate: what they report is its claim, which the judge checks against its
own clock where it matters (:mod:`stark_ray.eval.judge.claim`, :mod:`stark_ray.eval.judge.confirmation`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.measure.compare import compare_outputs
from stark_ray.eval.measure.inputs import clone_all
from stark_ray.eval.measure.kernel_times import describe, kernel_times, to_message
from stark_ray.eval.measure.laps import Laps
from stark_ray.eval.measure.process_state import ProcessState
from stark_ray.eval.measure.timing import (
    GPU_WARMUP_MS,
    HEAD_START_US,
    Looked,
    OddOutput,
    Stats,
    TimingMismatch,
    gap_over_reference,
    leaves_work_behind,
    time_interleaved,
    timed_with_second_look,
)
from stark_ray.eval.measure.timing import Timing as Measured  # one function's timing (this module's Timing: a how)
from stark_ray.eval.measure.tolerance import Tolerances
from stark_ray.eval.tasks import TaskError
from stark_ray.eval.worker.kernel_sources import library_compute, own_kernel_names
from stark_ray.eval.worker.streams import profile_call
from stark_ray.eval.worker.warm_reference import WarmReference
from stark_ray.records import STAGE_OK, EvalResult


@dataclass(frozen=True)
class Timing:
    """What a timing needs of the worker: its backend (timer, device), the request's settings, the task's
    rotating input sets (as its memory plan keeps them: made on first use, inside the timing's own error
    handling, where a device out of memory is said as such), how many rounds to time, and the process state the
    reference is timed in (eval/measure/process_state.py)."""

    backend: Backend
    cfg: EvalConfig
    timing_sets: Callable[[], list[list[Any]]]
    trials: int
    state: ProcessState | None = None  # the worker's, before any candidate: the reference's calls run in it

    @property
    def sets(self) -> list[list[Any]]:
        return self.timing_sets()


@contextlib.contextmanager
def _as_task_error(name: str) -> Iterator[None]:
    """A failure of the reference while its sets are made or it is timed, said as the task's (one line)."""
    try:
        yield
    except TaskError:
        raise
    except torch.OutOfMemoryError as e:
        raise TaskError(f"task {name}: the reference ran out of device memory while being timed "
                        f"(the memory budget, or what else the device holds: {describe_exception(e)[:300]})"
                        ) from None
    except Exception as e:
        raise TaskError(f"task {name}: reference forward failed: {describe_exception(e)}") from None


def time_reference(state: WarmReference, how: Timing, laps: Laps | None = None) -> tuple[EvalResult, float]:
    """The reference timed against itself (the ratio of the two halves shows the noise), and beside it
    torch.compile's where the baseline is asked for; on a GPU, where its time goes (none without a profiler).
    The seconds of each step go on ``laps``. With the result, its fastest call (the drift check's other reading) of
    one half: as many calls as a candidate's timing gives the reference."""
    cfg = how.cfg
    laps = laps or Laps()
    kernels = None
    laps.mark()
    with _as_task_error(state.name):
        sets = how.sets  # made on first use
    laps.lap("sets")
    if state.device == "cuda":  # on the first timing set itself (its timed calls run on it too): no copy of 6 GB
        with contextlib.suppress(Exception):
            kernels = describe(kernel_times(profile_call(state.model, list(sets[0])).launches))
        if state.seal is not None:  # a reference that writes its inputs wrote that set: sealed as it is now
            state.seal.seal_inputs(sets)
        laps.lap("profile")
    fns = [state.model, state.model]
    if cfg.baseline == "compile":  # compiled once per task and worker, warmed on the sets made above
        fns.append(state.baseline_compiled())
        laps.lap("compile")
    with _as_task_error(state.name):
        timings = time_interleaved(fns, sets, how.backend.timer(), cfg.warmup, how.trials, None,
                                   _warmup_ms(state), cfg.timing_precision)
    laps.lap("timing")
    stats = Stats.of(timings[0].stats.samples + timings[1].stats.samples)
    noise = timings[0].stats.median / timings[1].stats.median
    log = f"reference: {stats.describe()}; self-speedup (noise) {noise:.3f}"
    compiled_ms = None
    if len(timings) > 2:
        compiled_ms = timings[2].stats.median
        log += f"\ntorch.compile baseline: {timings[2].stats.describe()}"
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=stats.median, ref_runtime_ms=stats.median,
                      speedup=1.0, stage=STAGE_OK, log=log, ref_compile_runtime_ms=compiled_ms,
                      runtime_cv=stats.cv, ref_runtime_cv=stats.cv, kernels=kernels), timings[0].stats.min


def time_candidate(model: Any, state: WarmReference, defined: Callable[[], set[str]], how: Timing,
                   seed: int | None) -> dict[str, Any]:
    """The candidate ``model`` timed against the reference, after a profile of one call on a GPU (``defined``: the
    kernels its source defines); ``seed``: a reference that draws random numbers, every call of both sides after
    it. The answer the judge reads: both sides' timings, or ``rejected`` (an unordered stream) or ``mismatch``."""
    cfg = how.cfg
    flags: list[str] = []
    notes: list[str] = []
    findings: dict[str, str] = {}  # the line of each flag that decides a verdict (the judge reads it, not the log)
    head_start = True
    kernels: dict[str, Any] = {}
    if state.device == "cuda":
        try:
            report = profile_call(model, list(clone_all(how.sets[0])))
        except Exception as e:  # no profiler here (CUPTI missing): say so, do not guess
            report = None
            notes.append(f"kernel profile unavailable: {describe_exception(e)}")
        if report is not None:
            kernels = to_message(kernel_times(report.launches))
            own = own_kernel_names(report.names, defined())
            if not own:
                flags.append("no_kernel")
                shown = ", ".join(sorted(set(report.names))[:6]) or "nothing"
                findings["no_kernel"] = f"no kernel of its own was launched (only: {shown})"
                notes.append(findings["no_kernel"])
            elif (library := library_compute(report.launches, own)) is not None:
                flags.append("library_compute")
                findings["library_compute"] = library
            if report.unordered:
                return {"rejected": "unordered_stream", "error": report.describe_unordered(),
                        "flags": [*flags, "unordered_stream"], "log": notes}
            if report.side_streams:
                flags.append("extra_stream")
                head_start = False
                notes.append(f"its kernels use {len(report.side_streams)} more stream(s), in order with the "
                             "current one: both sides timed without a head start, up to a device-wide sync")
    fns = [state.model, model]
    if seed is not None:
        fns = [_seeded(fn, seed) for fn in fns]
        notes.append("the reference draws random numbers: every timed call of both sides comes after the same "
                     "seed (a few microseconds each, inside the timed call)")
    tol = Tolerances.of(cfg)

    def check(out: Any, ref: Any) -> str | None:
        c = compare_outputs(out, ref, tol)
        return None if c.ok else c.problem

    clean = how.state.fresh() if how.state is not None else None  # the reference's calls: as the worker started
    try:
        def timed() -> list[Measured]:
            return time_interleaved(fns, how.sets, how.backend.timer(head_start), cfg.warmup, how.trials, check,
                                    _warmup_ms(state), cfg.timing_precision, [clean])

        if head_start:
            looked = timed_with_second_look(timed)
        else:  # timed up to a device-wide sync already: no gap to read
            once = timed()
            looked = Looked(once, once)
        compiled_ms = None
        if cfg.baseline == "compile":  # checked once when compiled; timed beside the eager reference
            compiled = time_interleaved([state.model, state.baseline_compiled()], how.sets,
                                        how.backend.timer(head_start), cfg.warmup, how.trials, None,
                                        _warmup_ms(state), cfg.timing_precision, [clean, clean])[1]
            compiled_ms = compiled.stats.median
            notes.append(f"torch.compile baseline: {compiled.stats.describe()}")
    except TimingMismatch as e:
        return {"mismatch": str(e) if isinstance(e, OddOutput) else f"{e} (memoised or racy output?)"}
    ref_t, new_t = looked.taken
    ref_j, new_j = looked.judged  # the rounds the gap rule reads: both timings', where it was timed twice
    first_gap = looked.first_gap
    if clean is not None and (changed := clean.note()):
        notes.append(changed)
    synced = not head_start
    twice = " over both timings' rounds" if first_gap is not None else ""
    if head_start and leaves_work_behind(new_j, ref_j):
        flags.append("extra_stream")
        synced = True
        notes.append(f"work left running after forward returned ({1e3 * gap_over_reference(new_j, ref_j):.3g} us "
                     f"longer to the device idle than the reference's calls, round by round (median{twice}); "
                     f"shortest gaps {new_j.gap_ms:.3g} and {ref_j.gap_ms:.3g} ms; calls whose host outlasted the "
                     f"{ref_j.head_us or 0:.0f} us head start: {new_j.late} and {ref_j.late} of {new_j.stats.n}): "
                     "both sides timed up to a device-wide sync")
    elif first_gap is not None:
        notes.append(f"timed again: the first timing's calls were {1e3 * first_gap:.3g} us longer to the device idle "
                     f"than the reference's (round by round, median), both timings' rounds "
                     f"{1e3 * gap_over_reference(new_j, ref_j):.3g} us: the second timing's times stand")
    ref_stats, new_stats = (ref_t.synced, new_t.synced) if synced else (ref_t.stats, new_t.stats)
    if ref_t.head_us and ref_t.head_us > HEAD_START_US:
        notes.append(f"launch-bound: timed with a {ref_t.head_us:.0f} us head start (GPU time; launch "
                     "overhead not counted)")
    return {"ref": _stats(ref_stats), "new": _stats(new_stats), "compiled_ms": compiled_ms, "flags": flags,
            "findings": findings,
            "log": [f"reference: {ref_stats.describe()}", f"candidate: {new_stats.describe()}", *notes], **kernels}


def _stats(s: Stats) -> dict[str, Any]:
    """A timing for the judge; the samples in round order (the judge pairs the two sides' calls round by round)."""
    return {"median": s.median, "mean": s.mean, "std": s.std, "min": s.min, "n": s.n, "samples": list(s.samples)}


def _seeded(fn: Callable[..., Any], seed: int) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        torch.manual_seed(seed)
        return fn(*args)

    return call


def _warmup_ms(state: WarmReference) -> float:
    return GPU_WARMUP_MS if state.device == "cuda" else 0.0
