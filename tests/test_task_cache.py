"""A warm worker keeps the references of the tasks it serves (a campaign moves it from task to task), as many as
KEPT_TASKS and while what they hold stays under the memory budget, forgetting the least recently used first."""

from __future__ import annotations

import gc
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import get_backend
from stark_ray.eval.proc import garbage
from stark_ray.eval.proc.garbage import collect
from stark_ray.eval.wire.protocol import OP_END, OP_LOAD, OP_REFERENCE, OP_RELEASE
from stark_ray.eval.worker import host
from stark_ray.eval.worker.guards import Fingerprint
from stark_ray.eval.worker.host import CandidateHost

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"
NAMES = ["1_LeakyReluScale", "2_FusedSwishScaleClamp", "5_RowSoftmax"]


@pytest.fixture
def judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CandidateHost:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the worker writes the task modules it imports
    monkeypatch.chdir(tmp_path)  # and its candidates' private directories (never the checkout's root)
    return CandidateHost(get_backend("cpu_cpp"), None)


def reference(judge: CandidateHost, name: str) -> None:
    cfg = EvalConfig(backend="cpu_cpp", timing_trials=2, warmup=1)
    msg = {"op": OP_REFERENCE, "task_name": name, "task_source": (EXAMPLES / f"{name}.py").read_text(),
           "cfg": asdict(cfg)}
    answer = judge.handle(msg, lambda _: None)
    assert answer["result"]["passed_checks"] and answer["healthy"] and answer["tampered"] == [], answer


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
    judge.fingerprint = Fingerprint()  # a worker started with these constants (a change after it is tampering)
    for name in NAMES:
        reference(judge, name)
    assert kept(judge) == NAMES[1:]
    monkeypatch.setattr(host, "KEPT_CPU_BYTES", 1)  # nothing fits: only the task just served stays
    judge.fingerprint = Fingerprint()
    reference(judge, NAMES[0])
    assert kept(judge) == [NAMES[0]]


CACHING = """
import torch

CACHE = []


class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        CACHE.append(torch.ones(1 << 16))  # what a candidate keeps beside its model (an output cache, say)

    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.2) * 1.5
"""


def test_an_ended_candidate_leaves_nothing_behind_without_a_collection(judge: CandidateHost,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate's module and class are reference cycles: the worker collects them as it ends the candidate,
    so what the candidate allocated (gigabytes on a large task) goes back before the next one runs."""
    monkeypatch.setattr(garbage, "COLLECT_ABOVE", 0)  # this small task stands for a large one
    judge.fingerprint = Fingerprint()
    cfg = EvalConfig(backend="cpu_cpp", timing_trials=2, warmup=1)
    source = (EXAMPLES / f"{NAMES[0]}.py").read_text()
    answer = judge.handle({"op": OP_LOAD, "task_name": NAMES[0], "task_source": source, "cfg": asdict(cfg),
                           "candidate_source": CACHING}, lambda _: None)
    assert "loaded" in answer, answer
    assert judge.current is not None
    cached = weakref.ref(type(judge.current.model).__init__.__globals__["CACHE"][0])
    was_enabled = gc.isenabled()
    gc.disable()  # only the worker's own collection may free it
    try:
        answer = judge.handle({"op": OP_END}, lambda _: None)
        assert answer.get("ended") and answer["tampered"] == [], answer
        assert cached() is None
    finally:
        if was_enabled:
            gc.enable()


def test_a_task_it_stops_keeping_goes_though_its_state_was_frozen(judge: CandidateHost,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What survives a collection is frozen (so the next one scans only a candidate's objects); a task's state
    that the worker drops is thawed and collected all the same."""
    monkeypatch.setattr(host, "KEPT_TASKS", 1)
    judge.fingerprint = Fingerprint()
    reference(judge, NAMES[0])
    cycle: list = [torch.ones(1 << 16)]
    cycle.append(cycle)  # a state that is a reference cycle (as a torch.compile baseline's caches are)
    next(iter(judge.tasks.values())).extra = cycle
    first = weakref.ref(cycle[0])
    del cycle
    collect()  # the task's state is frozen now
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        reference(judge, NAMES[1])
        assert kept(judge) == [NAMES[1]] and first() is None
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


def serving_all_then_loaded(judge: CandidateHost) -> Any:
    """Every task's reference served, then a candidate of the first loaded: its task's state."""
    judge.fingerprint = Fingerprint()
    for name in NAMES:
        reference(judge, name)
    cfg = EvalConfig(backend="cpu_cpp", timing_trials=2, warmup=1)
    source = (EXAMPLES / f"{NAMES[0]}.py").read_text()
    answer = judge.handle({"op": OP_LOAD, "task_name": NAMES[0], "task_source": source, "cfg": asdict(cfg),
                           "candidate_source": CACHING}, lambda _: None)
    assert "loaded" in answer and judge.current is not None, answer
    return judge.current.state


def test_room_for_a_confirmation_batch_takes_the_candidates_timing_sets_and_the_other_tasks_not_its_own(
        judge: CandidateHost) -> None:
    """The judge's ``release`` with ``sets`` (room for a confirmation batch that did not fit): the states of the other
    tasks go and the current candidate's timing sets too (made again where it is timed once more); its task's state
    stays, and the candidate with it."""
    state = serving_all_then_loaded(judge)
    assert state.input_sets is not None
    answer = judge.handle({"op": OP_RELEASE, "keep": 0, "sets": True}, lambda _: None)
    assert answer["tampered"] == [] and answer["healthy"], answer
    assert kept(judge) == [NAMES[0]] and judge.current is not None and judge.current.state is state
    assert state.input_sets is None and state.held_bytes() == 0
    assert len(state.timing_sets(2)) == 2  # made again for a later timing


def test_the_judges_release_of_a_batch_lets_the_workers_mappings_go_and_nothing_else(judge: CandidateHost) -> None:
    """The judge's ``release`` with ``batch``, once a confirmation's rounds are over: the batch's mapped buffers go
    (their device memory goes back only once this process has let them go too), and nothing the worker keeps to go
    faster (the other tasks, the candidate's timing sets)."""
    state = serving_all_then_loaded(judge)
    sets = state.input_sets

    class Mapped:
        released = 0

        def release(self) -> None:
            Mapped.released += 1

    judge.current.buffers = [Mapped(), Mapped()]  # type: ignore[list-item]  # as a staged batch maps them
    judge.current.staged = [([torch.ones(4)], {})]
    answer = judge.handle({"op": OP_RELEASE, "batch": True}, lambda _: None)
    assert answer["tampered"] == [] and answer["healthy"], answer
    assert Mapped.released == 2 and judge.current.buffers == [] and judge.current.staged == []
    assert sorted(kept(judge)) == sorted(NAMES) and state.input_sets is sets
