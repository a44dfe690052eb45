"""The judge's special trials, in this process: blocks of different magnitude, calibrated sensitivity, same
address; what they change and what they keep."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn as nn

from stark_ray.config import EvalConfig
from stark_ray.eval.judge.perturbations import perturbable, random_source
from stark_ray.eval.judge.trials import (
    JudgeTask,
    all_trials,
    blocks_trial,
    sensitivity_trial,
    special_trials,
    standard_trial,
)
from stark_ray.eval.measure.compare import Tolerances, compare_outputs
from stark_ray.eval.measure.inputs import make_inputs, trial_scale


class Mse(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mean((a - b) ** 2)


class StridedSample(nn.Module):
    """The cheat: the mean over every 16th element only (right to 1e-3 on i.i.d. inputs)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mean((a.reshape(-1)[::16] - b.reshape(-1)[::16]) ** 2)


class PrefixSample(nn.Module):
    """The cheat: the mean over the first 1/16 of the elements."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.numel() // 16
        return torch.mean((a.reshape(-1)[:n] - b.reshape(-1)[:n]) ** 2)


class Module:
    def __init__(self, shape: tuple[int, ...], lower: bool = False, mask: bool = False) -> None:
        self.shape, self.lower, self.mask = shape, lower, mask

    def get_inputs(self) -> list[Any]:
        a, b = torch.rand(self.shape), torch.rand(self.shape)
        if self.lower:
            a, b = torch.tril(a), torch.tril(b)
        if self.mask:
            b = (b > 0.5).float()
        return [a, b]


def task(model: nn.Module, module: Module) -> JudgeTask:
    return JudgeTask("t", module, model, [], "cpu", 0)


CFG = EvalConfig(trials=5)
TOL = Tolerances.of(CFG)


def test_a_sampling_reduction_passes_plain_trials_but_not_the_special_ones() -> None:
    """At KernelBench's tolerance (1e-2), which the samples' error (~0.3%) is within; the sensitivity trial is
    calibrated at the tolerance it is judged by (here the same)."""
    t = task(Mse(), Module((2048, 1024)))  # 2M elements: the samples err by ~0.3%
    loose = Tolerances("kernelbench")
    for cheat in (StridedSample(), PrefixSample()):
        plain = [standard_trial(t, CFG, k) for k in range(CFG.trials)]
        assert all(compare_outputs(cheat(*p.inputs), p.ref, loose).ok for p in plain[:3])
        special, notes = special_trials(t, CFG, loose)
        assert not notes and len(special) == 3
        blocks, sensitivity = special[0], special[1]
        assert not compare_outputs(cheat(*sensitivity.inputs), sensitivity.ref, loose).ok
        if isinstance(cheat, PrefixSample):
            assert not compare_outputs(cheat(*blocks.inputs), blocks.ref, loose).ok
        honest = Mse()
        for trial in special[:2]:
            assert compare_outputs(honest(*trial.inputs), trial.ref, TOL).ok


def test_the_sensitivity_factor_is_the_smallest_that_moves_the_reference_and_is_kept() -> None:
    t = task(Mse(), Module((64, 1024)))
    base = standard_trial(t, CFG, 0)
    gen = random_source("cpu")
    trial, note = sensitivity_trial(t, base, gen, TOL)
    assert trial is not None and not note
    assert t.sensitivity[2]  # an MSE can be moved strongly: beyond 32 times the tolerance
    assert not compare_outputs(base.ref, trial.ref, TOL.widened(32)).ok
    first = t.sensitivity
    again, _ = sensitivity_trial(t, base, gen, TOL)  # from the level found on (new positions may need more)
    assert again is not None and t.sensitivity[:2] >= first[:2]
    assert not compare_outputs(base.ref, again.ref, TOL.widened(32)).ok
    changed = (trial.inputs[0] != base.inputs[0]).sum().item()
    assert 1 <= changed <= 2 and trial.inputs[0].reshape(-1)[-1] != base.inputs[0].reshape(-1)[-1]  # the last one


class ClampMean(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.clamp(max=1.0).mean() + 0 * b.sum()


def test_where_no_level_moves_the_reference_strongly_the_first_clear_move_serves() -> None:
    """A clamped mean over 51,200 elements: 512 changed elements move it by ~1% (beyond 4x the tolerance, never
    beyond 32x): that level is the trial, and the next evaluation takes it at once."""
    t = task(ClampMean(), Module((51200,)))
    base = standard_trial(t, CFG, 0)
    gen = random_source("cpu")
    trial, note = sensitivity_trial(t, base, gen, TOL)
    assert trial is not None and not note and "512 elements" in trial.label
    assert t.sensitivity[0] == 3 and not t.sensitivity[2]
    assert not compare_outputs(base.ref, trial.ref, TOL.widened(4)).ok
    first = t.sensitivity
    calls = []
    run = t.run
    t.run = lambda inputs, seed, private=False: calls.append(1) or run(inputs, seed, private)  # type: ignore
    again, _ = sensitivity_trial(t, base, gen, TOL)
    assert again is not None and t.sensitivity == first and len(calls) == 1  # no climb


def test_special_trials_keep_zeros_masks_and_strides() -> None:
    t = task(Mse(), Module((32, 32), lower=True, mask=True))
    base = standard_trial(t, CFG, 0)
    gen = random_source("cpu")
    blocks, _ = blocks_trial(t, base, gen)
    sens, _ = sensitivity_trial(t, base, gen, TOL)
    for trial in (blocks, sens):
        assert trial is not None
        a, b = trial.inputs
        assert torch.equal(a, torch.tril(a))  # a triangular input stays triangular
        assert torch.equal(b, base.inputs[1])  # a 0/1 mask stored as floats is left alone
    assert not perturbable(base.inputs[1]) and perturbable(base.inputs[0])
    x = torch.randn(8, 4).t()  # not contiguous
    t2 = JudgeTask("t2", type("M", (), {"get_inputs": staticmethod(lambda: [torch.randn(8, 4).t()])})(),
                   nn.Identity(), [], "cpu", 0)
    b2, _ = blocks_trial(t2, standard_trial(t2, EvalConfig(trials=1), 0), gen)
    assert b2 is not None and b2.inputs[0].stride() == x.stride()


def test_a_reference_that_is_not_finite_on_a_special_trial_leaves_it_out() -> None:
    class Log(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.log(1.5 - a)  # a in [0, 1): finite; a scaled by 2^k: log of a negative number

    t = task(Log(), Module((16, 16)))
    trial, note = sensitivity_trial(t, standard_trial(t, CFG, 0), random_source("cpu"), TOL)
    assert trial is None or torch.isfinite(trial.ref).all()
    if trial is None:
        assert "left out" in note


def test_same_address_pairs_two_seeded_trials() -> None:
    t = task(Mse(), Module((8, 8)))
    special, _ = special_trials(t, CFG, TOL)
    pair = special[-1]
    assert pair.then is not None and "same-address" in pair.label
    second = pair.then()
    second_inputs, second_ref = second.make(), second.reference(t)
    assert not torch.equal(pair.inputs[0], second_inputs[0])
    assert compare_outputs(Mse()(*second_inputs), second_ref, TOL).ok


def test_positions_and_blocks_differ_from_one_evaluation_to_the_next() -> None:
    t = task(Mse(), Module((64, 64)))
    base = standard_trial(t, CFG, 0)
    one, _ = sensitivity_trial(t, base, random_source("cpu"), TOL)
    two, _ = sensitivity_trial(t, base, random_source("cpu"), TOL)
    assert one is not None and two is not None and not torch.equal(one.inputs[0], two.inputs[0])


class Census(nn.Module):
    """A reference that counts, at each call, the live tensors of its input's size (in the process: the trials'
    inputs and outputs held at once); a few changed input elements move its output only at large factors (the
    sensitivity ladder climbs)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.seen: list[int] = []

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        import gc

        self.seen.append(sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.numel() == self.numel))
        return (a.mean() + 1000.0) * torch.ones_like(a) + 0.0 * b  # a few changed elements: a tiny move


