"""A backend is one object: a new one, registered by its import path, is accepted by the config, tells the agents
its format, says what the doctor must check, and is what the evaluator's own processes (the judge, the worker) run —
the example of docs/architecture.md, "Adding a backend"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval import backends
from stark_ray.eval.backends import BUILT_IN, backend_class, backend_path, get_backend, register_backend
from stark_ray.eval.backends.requirements import CXX
from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task
from stark_ray.prompts.loader import system_prompt

TOY_MODULE = '''
"""toy: plain PyTorch candidates on the CPU (a backend of a package of one's own)."""

import os
from typing import Any, ClassVar

from stark_ray.eval.backends.cpu_cpp import CpuCppBackend
from stark_ray.eval.backends.requirements import CXX


class ToyBackend(CpuCppBackend):
    name: ClassVar[str] = "toy"
    target: ClassVar[str] = "plain PyTorch on a toy CPU"
    requirements: ClassVar[tuple[str, ...]] = (CXX,)

    def prepare_worker(self, build_dir, threads):
        super().prepare_worker(build_dir, threads)
        os.environ["TOY_WORKER"] = "prepared"  # the candidate below checks it ran in a toy worker

    def hardware_info(self) -> dict[str, Any]:
        return {**super().hardware_info(), "toy": "read in the judge"}

    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        return f"a toy CPU ({info.get('toy')})"
'''
TOY_PROMPT = "Write ModelNew in plain PyTorch, toy style.\n"

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''
import os
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if os.environ.get("TOY_WORKER") != "prepared":
            raise RuntimeError("not run by the toy backend's worker")
        return torch.addcmul(torch.ones_like(x), x, torch.full_like(x, 2.0))
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy backend's module and its prompt file in a directory on the path (this process's and, through
    PYTHONPATH, the evaluator's processes'), registered as ``toy``."""
    package = tmp_path / "site"
    package.mkdir()
    (package / "toy_backend.py").write_text(TOY_MODULE)
    (package / "toy_backend.txt").write_text(TOY_PROMPT)
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("PYTHONPATH", str(package))
    monkeypatch.setattr(backends, "_REGISTRY", dict(BUILT_IN))
    register_backend("toy", "toy_backend:ToyBackend")
    yield "toy"
    sys.modules.pop("toy_backend", None)


def test_a_registered_backend_is_offered_described_and_checked(toy: str) -> None:
    assert EvalConfig(backend=toy).backend == toy
    prompt = system_prompt("code", toy)
    assert "plain PyTorch on a toy CPU" in prompt and TOY_PROMPT.strip() in prompt
    assert get_backend(toy).needs() == (CXX,)
    # the evaluator's processes are given the import path: they need no registration of their own
    argv = WorkerSpec(toy, "/tmp/build", 1).argv()
    assert argv[argv.index("--backend") + 1] == "toy_backend:ToyBackend" == backend_path(toy)
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; choose one of .*toy"):
        backend_class("nope")  # the registry checks a name (config does not: the judge's process imports it)
    # an import path is a backend name too, without registration
    assert backend_class("toy_backend:ToyBackend").name == "toy"
    with pytest.raises(ValueError, match="cannot import"):
        backend_class("toy_backend:Missing")

    class Local(backends.Backend):  # defined in a function: no other process could import it
        pass

    with pytest.raises(ValueError, match="importable"):
        register_backend("local", Local)


def test_every_built_in_backend_is_one_class_with_its_prompt_and_needs() -> None:
    for name in BUILT_IN:
        cls = backend_class(name)
        assert cls.name == name and cls.target and cls.requirements
        assert "class ModelNew" in cls.prompt_section()


@pytest.mark.slow
def test_the_evaluator_runs_a_registered_backend_in_its_own_processes(toy: str, tmp_path: Path,
                                                                       shared_build_dir: str) -> None:
    path = tmp_path / "1_Affine.py"
    path.write_text(TASK)
    task = load_task(path)
    cfg = EvalConfig(backend=toy, build_dir=shared_build_dir, isolate="off", trials=2, warmup=1, timing_trials=5)
    with EvalService(cfg) as service:
        assert service.hardware_description() == "a toy CPU (read in the judge)"
        service.reference(task)
        result = service.evaluate(task, CANDIDATE)
    assert result.accepted, (result.stage, result.error, result.log)
