"""The evaluator end to end: each kind of candidate in a real worker process.

C++ builds cost 10-25 s each on a 2-core machine, so the candidates are evaluated once, several at a time,
in a module-scoped fixture sharing one build cache (and its precompiled header); the tests then inspect the
results. Timing-sensitive checks re-evaluate alone, after the batch.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from eval_helpers import passed

from stark_ray.config import EvalConfig
from stark_ray.eval import Evaluator, Task, TaskError, load_task
from stark_ray.eval.service import EvalService
from stark_ray.records import (
    STAGE_COMPILE,
    STAGE_CORRECTNESS,
    STAGE_CRASH,
    STAGE_OK,
    STAGE_RUNTIME,
    STAGE_TIMEOUT,
    EvalResult,
)

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks"
CANDIDATES = ROOT / "examples" / "candidates"
DEMO = "2_FusedSwishScaleClamp"

pytestmark = pytest.mark.slow

# pure-Python candidates for the demo task (no build): the eager chain, plus one misbehaviour each
EAGER = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features, scale, lo, hi):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale, self.lo, self.hi = scale, lo, hi

    def forward(self, x):
        {before}
        y = x * self.scale + self.bias
        y = torch.clamp(y * torch.sigmoid(y), self.lo, self.hi)
        out = y * x + x
        {after}
        return out
"""


def eager(before: str = "pass", after: str = "pass", prelude: str = "") -> str:
    return prelude + EAGER.format(before=before, after=after)


PY_CANDIDATES = {
    "py_segfault": eager(before="import ctypes; ctypes.string_at(0)"),
    "py_exit_at_import": eager(prelude="import os\nos._exit(3)\n"),
    "py_sys_exit_in_forward": eager(before="import sys; sys.exit(1)"),
    "py_hang_in_forward": eager(before="while True: pass"),
    "py_hang_at_import": eager(prelude="while True:\n    pass\n"),
    "py_mutates_input": eager(after="x.zero_()"),
    "py_raises": eager(before="raise ValueError('bad block size')"),
}
CPP_CANDIDATES = {
    "fast": (DEMO, f"{DEMO}_fast.py"),
    "compile_error": (DEMO, f"{DEMO}_compile_error.py"),
    "wrong": (DEMO, f"{DEMO}_wrong.py"),
    "segfault": (DEMO, f"{DEMO}_segfault.py"),
    "hang": (DEMO, f"{DEMO}_hang.py"),
    "leaky_relu": ("1_LeakyReluScale", "1_LeakyReluScale_fast.py"),
    "layer_norm": ("6_ResidualLayerNorm", "6_ResidualLayerNorm_fast.py"),
}
SHORT_RUN = {"hang", "py_hang_in_forward", "py_hang_at_import"}  # evaluated with short timeouts

# A task whose output is nearly constant for standard-normal inputs: a constant candidate passes the plain
# trials and only the scaled-up trial exposes it.
GENTLE_GATE_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x * 0.01)


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
"""
CONSTANT_CANDIDATE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.full_like(x, 0.5)
"""


@pytest.fixture(scope="module")
def build_dir(shared_build_dir: str) -> str:
    return shared_build_dir


@pytest.fixture(scope="module")
def cfg(build_dir: str) -> EvalConfig:
    # builds get 15 minutes: four evaluations compile at once here, and on a busy 2-core box a build that takes
    # 60-90 s alone took more than 300 s
    return EvalConfig(build_dir=build_dir, trials=5, warmup=2, timing_trials=10, check_timeout_s=90,
                      compile_timeout_s=900)


@pytest.fixture(scope="module")
def short_cfg(cfg: EvalConfig) -> EvalConfig:
    # short where the candidate hangs; its build keeps the generous limit (a busy 2-core box, builds in parallel)
    return replace(cfg, check_timeout_s=10, timing_timeout_s=10)


def task(name: str) -> Task:
    return load_task(TASKS / f"{name}.py")


