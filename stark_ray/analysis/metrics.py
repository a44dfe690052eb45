"""The paper's metrics, as pure functions over rows of the ``tasks`` view (dicts; see views.TASK_COLUMNS).

Definitions (STARK.md, "Metrics"; KernelBench's fast_p):

- A task **succeeds** when one of its candidates is accepted: passed the checks, was timed and is not flagged
  (``EvalResult.accepted``; a candidate flagged ``no_kernel`` passed the checks but is not a success).
- **fast_p** = (tasks that succeed AND whose best speedup > p) / (all tasks of the group). fast_0 is the
  success rate; fast_1 is the share faster than the baseline. Against eager the speedup is the
  best candidate's (its reference re-timed in the same run); against torch.compile it is
  ``ref_compile_runtime_ms / best_runtime_ms``, and the denominator is the tasks whose torch.compile baseline
  was measured (None when none was).
- **geomean speedup** (the headline): geometric mean of the best speedup over the tasks that succeed.
  **geomean speedup (all)**: over all tasks, a task without an accepted candidate counting 1.0 (the reference is
  kept); a successful task counts its speedup even when below 1. **speed**: the paper's arithmetic mean of
  the best speedup over the tasks that succeed.
- **compile rate** / **passed rate** / **accepted rate**: per attempt, pooled over the group's tasks: compiled
  (resp. passed the checks, accepted) candidates / all candidates (parse failures included: they count against
  the budget).
- **attempts to first accepted**: the seq of a task's first accepted candidate (attempts finished up to it); mean and
  median over the tasks that succeed.
- tokens and cost: totals over the group (LLM calls recorded).

A row is one task *in one run*: a task run several times (repeats, seeds) counts once per run in every figure above,
and the headline says so (``distinct_tasks`` beside ``tasks``); :func:`repeats` gives, per such task, its figure
over the runs with a 95% interval from their spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FAST_PS: tuple[float, ...] = (0.0, 1.0, 1.5, 2.0)
EAGER, COMPILE = "eager", "compile"

Row = Mapping[str, Any]


def speedup(task: Row, against: str = EAGER) -> float | None:
    """The task's best speedup against ``eager`` or ``compile``; None without an accepted candidate or without
    that baseline."""
    if not task.get("success"):
        return None
    if against == EAGER:
        value = task.get("best_speedup")
    elif against == COMPILE:
        value = task.get("best_speedup_vs_compile")
    else:
        raise ValueError(f"unknown baseline {against!r}; choose {EAGER} or {COMPILE}")
    return None if value is None else float(value)


def measured(tasks: Iterable[Row], against: str = EAGER) -> list[Row]:
    """The tasks that count for a baseline: all of them for eager; those with a torch.compile time for compile."""
    if against == COMPILE:
        return [t for t in tasks if t.get("ref_compile_runtime_ms") is not None]
    return list(tasks)


def fast_p(tasks: Iterable[Row], p: float, against: str = EAGER) -> float | None:
    """Share of the tasks that succeed with speedup > p (None for an empty group)."""
    group = measured(tasks, against)
    if not group:
        return None
    hits = 0
    for t in group:
        s = speedup(t, against)
        if s is not None and s > p:
            hits += 1
    return hits / len(group)


def fast_p_curve(tasks: Sequence[Row], ps: Iterable[float], against: str = EAGER) -> list[float | None]:
    return [fast_p(tasks, p, against) for p in ps]


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values (None when there are none)."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    if any(not v > 0 for v in vals):
        raise ValueError(f"geometric mean of non-positive values: {sorted(vals)[:3]}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def geomean_speedup(tasks: Iterable[Row], against: str = EAGER, failures_as: float | None = None) -> float | None:
    """Over the tasks that succeed; with ``failures_as`` (e.g. 1.0) over all tasks measured for the baseline,
    a failed task counting that value."""
    values = []
    for t in measured(tasks, against):
        s = speedup(t, against)
        if s is not None:
            values.append(s)
        elif failures_as is not None:
            values.append(failures_as)
    return geomean(values)


def mean_speedup(tasks: Iterable[Row], against: str = EAGER) -> float | None:
    """The paper's "speed": arithmetic mean of the best speedup over the tasks that succeed."""
    values = [s for t in measured(tasks, against) if (s := speedup(t, against)) is not None]
    return statistics.fmean(values) if values else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass(frozen=True)
