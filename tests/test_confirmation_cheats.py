"""The judge's confirmation against candidates that know when it runs (cases a red team wrote against session 28's
evaluator): on a task whose reference draws random numbers (a dropout), the batch's outputs were not compared, and a
candidate that returned unwritten tensors there was "confirmed" at 200-450x, which let any claim through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import Task, load_task

pytestmark = pytest.mark.slow

# a linear layer, then dropout in training mode: every call draws from torch's generator
DROPOUT_TASK = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n, p):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.p = p

    def forward(self, x):
        return F.dropout(self.linear(x), p=self.p, training=True)


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return [512, 0.25]
'''

HEAD = '''
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def _in(name):
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == name:
            return True
        f = f.f_back
    return False


class ModelNew(nn.Module):
    def __init__(self, n, p):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.p = p
'''

HONEST = HEAD + '''
    def forward(self, x):
        return F.dropout(self.linear(x), p=self.p, training=True)
'''

# the reference's own work everywhere but in the judge's confirmation batch, where nothing is computed
EMPTY_IN_BATCH = HEAD + '''
    def forward(self, x):
        if _in("_batch"):
            return torch.empty(x.shape[0], self.linear.out_features)
        return F.dropout(self.linear(x), p=self.p, training=True)
'''


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    path = Path(tmp_path_factory.mktemp("tasks")) / "linear_dropout.py"
    path.write_text(DROPOUT_TASK)
    return load_task(path)


@pytest.fixture(scope="module")
def service(shared_build_dir: str) -> Iterator[EvalService]:
    # confirm_above 0: every claim goes through the judge's batch (the cheats' claims come from elsewhere)
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=20, worker_candidates=1,
                     confirm_above=0.0)
    with EvalService(cfg) as svc:
        yield svc


def test_a_dropout_candidates_confirmation_batch_is_compared_call_by_call(service: EvalService, task: Task) -> None:
    """Each call of the batch after a seed of its own, the same on both sides: an honest dropout gives the judge's
    outputs bit for bit, and one that computes nothing in the batch fails there."""
    honest = service.evaluate(task, HONEST)
    assert honest.accepted, (honest.error, honest.log)
    assert "each call after a seed of its own" in honest.log, honest.log
    cheat = service.evaluate(task, EMPTY_IN_BATCH)
    assert not cheat.accepted, (cheat.speedup, cheat.log)
    assert "confirmation batch" in (cheat.error or ""), cheat.error


# 128 MB in and 128 MB out: without a memory budget the CPU's batch may hold 1 GB (confirmation.CPU_BUDGET_BYTES),
# one set of the usual batch counts 6 x 128 MB beside 3 x 128 MB, so the lean batch of one set (4 x 128 MB) measures it
LARGE_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.randn(32 * 1024 * 1024)]


def get_init_inputs():
    return []
'''

LARGE_HONEST = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2.0
'''

def test_a_task_too_large_for_a_batch_set_is_confirmed_in_the_lean_batch(service: EvalService,
                                                                        tmp_path: Path) -> None:
    """Through the real worker: an honest candidate's claim measured by the lean batch (the reference side writing
    into the worker's shared inputs and slots between the worker's rounds). Its wrong outputs, and a worker looking
    at the shared memory between its rounds: test_eval_units.py."""
    path = tmp_path / "large_scale.py"
    path.write_text(LARGE_TASK)
    honest = service.evaluate(load_task(path), LARGE_HONEST)
    assert honest.accepted, (honest.error, honest.log)
    assert "lean batch of one set" in honest.log, honest.log
