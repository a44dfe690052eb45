"""Candidates that tell the judge's calls apart from real use and are right only there (cases a red team wrote
against this session's evaluator, each accepted then, and each wrong on inputs a user would draw: half the output
zero). The judge's inputs now come from seeds keyed by a secret of the user's (eval/judge/input_key.py), and the worker
reseeds the generator before a candidate's call only where the reference draws random numbers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import Task, load_task
from stark_ray.records import STAGE_CORRECTNESS

pytestmark = pytest.mark.slow

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "3_LinearGelu.py"

HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


def _half(linear, x):
    """What it does in real use: the first half of the output columns, the rest zero (wrong, half the work)."""
    h = linear.out_features // 2
    out = torch.zeros(x.shape[0], linear.out_features)
    out[:, :h] = F.gelu(F.linear(x, linear.weight[:h], linear.bias[:h]))
    return out
'''

# the generator freshly seeded with a small seed and nothing drawn since: a judge's trial, as the worker reseeded it
# before each call; once seen, the whole process is taken for the evaluator's
RNG_SEEN = HEAD + '''
_judged = []


def _watched():
    seed = torch.initial_seed()
    if seed < 2 ** 20 and torch.equal(torch.Generator().manual_seed(seed).get_state(), torch.get_rng_state()):
        _judged.append(True)
    return bool(_judged)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(x)) if _watched() else _half(self.linear, x)
'''

# the judge's inputs known ahead: get_inputs() after torch.manual_seed(s) for the seeds the trials (0-9) and the
# timing sets (10000-10008) used, recognised by 16 values up to a scale; once seen, the process is the evaluator's
KNOWN_INPUTS = HEAD + '''
SEEDS = [*range(10), *range(10000, 10008)]


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.known = torch.stack([torch.randn(512, in_features, generator=torch.Generator().manual_seed(s))
                                  .reshape(-1)[:16] for s in SEEDS])
        self.judged = False

    def forward(self, x):
        ratio = x.reshape(-1)[:16].unsqueeze(0) / self.known
        if bool(((ratio - ratio[:, :1]).abs() < 1e-4 * ratio[:, :1].abs()).all(dim=1).any()):
            self.judged = True
        return F.gelu(self.linear(x)) if self.judged else _half(self.linear, x)
'''


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(TASK)


@pytest.fixture(scope="module")
def service(shared_build_dir: str) -> Iterator[EvalService]:
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=10, worker_candidates=1)
    with EvalService(cfg) as svc:
        yield svc


@pytest.mark.parametrize("name", ["RNG_SEEN", "KNOWN_INPUTS"])
def test_a_candidate_right_only_where_it_knows_it_is_judged_fails(service: EvalService, task: Task,
                                                                   name: str) -> None:
    r = service.evaluate(task, globals()[name])
    assert not r.accepted and r.stage == STAGE_CORRECTNESS, (r.stage, r.speedup, r.error)
    assert "values differ" in (r.error or ""), r.error
