"""What ``--resume`` may change, and what a finished run says at once.

A resumed run continues the recorded search: its tasks and every setting come from ``run.json``. Three settings
may change, because they say how far and how wide the same search goes, not which search it is: ``--budget``
(raise it to continue a finished run: "continue this search to 60"; never below the attempts already recorded),
``--parallel`` and ``--stop-at-sol`` (0 continues the tasks that stopped at their speed of light). Any other
setting given with ``--resume`` is refused in one line rather than ignored. A run whose every task has its whole
budget recorded (or its best at ``--stop-at-sol`` of its speed of light) says so before Ray or an evaluator
starts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import Task
from stark_ray.run.directory import (
    SUMMARY_FILE,
    RunError,
    load_run,
    resume_settings,
    task_dir,
    write_run_file,
)
from stark_ray.search.memory import sol_share_reached
from stark_ray.store.location import Location, locate
from stark_ray.store.read import StoreError, recorded_attempts

CHANGEABLE = ("budget", "parallel", "stop_at_sol")  # SearchConfig fields a resume may set


@dataclass
class Resumed:
    """A run to continue: its tasks and settings (with the changes asked for), and what is recorded."""

    tasks: list[Task]
    search: SearchConfig
    agents: AgentConfig
    eval: EvalConfig
    attempts: dict[str, int]  # task -> attempts recorded
    summaries: bool = True  # every task's summary.json is there (a full disk may have kept one from being written)
    executor: str = "ray"  # the executor that made it (either can continue it)
    light: dict[str, float] = field(default_factory=dict)  # task -> its best's share of the speed of light

    @property
    def finished(self) -> bool:
        """Every task has its whole budget recorded, or its best at ``--stop-at-sol`` of its speed of light, and its
        summary written: nothing is left to do."""
        return self.summaries and all(self.attempts.get(t.name, 0) >= self.search.budget
                                      or sol_share_reached(self.light.get(t.name), self.search.stop_at_sol)
                                      for t in self.tasks)

    def describe(self) -> str:
        done = sum(min(n, self.search.budget) for n in self.attempts.values())
        return (f"{len(self.tasks)} task(s), {done} of {len(self.tasks) * self.search.budget} attempts recorded "
                f"(budget {self.search.budget} per task)")

    def finished_line(self, run_dir: object) -> str:
        """What ``--resume`` of a finished run says."""
        return f"{run_dir}: finished, {self.describe()}; nothing to do (a larger --budget continues it)"


def refuse_changes(options: list[str], allowed: str = "--budget, --parallel and --stop-at-sol") -> None:
    """RunError naming the options (as the user typed them: ``--seed``, ``TASK``) given with --resume that a
    resume cannot change; ``allowed`` says what it can."""
    if options:
        raise RunError(f"--resume continues the recorded search with its own settings; {', '.join(options)} "
                       f"cannot change (only {allowed} can)")


def resumed(run_dir: str | Path | Location, budget: int | None = None, parallel: int | None = None,
            stop_at_sol: float | None = None) -> Resumed:
    """The recorded run with ``budget``/``parallel``/``stop_at_sol`` changed where given. RunError (one line) for a
    run directory that cannot be resumed or a budget below what is recorded."""
    tasks, search, agents, ev = resume_settings(run_dir)
    executor = str(load_run(run_dir).get("executor") or "ray")
    try:
        attempts = recorded_attempts(run_dir)
    except FileNotFoundError:
        attempts = {}
    except StoreError as e:
        raise RunError(f"{run_dir}: {e}") from None
    changes: dict[str, int] = {}
    if budget is not None:
        most = max(attempts.values(), default=0)
        if budget < most:
            raise RunError(f"--budget {budget} is below the {most} attempts already recorded for one task")
        changes["budget"] = budget
    if parallel is not None:
        changes["parallel"] = parallel
    if stop_at_sol is not None:
        changes["stop_at_sol"] = stop_at_sol
    try:
        search = replace(search, **changes)  # SearchConfig checks the values
    except ValueError as e:
        raise RunError(str(e)) from None
    places = {t.name: task_dir(run_dir, t.name, len(tasks)) for t in tasks}
    written = all((p / SUMMARY_FILE).is_file() for p in places.values())
    light = {name: share for name, p in places.items()
             if search.stop_at_sol > 0 and (share := _best_sol_fraction(p)) is not None}
    return Resumed(tasks, search, agents, ev, attempts, written, executor, light)


def _best_sol_fraction(place: Location) -> float | None:
    """The best candidate's share of the speed of light as the task's summary.json says (None: not said)."""
    try:
        value = json.loads((place / SUMMARY_FILE).read_text()).get("best_sol_fraction")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def record_changes(run_dir: str | Path | Location, search: SearchConfig) -> None:
    """Write the resumed run's search settings into its run.json (a later resume continues from them)."""
    data = load_run(run_dir)
    if data.get("search") == asdict(search):
        return
    data["search"] = asdict(search)
    write_run_file(locate(run_dir), data)
