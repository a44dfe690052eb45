"""The device memory budget (stark_ray/eval/measure/memory.py): what an evaluation needs, what it keeps, and the one
line for a task that cannot fit. The GPU tests run KernelBench's own 19_ReLU (one 6.4 GB input) under a budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval.measure.memory import (
    CONTEXTS_BYTES,
    GB,
    TRANSIENT_BYTES,
    Footprint,
    OverBudget,
    check_fits,
    plan_for,
    resolve_budget,
    within_reach,
)

ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH = Path(os.environ.get("STARK_KERNELBENCH") or ROOT.parent / "shared" / "kernelbench" / "KernelBench")
RELU = Footprint(inputs=6_442_450_944, outputs=6_442_450_944, work=6_442_450_944, params=0)  # level1/19_ReLU


def test_an_evaluation_needs_four_input_sized_buffers_at_once_for_an_elementwise_task() -> None:
    phases = RELU.phases()
    assert max(phases.values()) == 4 * RELU.inputs  # sharing, checking, running and timing all reach it
    assert RELU.needs() == 4 * RELU.inputs + CONTEXTS_BYTES + TRANSIENT_BYTES
    reduction = Footprint(inputs=17_179_869_184, outputs=141_705_216, work=141_705_216, params=0)  # 45_Avg_Pool_2D
    assert 2 * reduction.inputs < reduction.needs() < 40 * GB


def test_the_plan_keeps_what_the_budget_leaves_room_for() -> None:
    small = Footprint(inputs=4 << 20, outputs=4 << 20, work=8 << 20, params=1 << 20)
    roomy = plan_for(small, 40 * 10**9)
    assert roomy.timing_sets == 4 and roomy.keep_sets and roomy.trial_cache > 0
    at_40 = plan_for(RELU, 40 * 10**9)  # 28 GB needed: one more set fits while timing, not kept beside the trials
    assert at_40.timing_sets == 2 and not at_40.keep_sets
    assert at_40.describe().startswith("2 timing set(s), trials kept up to ")
    at_80 = plan_for(RELU, 80 * 10**9)
    assert at_80.timing_sets == 2 and at_80.keep_sets  # a set of 6 GB: two rotate as well as four
    tight = plan_for(RELU, int(RELU.needs() * 1.02))
    assert tight.timing_sets == 1 and not tight.keep_sets and tight.trial_cache == 0 and tight.kept_others == 0


def test_a_task_that_cannot_fit_is_one_line_naming_its_need_and_the_budget() -> None:
    check_fits("level1/19_ReLU", RELU, 40 * 10**9, measured=True)
    with pytest.raises(OverBudget) as e:
        check_fits("level1/19_ReLU", RELU, 20 * 10**9, measured=True)
    line = str(e.value)
    assert line.startswith("task level1/19_ReLU needs 28.3 GB; budget 20.0 GB") and "\n" not in line
    with pytest.raises(OverBudget, match="needs at least"):
        check_fits("level1/19_ReLU", RELU, 20 * 10**9, measured=False)


def test_the_budget_is_the_users_or_a_share_of_the_free_memory() -> None:
    assert resolve_budget(40.0, free=100 * 10**9, total=140 * 10**9) == 40 * 10**9
    assert resolve_budget(400.0, free=100 * 10**9, total=140 * 10**9) == 140 * 10**9  # never above the device
    assert resolve_budget(None, free=100 * 10**9, total=140 * 10**9) == 90 * 10**9
    for bad in (0, -1, True, "40"):
        with pytest.raises(ValueError, match="memory_budget_gb"):
            EvalConfig(memory_budget_gb=bad)  # type: ignore[arg-type]


def test_a_budget_never_asks_for_what_other_processes_hold_now() -> None:
    """Two evaluations started at once on one 80 GB GPU each took 90% of the free memory they saw at their start:
    the later one ran out of memory mid-candidate. Each request's budget is lowered to what the others leave."""
    total = 80 * 10**9
    alone, others = within_reach(72 * 10**9, total, free=78 * 10**9, held=2 * 10**9)
    assert alone == 72 * 10**9 and others == 0  # nothing else on the GPU: the budget asked
    busy, others = within_reach(72 * 10**9, total, free=40 * 10**9, held=2 * 10**9)  # another holds 38 GB
    assert others == 38 * 10**9 and busy < 0.95 * 42 * 10**9 and busy > 39 * 10**9
    assert within_reach(busy, total, free=40 * 10**9 + 10**7, held=2 * 10**9)[0] == busy  # steady: no new plan
    with pytest.raises(OverBudget):  # what it leaves is then checked against the task's need, before any candidate
        check_fits("level1/19_ReLU", RELU, within_reach(72 * 10**9, total, 20 * 10**9, 2 * 10**9)[0], measured=True)


# -- on the GPU -----------------------------------------------------------------------------------------------
def _relu_task():  # type: ignore[no-untyped-def]
    from stark_ray.eval import kernelbench

    path = KERNELBENCH / "level1" / "19_ReLU.py"
    if not path.exists():
        pytest.skip(f"no KernelBench data at {KERNELBENCH} (set STARK_KERNELBENCH)")
    return kernelbench.load([kernelbench.KernelBenchEntry(1, 19, "19_ReLU", path)])[0]


CANDIDATE = "\n\nclass ModelNew(Model):\n    pass\n"