@pytest.fixture(scope="module")
def service(cfg: EvalConfig) -> Iterator[EvalService]:
    """One evaluator for the module's candidates (each evaluation takes its own settings: timeouts, tolerance; the
    isolation and the build cache are the service's): a service per candidate started three processes each."""
    with EvalService(cfg) as svc:
        yield svc


@pytest.fixture(scope="module")
def results(service: EvalService, cfg: EvalConfig, short_cfg: EvalConfig) -> dict[str, EvalResult]:
    """Every candidate kind, sent at once (builds and evaluations take their turns in the one service)."""
    jobs: dict[str, Callable[[], EvalResult]] = {}
    for key, (task_name, file) in CPP_CANDIDATES.items():
        ev = Evaluator(task(task_name), short_cfg if key in SHORT_RUN else cfg, service=service)
        jobs[key] = lambda ev=ev, src=(CANDIDATES / file).read_text(): ev.evaluate(src)
    for key, source in PY_CANDIDATES.items():
        c = replace(short_cfg, compile_timeout_s=8, compile_timeout_scale=0) if key in SHORT_RUN else cfg
        jobs[key] = lambda ev=Evaluator(task(DEMO), c, service=service), src=source: ev.evaluate(src)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def test_fast_candidate_is_correct(results: dict[str, EvalResult]) -> None:
    r = results["fast"]
    assert r.stage == STAGE_OK and passed(r), r.error  # evaluated beside others: timing noise may flag it
    assert r.compiled and r.passed_checks and r.runtime_ms and r.ref_runtime_ms and r.speedup
    assert r.max_abs_err is not None and r.max_abs_err < 1e-3
    assert r.compile_s and r.eval_s and r.eval_s >= r.compile_s


@pytest.mark.parametrize("key", ["leaky_relu", "layer_norm"])
def test_other_tasks_candidates_are_correct(results: dict[str, EvalResult], key: str) -> None:
    r = results[key]
    assert r.passed_checks and r.stage == STAGE_OK, r.error
    assert r.speedup is not None and r.speedup > 0
    # four evaluations share the 2 cores here: a worker's timing can overstate a speedup (a 1.4x layer norm came
    # out at 3.57x, reference CV 42%), and then the judge's own clock flags it; no other flag is acceptable
    assert set(r.flags) <= {"suspicious"}, (r.flags, r.error)


def test_compile_error_reports_the_compiler(results: dict[str, EvalResult]) -> None:
    r = results["compile_error"]
    assert r.stage == STAGE_COMPILE and not r.compiled and not r.passed_checks
    assert r.error is not None and "\n" not in r.error
    assert r.error.startswith("main.cpp:") and "error:" in r.error and "feature" in r.error
    assert "was not declared" in r.log and "error:" in r.log


def test_wrong_candidate_fails_correctness(results: dict[str, EvalResult]) -> None:
    r = results["wrong"]
    assert r.stage == STAGE_CORRECTNESS and r.compiled and not r.passed_checks
    assert r.max_abs_err is not None and r.max_abs_err > 0.01 and r.rel_err is not None
    assert r.error is not None and r.error.startswith("trial 1/5: output: values differ")


@pytest.mark.parametrize("key", ["segfault", "py_segfault"])
def test_segfault_is_a_crash(results: dict[str, EvalResult], key: str) -> None:
    r = results[key]
    assert r.stage == STAGE_CRASH and not r.passed_checks
    assert r.error is not None and "SIGSEGV" in r.error and "candidate.py:" in r.error
    assert "Segmentation fault" in r.log


def test_exit_at_import_is_a_crash(results: dict[str, EvalResult]) -> None:
    r = results["py_exit_at_import"]
    assert r.stage == STAGE_CRASH and not r.compiled
    assert r.error == "worker exited with code 3 before reporting while importing (building) the candidate"


def test_sys_exit_in_forward_is_caught(results: dict[str, EvalResult]) -> None:
    r = results["py_sys_exit_in_forward"]
    assert r.stage == STAGE_RUNTIME and r.compiled and not r.passed_checks
    assert r.error == "trial 1/5: SystemExit: 1 (candidate.py:13)"


