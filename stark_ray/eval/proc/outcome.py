"""A process of the evaluator that died or ran out of time, as the failed result of the candidate it served.

Shared by the service (about the judge) and the judge (about its worker); no torch here.
"""

from __future__ import annotations

import signal
import statistics
from collections.abc import Sequence
from dataclasses import replace

from stark_ray.config import EvalConfig
from stark_ray.eval.diagnostics import clean_log, crash_location, forward_location, was_building
from stark_ray.eval.wire.protocol import PHASE_CHECK, PHASE_COMPILE, PHASE_SETUP, PHASE_START, PHASE_TIME
from stark_ray.records import STAGE_CRASH, STAGE_TIMEOUT, EvalResult, excerpt

SETUP_ALLOWANCE_S = 60.0  # task import and the reference's first run, on top of the check timeout
COMPILE_BASELINE_ALLOWANCE_S = 600.0  # torch.compile of the reference, once per task and worker
BUILDS_KEPT = 50  # the latest builds whose times a timed-out build is told beside

DOING = {
    PHASE_START: "starting the worker",
    PHASE_SETUP: "loading the task and building the reference",
    PHASE_COMPILE: "importing (building) the candidate",
    PHASE_CHECK: "running the correctness trials",
    PHASE_TIME: "timing the candidate",
}


def limits_for(cfg: EvalConfig) -> dict[str, float]:
    """Each phase's time limit for a candidate (seconds)."""
    time_limit = cfg.timing_timeout_s + (COMPILE_BASELINE_ALLOWANCE_S if cfg.baseline == "compile" else 0.0)
    return {
        PHASE_SETUP: cfg.check_timeout_s + SETUP_ALLOWANCE_S,
        PHASE_COMPILE: cfg.compile_timeout_s,
        PHASE_CHECK: cfg.check_timeout_s,
        PHASE_TIME: time_limit,
    }


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "was killed"
    if returncode < 0:
        try:
            return f"crashed ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"crashed (signal {-returncode})"
    return f"exited with code {returncode} before reporting"


HOST_SCALE_CAP = 4.0  # a scaled build limit is at most this many times the configured one


def build_limit(configured_s: float, others: Sequence[float], scale: float) -> float:
    """A build's time limit on this host: the configured one, raised to ``scale`` times the slowest of the host's
    recent builds (at most HOST_SCALE_CAP times the configured one; ``scale`` 0: the configured one). On a loaded
    2-core host the builds took 174-244 s against a 300 s limit: a candidate a little heavier than the others was
    recorded a timeout for the host's load."""
    if not others or scale <= 0:
        return configured_s
    return min(max(configured_s, scale * max(others)), HOST_SCALE_CAP * configured_s)


def build_time_out(result: EvalResult, log: str, limit_s: float, others: Sequence[float]) -> EvalResult:
    """A build stopped at its time limit, told as the build's time (with how long the other builds took) rather
    than with the Python stack of a process waiting on its compiler; ``result`` as it is when the process was doing
    something else (its own import hung: the timeout's message names the line)."""
    output = was_building(log)
    if output is None:
        return result
    if others:
        took = (f"the other candidates' builds on this evaluator took {statistics.median(others):.0f} s at the "
                f"median and {max(others):.0f} s at most ({len(others)} builds, cached ones included)")
    else:
        took = "no other build has finished on this evaluator yet"
    note = (f"The build was stopped at its time limit of {limit_s:g} s (--compile-timeout, raised with the host's "
            f"slowest recent build: --compile-timeout-scale) while it was still "
            f"building; {took}. Code that takes far longer to compile than the others: large unrolled loops, many "
            "template instantiations or kernels, or heavy headers?")
    kept = clean_log(output).strip()
    return replace(result, error=f"the build did not finish within its time limit of {limit_s:g} s "
                                 "(--compile-timeout)", log=excerpt(f"{kept}\n{note}" if kept else note))


def lost_result(phase: str, timed_out: bool, returncode: int | None, log: str, limit_s: float,
                who: str = "worker", source: str | None = None, oom_killed: bool = False) -> EvalResult:
    """The failed result of a candidate whose process died (``returncode``) or ran out of time in ``phase``;
    ``source`` (the candidate's) names its forward when the process's stack dump names no line of it; ``oom_killed``:
    the kernel's out-of-memory killer killed in the process's control group meanwhile (said, and flagged)."""
    where = crash_location(log)
    at = f" at {where}" if where else ""
    if not where and source is not None and phase in (PHASE_CHECK, PHASE_TIME):
        entry = forward_location(source)
        at = f" in the candidate's forward ({entry}; its stack dump was cut short)" if entry else ""
    if timed_out:
        stage, error = STAGE_TIMEOUT, f"timed out after {limit_s:g} s while "
    else:
        stage, error = STAGE_CRASH, f"{who} {describe_exit(returncode)} while "
    if oom_killed and not timed_out:
        error = (f"out of memory on the host: the {who} was killed by the kernel's out-of-memory killer (the host's "
                 f"memory ran out, this candidate's process or another's) while ")
    if timed_out and phase == PHASE_COMPILE:
        at += " (the build's time limit: --compile-timeout)"
    return EvalResult(compiled=phase in (PHASE_CHECK, PHASE_TIME), stage=stage,
                      error=f"{error}{DOING.get(phase, phase)}{at}", log=excerpt(clean_log(log)),
                      flags=["out_of_memory"] if oom_killed and not timed_out else [])
