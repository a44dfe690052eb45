"""KernelBench's own 250 task files (levels 1-3, as data beside the checkout: ../shared/kernelbench, or
STARK_KERNELBENCH): every one loads, and two small ones go end to end through the evaluator with ``cpu_cpp``.
Their sizes are KernelBench's (a level-1 input is often 6 GB): the GPU sweep is benchmarks/kernelbench_sweep.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval import kernelbench

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("STARK_KERNELBENCH") or ROOT.parent / "shared" / "kernelbench")
# small at KernelBench's sizes and quick on two CPU cores (a forward in ~0.4 s)
SMALL = ("level2/6_Conv3d_Softmax_MaxPool_MaxPool", "level3/32_ConvolutionalVisionTransformer")


@pytest.fixture(scope="module")
def refs() -> list[kernelbench.KernelBenchEntry]:
    if not DATA.exists():
        pytest.skip(f"no KernelBench data at {DATA} (set STARK_KERNELBENCH)")
    return kernelbench.scan(DATA)


def test_all_250_task_files_load_without_running(refs: list[kernelbench.KernelBenchEntry]) -> None:
    counts = {level: sum(r.level == level for r in refs) for level in (1, 2, 3)}
    assert counts == {1: 100, 2: 100, 3: 50}
    tasks = kernelbench.load(refs)  # parsed and checked: class Model, get_inputs, get_init_inputs
    assert len({t.name for t in tasks}) == 250 and all(t.name.startswith("level") for t in tasks)
    assert len(kernelbench.select(DATA, subset="representative")) == 35


@pytest.mark.slow
def test_small_tasks_end_to_end_with_the_reference_as_candidate(refs: list[kernelbench.KernelBenchEntry],
                                                                tmp_path: Path) -> None:
    """The reference, then its own forward as ModelNew (what the GPU sweep runs): correct and timed."""
    from stark_ray.eval.service import EvalService

    picked = [r for r in refs if r.qualified in SMALL]
    assert len(picked) == len(SMALL)
    cfg = EvalConfig(backend="cpu_cpp", trials=2, timing_trials=3, timing_precision=0, build_dir=str(tmp_path))
    with EvalService(cfg) as service:
        for task in kernelbench.load(picked):
            reference = service.reference(task)
            assert reference.accepted and reference.runtime_ms is not None and reference.runtime_ms > 0
            result = service.evaluate(task, task.source + "\n\nclass ModelNew(Model):\n    pass\n")
            assert result.passed_checks and result.stage == "ok", f"{task.name}: {result.error}"
            assert result.speedup is not None and result.speedup > 0  # timed (its figure depends on the host)
            assert "correct over 2 trials" in result.log
