"""The correctness trials the judge puts a candidate through: their inputs and the reference's outputs for them.

- **Standard trials** (``cfg.trials``, default 5): fresh seeded inputs each (``seed + t``), the last scaled x4 and
  the one before x1/8 (from 4 trials on), so constant outputs and outputs tuned to one range fail. A warm judge
  keeps their inputs and reference outputs for the next candidate of the task (:class:`TrialCache`).
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
zeros stay zeros (a triangular or sparse input keeps its structure). A special trial on which the reference is not
finite where it was, or raises, is left out, with a note in the log.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.compare import Tolerances, compare_outputs, flatten_outputs
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.guards import nbytes_of
from stark_ray.eval.inputs import clone_all, make_inputs, map_tensors, trial_scale
from stark_ray.eval.tasks import TaskError

TRIAL_CACHE_BYTES = 2 << 30  # per task: the standard trials' inputs and reference outputs kept
BLOCKS = 8
BLOCK_SCALE_DECADES = 2.0  # block factors from 10^-2 to 1
SENSITIVE_COUNTS = (2, 8, 64, 512)  # elements changed per floating input (the last one included)
SENSITIVE_FACTORS = (4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 2.0**20, 2.0**24)
SENSITIVE_MARGIN = 4.0  # the reference must move beyond this many times the tolerance ...
STRONG_MARGIN = 32.0  # ... and beyond this many times where some level of the ladder does
SAMPLE = 1 << 16  # elements looked at to tell whole-number inputs


@dataclass
class Trial:
    label: str
    inputs: list[Any]
    ref: Any
    seed: int
    then: tuple[list[Any], Any] | None = None  # same-address: the second contents, and the reference's output


class TrialCache:
    """A task's standard trials (inputs and reference outputs), kept while they fit in ``max_bytes``."""

    def __init__(self, max_bytes: int = TRIAL_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.entries: dict[tuple[int, int, int], Trial] = {}

    def get(self, key: tuple[int, int, int], make: Callable[[], Trial]) -> Trial:
        found = self.entries.get(key)
        if found is None:
            found = make()
            size = sum(nbytes_of(found.inputs)) + sum(nbytes_of(found.ref))
            if self.used + size <= self.max_bytes:
                self.entries[key] = found
                self.used += size
        return found


@dataclass
class JudgeTask:
    """A task's reference inside the judge."""

    name: str
    module: Any
    model: Any
    init_inputs: list[Any]
    device: str
    seed: int
    cache: TrialCache = field(default_factory=TrialCache)
    # where the ladder of counts and factors moved the reference last time, and whether that was a strong move
    sensitivity: tuple[int, int, bool] = (0, 0, True)
    input_bytes: int = 0  # of one trial's inputs

    def get_inputs(self) -> list[Any]:
        from stark_ray.eval.tasks import make_task_inputs

        return make_task_inputs(self.module, self.name)

    def held_bytes(self) -> int:
        held = self.cache.used
        params = getattr(self.model, "parameters", None)
        if callable(params):
            with contextlib.suppress(Exception):  # a reference with an odd parameters(): counted as none
                held += sum(p.numel() * p.element_size() for p in params())
        return held

    def run(self, inputs: list[Any], seed: int) -> Any:
        """The reference's output for ``inputs`` (on a copy: a reference that works in place keeps them)."""
        torch.manual_seed(seed)
        try:
            with torch.no_grad():
                out = self.model(*clone_all(inputs))
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


def standard_trial(task: JudgeTask, cfg: EvalConfig, trial: int) -> Trial:
    seed = cfg.seed + trial

    def make() -> Trial:
        inputs = make_inputs(task.get_inputs, seed, trial_scale(trial, cfg.trials), task.device)
        return Trial(trial_label(trial, cfg.trials), inputs, task.run(inputs, seed), seed)

    return task.cache.get((cfg.seed, trial, cfg.trials), make)


def random_source(device: str) -> torch.Generator:
    """A generator seeded from the OS: blocks and positions no candidate (and no earlier run) can know."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63))
    return gen


def perturbable(t: torch.Tensor) -> bool:
    """A floating input whose values are not all whole numbers (a mask or labels as floats are left alone)."""
    if not t.is_floating_point() or t.numel() == 0:
        return False
    flat = t.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // SAMPLE)]
    return not bool(torch.equal(sample, sample.round()))


def _rebuilt(t: torch.Tensor, change: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """A copy of ``t`` (same strides) whose flat (contiguous) values ``change`` altered in place."""
    if t.is_contiguous():  # one copy, changed in place
        flat = t.detach().clone().reshape(-1)
        change(flat)
        return flat.view(t.shape)
    flat = t.detach().contiguous().reshape(-1).clone()
    change(flat)
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(flat.view(t.shape))
    return out


def _changed_inputs(inputs: list[Any], change: Callable[[torch.Tensor], None]) -> tuple[list[Any], int]:
    count = [0]

    def one(t: torch.Tensor) -> torch.Tensor:
        if not perturbable(t):
            return t.clone()
        count[0] += 1
        return _rebuilt(t, change)

    return list(map_tensors(inputs, one)), count[0]


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

    def scale_blocks(flat: torch.Tensor) -> None:
        n = flat.numel()
        blocks = min(BLOCKS, n)
        cuts = torch.randint(1, n, (blocks - 1,), generator=gen, device=gen.device).unique() if n > 1 else None
        edges = [0, *cuts.tolist(), n] if cuts is not None else [0, n]
        factors = torch.pow(10.0, -BLOCK_SCALE_DECADES * torch.rand(len(edges) - 1, generator=gen,
                                                                    device=gen.device)).tolist()
        for a, b, f in zip(edges, edges[1:], factors, strict=False):
            flat[a:b].mul_(f)

    inputs, changed = _changed_inputs(base.inputs, scale_blocks)
    if not changed:
        return None, "blocks trial left out: no floating input to scale"
    label = "blocks trial (inputs scaled block by block, by 0.01 to 1)"
    try:
        ref = task.run(inputs, base.seed)
    except TaskError as e:
        return None, f"blocks trial left out: the reference fails on it ({e})"
    if not finite_where(ref, base.ref):
        return None, "blocks trial left out: the reference is not finite on it"
    return Trial(label, inputs, ref, base.seed), ""


class _Perturbation:
    """``count`` positions in each floating input (its last element among them, the rest at random), each with
    its own share (1/2 to 1) of a factor; the same positions whatever the factor."""

    def __init__(self, count: int, gen: torch.Generator) -> None:
        self.count = count
        self.gen = gen
        self.picks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _positions(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.gen
        where = torch.randint(0, n, (max(self.count - 1, 0),), generator=gen, device=gen.device)
        where = torch.cat([where, torch.tensor([n - 1], device=gen.device)]).to(device)
        share = (0.5 + 0.5 * torch.rand(where.numel(), generator=gen, device=gen.device)).to(device)
        return where, share

    def apply(self, inputs: list[Any], factor: float) -> tuple[list[Any], int]:
        index = 0

        def multiply(flat: torch.Tensor) -> None:
            nonlocal index
            if index not in self.picks:
                self.picks[index] = self._positions(flat.numel(), flat.device)
            where, share = self.picks[index]
            index += 1
            flat[where] = flat[where] * (share * factor).to(flat.dtype)

        return _changed_inputs(inputs, multiply)


def _sensitive(change: _Perturbation, factor: float, inputs: list[Any], ref: Any, base: Trial) -> Trial:
    return Trial(f"sensitivity trial ({change.count} elements of each floating input x{factor:g})", inputs, ref,
                 base.seed)


def sensitivity_trial(task: JudgeTask, base: Trial, gen: torch.Generator, tol: Tolerances
                      ) -> tuple[Trial | None, str]:
    """A few elements of each floating input multiplied strongly: by the smallest factor on the ladder (from the
    task's last level on) that moves the reference beyond STRONG_MARGIN times the tolerance, or, where no level
    does, the first one that moved it beyond SENSITIVE_MARGIN times: a (trial, note). The strong move matters
    for a kernel that samples its input: its estimate of a small move errs by a fraction of that move, which at
    4x the tolerance could stay within it. A 1/16 strided mean of an MSE passed 2 in 60 such trials of 8 elements
    at 4x, 1 in 100 at 32x, and none of 100 with 2 elements at 32x: it misses both, or weighs one 16-fold, and
    errs by about the whole move."""
    weak, strong = tol.widened(SENSITIVE_MARGIN), tol.widened(STRONG_MARGIN)
    start_count, start_factor, want_strong = task.sensitivity  # no strong level last time: the weak one will do
    fallback: tuple[int, int, _Perturbation] | None = None  # its level (made again: a large task's inputs are GBs)
    for ci in range(start_count, len(SENSITIVE_COUNTS)):
        change = _Perturbation(SENSITIVE_COUNTS[ci], gen)
        for fi in range(start_factor if ci == start_count else 0, len(SENSITIVE_FACTORS)):
            factor = SENSITIVE_FACTORS[fi]
            inputs, changed = change.apply(base.inputs, factor)
            if not changed:
                return None, "sensitivity trial left out: no floating input to change"
            try:
                ref = task.run(inputs, base.seed)
            except TaskError:
                break
            if not finite_where(ref, base.ref):
                break  # larger factors overflow too: try more elements instead
            if compare_outputs(base.ref, ref, weak).ok:  # a candidate ignoring this change might pass
                continue
            if not want_strong or not compare_outputs(base.ref, ref, strong).ok:
                task.sensitivity = (ci, fi, want_strong)
                return _sensitive(change, factor, inputs, ref, base), ""
            if fallback is None:
                fallback = (ci, fi, change)
            del inputs, ref
    if fallback is not None:
        ci, fi, change = fallback
        task.sensitivity = (ci, fi, False)
        inputs, _ = change.apply(base.inputs, SENSITIVE_FACTORS[fi])  # the same positions
        return _sensitive(change, SENSITIVE_FACTORS[fi], inputs, task.run(inputs, base.seed), base), ""
    task.sensitivity = (0, 0, True)
    return None, "sensitivity trial left out: no change of a few input elements moves the reference's output"


def same_address_trial(a: Trial, b: Trial) -> Trial:
    """``a``'s inputs, then ``b``'s written into the same tensors."""
    return Trial("same-address trial (new contents in the same input tensors)", a.inputs, a.ref, a.seed,
                 then=(b.inputs, b.ref))


def all_trials(task: JudgeTask, cfg: EvalConfig, tol: Tolerances) -> Iterator[tuple[Trial | None, str]]:
    """Every trial of one evaluation, made one at a time (a large task's trial holds gigabytes: only the one in
    progress is kept): the standard ones, then blocks, sensitivity and same address; a special trial left out
    comes as (None, why)."""
    for t in range(cfg.trials):
        yield standard_trial(task, cfg, t), ""
    gen = random_source(task.device)
    yield blocks_trial(task, standard_trial(task, cfg, 0), gen)
    yield sensitivity_trial(task, standard_trial(task, cfg, 0), gen, tol)
    first = standard_trial(task, cfg, 0)
    if cfg.trials > 1:
        second = standard_trial(task, cfg, 1)
    else:
        inputs = make_inputs(task.get_inputs, cfg.seed + 1, 1.0, task.device)
        second = Trial("", inputs, task.run(inputs, cfg.seed + 1), cfg.seed + 1)
    yield same_address_trial(first, second), ""


def special_trials(task: JudgeTask, cfg: EvalConfig, tol: Tolerances) -> tuple[list[Trial], list[str]]:
    """The blocks, sensitivity and same-address trials of one evaluation at once, with notes on those left out
    (for tests; the judge takes them one at a time from :func:`all_trials`)."""
    trials: list[Trial] = []
    notes: list[str] = []
    for i, (trial, note) in enumerate(all_trials(task, cfg, tol)):
        if i < cfg.trials:
            continue
        if trial is not None:
            trials.append(trial)
        if note:
            notes.append(note)
    return trials, notes


def synchronize(task: JudgeTask) -> None:
    """Wait for the task's device (a no-op on the CPU)."""
    if task.device == "cuda":
        torch.cuda.synchronize()