def test_making_the_trials_holds_at_most_the_base_output_and_one_set_of_inputs() -> None:
    """A 6 GB task's trials are made one set at a time: while the reference runs on a trial's inputs, only the base
    trial's output lives beside them (not the last level's output, nor another set), and a derived trial's
    reference runs on its changed inputs without a copy. 33 x 97: a size no other tensor of the test run has."""
    shape = (33, 97)
    model = Census(33 * 97)
    t = task(model, Module(shape))
    t.cache.limit(0)  # as for a large task: nothing kept
    t.fresh_inputs = True  # as the judge finds for these inputs: the second contents' reference runs on them
    for trial, _ in all_trials(t, CFG, TOL):  # as the judge takes them: each one's output dropped once judged
        if trial is not None:
            trial.ref = None
            if trial.then is not None:
                trial.then().reference(t)
    assert len(model.seen) > 9  # the standard trials, blocks, the sensitivity ladder's levels, same address
    # a standard trial: the call's two inputs (a copy) and the two they were copied from; a derived trial: its two
    # changed inputs (its own: no copy) and the base trial's output; the same-address trial's second contents: one
    # set alone (their first call's output dropped once judged)
    assert max(model.seen) <= 4 and 3 in model.seen and model.seen[-1] == 2, model.seen


class InPlaceDouble(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.mul_(2.0) + b  # changes its first input


class SameTensors(Module):
    """A get_inputs that hands out the same tensors every call (seeded once: deterministic)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__(shape)
        self.made: list[Any] | None = None

    def get_inputs(self) -> list[Any]:
        if self.made is None:
            self.made = super().get_inputs()
        return self.made


def test_the_second_contents_reference_never_runs_on_the_tasks_own_tensors() -> None:
    """Where get_inputs hands out the task's own tensors (the judge finds so once per task: fresh_inputs False),
    the same-address trial's reference runs on a copy: an in-place reference must not change what the next trial
    (and the next candidate) is given."""
    module = SameTensors((16, 16))
    t = task(InPlaceDouble(), module)
    t.cache.limit(0)  # as for a large task: the second contents are made again, not kept
    pair = special_trials(t, CFG, TOL)[0][-1]
    assert pair.then is not None and module.made is not None
    before = [x.clone() for x in module.made]
    second = pair.then()
    second.reference(t, second.make())
    assert all(torch.equal(x, y) for x, y in zip(module.made, before, strict=True))
    fresh = task(InPlaceDouble(), Module((16, 16)))
    fresh.fresh_inputs = True  # new tensors every call: run on the set made for it, no copy
    fresh.cache.limit(0)
    then = special_trials(fresh, CFG, TOL)[0][-1].then
    assert then is not None
    contents = then()
    inputs = contents.make()
    contents.reference(fresh, inputs)
    assert torch.equal(inputs[0], 2 * contents.make()[0])  # the reference ran on the set itself


class LivePeak(torch.overrides.TorchFunctionMode):
    """The most storages of tensors of one shape alive at the end of any torch call made under it (views and
    detached aliases of one tensor count once). Every tensor of the shape is made under it (the shape is the test's
    own), so the ones it saw come out of its calls: each kept by a weak reference, none kept alive by it. (A scan of
    every object the process holds, after every call, took a minute in a test process that had run other modules.)"""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape
        self.high = 0
        self.seen: list[weakref.ref[torch.Tensor]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, list | tuple) else [out]):
            if isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape:
                self.seen.append(weakref.ref(t))
        live = {t.untyped_storage().data_ptr() for ref in self.seen if (t := ref()) is not None}
        self.high = max(self.high, len(live))
        return out


def test_a_derived_trials_inputs_are_changed_as_made_unless_they_are_the_tasks_own() -> None:
    """The blocks and sensitivity trials' inputs are made and changed in place: fresh tensors (as KernelBench's
    get_inputs makes them) are not copied first, which on a 6 GB task held two sets beside the base trial's output
    while the judge shared the trial (38_L1Norm_, 39_L2Norm_, 45_Average_Pooling_2D out of memory at 40 GB); the
    task's own tensors are copied, never changed."""
    shape = (29, 83)  # a size no other tensor of the test run has
    fresh = task(Mse(), Module(shape))
    fresh.fresh_inputs = True
    fresh.cache.limit(0)
    special, _ = special_trials(fresh, CFG, TOL)
    derived = [t for t in special if t.then is None]
    assert len(derived) == 2  # blocks and sensitivity
    for trial in derived:
        trial.ref = None  # only what make() itself holds is counted
        peak = LivePeak(shape)
        with peak:
            made = trial.make()
        del made
        assert peak.high <= 2, (trial.label, peak.high)  # the two inputs, no copy beside them
    own = SameTensors(shape)
    shared = task(Mse(), own)
    shared.cache.limit(0)
    special, _ = special_trials(shared, CFG, TOL)
    assert own.made is not None
    before = [x.clone() for x in own.made]
    for trial in (t for t in special if t.then is None):
        made = trial.make()
        assert not torch.equal(made[0], before[0])  # changed ...
    assert all(torch.equal(x, y) for x, y in zip(own.made, before, strict=True))  # ... on a copy


