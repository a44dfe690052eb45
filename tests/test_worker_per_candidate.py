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


# fills 3 GiB of host memory in its first call, each page touched (past a 2 GiB cap: the allocation itself fails)
FILLS_THE_HOST = "import torch\n" + MODEL.replace("{forward}", "_fill = torch.ones(3 << 28, dtype=torch.float64)")


@pytest.mark.parametrize("isolate", ["off", "auto"])
def test_a_candidate_past_its_host_memory_cap_is_out_of_memory_in_one_line(tmp_path: Path, isolate: str) -> None:
    """The candidate's process is held to worker_memory_gb (RLIMIT_DATA): a 3 GiB fill under a 2 GiB cap fails where
    the candidate made it, said as out of memory (flagged), not a crash or a time limit; the honest control beside
    it stays accepted under the same cap, and so does the next honest one."""
    task = load_task(TASK)
    cfg = EvalConfig(backend="cpu_cpp", build_dir=str(tmp_path / "build"), timing_trials=11, warmup=2,
                     isolate=isolate, worker_memory_gb=2.0)
    honest = HONEST.format(forward="pass", factor="")
    with EvalService(cfg) as service:
        before = service.evaluate(task, honest)
        filled = service.evaluate(task, FILLS_THE_HOST.format(factor=""))
        after = service.evaluate(task, honest)
    assert passed(before) and passed(after), [(r.stage, r.error) for r in (before, after)]
    assert filled.stage == "runtime" and "out_of_memory" in filled.flags, (filled.stage, filled.error, filled.flags)
    assert filled.error is not None and filled.error.startswith("out of memory on the host")
    assert "\n" not in filled.error