class Baseline:
    """The metrics against one baseline."""

    tasks: int  # tasks measured for this baseline (the fast_p denominator)
    successes: int
    fast_p: dict[float, float | None]
    geomean_speedup: float | None  # over the tasks that succeed (the headline)
    geomean_speedup_all: float | None  # over all measured tasks, failure = 1.0
    mean_speedup: float | None  # the paper's "speed"


@dataclass(frozen=True)
class Light:
    """How close a group's tasks came to their speed of light (the tasks that have one)."""

    tasks: int  # tasks with a speed of light
    memory_bound: int
    ref_median: float | None  # median SOL fraction of the references
    best_median: float | None  # of the best candidates (tasks without one: not counted)
    ref_near: int  # references at half their speed of light or closer: little left to win there
    best_near: int  # best candidates at half or closer


NEAR = 0.5  # a SOL fraction at least this is "near the limit"


def light(tasks: Sequence[Row]) -> Light | None:
    """None when no task of the group has a speed of light (runs recorded before it, or no device figures)."""
    known = [t for t in tasks if t.get("sol_ms") is not None]
    if not known:
        return None
    refs = [float(t["ref_sol_fraction"]) for t in known if t.get("ref_sol_fraction") is not None]
    bests = [float(t["best_sol_fraction"]) for t in known if t.get("best_sol_fraction") is not None]
    return Light(len(known), sum(1 for t in known if t.get("sol_bound") == "memory"),
                 statistics.median(refs) if refs else None, statistics.median(bests) if bests else None,
                 sum(1 for f in refs if f >= NEAR), sum(1 for f in bests if f >= NEAR))


@dataclass(frozen=True)
class Summary:
    """Every metric of one group of tasks (a level, a run, or all)."""

    label: str
    tasks: int
    eager: Baseline
    compile: Baseline | None  # None when no task of the group has a torch.compile time
    attempts: int
    compile_rate: float | None
    passed_rate: float | None
    accepted_rate: float | None
    first_accepted_mean: float | None
    first_accepted_median: float | None
    llm_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    light: Light | None = None  # None: no task of the group has a speed of light
    distinct_tasks: int = 0  # different task names among the rows (fewer than ``tasks`` where a task ran again)
    runs: int = 0  # runs the rows come from

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def baseline(tasks: Sequence[Row], against: str = EAGER, ps: Iterable[float] = FAST_PS) -> Baseline | None:
    group = measured(tasks, against)
    if not group:
        return None
    return Baseline(
        tasks=len(group),
        successes=sum(1 for t in group if speedup(t, against) is not None),
        fast_p={p: fast_p(group, p, against) for p in ps},
        geomean_speedup=geomean_speedup(group, against),
        geomean_speedup_all=geomean_speedup(group, against, failures_as=1.0),
        mean_speedup=mean_speedup(group, against),
    )


def summarize(tasks: Sequence[Row], label: str = "all", ps: Iterable[float] = FAST_PS) -> Summary:
    ps = tuple(ps)
    eager = baseline(tasks, EAGER, ps) or Baseline(0, 0, dict.fromkeys(ps), None, None, None)
    attempts = sum(int(t.get("attempts") or 0) for t in tasks)
    firsts = [int(t["attempts_to_first_accepted"]) for t in tasks
              if t.get("success") and t.get("attempts_to_first_accepted") is not None]
    return Summary(
        label=label,
        tasks=len(tasks),
        eager=eager,
        compile=baseline(tasks, COMPILE, ps),
        attempts=attempts,
        compile_rate=_ratio(sum(int(t.get("compiled_attempts") or 0) for t in tasks), attempts),
        passed_rate=_ratio(sum(int(t.get("passed_checks_attempts") or 0) for t in tasks), attempts),
        accepted_rate=_ratio(sum(int(t.get("accepted_attempts") or 0) for t in tasks), attempts),
        first_accepted_mean=statistics.fmean(firsts) if firsts else None,
        first_accepted_median=float(statistics.median(firsts)) if firsts else None,
        llm_calls=sum(int(t.get("llm_calls") or 0) for t in tasks),
        input_tokens=sum(int(t.get("input_tokens") or 0) for t in tasks),
        output_tokens=sum(int(t.get("output_tokens") or 0) for t in tasks),
        cost_usd=sum(float(t.get("cost_usd") or 0.0) for t in tasks),
        light=light(tasks),
        distinct_tasks=len({t.get("task") for t in tasks}),
        runs=len({t.get("run_id") for t in tasks}),
    )


