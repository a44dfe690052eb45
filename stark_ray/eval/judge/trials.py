"""The correctness trials the judge puts a candidate through: their inputs and the reference's outputs for them.

- **Standard trials** (``cfg.trials``, default 5): fresh seeded inputs each (a hash of ``seed`` and ``t`` keyed by
  a secret of the user's on this machine: :mod:`stark_ray.eval.judge.input_key`), the last scaled x4 and the one before
  x1/8 (from 4 trials on), so constant outputs and outputs tuned to one range fail. A warm judge keeps their inputs
  and reference outputs for the next candidate of the task (:class:`TrialCache`).
- **Blocks trial**: every floating input scaled block by block of its flat view (8 blocks at random cuts, factors
  from 0.01 to 1): inputs that are not i.i.d., so a kernel that computes on a part of its input (a prefix, some
  rows) and extrapolates fails.
- **Sensitivity trial**: a few elements of each floating input (its last one and random ones) multiplied
  strongly, by the smallest factor that moves the reference's output beyond 32 times the tolerance (4 times where
  nothing on the ladder reaches 32): a kernel that ignores part of its input, or samples it (an average of 1/16
  of the elements is right on i.i.d. inputs to 6e-4), misses the change or misjudges it, and fails. The level
  found is kept per task; positions are drawn afresh.
- **Same-address trial**: two calls on the same input tensors (same ``data_ptr``), new contents written into them
  between the calls; both outputs checked: an output cache keyed by address fails.

Blocks and positions come from the judge's own random source, different in every evaluation. Only floating inputs
whose values are not all whole numbers are changed (a mask or labels stored as floats keep their meaning), and
zeros stay zeros (a triangular or sparse input keeps its structure): eval/judge/perturbations.py. A special trial on
which the reference is not finite where it was, or raises, is left out, with a note in the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.judge.input_key import input_key, trial_seed
from stark_ray.eval.judge.perturbations import Blocks, Change, Inputs, Perturbation, change_in_place, random_source
from stark_ray.eval.measure.compare import compare_outputs, flatten_outputs
from stark_ray.eval.measure.inputs import clone_all, make_inputs, nbytes_of, trial_scale
from stark_ray.eval.measure.memory import TRIAL_CACHE_BYTES, Footprint, Plan, param_bytes
from stark_ray.eval.measure.tolerance import Tolerances
from stark_ray.eval.tasks import BuiltReference, TaskError

SENSITIVE_COUNTS = (2, 8, 64, 512)  # elements changed per floating input (the last one included)
SENSITIVE_FACTORS = (4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 2.0**20, 2.0**24)
SENSITIVE_MARGIN = 4.0  # the reference must move beyond this many times the tolerance ...
STRONG_MARGIN = 32.0  # ... and beyond this many times where some level of the ladder does


@dataclass
class Trial:
    """One trial: how to make its inputs, and the reference's outputs for them. The inputs are made when needed
    (``make`` gives fresh tensors with the same values every time: milliseconds on a GPU), so that a large task's
    trial holds only its outputs between the moments its inputs are used."""

    label: str
    make: Callable[[], Inputs]
    ref: Any
    seed: int
    then: Callable[[], Contents] | None = None  # same-address: the second contents (the same tensors), when needed
    held: int = 0  # bytes it holds (inputs and outputs) where it keeps its inputs: what a cache would keep
    input_bytes: int = 0
    special: bool = False  # not one of the standard trials (the secret one, blocks, sensitivity, same address)

    @property
    def inputs(self) -> Inputs:
        """Fresh inputs (the caller's own)."""
        return self.make()


@dataclass
class Contents:
    """The same-address trial's second contents: how to make them and their seed, and the reference's outputs where
    a kept trial already knows them (else :meth:`reference` runs it on a set made for it alone)."""

    make: Callable[[], Inputs]
    seed: int
    ref: Any = None

    def reference(self, task: JudgeTask, made: Inputs | None = None) -> Any:
        """The reference's outputs for these contents: run on ``made`` (a set of these contents that is the
        caller's to lose: it may come back changed) or on a set made here; on a copy where ``get_inputs`` hands out
        the task's own tensors (``JudgeTask.fresh_inputs`` is False)."""
        if self.ref is not None:
            return self.ref
        return task.run(self.make() if made is None else made, self.seed, private=task.fresh_inputs)


class TrialCache:
    """A task's standard trials (inputs and reference outputs), kept while they fit in ``max_bytes``."""

    def __init__(self, max_bytes: int = TRIAL_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.entries: dict[tuple[int, int, int], Trial] = {}

    def room(self, size: int) -> bool:
        return self.used + size <= self.max_bytes

    def limit(self, max_bytes: int) -> None:
        """A new limit (the task's memory plan); everything kept goes where it is exceeded."""
        self.max_bytes = max_bytes
        if self.used > max_bytes:
            self.entries.clear()
            self.used = 0

    def clear(self) -> None:
        """Everything kept goes (the limit stays)."""
        self.entries.clear()
        self.used = 0

    def holds(self, trial: Trial) -> bool:
        return any(kept is trial for kept in self.entries.values())

    def get(self, key: tuple[int, int, int], build: Callable[[], Trial]) -> Trial:
        found = self.entries.get(key)
        if found is None:
            found = build()
            if found.held and self.room(found.held):
                self.entries[key] = found
                self.used += found.held
        return found


@dataclass
class JudgeTask(BuiltReference):
    """A task's reference inside the judge."""

    cache: TrialCache = field(default_factory=TrialCache)
    # where the ladder of counts and factors moved the reference last time, and whether that was a strong move
    sensitivity: tuple[int, int, bool] = (0, 0, True)
    input_bytes: int = 0  # of one trial's inputs
    footprint: Footprint | None = None  # measured on its first trial (eval/measure/memory.py)
    plan: Plan | None = None
    planned_for: int = 0  # the budget the plan was made for
    fresh_inputs: bool = False  # get_inputs() makes new tensors each call (the judge checks once per task)
    draws_random: bool = False  # the forward draws from torch's generators (a dropout): every call seeded alike
    sol: Any = None  # its speed of light on this device (eval/judge/sol.py), None where it cannot be told
    # its precision floors (eval/judge/precision.py) by (seed, trials): measured where the reference is timed alone
    floors: dict[tuple[int, int], Any] = field(default_factory=dict)
    # what its trials' seeds are keyed by: the user's key on this machine (eval/judge/input_key.py), known to no
    # candidate
    input_key: int = field(default_factory=input_key)
    alone_ms: float | None = None  # the reference timed against itself in a worker no candidate had run in
    alone_min_ms: float | None = None  # ... and its fastest call there
    alone_pace_s: float | None = None  # the judge's pace of it around that timing (eval/judge/drift.py)

    def held_bytes(self) -> int:
        return self.cache.used + param_bytes(self.model)

    def run(self, inputs: list[Any], seed: int | None, private: bool = False) -> Any:
        """The reference's output for ``inputs`` after ``torch.manual_seed(seed)`` (None: no reseeding): on a copy
        (a reference that works in place keeps them), or on ``inputs`` themselves where they are ``private`` (the
        caller's to lose: one input's worth less memory)."""
        if seed is not None:
            torch.manual_seed(seed)
        try:
            with torch.no_grad():
                out = self.model(*(inputs if private else clone_all(inputs)))
                if self.device == "cuda":
                    torch.cuda.synchronize()
                return out
        except torch.OutOfMemoryError:
            raise  # the device is full (of what the worker holds, perhaps): not the task's fault
        except Exception as e:
            raise TaskError(f"task {self.name}: reference forward failed: {describe_exception(e)}") from None


def trial_label(trial: int, trials: int) -> str:
    scale = trial_scale(trial, trials)
    return f"trial {trial + 1}/{trials}" + ("" if scale == 1.0 else f" (inputs x{scale:g})")


def _maker(task: JudgeTask, seed: int, scale: float) -> Callable[[], Inputs]:
    def make() -> Inputs:
        return make_inputs(task.get_inputs, seed, scale, task.device, fresh=task.fresh_inputs)

    return make


def standard_trial(task: JudgeTask, cfg: EvalConfig, trial: int) -> Trial:
    seed = trial_seed(task.input_key, cfg.seed, trial)
    scale = trial_scale(trial, cfg.trials)
    make = _maker(task, seed, scale)

    def build() -> Trial:
        inputs = make()
        size = sum(nbytes_of(inputs))
        ref = task.run(inputs, seed)  # on a copy: what make() gives is never changed (it may be the task's own)
        label = trial_label(trial, cfg.trials)
        held = size + sum(nbytes_of(ref))
        if task.cache.room(held):  # kept for the next candidate: its inputs stay
            return Trial(label, lambda: clone_all(inputs), ref, seed, held=held, input_bytes=size)
        return Trial(label, make, ref, seed, input_bytes=size)

    return task.cache.get((cfg.seed, trial, cfg.trials), build)


def standard_inputs(task: JudgeTask, cfg: EvalConfig, trial: int) -> Inputs:
    """A standard trial's inputs: a copy of those the task keeps, or made afresh (nothing run, nothing kept: the
    confirmation batch's template, made where memory is short)."""
    found = task.cache.entries.get((cfg.seed, trial, cfg.trials))
    if found is not None:
        return found.inputs
    return _maker(task, trial_seed(task.input_key, cfg.seed, trial), trial_scale(trial, cfg.trials))()


AFTER_TIMING = 1 << 20  # the trial after the timing: a standard trial's index no evaluation reaches (its own seed)
AFTER_TIMING_LABEL = "trial after the timing (fresh inputs)"


def after_timing_trial(task: JudgeTask, cfg: EvalConfig) -> Trial:
    """One more trial once the candidate was timed, on inputs of its own seed (a key of the user's: no candidate
    knows them) at scale 1: a candidate correct through the trials and wrong after the timing's calls (a count of
    calls, a state the timed calls filled) fails it. Kept like the standard trials where it fits."""
    seed = trial_seed(task.input_key, cfg.seed, AFTER_TIMING)
    make = _maker(task, seed, 1.0)

    def build() -> Trial:
        inputs = make()
        size = sum(nbytes_of(inputs))
        ref = task.run(inputs, seed)
        held = size + sum(nbytes_of(ref))
        label = AFTER_TIMING_LABEL
        if task.cache.room(held):
            return Trial(label, lambda: clone_all(inputs), ref, seed, held=held, input_bytes=size, special=True)
        return Trial(label, make, ref, seed, input_bytes=size, special=True)

    return task.cache.get((cfg.seed, AFTER_TIMING, cfg.trials), build)


def changed_copy(task: JudgeTask, make: Callable[[], Inputs], change: Change) -> tuple[Inputs, int]:
    """``make()``'s inputs changed in place, on a copy where they may be the task's own tensors (``get_inputs`` hands
    out the same tensors: ``JudgeTask.fresh_inputs`` False); how many inputs were changed. Fresh inputs are changed
    as made: a copy of a 6 GB set would hold two sets at once beside the base trial's output."""
    made = make()
    inputs = made if task.fresh_inputs else clone_all(made)
    del made
    return inputs, change_in_place(inputs, change)


def _changed(task: JudgeTask, make: Callable[[], Inputs], change: Change) -> Callable[[], Inputs]:
    def changed() -> Inputs:
        return changed_copy(task, make, change)[0]

    return changed


def finite_where(out: Any, base: Any) -> bool:
    """Whether ``out`` is finite wherever ``base`` (the reference's output on plain inputs) is."""
    for (_, o), (_, b) in zip(flatten_outputs(out), flatten_outputs(base), strict=False):
        comparable = (isinstance(o, torch.Tensor) and isinstance(b, torch.Tensor) and o.shape == b.shape
                      and (o.is_floating_point() or o.is_complex()))
        if comparable and bool((~torch.isfinite(o) & torch.isfinite(b)).any()):
            return False
    return True


def blocks_trial(task: JudgeTask, base: Trial, gen: torch.Generator) -> tuple[Trial | None, str]:
    """Floating inputs scaled block by block (random cuts and factors): a (trial, note)."""
    blocks = Blocks(gen)
    inputs, changed = changed_copy(task, base.make, blocks)
    if not changed:
        return None, "blocks trial left out: no floating input to scale"
    label = "blocks trial (inputs scaled block by block, by 0.01 to 1)"
    try:
        ref = task.run(inputs, base.seed, private=True)  # a changed copy of its own
    except TaskError as e:
        return None, f"blocks trial left out: the reference fails on it ({e})"
    finally:
        del inputs
    if not finite_where(ref, base.ref):
        return None, "blocks trial left out: the reference is not finite on it"
    return Trial(label, _changed(task, base.make, blocks), ref, base.seed, input_bytes=base.input_bytes,
                 special=True), ""


def _sensitive(task: JudgeTask, change: Perturbation, factor: float, ref: Any, base: Trial) -> Trial:
    return Trial(f"sensitivity trial ({change.count} elements of each floating input x{factor:g})",
                 _changed(task, base.make, change.by(factor)), ref, base.seed, input_bytes=base.input_bytes,
                 special=True)


def sensitivity_trial(task: JudgeTask, base: Trial, gen: torch.Generator, tol: Tolerances
                      ) -> tuple[Trial | None, str]:
    """A few elements of each floating input multiplied strongly: by the smallest factor on the ladder (from the
    task's last level on) that moves the reference beyond STRONG_MARGIN times the tolerance, or, where no level
    does, the first one that moved it beyond SENSITIVE_MARGIN times: a (trial, note). The strong move matters
    for a kernel that samples its input: its estimate of a small move errs by a fraction of that move, which at
    4x the tolerance could stay within it. A 1/16 strided mean of an MSE passed 2 in 60 such trials of 8 elements
    at 4x, 1 in 100 at 32x, and none of 100 with 2 elements at 32x: it misses both, or weighs one 16-fold, and
    errs by about the whole move. Each level's inputs are made afresh and changed in place (a large task's inputs
    are GBs: one set at a time)."""
    weak, strong = tol.widened(SENSITIVE_MARGIN), tol.widened(STRONG_MARGIN)
    start_count, start_factor, want_strong = task.sensitivity  # no strong level last time: the weak one will do
    fallback: tuple[int, int, Perturbation] | None = None  # its level (made again: a large task's inputs are GBs)
    for ci in range(start_count, len(SENSITIVE_COUNTS)):
        change = Perturbation(SENSITIVE_COUNTS[ci], gen)
        for fi in range(start_factor if ci == start_count else 0, len(SENSITIVE_FACTORS)):
            factor = SENSITIVE_FACTORS[fi]
            inputs, changed = changed_copy(task, base.make, change.by(factor))
            if not changed:
                return None, "sensitivity trial left out: no floating input to change"
            try:
                ref = task.run(inputs, base.seed, private=True)
            except TaskError:
                break
            finally:
                del inputs
            if not finite_where(ref, base.ref):
                del ref
                break  # larger factors overflow too: try more elements instead
            if compare_outputs(base.ref, ref, weak).ok:  # a candidate ignoring this change might pass
                del ref  # before the next level's inputs and outputs are made
                continue
            if not want_strong or not compare_outputs(base.ref, ref, strong).ok:
                task.sensitivity = (ci, fi, want_strong)
                return _sensitive(task, change, factor, ref, base), ""
            if fallback is None:
                fallback = (ci, fi, change)
            del ref
    if fallback is not None:
        ci, fi, change = fallback
        task.sensitivity = (ci, fi, False)
        inputs, _ = changed_copy(task, base.make, change.by(SENSITIVE_FACTORS[fi]))  # the same positions
        ref = task.run(inputs, base.seed, private=True)
        del inputs
        return _sensitive(task, change, SENSITIVE_FACTORS[fi], ref, base), ""
    task.sensitivity = (0, 0, True)
    return None, "sensitivity trial left out: no change of a few input elements moves the reference's output"


def same_address_trial(a: Trial, b: Callable[[], Contents]) -> Trial:
    """``a``'s inputs, then ``b``'s contents (made when needed) written into the same tensors."""
    return Trial("same-address trial (new contents in the same input tensors)", a.make, a.ref, a.seed, then=b,
                 input_bytes=a.input_bytes, special=True)


def all_trials(task: JudgeTask, cfg: EvalConfig, tol: Tolerances) -> Iterator[tuple[Trial | None, str]]:
    """Every trial of one evaluation, made one at a time (a large task's trial holds gigabytes: only the one in
    progress is kept, and nothing here holds one across a yield): the standard ones, then blocks, sensitivity and
    same address; a special trial left out comes as (None, why)."""
    for t in range(cfg.trials):
        yield standard_trial(task, cfg, t), ""
    gen = random_source(task.device)
    off = set(cfg.defences_off)  # the special trials are defences of the table (eval/defences.py)
    if "blocks_trial" not in off:
        yield blocks_trial(task, standard_trial(task, cfg, 0), gen)
    if "sensitivity_trial" not in off:
        yield sensitivity_trial(task, standard_trial(task, cfg, 0), gen, tol)
    if "same_address_trial" not in off:
        yield same_address_trial(standard_trial(task, cfg, 0), lambda: _second(task, cfg)), ""


def _second(task: JudgeTask, cfg: EvalConfig) -> Contents:
    """The same-address trial's second contents: the second standard trial's (its outputs too where it is kept),
    or fresh ones with one trial. Their reference outputs are computed once their values are in the shared tensors,
    from a set of the judge's own: beside the shared copy, a task's evaluation then holds one input set and the
    forward's memory, not two sets."""
    seed = trial_seed(task.input_key, cfg.seed, 1)
    if cfg.trials > 1:
        kept = task.cache.entries.get((cfg.seed, 1, cfg.trials))
        if kept is not None:
            return Contents(kept.make, kept.seed, kept.ref)
        return Contents(_maker(task, seed, trial_scale(1, cfg.trials)), seed)
    return Contents(_maker(task, seed, 1.0), seed)


def special_trials(task: JudgeTask, cfg: EvalConfig, tol: Tolerances) -> tuple[list[Trial], list[str]]:
    """The blocks, sensitivity and same-address trials of one evaluation at once, with notes on those left out
    (for tests; the judge takes them one at a time from :func:`all_trials`)."""
    trials: list[Trial] = []
    notes: list[str] = []
    for trial, note in all_trials(task, cfg, tol):
        if trial is not None and trial.special:
            trials.append(trial)
        if note:
            notes.append(note)
    return trials, notes


def synchronize(task: JudgeTask) -> None:
    """Wait for the task's device (a no-op on the CPU)."""
    if task.device == "cuda":
        torch.cuda.synchronize()