def test_a_scaled_trials_inputs_are_scaled_as_made_unless_they_are_the_tasks_own() -> None:
    """The scaled standard trials (x4, x0.125) scale fresh inputs in place: a scaled copy held the drawn set beside
    it, two sets where the memory plan counts one (on the H200 at 40 GB: 38_L1Norm_'s 8.6 GB input beside its
    output and the drawn copy, out of memory while the judge shared the trial; 45_Average_Pooling_2D's 17 GB). A
    get_inputs that hands out the task's own tensors, or one tensor twice, is scaled on a copy, never changed."""
    shape = (31, 79)  # a size no other tensor of the test run has
    fresh = task(Mse(), Module(shape))
    fresh.fresh_inputs = True
    fresh.cache.limit(0)
    scaled = [k for k in range(CFG.trials) if trial_scale(k, CFG.trials) != 1.0]
    assert len(scaled) == 2
    for k in scaled:
        trial = standard_trial(fresh, CFG, k)
        trial.ref = None
        peak = LivePeak(shape)
        with peak:
            made = trial.make()
        assert peak.high <= 2, (trial.label, peak.high)  # the two inputs, no copy beside them
        plain = make_inputs(fresh.get_inputs, trial.seed)
        assert torch.equal(made[0], plain[0] * trial_scale(k, CFG.trials))  # the same values as on a copy
        del made, plain
    own = SameTensors(shape)
    shared = task(Mse(), own)
    shared.cache.limit(0)
    made = standard_trial(shared, CFG, scaled[0]).make()
    assert own.made is not None and not torch.equal(made[0], own.made[0])  # scaled on a copy
    x = torch.rand(shape)
    before = x.clone()
    twice = make_inputs(lambda: [x, x], 0, 4.0, fresh=True)  # one tensor twice: scaled once each, on copies
    assert torch.equal(twice[0], 4.0 * before) and torch.equal(twice[1], 4.0 * before)
    assert torch.equal(x, before)
