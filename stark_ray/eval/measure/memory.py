"""The evaluator's device memory: one budget for the judge, its worker and the buffers they share.

KernelBench sizes its tasks for large GPUs (a level-1 input is often 6-17 GB), so what an evaluation keeps is
chosen from the task's :class:`Footprint` and the budget, not fixed: how many rotating timing sets the worker
makes and whether it keeps them between candidates, how many standard trials the judge keeps, how many other
tasks either process keeps warm. The budget is ``EvalConfig.memory_budget_gb`` (``--memory-budget``), by default
DEFAULT_SHARE of the device's free memory when the judge starts. It is enforced per process with
``torch.cuda.set_per_process_memory_fraction``, each process capped at the budget less what the other holds
(:func:`apply_cap`), so that the two together stay within it: an H200 runs as a 40 GB or 80 GB GPU would.
The worker runs candidates and could lift its own cap; the cap emulates a smaller device, it is no defence.

A task whose evaluation cannot fit is one line, ``task X needs 52.3 GB; budget 40 GB`` (:class:`OverBudget`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from stark_ray.eval.tasks import TaskError

GB = 1e9
TRACE_ENV = "STARK_MEMORY_TRACE"  # a file: the judge's steps, each with its moment and memory (memory_timeline.py)
DEFAULT_SHARE = 0.9  # of the device's free memory when the judge starts
CONTEXTS_BYTES = int(1.5e9)  # the judge's and the worker's CUDA contexts and libraries, outside either allocator
TRANSIENT_BYTES = int(1e9)  # comparisons in chunks, the L2 flush buffer, library workspaces: beside any phase
MIN_CAP_BYTES = 256 << 20  # a process is never capped below this (its own small allocations)
MAX_TIMING_SETS = 4  # rotating timing input sets where they fit ...
LARGE_SET_BYTES = 1 << 30  # ... and 2 for a set larger than this: far beyond any cache, two rotate as well as four
TRIAL_CACHE_BYTES = 2 << 30  # the judge keeps at most this of a task's standard trials (inputs and outputs)
KEPT_SHARE = 0.25  # the states of other tasks kept warm: at most this share of the budget
CACHED_SLACK = 256 << 20  # cached blocks beyond this go back to the device before the other process's turn
MARGIN = 0.1  # of the budget, left free by what is kept (fragmentation, the allocators' rounding)


class OverBudget(TaskError):
    """A task whose evaluation cannot fit in the memory budget. The message is one line."""


@dataclass(frozen=True)
class Footprint:
    """What one task's evaluation moves through device memory (bytes)."""

    inputs: int  # one set of the task's inputs
    outputs: int  # the reference's outputs
    work: int  # the reference's forward beyond its inputs at its peak: outputs and intermediates (>= outputs)
    params: int  # the reference model's parameters and buffers (each process holds a copy)

    def phases(self) -> dict[str, int]:
        """Device memory at once in each phase of an evaluation, with everything optional at its smallest (one
        timing set, no trial kept), both processes and what they share counted."""
        i, o, w = self.inputs, self.outputs, max(self.work, self.outputs)
        return {
            # the judge makes a trial: a standard trial's inputs and the copy its reference runs on, or a derived
            # trial's changed inputs (run on without a copy) beside the base trial's reference output
            "making a trial": max(2 * i + w, i + o + w),
            # a trial's inputs made (then dropped) beside their shared copy, the reference output and the slots
            "sharing a trial": 2 * i + 2 * o,
            # the same-address trial's second contents: made and written into the shared copy (beside the slots),
            # the reference run on them
            "second contents": 2 * i + o + w,
            # the worker's call on the shared inputs, beside the judge's reference output and the slots
            "running a trial": i + 2 * o + w,
            # the judge's check of the inputs: the shared copy and the inputs made again
            "checking a trial": 2 * i + 2 * o,
            # the worker's timing: one set and the call's clone, the reference's output kept while the candidate
            # runs (or the other way round)
            "timing": 2 * i + o + w,
        }

    def needs(self) -> int:
        """The least device memory an evaluation of this task takes (contexts included)."""
        return max(self.phases().values()) + 2 * self.params + CONTEXTS_BYTES + TRANSIENT_BYTES

    def describe(self) -> str:
        return (f"inputs {self.inputs / GB:.2f} GB, outputs {self.outputs / GB:.2f} GB, reference forward "
                f"{self.work / GB:.2f} GB, parameters {self.params / GB:.2f} GB")


@dataclass(frozen=True)
class Plan:
    """What an evaluation of one task keeps, chosen to fit the budget."""

    timing_sets: int  # rotating input sets the worker times with
    keep_sets: bool  # whether the worker keeps them between candidates (else made again each time: milliseconds)
    trial_cache: int  # bytes of standard trials the judge may keep
    kept_others: int  # bytes the states of other tasks may hold (in each process)

    def describe(self) -> str:
        return (f"{self.timing_sets} timing set(s){' kept' if self.keep_sets else ''}, trials kept up to "
                f"{self.trial_cache / GB:.1f} GB, other tasks up to {self.kept_others / GB:.1f} GB")

    def to_json(self) -> dict[str, Any]:
        return {"timing_sets": self.timing_sets, "keep_sets": self.keep_sets, "trial_cache": self.trial_cache,
                "kept_others": self.kept_others}

    @staticmethod
    def from_json(d: Any) -> Plan | None:
        try:
            return Plan(int(d["timing_sets"]), bool(d["keep_sets"]), int(d["trial_cache"]), int(d["kept_others"]))
        except (KeyError, TypeError, ValueError):
            return None


