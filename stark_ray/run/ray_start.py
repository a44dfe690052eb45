"""Starting a Ray run: the evaluators (each times its tasks' references as soon as its device worker is up), the
run directory (new, or the resumed one), and the TreeMemory actor with every task's tree; what a resumed run spent
before counts against its caps."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from dataclasses import replace
from typing import Any

import ray

from stark_ray.actors.tree_memory import TaskSpec
from stark_ray.agents.base import TaskInfo
from stark_ray.eval.judge.sol import light_line
from stark_ray.eval.measure.memory import OverBudget
from stark_ray.eval.tasks import TaskError
from stark_ray.run.directory import new_run_dir, recorded_usage, run_record, write_run_file
from stark_ray.run.mirror import RunMirror
from stark_ray.run.placement import RayRun, checked_get, recorded_tasks, start_evaluators, start_memory
from stark_ray.run.reporter import Reporter
from stark_ray.run.resume import record_changes
from stark_ray.search.tree import Tree
from stark_ray.store.location import Location, locate

log = logging.getLogger(__name__)
EXECUTOR = "ray"  # as run.json and the summaries name it


class RayStart:
    """Part of the Ray driver (``ray_driver.RayDriver``), whose state it sets up."""

    run: RayRun
    reporter: Reporter
    embedded: bool
    tasks: dict[str, Any]
    view: RunMirror
    dispatch: Any
    deaths: Any
    cap: Any
    spend: Any
    phases: dict[str, float]
    evaluators: list[Any]
    worker_starts: list[Any]
    infos: dict[str, TaskInfo]
    dir: Location
    run_id: str
    memory: Any

    def start(self) -> None:
        """Start the evaluators (timing the references) and the memory; make or reopen the run directory."""
        run = self.run
        token = uuid.uuid4().hex[:6]  # a resumed run's actors must not collide with a dying driver's
        t0 = time.monotonic()
        self.evaluators = start_evaluators(run, self.embedded, token)
        self.cap.evaluators = len(self.evaluators)
        self.dispatch.place([t.name for t in run.tasks], len(self.evaluators))
        home = self.dispatch.home
        # every evaluator starts its device worker now, at once, and times its tasks' references as soon as that
        # is up. Every reference is checked before a run directory exists; a resumed run needs them only for tasks
        # whose tree has no row yet (killed before its reference was written)
        hardware_refs = [e.hardware.remote() for e in self.evaluators]
        recorded = set(recorded_tasks(run.resume)) if run.resume is not None else set()
        pending = {t.name: self.evaluators[home[t.name]].reference.remote(t) for t in run.tasks
                   if t.name not in recorded}
        self.reporter.phase(f"starting {len(self.evaluators)} {run.eval.backend} evaluator(s), then timing "
                            f"{len(pending)} reference(s)")
        hardware = checked_get(hardware_refs)  # EvaluatorError: this host cannot evaluate (one line)
        self.phases["evaluators_s"] = time.monotonic() - t0
        self.worker_starts = [h["start_phases"] for h in hardware]  # where each device worker's start went
        self.deaths.instances = {i: h.get("instance") for i, h in enumerate(hardware)}
        self.deaths.nodes = {i: h.get("node") for i, h in enumerate(hardware)}
        self.dispatch.share([h["class"] for h in hardware])
        specs = []
        self.infos: dict[str, TaskInfo] = {
            t.name: TaskInfo(name=t.name, reference_source=t.source, backend=run.eval.backend,
                             hardware=hardware[home[t.name]]["description"]) for t in run.tasks}
        skipped: list[str] = []
        for task in run.tasks:
            try:
                reference = checked_get(pending[task.name]) if task.name in pending else None
            except OverBudget as e:  # this device cannot evaluate it at this budget: a campaign goes on without it
                if len(run.tasks) == 1:
                    raise
                skipped.append(task.name)
                print(f"stark: skipped: {e}", file=sys.stderr, flush=True)
                continue
            specs.append(TaskSpec(self.infos[task.name], reference))
        if skipped:
            self.skip(skipped)
            run = self.run
        self.phases["references_s"] = time.monotonic() - t0 - self.phases["evaluators_s"]
        t1 = time.monotonic()
        if run.resume is not None:
            self.dir = locate(run.resume)
            record_changes(self.dir, run.search)  # a raised budget or another --parallel: the next resume keeps it
        else:
            base = run.tasks[0].name if len(run.tasks) == 1 else "campaign"
            out = locate(run.out)
            self.dir = new_run_dir(out, base) if run.run_id is None else out / run.run_id
            self.dir.mkdir()
            write_run_file(self.dir, run_record(run.tasks, run.search, run.agents, run.eval, EXECUTOR))
        self.run_id = self.dir.name
        self.view.dir = self.dir
        self.memory = start_memory(run, self.dir, f"stark-memory-{self.run_id}-{token}", specs)
        snapshots = ray.get([self.memory.snapshot.remote(name) for name in self.tasks])
        recorded = recorded_usage(self.dir) if run.resume is not None else None  # all tasks' calls, one read
        for name, snapshot in zip(self.tasks, snapshots, strict=True):
            if recorded is not None:  # what the earlier part of the run spent counts against the caps
                spent = recorded[name]
                self.spend.add(name, spent.cost_usd, spent.input_tokens + spent.output_tokens)
                self.view.usage[name] = spent  # and in the summaries: this part's calls are added as they come
            tree = Tree.from_records(snapshot)
            self.infos[name] = replace(self.infos[name], light=light_line(tree.nodes[0].result))  # its reference's
            self.view.load(name, tree)
            self.reporter.start(self.tasks[name], run.search.budget, tree)
        self.phases["memory_s"] = time.monotonic() - t1
        log.info("run %s started: %s; device workers: %s", self.run_id,
                 ", ".join(f"{k} {v:.2f}" for k, v in self.phases.items()), self.worker_starts)

    def skip(self, names: list[str]) -> None:
        """Go on without these tasks (their references do not fit the memory budget); none left is a TaskError."""
        kept = [t for t in self.run.tasks if t.name not in names]
        if not kept:
            raise TaskError(f"no task fits the memory budget ({len(names)} skipped)")
        self.run = replace(self.run, tasks=kept)
        self.tasks = {t.name: t for t in kept}
        self.view = RunMirror(t.name for t in kept)