def test_exception_in_forward_is_a_runtime_failure(results: dict[str, EvalResult]) -> None:
    r = results["py_raises"]
    assert r.stage == STAGE_RUNTIME
    assert r.error == "trial 1/5: ValueError: bad block size (candidate.py:13)"
    assert "candidate.py" in r.log and "Traceback" in r.log


@pytest.mark.parametrize("key", ["hang", "py_hang_in_forward"])
def test_hang_in_forward_times_out(results: dict[str, EvalResult], key: str) -> None:
    r = results[key]
    assert r.stage == STAGE_TIMEOUT and r.compiled and not r.passed_checks, r.error
    assert r.error is not None and r.error.startswith("timed out after 10 s while running the correctness trials")
    assert "at candidate.py:" in r.error  # where it was stuck, from the stack dump before the kill


def test_hang_at_import_hits_the_compile_timeout(results: dict[str, EvalResult]) -> None:
    r = results["py_hang_at_import"]
    assert r.stage == STAGE_TIMEOUT and not r.compiled
    assert r.error is not None and r.error.startswith("timed out after 8 s while importing (building)")


def test_input_mutation_fails(results: dict[str, EvalResult]) -> None:
    r = results["py_mutates_input"]
    assert r.stage == STAGE_CORRECTNESS
    assert r.error == "trial 1/5: the candidate modified its inputs"


def test_same_extension_name_never_collides(results: dict[str, EvalResult], build_dir: str) -> None:
    # compile_error, wrong, segfault and hang all call load_inline(name="fused_swish", ...)
    assert {results[k].stage for k in ("compile_error", "wrong", "segfault", "hang")} == {
        STAGE_COMPILE, STAGE_CORRECTNESS, STAGE_CRASH, STAGE_TIMEOUT}
    swish_builds = [p for p in Path(build_dir).iterdir()
                    if any(re.fullmatch(r"fused_swish_[0-9a-f]{16}\.so", f.name) for f in p.glob("*.so"))]
    assert len(swish_builds) == 3  # wrong, segfault, hang (the compile error produced no library)


def test_second_evaluation_hits_the_build_cache(results: dict[str, EvalResult], cfg: EvalConfig,
                                                service: EvalService) -> None:
    # no new build: the cache's entries are the same after it (a busy box timed a cache hit at 142 s: the test
    # asked for under 5 s)
    # (the cache is shared with the suite's other modules, which may build meanwhile: its own library is counted)
    def own() -> list[str]:
        return sorted(p.name for p in Path(cfg.build_dir or "").glob("*/fused_swish_scale_clamp_*.so"))

    libraries = own()
    again = Evaluator(task(DEMO), cfg, service=service).evaluate((CANDIDATES / f"{DEMO}_fast.py").read_text())
    assert passed(again), again.error
    assert results["fast"].compile_s is not None and again.compile_s is not None
    assert own() == libraries and libraries


def test_reference(results: dict[str, EvalResult], cfg: EvalConfig, service: EvalService) -> None:
    ev = Evaluator(task(DEMO), cfg, service=service)
    ref = ev.reference()
    assert ref.accepted and ref.stage == STAGE_OK and ref.speedup == 1.0
    assert ref.runtime_ms is not None and ref.runtime_ms == ref.ref_runtime_ms and ref.runtime_ms > 0
    assert "CPU" in ev.hardware_description()
    # where its seconds went: the task's set-up in the judge, the judge's paces, the timing in a worker
    assert re.search(r"evaluator time: (ahead/[a-z]+ [0-9.]+ s, )?task [0-9.]+ s, pace/before [0-9.]+ s, "
                     r"(start/(spare|unready|fresh) [0-9.]+ s, )?timing [0-9.]+ s, pace/after [0-9.]+ s",
                     ref.log), ref.log
    assert re.search(r"worker time: setup [0-9.]+ s, sets [0-9.]+ s, timing [0-9.]+ s", ref.log), ref.log


