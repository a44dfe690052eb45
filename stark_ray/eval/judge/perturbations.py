"""How the special trials (eval/judge/trials.py) change a task's inputs: in place, on the flat (contiguous order) values
of every floating input whose values are not all whole numbers (a mask or labels stored as floats keep their
meaning). :class:`Blocks` scales each such input block by block (cuts and factors drawn once per input);
:class:`Perturbation` multiplies a few positions of each (its last element among them) by a factor, the same
positions whatever the factor. Cuts, factors and positions come from a generator seeded from the OS
(:func:`random_source`): no candidate, and no earlier run, can know them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import torch

from stark_ray.eval.measure.compare import flatten_outputs

BLOCKS = 8
BLOCK_SCALE_DECADES = 2.0  # block factors from 10^-2 to 1
SAMPLE = 1 << 16  # elements looked at to tell whole-number inputs

Inputs = list[Any]


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


Change = Callable[[int, torch.Tensor], None]  # (the input's number among those changed, its flat values)


def change_in_place(inputs: Inputs, change: Change) -> int:
    """``change`` the flat (contiguous order) values of every perturbable floating input of ``inputs`` (fresh
    tensors of the caller's own: changed in place, strides kept); how many were changed."""
    count = 0
    for _, t in flatten_outputs(inputs, "input"):
        if not isinstance(t, torch.Tensor) or not perturbable(t):
            continue
        if t.is_contiguous():
            change(count, t.detach().view(-1))
        else:
            flat = t.detach().contiguous().reshape(-1)
            change(count, flat)
            t.detach().copy_(flat.view(t.shape))
        count += 1
    return count


class Blocks:
    """Each floating input scaled block by block: cuts and factors drawn once per input (the same every time the
    trial's inputs are made)."""

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen
        self.drawn: dict[int, tuple[list[int], list[float]]] = {}

    def __call__(self, index: int, flat: torch.Tensor) -> None:
        if index not in self.drawn:
            gen, n = self.gen, flat.numel()
            blocks = min(BLOCKS, n)
            cuts = torch.randint(1, n, (blocks - 1,), generator=gen, device=gen.device).unique() if n > 1 else None
            edges = [0, *cuts.tolist(), n] if cuts is not None else [0, n]
            factors = torch.pow(10.0, -BLOCK_SCALE_DECADES * torch.rand(len(edges) - 1, generator=gen,
                                                                        device=gen.device)).tolist()
            self.drawn[index] = (edges, factors)
        edges, factors = self.drawn[index]
        for a, b, f in zip(edges, edges[1:], factors, strict=False):
            flat[a:b].mul_(f)


class Perturbation:
    """``count`` positions in each floating input (its last element among them, the rest at random), each with
    its own share (1/2 to 1) of a factor; the same positions whatever the factor."""

    def __init__(self, count: int, gen: torch.Generator) -> None:
        self.count = count
        self.gen = gen
        self.picks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _positions(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.gen
        where = torch.randint(0, n, (max(self.count - 1, 0),), generator=gen, device=gen.device)
        where = torch.cat([where, torch.tensor([n - 1], device=gen.device)]).unique()  # each once: made alike
        share = (0.5 + 0.5 * torch.rand(where.numel(), generator=gen, device=gen.device)).to(device)
        where = where.to(device)
        return where, share

    def by(self, factor: float) -> Change:
        def multiply(index: int, flat: torch.Tensor) -> None:
            if index not in self.picks:
                self.picks[index] = self._positions(flat.numel(), flat.device)
            where, share = self.picks[index]
            flat[where] = flat[where] * (share * factor).to(flat.dtype)

        return multiply