def level_label(level: Any) -> str:
    return "no level" if level is None else f"level {level}"


def group_by(tasks: Iterable[Row], key: Callable[[Row], Any]) -> dict[Any, list[Row]]:
    """Tasks grouped by ``key``, groups in sorted key order (None last)."""
    groups: dict[Any, list[Row]] = {}
    for t in tasks:
        groups.setdefault(key(t), []).append(t)
    return dict(sorted(groups.items(), key=lambda kv: _order(kv[0])))


def _order(key: Any) -> tuple[int, float, str]:
    """Numbers first (by value), then text, then None."""
    if key is None:
        return (2, 0.0, "")
    if isinstance(key, int | float) and not isinstance(key, bool):
        return (0, float(key), "")
    return (1, 0.0, str(key))


def by_level(tasks: Sequence[Row], ps: Iterable[float] = FAST_PS) -> list[Summary]:
    """One summary per level (tasks without a level together), then ``all``; only ``all`` when every task has
    the same level or none."""
    ps = tuple(ps)
    groups = group_by(tasks, lambda t: t.get("level"))
    out = [summarize(g, level_label(level), ps) for level, g in groups.items()] if len(groups) > 1 else []
    return [*out, summarize(tasks, "all", ps)]


def by_run(tasks: Sequence[Row], ps: Iterable[float] = FAST_PS) -> list[Summary]:
    """One summary per run (an empty list when there is a single run)."""
    ps = tuple(ps)
    groups = group_by(tasks, lambda t: t.get("run_id"))
    return [summarize(g, str(run), ps) for run, g in groups.items()] if len(groups) > 1 else []


# Student's t at 97.5% for 1..30 degrees of freedom (a 95% two-sided interval from a few runs); beyond: 1.96
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Repeat:
    """One task run more than once: how its runs went, and its best speedup over them."""

    task: str
    runs: int
    successes: int
    geomean_speedup: float | None  # over the runs that succeeded
    low: float | None  # the 95% interval of that geometric mean from the runs' spread (two runs at least)
    high: float | None
    least: float | None  # the lowest and highest best speedup of a successful run
    most: float | None


def repeats(tasks: Sequence[Row]) -> list[Repeat]:
    """Per task that appears in more than one run, in name order: successes, and the geometric mean of its best
    speedup over its successful runs with a 95% Student-t interval for that mean (on their logarithms: how well
    the runs pin the task's figure down, which one run's own ± does not show), and the lowest and highest run."""
    out = []
    for name, group in group_by(tasks, lambda t: t.get("task")).items():
        if len(group) < 2:
            continue
        values = [s for t in group if (s := speedup(t)) is not None and s > 0]
        mean = geomean(values)
        low = high = None
        if len(values) >= 2:
            logs = [math.log(v) for v in values]
            freedom = len(logs) - 1
            t = _T975[freedom - 1] if freedom <= len(_T975) else 1.96
            half = t * statistics.stdev(logs) / math.sqrt(len(logs))
            centre = statistics.fmean(logs)
            low, high = math.exp(centre - half), math.exp(centre + half)
        out.append(Repeat(str(name), len(group), len(values), mean, low, high,
                          min(values) if values else None, max(values) if values else None))
    return out
