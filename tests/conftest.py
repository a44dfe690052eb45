from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# helpers shared by test modules (search_helpers, llm_server, ...) live beside the tests
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def shared_build_dir() -> Iterator[str]:
    """One C++ build cache for the whole session: candidates with the same flags share a precompiled header
    (about 0.8 GB each, 35 s to build on 2 cores). Removed at the end."""
    path = tempfile.mkdtemp(prefix="stark-build-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _gpu_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _has_gpu() -> bool:
    return _gpu_count() > 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` need a CUDA GPU: skipped on machines without one (CI), run with ``-m gpu``."""
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """One local Ray for the session: 2 CPUs and the machine's GPUs (a logical one where there is none); its
    workers import the tests' and benchmarks' helpers (the scripted replies). Yields the GCS address, for drivers
    started in subprocesses."""
    ray = pytest.importorskip("ray")
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(repo), str(repo / "tests"), str(repo / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    gpus = _gpu_count() or 1
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
