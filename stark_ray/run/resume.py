"""What ``--resume`` may change, and what a finished run says at once.

A resumed run continues the recorded search: its tasks and every setting come from ``run.json``. Two settings
may change, because they say how far and how wide the same search goes, not which search it is: ``--budget``
(raise it to continue a finished run: "continue this search to 60"; never below the attempts already recorded)
and ``--parallel``. Any other setting given with ``--resume`` is refused in one line rather than ignored. A run
whose every task has its whole budget recorded says so before Ray or an evaluator starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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
from stark_ray.store.location import Location, locate
from stark_ray.store.read import StoreError, recorded_attempts

CHANGEABLE = ("budget", "parallel")  # SearchConfig fields a resume may set


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

    @property
    def finished(self) -> bool:
        """Every task has its whole budget recorded and its summary written: nothing is left to do."""
        return self.summaries and all(self.attempts.get(t.name, 0) >= self.search.budget for t in self.tasks)

    def describe(self) -> str:
        done = sum(min(n, self.search.budget) for n in self.attempts.values())
        return (f"{len(self.tasks)} task(s), {done} of {len(self.tasks) * self.search.budget} attempts recorded "
                f"(budget {self.search.budget} per task)")

    def finished_line(self, run_dir: object) -> str:
        """What ``--resume`` of a finished run says."""
        return f"{run_dir}: finished, {self.describe()}; nothing to do (a larger --budget continues it)"


def refuse_changes(options: list[str], allowed: str = "--budget and --parallel") -> None:
    """RunError naming the options (as the user typed them: ``--seed``, ``TASK``) given with --resume that a
    resume cannot change; ``allowed`` says what it can."""
    if options:
        raise RunError(f"--resume continues the recorded search with its own settings; {', '.join(options)} "
                       f"cannot change (only {allowed} can)")


def resumed(run_dir: str | Path | Location, budget: int | None = None, parallel: int | None = None) -> Resumed:
    """The recorded run with ``budget``/``parallel`` changed where given. RunError (one line) for a run directory
    that cannot be resumed or a budget below what is recorded."""
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
    try:
        search = replace(search, **changes)  # SearchConfig checks the values
    except ValueError as e:
        raise RunError(str(e)) from None
    places = [task_dir(run_dir, t.name, len(tasks)) for t in tasks]
    return Resumed(tasks, search, agents, ev, attempts, all((p / SUMMARY_FILE).is_file() for p in places),
                   executor)


def record_changes(run_dir: str | Path | Location, search: SearchConfig) -> None:
    """Write the resumed run's search settings into its run.json (a later resume continues from them)."""
    data = load_run(run_dir)
    if data.get("search") == asdict(search):
        return
    data["search"] = asdict(search)
    write_run_file(locate(run_dir), data)
