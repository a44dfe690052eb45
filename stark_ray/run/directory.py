"""The files of a run besides its Parquet rows, alike whichever executor made it: run.json (what --resume and the
``runs`` view read) and each task's summary."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import Task
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import LLMUsage
from stark_ray.run.summary import RunSummary, summary_of
from stark_ray.search.memory import sol_reached
from stark_ray.search.runoff import Runoff
from stark_ray.search.tree import Tree
from stark_ray.store.location import Location, locate
from stark_ray.store.parquet import safe_name
from stark_ray.store.read import call_rows

RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"


def new_run_dir(out: str | Path | Location, task_name: str) -> Location:
    """A new run directory ``<task>-<UTC time>`` (``-2``, ``-3``, ... when taken) under ``out``, a local
    directory or a filesystem URI (created when absent). On a remote filesystem, where a name cannot be taken
    atomically, the name ends with four random hex digits so that drivers started in the same second differ."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    root = locate(out)
    base = f"{safe_name(task_name)}-{stamp}" + ("" if root.local else f"-{uuid.uuid4().hex[:4]}")
    root.mkdir()
    for n in range(1, 1000):
        run_dir = root / (base if n == 1 else f"{base}-{n}")
        try:
            run_dir.make_new()
            return run_dir
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory name for {base} under {root}")


def write_atomic(path: Path | Location, text: str) -> None:
    """Write a small file whole (a reader never sees part of it), locally or on a filesystem URI."""
    locate(path).write_text(text)


class RunError(Exception):
    """A run that cannot start (a bad resume directory, no evaluator). One line."""


class RayUnavailable(RunError):
    """A private local Ray that could not start on this machine (a host too busy for its agents). One line."""


def load_run(run_dir: str | Path | Location) -> dict[str, Any]:
    try:
        path = locate(run_dir) / RUN_FILE
    except ValueError as e:
        raise RunError(str(e)) from None
    try:
        if not path.is_file():
            raise RunError(f"{run_dir} is not a run directory (no {RUN_FILE})")
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {path}: {e}") from None


def resume_settings(run_dir: str | Path | Location) -> tuple[list[Task], SearchConfig, AgentConfig, EvalConfig]:
    """The tasks and settings an earlier run recorded."""
    data = load_run(run_dir)
    tasks = [Task(t["name"], Path(t["path"]), t["source"]) for t in data["tasks"]]
    return (tasks, SearchConfig(**data["search"]), AgentConfig(**data["agents"]), EvalConfig(**data["eval"]))


def run_record(tasks: list[Task], search: SearchConfig, agents: AgentConfig, ev: EvalConfig,
               executor: str) -> dict[str, Any]:
    """run.json: the tasks (with their sources) and every setting, which ``--resume`` continues with."""
    return {"tasks": [{"name": t.name, "path": str(t.path), "source": t.source} for t in tasks],
            "search": asdict(search), "agents": asdict(agents), "eval": asdict(ev), "executor": executor}


def write_run_file(run_dir: Location, record: dict[str, Any]) -> None:
    locate(run_dir / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")


def recorded_usage(run_dir: str | Path | Location) -> defaultdict[str, UsageTotals]:
    """Every task's LLM calls as recorded (a resumed run's earlier calls included), read in one pass: a task
    without any gets empty totals."""
    totals: defaultdict[str, UsageTotals] = defaultdict(UsageTotals)
    try:
        rows = call_rows(run_dir)
    except (FileNotFoundError, OSError):
        return totals
    names = set(LLMUsage.__dataclass_fields__)
    for row in rows:
        totals[row["task"]].add(LLMUsage(**{k: v for k, v in row.items() if k in names}))
    return totals


def summary_settings(search: SearchConfig, agents: AgentConfig, ev: EvalConfig, executor: str) -> dict[str, Any]:
    """The settings a task's summary.json repeats (prices only where set)."""
    public = {k: v for k, v in asdict(agents).items() if k != "prices" or v}
    return {"search": asdict(search), "agents": public, "eval": asdict(ev), "executor": executor}


def task_summary(task: Task, tree: Tree, run_dir: str | Path | Location, run_id: str, status: str, wall_s: float,
                 search: SearchConfig, agents: AgentConfig, ev: EvalConfig, usage: UsageTotals,
                 executor: str, runoff: Runoff | None = None) -> RunSummary:
    """A task's summary, as either executor writes it (one that ended at its speed of light says so in
    ``settings["stopped_by"]``; ``runoff``: the side-by-side evaluation that named its best)."""
    settings = summary_settings(search, agents, ev, executor)
    best = tree.best()
    if tree.evaluated < search.budget and sol_reached(tree, search.stop_at_sol) and best is not None:
        settings["stopped_by"] = (f"speed of light: the best candidate runs at {best.result.sol_fraction:.0%} of it "
                                  f"(--stop-at-sol {search.stop_at_sol:g})")
    return summary_of(task.name, run_id, str(run_dir), tree, status, search.budget, usage, settings, wall_s, runoff)


def task_dir(run_dir: str | Path | Location, name: str, tasks: int) -> Location:
    """Where a task's summary and best kernel go: the run directory itself for a one-task run, else
    ``tasks/<name>/`` in it."""
    loc = locate(run_dir)
    return loc if tasks == 1 else loc / "tasks" / name


def write_task_end(place: Location, tree: Tree, summary: RunSummary) -> None:
    """The end of a task: its ``summary.json`` and the best kernel its summary names, in ``place``."""
    place.mkdir()
    write_atomic(place / SUMMARY_FILE, json.dumps(asdict(summary), indent=2) + "\n")
    best = tree.nodes.get(summary.best_node) if summary.best_node is not None else tree.best()
    if best is not None:
        write_atomic(place / "best_kernel.py", best.source)
