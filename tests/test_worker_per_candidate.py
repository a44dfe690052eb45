"""What one candidate leaves in its worker process never decides another's verdict: by default every candidate runs
in a worker process of its own (EvalConfig.worker_candidates), on the CPU backends too. Before, a CPU worker served 64
candidates: one that exhausted the file descriptors made every later candidate of its worker fail (5 of 5 honest
ones), and one that left a thread spinning slowed the next ones' timing. Real processes, the cpu_cpp backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_helpers import passed
from leaky_candidates import MODEL, TASK

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task

pytestmark = pytest.mark.slow

TAKES_EVERY_DESCRIPTOR = """
import os, resource, torch

_kept = []
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
for _ in range(min(_soft, 50_000)):  # every descriptor it may have, kept open after it returns
    try:
        _kept.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
""" + MODEL

HONEST = "import torch\n" + MODEL


def test_a_candidate_that_takes_every_descriptor_cannot_fail_the_next(tmp_path: Path) -> None:
    task = load_task(TASK)
    cfg = EvalConfig(backend="cpu_cpp", build_dir=str(tmp_path / "build"), timing_trials=11, warmup=2, isolate="off")
    honest = HONEST.format(forward="pass", factor="")
    with EvalService(cfg) as service:
        service.evaluate(task, TAKES_EVERY_DESCRIPTOR.format(forward="pass", factor=""))  # its own verdict: any
        after = [service.evaluate(task, honest) for _ in range(2)]
    assert all(passed(r) for r in after), [(r.stage, r.error) for r in after]
