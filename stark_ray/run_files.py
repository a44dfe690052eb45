"""The files of a Ray run besides its Parquet rows: run.json (what --resume reads) and each task's summary."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import Task
from stark_ray.llm.usage import UsageTotals
from stark_ray.optimize import RunSummary, summary_of
from stark_ray.records import LLMUsage
from stark_ray.search.tree import Tree
from stark_ray.store.location import Location, locate
from stark_ray.store.read import call_rows

RUN_FILE = "run.json"


class RunError(Exception):
    """A run that cannot start (a bad resume directory, no evaluator). One line."""


def load_run(run_dir: str | Path | Location) -> dict[str, Any]:
    try:
        path = locate(run_dir) / RUN_FILE
    except ValueError as e:
        raise RunError(str(e)) from None
    try:
        if not path.is_file():
            raise RunError(f"{run_dir} is not a Ray run directory (no {RUN_FILE})")
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {path}: {e}") from None


def resume_settings(run_dir: str | Path | Location) -> tuple[list[Task], SearchConfig, AgentConfig, EvalConfig]:
    """The tasks and settings an earlier run recorded."""
    data = load_run(run_dir)
    tasks = [Task(t["name"], Path(t["path"]), t["source"]) for t in data["tasks"]]
    return (tasks, SearchConfig(**data["search"]), AgentConfig(**data["agents"]), EvalConfig(**data["eval"]))


def run_record(tasks: list[Task], search: SearchConfig, agents: AgentConfig, ev: EvalConfig) -> dict[str, Any]:
    return {"tasks": [{"name": t.name, "path": str(t.path), "source": t.source} for t in tasks],
            "search": asdict(search), "agents": asdict(agents), "eval": asdict(ev), "executor": "ray"}


def recorded_usage(run_dir: str | Path | Location, task: str) -> UsageTotals:
    """Every LLM call of the task as recorded (a resumed run's earlier calls included)."""
    totals = UsageTotals()
    try:
        rows = call_rows(run_dir, task)
    except (FileNotFoundError, OSError):
        return totals
    names = set(LLMUsage.__dataclass_fields__)
    for row in rows:
        totals.add(LLMUsage(**{k: v for k, v in row.items() if k in names}))
    return totals


def task_summary(task: Task, tree: Tree, run_dir: str | Path | Location, run_id: str, status: str, wall_s: float,
                 search: SearchConfig, ev: EvalConfig, usage: UsageTotals) -> RunSummary:
    settings = {"search": asdict(search), "eval": asdict(ev), "executor": "ray"}
    return summary_of(task.name, run_id, str(run_dir), tree, status, search.budget, usage, settings, wall_s)