def test_reference_failure_is_a_task_error(tmp_path: Path, cfg: EvalConfig, service: EvalService) -> None:
    path = tmp_path / "8_Broken.py"
    path.write_text(GENTLE_GATE_TASK.replace("return torch.sigmoid(x * 0.01)",
                                             "return x @ torch.ones(3, 3)"))
    with pytest.raises(TaskError) as e:
        Evaluator(load_task(path), cfg, service=service).reference()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("task 8_Broken: reference forward failed: RuntimeError: ")


def test_constant_output_fails_the_scaled_trial(tmp_path: Path, cfg: EvalConfig, service: EvalService) -> None:
    path = tmp_path / "9_GentleGate.py"
    path.write_text(GENTLE_GATE_TASK)
    # the paper's tolerance alone (allclose 1e-2, normalized error 1e-2) passes the constant on plain inputs:
    # the scaled trial catches it
    r = Evaluator(load_task(path), replace(cfg, tolerance="kernelbench"), service=service).evaluate(CONSTANT_CANDIDATE)
    assert r.stage == STAGE_CORRECTNESS
    assert r.error is not None and r.error.startswith("trial 5/5 (inputs x4): output: values differ")
    # the default float32 bound on the normalized error (1e-3) already catches it on the first trial
    r = Evaluator(load_task(path), cfg, service=service).evaluate(CONSTANT_CANDIDATE)
    assert r.stage == STAGE_CORRECTNESS
    assert r.error is not None and r.error.startswith("trial 1/5: output: normalized error")


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


def test_build_timeout_kills_the_compiler_and_leaves_no_lock(results: dict[str, EvalResult],
                                                            cfg: EvalConfig, service: EvalService) -> None:
    source = (CANDIDATES / f"{DEMO}_fast.py").read_text().replace(
        'name="fused_swish_scale_clamp"', 'name="killed_build"')
    ev = Evaluator(task(DEMO), replace(cfg, compile_timeout_s=4, compile_timeout_scale=0), service=service)
    r = ev.evaluate(source)
    assert r.stage == STAGE_TIMEOUT and not r.compiled
    # told as the build's time, beside the other builds' (the batch above built seven), not as a thread dump
    assert r.error == "the build did not finish within its time limit of 4 s (--compile-timeout)", r.log
    assert "other candidates' builds on this evaluator took" in r.log, r.log
    assert "most recent call first" not in r.log and 'File "' not in r.log
    deadline = time.monotonic() + 3  # SIGKILL is delivered asynchronously
    while _processes_mentioning("killed_build_") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning("killed_build_")  # the compiler went down with the worker
    again = Evaluator(task(DEMO), cfg, service=service).evaluate(source)  # the killed build's leftovers: no block
    assert passed(again), again.error


def test_precompiled_header_serves_sources_that_include_torch_extension_themselves(
        results: dict[str, EvalResult], cfg: EvalConfig, service: EvalService) -> None:
    # the batch above built the header for these flags (seven builds); most real candidates start with
    # `#include <torch/extension.h>`, a second include after load_inline's own, which gcc resolves beside the .gch
    source = (CANDIDATES / f"{DEMO}_fast.py").read_text()
    source = source.replace('cpp_source = r"""\n', 'cpp_source = r"""\n#include <torch/extension.h>\n', 1)
    source = source.replace('name="fused_swish_scale_clamp"', 'name="fused_swish_own_include"')
    assert source.count("#include <torch/extension.h>") == 1 and "fused_swish_own_include" in source
    assert service.wait_for_headers(1500)  # made in the service's background (niced), outside any candidate's time
    pch = Path(cfg.build_dir or "") / "pch"
    failed = [f.read_text()[-2000:] for f in pch.glob("*/FAILED")]
    assert list(pch.glob("*/torch/extension.h.gch")), (sorted(p.name for p in pch.iterdir()), failed)
    result = Evaluator(task(DEMO), cfg, service=service).evaluate(source)
    assert passed(result), result.log
    assert "-Winvalid-pch" not in result.log
