"""The seal on a task's reference in a worker (eval/worker/reference_seal.py): what a candidate changes of the
reference's model, module, classes or timing inputs is named; what the reference's own forward changes (running
statistics, state it keeps) and torch.compile are not."""

from __future__ import annotations

import gc
import time
import types
import weakref
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from stark_ray.eval.worker.reference_seal import Seal

SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.norm = nn.BatchNorm1d(n)

    def forward(self, x):
        return F.gelu(self.norm(self.linear(x)))


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.block = Block(n)
        self.scale = 0.5
        self.hidden = torch.zeros(1, n)

        self.register_buffer("state", torch.zeros(1, n))

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)  # state the forward replaces itself (33_VanillaRNN)
        self.hidden = torch.tanh(self.hidden + x[:1])
        self.state = torch.tanh(self.state + x[:1])  # a buffer too
        self.calls = x.size(0) * 1000 + len(self.__dict__)  # a number (a new object each call), a size
        self.shape = x.shape
        return self.block(x) * self.scale
'''


@pytest.fixture
def built() -> tuple[types.ModuleType, nn.Module]:
    module = types.ModuleType("stark_task_seal_test")
    exec(compile(SOURCE, "task_seal_test.py", "exec"), module.__dict__)
    return module, module.Model(8)


def _call(model: nn.Module) -> None:
    with torch.no_grad():
        model(torch.randn(4, 8))


def test_the_references_own_forward_and_torch_compile_break_nothing(built: tuple[types.ModuleType,
                                                                                nn.Module]) -> None:
    module, model = built
    seal = Seal(module, model)
    sets = [[torch.randn(4, 8)] for _ in range(2)]
    seal.seal_inputs(sets)
    for _ in range(3):  # BatchNorm's running statistics written in place, the hidden state replaced
        _call(model)
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    assert seal.broken() == []


class _SlowF:
    """A stand-in for torch.nn.functional that a task's torch layers would call."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch.nn.functional, name)


def _replaced(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def slow(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0)
        return forward(self, x)

    return slow


@pytest.mark.parametrize("change, named", [
    (lambda m, model: model.block.register_forward_hook(lambda *a: time.sleep(0)), "block._forward_hooks"),
    (lambda m, model: model.register_forward_pre_hook(lambda *a: None), "model._forward_pre_hooks"),
    (lambda m, model: setattr(m.Block, "forward", lambda self, x: x), "Block.forward"),
    (lambda m, model: setattr(m.Model.forward, "__code__", (lambda self, x: x).__code__), "Model.forward.__code__"),
    (lambda m, model: setattr(m, "F", types.SimpleNamespace(gelu=torch.relu)), "task module.F"),
    (lambda m, model: setattr(model.block, "forward", lambda x: x), "model.block.__dict__ (what hides"),
    (lambda m, model: setattr(torch.nn.modules.linear, "F", _SlowF()), "torch.nn.modules.linear.F"),
    (lambda m, model: setattr(model.block.linear, "weight", nn.Parameter(model.block.linear.weight.clone())),
     "model.block.linear._parameters['weight']"),
    (lambda m, model: model.block.linear.weight.detach().mul_(1.0), "model.block.linear.weight"),
    (lambda m, model: setattr(model.block.linear.weight, "data",
                              model.block.linear.weight.data.t().contiguous().t()), "model.block.linear.weight"),
    (lambda m, model: setattr(model.block, "norm", nn.Identity()), "model.block._modules['norm']"),
    # torch's own classes of its submodules (nn.Module itself is the fingerprint's): a red team's, session 29
    (lambda m, model: setattr(nn.Linear, "forward", _replaced(nn.Linear.forward)), "Linear.forward"),
    (lambda m, model: setattr(nn.BatchNorm1d, "__call__", lambda self, x: x), "BatchNorm1d.__dict__ (keys)"),
])
def test_a_change_to_the_reference_is_named(built: tuple[types.ModuleType, nn.Module],
                                            change: Callable[[types.ModuleType, nn.Module], object],
                                            named: str) -> None:
    module, model = built
    seal = Seal(module, model)
    saved = {cls: dict(vars(cls)) for cls in (nn.Linear, nn.BatchNorm1d)}
    functional = torch.nn.modules.linear.F
    try:
        change(module, model)
        broken = seal.broken()
    finally:  # torch's classes as they were
        torch.nn.modules.linear.F = functional
        for cls, attrs in saved.items():
            for key in set(vars(cls)) - set(attrs):
                delattr(cls, key)
            for key in ("forward", "__call__"):
                if key in attrs:
                    setattr(cls, key, attrs[key])
    assert any(named in b for b in broken), broken
    assert all(b.startswith("the reference's ") for b in broken)


def test_the_timing_inputs_are_sealed_as_made_and_let_go_with_them(built: tuple[types.ModuleType,
                                                                               nn.Module]) -> None:
    module, model = built
    seal = Seal(module, model)
    sets = [[torch.randn(4, 8)] for _ in range(2)]
    seal.seal_inputs(sets)
    sets[1][0].add_(1.0)  # an in-place write on the worker's own copy (a candidate gets clones)
    assert any("timing input set 1 [0]" in b for b in seal.broken()), seal.broken()
    gone = weakref.ref(sets[0][0])
    seal.seal_inputs(None)
    del sets
    gc.collect()
    assert gone() is None and seal.broken() == []
