"""Correctness: several trials with fresh seeded inputs (more than one distribution), against the reference.

Per trial: ``torch.manual_seed(seed + trial)`` then ``get_inputs()``; floating inputs scaled on the last
trials (:func:`~stark_ray.eval.inputs.trial_scale`). Memory the candidate's outputs will likely get is
poisoned first. The candidate runs first (it cannot read a reference output that does not exist yet) on its
own clone of the inputs; its outputs are copied right away on the current stream and the device is
synchronized, so its faults surface as its own. Then the reference runs on another clone (a warm worker
keeps each trial's inputs for the next candidate of the task: :class:`TrialCache`). The candidate's
outputs must be plain tensors on the device, sharing no memory with its inputs; its clone of the inputs must
be unchanged; and the outputs must match in structure, shape, dtype, NaN pattern, ``allclose`` and
normalized error.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.compare import Tolerances, compare_outputs
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.guards import nbytes_of, output_problem, poison, snapshot
from stark_ray.eval.inputs import clone_all, make_inputs, same_values, trial_scale
from stark_ray.eval.tasks import TaskError
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, STAGE_RUNTIME


@dataclass
class CorrectnessReport:
    stage: str  # STAGE_OK, STAGE_CORRECTNESS or STAGE_RUNTIME
    error: str | None = None
    log: str = ""
    max_abs_err: float | None = None
    rel_err: float | None = None

    @property
    def ok(self) -> bool:
        return self.stage == STAGE_OK


def trial_label(trial: int, trials: int) -> str:
    scale = trial_scale(trial, trials)
    return f"trial {trial + 1}/{trials}" + ("" if scale == 1.0 else f" (inputs x{scale:g})")


def _no_sync() -> None:
    """Nothing is queued on the CPU."""


class TrialCache:
    """A task's trial inputs, kept on the device in a warm worker while they fit in ``max_bytes``: every
    candidate of the task is checked on the same seeded trials, so they are made (on the CPU, by the task's
    get_inputs, then moved) once. Reference outputs are not kept: the candidate always runs before the
    reference's output for its inputs exists."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.entries: dict[tuple[int, int, int], list[Any]] = {}

    def inputs(self, key: tuple[int, int, int], make: Callable[[], list[Any]]) -> list[Any]:
        found = self.entries.get(key)
        if found is None:
            found = make()
            size = sum(nbytes_of(found))
            if self.used + size <= self.max_bytes:
                self.entries[key] = found
                self.used += size
        return found


def check_correctness(reference: Callable[..., Any], candidate: Callable[..., Any],
                      get_inputs: Callable[[], Any], cfg: EvalConfig, device: str = "cpu",
                      task_name: str = "task", output_nbytes: list[int] | None = None,
                      synchronize: Callable[[], None] = _no_sync, cache: TrialCache | None = None
                      ) -> CorrectnessReport:
    tol = Tolerances.of(cfg)
    worst_abs = worst_rel = 0.0
    for trial in range(cfg.trials):
        label = trial_label(trial, cfg.trials)
        seed = cfg.seed + trial
        def make(seed: int = seed, trial: int = trial) -> list[Any]:
            return make_inputs(get_inputs, seed, trial_scale(trial, cfg.trials), device)

        inputs = cache.inputs((cfg.seed, trial, cfg.trials), make) if cache is not None else make()
        cand_inputs = clone_all(inputs)
        with torch.no_grad():
            if output_nbytes:
                poison(output_nbytes, device)
            torch.manual_seed(seed)
            try:
                raw = candidate(*cand_inputs)
                out = snapshot(raw)
                synchronize()
            except Exception as e:
                return CorrectnessReport(STAGE_RUNTIME, f"{label}: {describe_exception(e)}",
                                         log=traceback.format_exc())
            problem = output_problem(raw, cand_inputs, device)
            if problem:
                return CorrectnessReport(STAGE_CORRECTNESS, f"{label}: {problem}", log=problem)
            del raw
            torch.manual_seed(seed)
            try:
                ref = reference(*clone_all(inputs))
                synchronize()
            except Exception as e:
                why = describe_exception(e)
                raise TaskError(f"task {task_name}: reference forward failed: {why}") from None
        if not same_values(cand_inputs, inputs):
            return CorrectnessReport(STAGE_CORRECTNESS, f"{label}: the candidate modified its inputs")
        c = compare_outputs(out, ref, tol)
        if not c.ok:
            problem = f"{label}: {c.problem}"
            return CorrectnessReport(STAGE_CORRECTNESS, problem, log=problem, max_abs_err=c.max_abs_err,
                                     rel_err=c.rel_err)
        worst_abs, worst_rel = max(worst_abs, c.max_abs_err), max(worst_rel, c.rel_err)
    return CorrectnessReport(STAGE_OK, max_abs_err=worst_abs, rel_err=worst_rel)
