"""The precompiled header a flag set has earned is made in the service's background, never inside a candidate's
build: a header build that never returns charges no candidate. Its own service and build cache (fresh: the header
is due at the first build), apart from tests/test_eval.py's batch so that the two run side by side."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from eval_helpers import passed

from stark_ray.config import EvalConfig
from stark_ray.eval import Evaluator, load_task
from stark_ray.eval.service import EvalService

ROOT = Path(__file__).resolve().parents[1]
DEMO = "2_FusedSwishScaleClamp"
TASK = ROOT / "examples" / "tasks" / f"{DEMO}.py"
CANDIDATE = ROOT / "examples" / "candidates" / f"{DEMO}_fast.py"

pytestmark = pytest.mark.slow


def test_a_slow_shared_header_build_is_never_charged_to_a_candidate(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The precompiled header a flag set has earned is made in the service's background, never inside a
    candidate's build: here its compiler never returns (a host too busy to build it), and every candidate is still
    built, judged and timed — once a header build ran inside the candidate's request and used up its limit: the
    candidate was recorded a timeout, and so was every later one on that host."""
    import os
    import shutil
    import signal
    import stat

    real = shutil.which(os.environ.get("CXX") or "c++") or "c++"
    started = tmp_path / "header-build-started"
    wrapper = tmp_path / "slow-cxx"
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *c++-header*) echo $$ > {started}; exec sleep 3600;; esac\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("STARK_RAY_PCH_AFTER", "0")  # due at the first build
    cfg = EvalConfig(build_dir=str(tmp_path / "build"), isolate="off", trials=2, warmup=1, timing_trials=5,
                     compile_timeout_s=900, check_timeout_s=120, timing_timeout_s=120)
    source = CANDIDATE.read_text()
    try:
        with EvalService(cfg) as service:
            first = Evaluator(load_task(TASK), cfg, service=service).evaluate(source)
            assert passed(first), (first.stage, first.error)
            for _ in range(600):  # the header's build was started, after the candidate's, in the background
                if started.exists():
                    break
                time.sleep(0.1)
            assert started.exists()
            assert not service.wait_for_headers(0.1)  # ... and is still running: it never returns here
            again = Evaluator(load_task(TASK), cfg, service=service).evaluate(
                source.replace('name="fused_swish_scale_clamp"', 'name="fused_swish_second"'))
            assert passed(again), (again.stage, again.error)
    finally:
        if started.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(started.read_text()), signal.SIGKILL)
