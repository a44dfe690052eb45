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

# Most C++ candidates of the suite have the same flags, and the suite builds a few dozen of them into one cache:
# the precompiled torch/extension.h pays from the second build of a flag set on (on 2 cores a build took 67 s
# without it and 29 s with it; the header, once, about 75 s). From the second, not the first: a flag set that only
# one test builds never pays for a header (one did, 40 s of CPU for nothing, 2026-12-04). A run keeps the default
# (eval/build/pch.py: after three builds).
os.environ.setdefault("STARK_RAY_PCH_AFTER", "1")


# One C++ build cache for the whole test run, shared by pytest-xdist's workers: candidates with the same flags share a
# precompiled header (about 0.8 GB each, a minute to build on 2 cores) and every build is made once. Made by the
# process that starts the run (the workers inherit the variable) and removed by it at the end; one the user set
# (STARK_TEST_BUILD_DIR=~/.cache/stark-test-builds) is kept, so that the next run starts with every build made.
BUILD_DIR_ENV = "STARK_TEST_BUILD_DIR"
_made_build_dir: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep LONGEST_FIRST's order (below), which
        config.option.loadscopereorder = False  # it would otherwise replace by the number of tests per module
    if BUILD_DIR_ENV not in os.environ:
        os.environ[BUILD_DIR_ENV] = tempfile.mkdtemp(prefix="stark-build-test-")
        _made_build_dir.append(os.environ[BUILD_DIR_ENV])


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _made_build_dir:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(BUILD_DIR_ENV, None)


@pytest.fixture(scope="session")
def shared_build_dir() -> str:
    """The test run's C++ build cache (above)."""
    path = os.environ[BUILD_DIR_ENV]
    os.makedirs(path, exist_ok=True)
    return path


def _gpu_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _has_gpu() -> bool:
    return _gpu_count() > 0


# The modules that take longest on a 2-core machine (their C++ builds, whole searches, Ray starts), longest first
# (measured under pytest-xdist, 2026-12-03), run first, so that under pytest-xdist (-n 4 --dist loadfile, the
# README's command) the last module to start is a short one and no worker idles at the end. The others keep their
# order after these.
LONGEST_FIRST = ("test_eval.py", "test_optimize.py", "test_header_builds.py", "test_ray_runtime.py", "test_cli.py",
                 "test_local_ray.py",
                 "test_eval_warm.py", "test_campaign.py", "test_read_only_world.py", "test_integrity.py",
                 "test_executors.py", "test_cli_runs.py", "test_s3_runs.py", "test_eval_sandbox.py",
                 "test_hostile_channel.py", "test_lifetime.py", "test_build_integrity.py", "test_doctor.py",
                 "test_resume.py", "test_parser.py", "test_compile_pool.py", "test_ray_driver.py", "test_analysis.py",
                 "test_kernelbench_data.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (above); tests marked ``gpu`` need a CUDA GPU: skipped on machines without one
    (CI), run with ``-m gpu``."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# Credentials for the local S3 server of s3_root (which accepts any), set in the test process while it runs
S3_TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "stark-test", "AWS_SECRET_ACCESS_KEY": "stark-test",
                       "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A local S3-compatible server (moto) on 127.0.0.1 for the session; yields its ``host:port``. The test
    process gets the credentials above while it runs."""
    import socket
    import subprocess
    import time
    import urllib.request

    import moto.server  # a dev dependency: a missing one fails here, it does not skip the S3 tests

    if moto.__version__ in ("5.2.0", "5.2.1"):  # excluded in pyproject.toml's dev extras: see the note there
        raise RuntimeError(f"moto {moto.__version__} breaks every multipart upload to S3 (getmoto/moto#10055); "
                           'pip install -e ".[dev]" to get a fixed one')

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    saved = {k: os.environ.get(k) for k in S3_TEST_CREDENTIALS}
    os.environ.update(S3_TEST_CREDENTIALS)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"the S3 server did not start: {log.read()[-2000:]!r}") from None
                    time.sleep(0.2)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def s3_root(s3_server: str, request: pytest.FixtureRequest) -> str:
    """A fresh bucket on the local S3 server, as the URI a user would give: ``s3://<bucket>/runs?...``."""
    import re
    import uuid

    import pyarrow.fs as pafs

    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    options = f"endpoint_override={s3_server}&scheme=http&region=us-east-1"
    fs, _ = pafs.FileSystem.from_uri(f"s3://{bucket}?{options}&allow_bucket_creation=true")
    fs.create_dir(bucket)
    return f"s3://{bucket}/runs?{options}"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """One local Ray for the session: 2 CPUs and the machine's GPUs (a logical one where there is none); its
    workers import the tests' and benchmarks' helpers (the scripted replies). Yields the GCS address, for drivers
    started in subprocesses."""
    import ray

    from stark_ray.run.placement import connect, disconnect

    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(repo), str(repo / "tests"), str(repo / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    gpus = _gpu_count() or 1
    # the cluster's processes must not inherit the S3 credentials (should s3_server have set them already): a run
    # directory on S3 works only if the driver forwards them to its TreeMemory actor, as on a real cluster
    hidden = {k: os.environ.pop(k) for k in S3_TEST_CREDENTIALS if k in os.environ}
    try:
        connect(None, runtime_env={"env_vars": {"PYTHONPATH": path}}, num_cpus=2, num_gpus=gpus)
    finally:
        os.environ.update(hidden)
    yield ray.get_runtime_context().gcs_address
    disconnect()