def test_the_judges_steps_are_traced_with_its_memory_only_where_asked(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``STARK_MEMORY_TRACE`` (benchmarks/memory_timeline.py): a line per mark, its moment on the host's monotonic
    clock (nvidia-smi's samples are read against it) and what the judge holds; nothing written where it is unset."""
    import time

    from stark_ray.eval.judge.memory import mark
    from stark_ray.eval.measure.memory import TRACE_ENV

    trace = tmp_path / "steps.tsv"
    monkeypatch.delenv(TRACE_ENV, raising=False)
    mark("not traced")
    assert not trace.exists()
    monkeypatch.setenv(TRACE_ENV, str(trace))
    before = time.monotonic()
    mark("step run (trial 1/5)")
    mark("confirmation: the template made")
    rows = [line.split("\t") for line in trace.read_text().splitlines()]
    assert [r[1] for r in rows] == ["step run (trial 1/5)", "confirmation: the template made"]
    # the moment is written to the microsecond: read back, it may round below ``before`` by half of one
    assert all(before - 1e-6 <= float(r[0]) <= time.monotonic() + 1e-6 and len(r) == 3 for r in rows)


@pytest.mark.gpu
def test_a_6_gb_task_evaluates_within_40_gb_and_says_what_it_needs_under_20() -> None:
    from stark_ray.eval.service import EvalService

    task = _relu_task()
    with EvalService(EvalConfig(backend="cuda", memory_budget_gb=40)) as service:
        reference = service.reference(task)
        assert reference.accepted and reference.peak_memory_gb is not None and reference.peak_memory_gb <= 40
        assert "device memory: needs 28.3 GB of a budget of 40.0 GB" in reference.log, reference.log
        result = service.evaluate(task, task.source + CANDIDATE)
        assert result.passed_checks and "no_kernel" in result.flags, result.error
        assert result.peak_memory_gb is not None and 4 * RELU.inputs / GB - 1 < result.peak_memory_gb <= 40
        tight = EvalConfig(backend="cuda", memory_budget_gb=20)
        with pytest.raises(OverBudget, match=r"needs (at least )?2\d\.\d GB; budget 20\.0 GB"):
            service.reference(task, tight)
        over = service.evaluate(task, task.source + CANDIDATE, tight)
        assert "over_budget" in over.flags and "budget 20.0 GB" in (over.error or "")
        again = service.evaluate(task, task.source + CANDIDATE)  # the 40 GB budget again: judged as before
        assert again.passed_checks and "no_kernel" in again.flags, again.error


# a candidate that fills the device past what its process is allowed (straight through the driver, beside torch's
# allocator and its cap) and keeps it filled while it is loaded: the judge's own allocations then fail
HOG = """

import ctypes

import torch as _torch

_torch.zeros(1, device="cuda")  # the device's context current on this thread
_free, _total = _torch.cuda.mem_get_info()
_held = ctypes.c_uint64()
assert ctypes.CDLL("libcuda.so.1").cuMemAlloc_v2(ctypes.byref(_held), ctypes.c_size_t(int(_free * 0.98))) == 0


class ModelNew(Model):
    pass
"""


@pytest.mark.gpu
def test_the_judges_own_device_memory_running_out_is_evaluated_again_before_it_is_charged() -> None:
    """The judge's own allocation failing was the candidate's failure at once. Now the judge gives back all it holds
    but the task and the candidate is evaluated again; one whose own process fills the device fails both times and
    is charged, both said; the next honest candidate is judged as usual (the control)."""
    from stark_ray.eval.service import EvalService

    task = _relu_task()
    with EvalService(EvalConfig(backend="cuda", memory_budget_gb=40)) as service:
        assert service.reference(task).accepted
        hog = service.evaluate(task, task.source + HOG)
        assert "judge_memory" in hog.flags and "out_of_memory" in hog.flags, (hog.stage, hog.flags, hog.error)
        assert "evaluated 2 times: each time the judge's own allocation ran out of device memory" in hog.log, hog.log
        honest = service.evaluate(task, task.source + CANDIDATE)
        assert honest.passed_checks and "no_kernel" in honest.flags, honest.error


@pytest.mark.gpu
def test_a_6_gb_tasks_claim_is_measured_by_the_judge_at_the_default_budget() -> None:
    """Every claim through the judge's confirmation (the path a fast kernel takes: ``own_kernel`` off so that the
    reference's own forward reaches it), on a task with 6.4 GB in and 6.4 GB out: at the default budget of an 80 GB
    card one batch set fits (issue 41: `23_Softmax`, `26_GELU_` of that size were `unconfirmed` on an H100, 64.4 GB
    needed for one set where 60.9 GB were left; a fast kernel's gain would have counted for 2x at most); at 40 GB it
    does not, and says so in one line, never failing the candidate."""
    import torch

    from stark_ray.eval.service import EvalService

    if torch.cuda.get_device_properties(0).total_memory < 75e9:
        pytest.skip("needs an 80 GB card")
    task = _relu_task()
    confirm_all = EvalConfig(backend="cuda", confirm_above=0.0, defences_off=("own_kernel",))
    with EvalService(confirm_all) as service:
        assert service.reference(task).accepted
        result = service.evaluate(task, task.source + CANDIDATE)
        assert result.passed_checks and "unconfirmed" not in result.flags, (result.flags, result.log)
        assert "judge's wall clock" in result.log, result.log
        tight = EvalConfig(backend="cuda", confirm_above=0.0, defences_off=("own_kernel",), memory_budget_gb=40)
        capped = service.evaluate(task, task.source + CANDIDATE, tight)
        assert capped.passed_checks and "unconfirmed" in capped.flags, (capped.flags, capped.error)
        assert "GB for one" in capped.log and "GB left" in capped.log, capped.log
