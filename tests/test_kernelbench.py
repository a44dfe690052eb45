"""Selecting tasks from a KernelBench-style checkout (a tree of our own tiny task files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stark_ray.eval.kernelbench import REPRESENTATIVE, levels_root, load, scan, select
from stark_ray.eval.tasks import TaskError

TASK = """import torch
import torch.nn as nn
{extra}

class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(1 << 40)]  # far too large to make: loading must never call this


def get_init_inputs():
    return []
"""


def make_checkout(root: Path, files: dict[int, list[str]]) -> Path:
    for level, names in files.items():
        d = root / "KernelBench" / f"level{level}"
        d.mkdir(parents=True)
        for name in names:
            (d / name).write_text(TASK.format(extra=""))
    (root / "KernelBench" / "level1" / "README.md").write_text("not a task")
    (root / "KernelBench" / "level1" / "helper.py").write_text("x = 1")  # not {id}_{Name}.py
    return root


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    level1 = [f"{i}_Op{i}.py" for i in (*REPRESENTATIVE[1], 2, 10)]
    level2 = ["1_Conv2d_ReLU_BiasAdd.py", "2_ConvTranspose_Clamp.py", "5_Gemm_Softmax.py"]
    return make_checkout(tmp_path, {1: level1, 2: level2})


def test_scan_finds_task_files_by_level_then_id(checkout: Path) -> None:
    refs = scan(checkout)
    assert levels_root(checkout) == checkout / "KernelBench" and levels_root(checkout / "KernelBench")
    assert [r.qualified for r in refs][:4] == ["level1/1_Op1", "level1/2_Op2", "level1/3_Op3", "level1/6_Op6"]
    assert refs[-1].qualified == "level2/5_Gemm_Softmax"
    assert not any(r.name == "helper" for r in refs)


def test_select_by_level_id_and_name(checkout: Path) -> None:
    assert [r.qualified for r in select(checkout, levels=[2])] == [
        "level2/1_Conv2d_ReLU_BiasAdd", "level2/2_ConvTranspose_Clamp", "level2/5_Gemm_Softmax"]
    assert [r.qualified for r in select(checkout, ids=[1, 2])] == [
        "level1/1_Op1", "level1/2_Op2", "level2/1_Conv2d_ReLU_BiasAdd", "level2/2_ConvTranspose_Clamp"]
    assert [r.qualified for r in select(checkout, names=["conv"])] == [
        "level2/1_Conv2d_ReLU_BiasAdd", "level2/2_ConvTranspose_Clamp"]


def test_representative_subset(checkout: Path) -> None:
    refs = select(checkout, levels=[1], subset="representative")
    assert [r.id for r in refs] == list(REPRESENTATIVE[1])
    with pytest.raises(TaskError, match=r"level2/8"):  # the checkout lacks most of level 2's subset
        select(checkout, levels=[2], subset="representative")
    with pytest.raises(TaskError, match="levels 1-3"):
        select(checkout, levels=[4], subset="representative")


def test_missing_ids_and_bad_paths_are_one_line_errors(checkout: Path, tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"level1/99"):
        select(checkout, levels=[1], ids=[1, 99])
    with pytest.raises(TaskError, match="no such directory"):
        select(tmp_path / "nowhere")
    with pytest.raises(TaskError, match="KernelBench checkout"):
        select(tmp_path / "KernelBench" / "level1")
    with pytest.raises(TaskError, match="unknown subset"):
        select(checkout, subset="tiny")
    with pytest.raises(TaskError, match="no task matches"):
        select(checkout, names=["attention"])


def test_loading_parses_without_running_anything(checkout: Path) -> None:
    bad = checkout / "KernelBench" / "level2" / "9_ImportsMissingModule.py"
    bad.write_text(TASK.format(extra="import a_module_that_does_not_exist"))
    tasks = load(select(checkout, levels=[2]))
    assert [t.name for t in tasks][-1] == "level2/9_ImportsMissingModule"  # parsed, never imported
    assert all("class Model" in t.source for t in tasks)
