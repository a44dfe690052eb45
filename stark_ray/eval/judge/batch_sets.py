"""A confirmation batch's K input sets and output slots, packed one after another on shared buffers
(:meth:`Outbox.pack`): the judge's views of them, and the private staging of the inputs that a round fills with
fresh values before its clock runs and writes in one copy per buffer once it does
(:mod:`stark_ray.eval.judge.confirmation`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from stark_ray.eval.measure.compare import flatten_outputs
from stark_ray.eval.measure.inputs import map_tensors, same_values
from stark_ray.eval.wire.exchange import TensorSpec, dtype_of
from stark_ray.eval.wire.outbox import Outbox


class PackedSets:
    """K input sets packed on the buffers of ``box`` (:meth:`Outbox.pack`), with a private staging copy of the same
    layout: a round's fresh values go into the staging before the clock starts (where no other process can see
    them), and into the buffers by one copy per buffer inside it, the same few copies on both sides."""

    def __init__(self, box: Outbox, template: list[Any], k: int, staging: PackedSets | None = None,
                 direct: bool = False) -> None:
        """``staging``: the other side's sets of the same layout, whose private staging these share (both sides
        are given the same fresh values each round: one staging copy of the batch's inputs, not two); ``direct``:
        the buffers are the staging (private to the judge: the lean batch's reference side, which runs on it)."""
        leaves = _tensors(template)
        placed = box.pack([t for _ in range(k) for t in leaves])
        # buffer number -> (the shared buffer, a private staging of its bytes)
        numbers = sorted({spec.buffer for spec, _ in placed})
        theirs = [t for _, t in staging.pairs.values()] if staging is not None else []
        self.pairs = {}
        for j, i in enumerate(numbers):
            data = box.buffers[i].data
            same = j < len(theirs) and theirs[j].shape == data.shape and theirs[j].device == data.device
            # zeros: the gaps between packed tensors reach the worker's buffers too, never the judge's old memory
            self.pairs[i] = (box.buffers[i], data if direct else theirs[j] if same else torch.zeros_like(data))
        self.direct = direct
        n = len(leaves)
        self.specs = [[spec for spec, _ in placed[i * n:(i + 1) * n]] for i in range(k)]
        self.sets = [_rebuilt(template, [view for _, view in placed[i * n:(i + 1) * n]]) for i in range(k)]
        self.staged = [[on_buffer(self.pairs[spec.buffer][1], spec) for spec in specs] for specs in self.specs]

    def fill(self, make: Callable[[], list[Any]]) -> None:
        """A round's fresh values into the staging (outside the clock), one set at a time: ``make()`` gives a set,
        copied and dropped, so that a round holds one set beside the staging, not K (a 6 GB task's batch of one set
        held four copies of its inputs, and did not fit the budget)."""
        for views in self.staged:
            values = make()
            for view, value in zip(views, _tensors(values), strict=True):
                view.copy_(value)
            del values

    def staged_set(self, i: int) -> list[Any]:
        """Set ``i`` as staged (a copy: the caller may hand it to a forward that writes its inputs)."""
        return _rebuilt(self.sets[i], [t.clone() for t in self.staged[i]])

    def write(self) -> None:
        """The staged values into the buffers (inside the clock)."""
        if self.direct:
            return
        for shared, staging in self.pairs.values():
            shared.data.copy_(staging)

    def changed(self) -> bool:
        """Whether a set in the buffers differs from the staged values written (a candidate modified its inputs)."""
        return not all(same_values(v, t) for views, staged in zip(self.sets, self.staged, strict=True)
                       for v, t in zip(_tensors(views), staged, strict=True))

    def shares_staging(self, other: PackedSets) -> bool:
        """Whether these sets write from ``other``'s staging (filled once for both sides)."""
        return all(mine.data_ptr() == theirs.data_ptr()
                   for (_, mine), (_, theirs) in zip(self.pairs.values(), other.pairs.values(), strict=True))


def on_buffer(data: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """The tensor ``spec`` places on a buffer's bytes ``data`` (the buffer itself, or a copy of it)."""
    return data.view(dtype_of(spec.dtype)).as_strided(spec.shape, spec.stride, spec.offset)


def _rebuilt(template: list[Any], views: list[torch.Tensor]) -> list[Any]:
    it = iter(views)
    return list(map_tensors(template, lambda _: next(it)))


def packed_slots(box: Outbox, like: Any, k: int) -> list[list[tuple[str, TensorSpec, torch.Tensor]]]:
    """K sets of output slots (one per tensor of ``like``, by its path) packed on ``box``'s slot buffers."""
    leaves = [(path, t) for path, t in flatten_outputs(like) if isinstance(t, torch.Tensor)]
    placed = box.pack([t for _ in range(k) for _, t in leaves], slots=True)
    n = len(leaves)
    return [[(path, spec, view) for (path, _), (spec, view) in zip(leaves, placed[i * n:(i + 1) * n], strict=True)]
            for i in range(k)]


def _tensors(values: list[Any]) -> list[torch.Tensor]:
    return [t for _, t in flatten_outputs(values, "input") if isinstance(t, torch.Tensor)]
