"""What a task's reference must be to serve as one, checked once per task in the judge: outputs that can be
compared, inputs that a seed decides, and a forward that depends only on its inputs and torch's seeded generators
(one that draws from them, a dropout, is told apart: its calls are seeded alike)."""

from __future__ import annotations

from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.judge.trials import JudgeTask, Trial
from stark_ray.eval.measure.compare import compare_outputs, flatten_outputs, tensors_of
from stark_ray.eval.measure.inputs import make_inputs, same_values, share_storage
from stark_ray.eval.measure.tolerance import Tolerances
from stark_ray.eval.tasks import TaskError

ALLOWED_LEAVES = (torch.Tensor, bool, int, float, str, type(None))


def check_outputs(name: str, ref: Any) -> None:
    """TaskError unless the reference's outputs are a tensor, or a tuple, list or dict of tensors and numbers."""
    leaves = flatten_outputs(ref)
    odd = [type(v).__name__ for _, v in leaves if not isinstance(v, ALLOWED_LEAVES)]
    if odd or not any(isinstance(v, torch.Tensor) for _, v in leaves):
        what = odd[0] if odd else type(ref).__name__
        raise TaskError(f"task {name}: the reference returns {what}, which cannot be compared (a tensor, or a "
                        "tuple, list or dict of tensors and numbers)")


def check_determinism(task: JudgeTask, first: Trial, cfg: EvalConfig) -> None:
    """TaskError unless ``get_inputs`` and the forward are deterministic under a seed; sets the task's
    ``fresh_inputs`` and ``draws_random``."""
    name, device = task.name, task.device
    made = make_inputs(task.get_inputs, first.seed, 1.0, device)  # get_inputs itself, not a kept trial's copy
    other = make_inputs(task.get_inputs, first.seed, 1.0, device)
    if not all(map(same_values, tensors_of(made), tensors_of(other))):
        raise TaskError(f"task {name}: get_inputs() is not deterministic under a seed (two calls differ); its "
                        "inputs must come from torch's seeded generators")
    # a get_inputs that hands out the same tensors every time: the reference never runs on them themselves
    task.fresh_inputs = not share_storage(tensors_of(made), tensors_of(other))
    del other
    # after the same seed, as every call of the reference and the candidate is made: a forward that draws from
    # torch's generators (a dropout in training mode) gives the same outputs, one that depends on anything else
    # does not
    again = task.run(made, first.seed, private=task.fresh_inputs)
    del made
    same = compare_outputs(again, first.ref, Tolerances.of(cfg))
    del again
    if not same.ok:
        raise TaskError(f"task {name}: the reference is not deterministic (two calls on the same inputs after "
                        f"the same seed differ: {same.problem}); its forward must depend only on its inputs and "
                        "torch's seeded generators")
    # once more without the seed (make_inputs leaves the generator past the inputs' draws): a forward that draws
    # random numbers is told apart, and its timed calls are seeded too
    unseeded = task.run(make_inputs(task.get_inputs, first.seed, 1.0, device), None, private=task.fresh_inputs)
    task.draws_random = not compare_outputs(unseeded, first.ref, Tolerances.of(cfg)).ok
