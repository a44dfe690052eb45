"""A warm worker keeps the references of the tasks it serves (a campaign moves it from task to task), as many as
KEPT_TASKS and while what they hold stays under the memory budget, forgetting the least recently used first."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval import host
from stark_ray.eval.backends import get_backend
from stark_ray.eval.host import CandidateHost
from stark_ray.eval.protocol import OP_REFERENCE

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"
NAMES = ["1_LeakyReluScale", "2_FusedSwishScaleClamp", "5_RowSoftmax"]


@pytest.fixture
def judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CandidateHost:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the worker writes the task modules it imports
    return CandidateHost(get_backend("cpu_cpp"), None)


def reference(judge: CandidateHost, name: str) -> None:
    cfg = EvalConfig(backend="cpu_cpp", timing_trials=2, warmup=1)
    msg = {"op": OP_REFERENCE, "task_name": name, "task_source": (EXAMPLES / f"{name}.py").read_text(),
           "cfg": asdict(cfg)}
    answer = judge.handle(msg, lambda _: None)
    assert answer["result"]["correct"] and answer["healthy"] and answer["tampered"] == [], answer


def kept(judge: CandidateHost) -> list[str]:
    return [state.name for state in judge.tasks.values()]


def test_a_worker_keeps_every_task_it_serves_while_they_fit(judge: CandidateHost) -> None:
    for name in NAMES:
        reference(judge, name)
    assert kept(judge) == NAMES
    assert all(state.held_bytes() > 0 for state in judge.tasks.values())  # the timing input sets at least
    reference(judge, NAMES[0])  # served again from what it kept: now the most recently used
    assert kept(judge) == [*NAMES[1:], NAMES[0]]


def test_the_least_recently_used_go_first_beyond_the_count_or_the_bytes(
        judge: CandidateHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "KEPT_TASKS", 2)
    for name in NAMES:
        reference(judge, name)
    assert kept(judge) == NAMES[1:]
    monkeypatch.setattr(host, "KEPT_CPU_BYTES", 1)  # nothing fits: only the task just served stays
    reference(judge, NAMES[0])
    assert kept(judge) == [NAMES[0]]