def plan_for(fp: Footprint, budget: int) -> Plan:
    """What the optional holdings may take once the evaluation's least need is met within ``budget`` (less a
    margin): more timing sets first (they are needed at once only while timing), then, from what is left, the sets
    kept between candidates, the judge's trials and the states of other tasks (in each process)."""
    spare = max(0, int((1 - MARGIN) * budget) - fp.needs())
    sets = MAX_TIMING_SETS if fp.inputs <= LARGE_SET_BYTES else 2
    while sets > 1 and (sets - 1) * fp.inputs > spare:  # the need counts one set: each more comes from the spare
        sets -= 1
    kept = sets * fp.inputs
    keep = 2 * kept <= spare  # held through the judge's trials too: only with room to spare
    # what stays held while the worker times (the sets beyond the first, or all of them when kept) is not left
    left = max(0, spare - (kept if keep else (sets - 1) * fp.inputs))
    # the judge's trials and the other tasks of both processes: together at most three quarters of what is left
    return Plan(timing_sets=sets, keep_sets=keep, trial_cache=min(TRIAL_CACHE_BYTES, left // 4),
                kept_others=int(min(KEPT_SHARE * budget, left // 4)))


def check_fits(name: str, fp: Footprint, budget: int, measured: bool) -> None:
    """OverBudget (one line) when the task's least need exceeds ``budget``."""
    need = fp.needs()
    if need > budget:
        how = "" if measured else "at least "
        raise OverBudget(f"task {name} needs {how}{need / GB:.1f} GB; budget {budget / GB:.1f} GB "
                         f"({fp.describe()})")


BUSY_SHARE = 0.95  # of the device less what other processes hold: a budget never asks for more
BUSY_STEP = 1 << 29  # ... rounded down to this (what others hold moves a little from request to request)


def within_reach(budget: int, total: int, free: int, held: int) -> tuple[int, int]:
    """``budget`` (bytes) lowered to what this evaluator can really have now — BUSY_SHARE of the device less what
    other processes hold (``total - free - held``, ``held``: what this evaluator holds) — and what the others hold.
    A second evaluator started at the same time as a first, or a campaign beside a ``stark eval``, each took a
    share of the free memory it saw at its start; the later of two then ran out of memory in the middle of a
    candidate."""
    others = max(0, total - free - held)
    reach = int(BUSY_SHARE * (total - others)) // BUSY_STEP * BUSY_STEP
    return min(budget, reach), others


def resolve_budget(budget_gb: float | None, free: int, total: int) -> int:
    """The budget in bytes: ``budget_gb`` (never above the device), or DEFAULT_SHARE of the free memory."""
    if budget_gb is None:
        return int(DEFAULT_SHARE * free)
    return int(min(budget_gb * GB, total))


def apply_cap(cap: int) -> None:
    """Cap this process's CUDA caching allocator at ``cap`` bytes (the blocks it caches beyond it are freed on
    demand)."""
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, max(cap, MIN_CAP_BYTES) / total))


def give_back_cached() -> None:
    """The CUDA caching allocator's unused blocks back to the device where they are more than CACHED_SLACK: before
    the other process's turn, so that what this one reserves is what it holds."""
    import torch

    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > CACHED_SLACK:
        torch.cuda.empty_cache()


def on_meta(module: Any, init_inputs: list[Any], get_inputs: Any, mode: Any = None) -> tuple[int, int, int, bool]:
    """The task's reference built and run on the ``meta`` device, from shapes alone (nothing allocated), under
    ``mode`` where given (a ``TorchDispatchMode``: what counts its operations): the bytes of its inputs, outputs and
    parameters, and whether the forward ran there (else its outputs count as none: it needs values, as an
    ``.item()`` or a data-dependent shape does)."""
    import copy

    import torch

    from stark_ray.eval.measure.inputs import nbytes_of

    with torch.device("meta"):
        inputs = list(get_inputs())
        model = module.Model(*copy.deepcopy(init_inputs))
        params = param_bytes(model)
        try:
            with torch.no_grad(), mode if mode is not None else contextlib.nullcontext():
                outputs, ran = sum(nbytes_of(model(*inputs))), True
        except Exception:
            outputs, ran = 0, False
    return sum(nbytes_of(inputs)), outputs, params, ran


def meta_footprint(module: Any, init_inputs: list[Any], get_inputs: Any) -> Footprint:
    """A task's footprint from shapes alone (:func:`on_meta`): its inputs and parameters, and its outputs where the
    forward runs there (else counted as none: a lower bound). The work is taken to be the outputs."""
    inputs, outputs, params, _ = on_meta(module, init_inputs, get_inputs)
    return Footprint(inputs, outputs, outputs, params)


def param_bytes(model: Any) -> int:
    total = 0
    for name in ("parameters", "buffers"):
        fn = getattr(model, name, None)
        if callable(fn):
            with contextlib.suppress(Exception):  # an odd parameters(): counted as none
                total += sum(t.numel() * t.element_size() for t in fn())
    return total

