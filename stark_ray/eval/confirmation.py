"""The judge's own measurement of a speedup: wall-clock time around a batch of calls, measured outside the worker.

The worker's figures (CUDA events, or ``time.perf_counter`` on the CPU) are taken in the process that imported the
candidate, which can patch them, hide work on other streams or answer from a cache. So a speedup above
CONFIRM_ABOVE is measured again by the judge:

- K fresh input sets (seeds no one knew), K chosen so that the candidate's batch lasts BATCH_TARGET_MS by its own
  claimed time (a claim too fast only makes the batch longer), within a memory budget; three rounds with new sets
  each, the two sides taking turns to go first;
- the reference's batch runs here: every set once with its outputs copied into buffers and a byte sum of each
  read back; the candidate's runs in the worker the same way into the judge's slots, and its answer carries the
  byte sums, so it cannot come before the outputs exist. The judge's clock runs from sending ``go`` to the answer
  (the sets and slots were mapped and paged in before, by ``stage``);
- the slots' byte sums must equal the worker's, the outputs must match the reference's at tolerance, and the
  inputs must be unchanged;
- the copies and byte sums cost both sides the same: the judge measures that cost on its own buffers and takes it
  off both (never more than half of either); the batch speedup is the ratio of the faster round of each. The
  speedup is confirmed when the batch speedup is at least AGREEMENT (half) of the worker's, or 10x by itself (a
  call of microseconds carries host noise that compresses very large ratios; the worker's figure is then the
  one reported, so a speedup that is really above 10x may be overstated). Else the result is flagged
  ``suspicious`` and kept off the leaderboard.

The batch measures wall-clock time: a call whose host side (Python, launches) takes longer than its GPU work shows
that time, which the worker's timing leaves out by design. Such a speedup cannot be confirmed from outside and is
flagged too, with the two figures in its error line.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.eval.compare import Tolerances, compare_outputs, flatten_outputs
from stark_ray.eval.exchange import byte_sum
from stark_ray.eval.guards import nbytes_of
from stark_ray.eval.inputs import clone_all, make_inputs
from stark_ray.eval.trials import JudgeTask

CONFIRM_ABOVE = 2.0  # speedups above this are measured again by the judge
AGREEMENT = 0.5  # confirmed when the judge's batch speedup is at least this share of the worker's ...
CONFIRMED_BY_ITSELF = 10.0  # ... or this large by itself (µs calls: the host's noise per call compresses it)
BATCH_TARGET_MS = 10.0  # the candidate's batch lasts about this long, by its own claim
MAX_SETS = 64
ROUNDS = 3  # the fastest of each side counts: load on the host only ever adds time
CUDA_BUDGET_SHARE = 0.125  # of the device's memory, for a batch's inputs and outputs (all copies)
CPU_BUDGET_BYTES = 1 << 30


@dataclass(frozen=True)
class Confirmation:
    confirmed: bool
    note: str  # one line for the log (and the error, when not confirmed)
    wall_speedup: float | None = None
    problem: str | None = None  # the candidate's batch outputs (or inputs) were wrong: a correctness failure


# (sets of inputs) -> (the judge's wall seconds around the worker's batch, the outputs per set, problem)
CandidateBatch = Callable[[list[list[Any]]], tuple[float, list[Any], str | None]]


def set_count(task: JudgeTask, claimed_ms: float, sample: list[Any], sample_out: Any) -> int:
    """Input sets per batch: the candidate's claimed time times this is about BATCH_TARGET_MS, within budget."""
    wanted = math.ceil(BATCH_TARGET_MS / max(claimed_ms, 1e-3))
    per_set = 3 * sum(nbytes_of(sample)) + 4 * sum(nbytes_of(sample_out))  # inputs: ours, the run's, shared
    if task.device == "cuda":
        budget = int(CUDA_BUDGET_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    else:
        budget = CPU_BUDGET_BYTES
    return max(1, min(MAX_SETS, wanted, budget // max(per_set, 1)))


def _tensor_leaves(out: Any) -> list[torch.Tensor]:
    return [t for _, t in flatten_outputs(out) if isinstance(t, torch.Tensor)]


def _copy_and_sum(outs: list[Any], buffers: list[list[torch.Tensor]]) -> None:
    sums = []
    for out, bufs in zip(outs, buffers, strict=True):
        for buf, t in zip(bufs, _tensor_leaves(out), strict=True):
            buf.copy_(t)
            sums.append(byte_sum(buf))
    if sums:
        torch.stack(sums).tolist()


def reference_batch(task: JudgeTask, sets: list[list[Any]]) -> tuple[float, float, list[Any]]:
    """The reference over every set once, outputs copied into buffers and their byte sums read: (wall seconds,
    seconds of the copies and sums alone, outputs)."""
    with torch.no_grad():
        first = task.model(*sets[0])  # buffers like the outputs (and a warm call)
        buffers = [[torch.zeros_like(t) for t in _tensor_leaves(first)] for _ in sets]  # paged in, as the slots
        _sync(task)
        started = time.perf_counter()
        outs = []
        sums = []
        for inputs, bufs in zip(sets, buffers, strict=True):
            out = task.model(*inputs)
            for buf, t in zip(bufs, _tensor_leaves(out), strict=True):
                buf.copy_(t)
                sums.append(byte_sum(buf))
            outs.append(out)
        if sums:
            torch.stack(sums).tolist()
        wall = time.perf_counter() - started
        _sync(task)
        started = time.perf_counter()
        _copy_and_sum(outs, buffers)  # what the copies and sums alone cost, on these outputs
        overhead = time.perf_counter() - started
    return wall, overhead, outs


def _sync(task: JudgeTask) -> None:
    if task.device == "cuda":
        torch.cuda.synchronize()


def confirm(task: JudgeTask, event_speedup: float, claimed_ms: float, tol: Tolerances,
            candidate_batch: CandidateBatch) -> Confirmation:
    """Measure the candidate's speedup with the judge's own clock (see the module's docstring)."""
    sample = make_inputs(task.get_inputs, secrets.randbits(31), 1.0, task.device)
    k = set_count(task, claimed_ms, sample, task.run(sample, task.seed))
    del sample
    ref_walls: list[float] = []
    cand_walls: list[float] = []
    overheads: list[float] = []
    for r in range(ROUNDS):
        sets = [make_inputs(task.get_inputs, secrets.randbits(31), 1.0, task.device) for _ in range(k)]
        refs: list[Any] = []
        outs: list[Any] = []
        for side in ("ref", "cand") if r % 2 == 0 else ("cand", "ref"):
            if side == "ref":
                wall, overhead, refs = reference_batch(task, [clone_all(s) for s in sets])
                ref_walls.append(wall)
                overheads.append(overhead)
            else:
                wall, outs, problem = candidate_batch(sets)  # it checks its copies of the inputs stayed unchanged
                if problem:
                    problem = f"confirmation batch: {problem}"
                    return Confirmation(False, problem, problem=problem)
                cand_walls.append(wall)
        for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
            c = compare_outputs(out, ref, tol)
            if not c.ok:
                problem = f"confirmation batch, set {i + 1}: {c.problem}"
                return Confirmation(False, problem, problem=problem)
    overhead = min(overheads)
    ref_s = max(min(ref_walls) - overhead, 0.5 * min(ref_walls))
    cand_s = max(min(cand_walls) - overhead, 0.5 * min(cand_walls))
    wall = ref_s / cand_s if cand_s > 0 else float("inf")
    calls = f"{ROUNDS}x{k} call(s) on fresh inputs, {1e3 * cand_s / k:.3g} ms per call"
    if wall < min(AGREEMENT * event_speedup, CONFIRMED_BY_ITSELF):
        return Confirmation(False, f"suspicious: {event_speedup:.2f}x by the worker's timing but {wall:.2f}x by "
                                   f"the judge's wall clock ({calls})", wall)
    return Confirmation(True, f"speedup confirmed by the judge's wall clock: {wall:.2f}x ({calls})", wall)
