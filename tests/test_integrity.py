"""Kernels written to fool the evaluator, on the CPU, through real worker and judge processes: each is rejected,
and the next honest candidate in the same evaluator is judged right.

- a reduction over a part of its input (every 16th element; the first 1/16): right on i.i.d. inputs, caught by
  the sensitivity and blocks trials;
- an output cache keyed by the input's address: caught by the same-address trial;
- a candidate that rebinds functions of every evaluator module it can reach (a ``sys.modules`` walk), that
  replaces ``torch.allclose``, or that patches ``time.perf_counter`` to hide its time: the fingerprint catches the
  patch, and with the fingerprint defeated as well the judge's own comparison and clock still decide.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from eval_helpers import ended, passed

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import Task, load_task
from stark_ray.records import STAGE_CORRECTNESS, EvalResult

pytestmark = pytest.mark.slow

MSE_TASK = '''"""Mean squared error over 4M elements (a scalar)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.rand(4096, 1024) * 2.0, torch.rand(4096, 1024)]


def get_init_inputs():
    return []
'''

# one extension for every C++ candidate here (built once): the MSE over every element, every 16th, or the first
# 1/16; and an affine map that caches its output by the input's address
KERNELS_CPP = r"""
#include <torch/extension.h>

torch::Tensor mse(torch::Tensor a, torch::Tensor b, int64_t stride, bool prefix) {
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    const float* pa = ac.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    const int64_t n = ac.numel();
    const int64_t end = prefix ? n / 16 : n;
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t i = 0; i < end; i += stride) {
        const double d = (double)pa[i] - (double)pb[i];
        sum += d * d;
        ++count;
    }
    return torch::full({}, (float)(sum / (double)count), ac.options());
}

#include <unordered_map>

static std::unordered_map<const void*, torch::Tensor> cache;  // output by the input's address

torch::Tensor affine(torch::Tensor x, double s, double t) {
    auto xc = x.contiguous();
    const void* key = xc.data_ptr();
    auto hit = cache.find(key);
    if (hit != cache.end()) return hit->second.clone();
    auto out = torch::empty_like(xc);
    const float* px = xc.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) po[i] = px[i] * (float)s + (float)t;
    cache[key] = out.clone();
    return out;
}
"""

_LOAD = ('''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""''' + KERNELS_CPP + '''"""

# the examples' flags: the suite's C++ builds share one precompiled header (a flag set of its own costs a minute)
_ext = load_inline(name="integrity_kernels", cpp_sources=_CPP, functions=["mse", "affine"],
                   extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"], extra_ldflags=["-fopenmp"])
''')

MSE_CANDIDATE = _LOAD + '''

class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets, STRIDE, PREFIX)
'''


def mse_candidate(stride: int, prefix: bool) -> str:
    return f"STRIDE = {stride}\nPREFIX = {prefix}\n" + MSE_CANDIDATE


AFFINE_TASK = '''"""Elementwise: y = x * s + t over 64K floats."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, s: float, t: float):
        super().__init__()
        self.s, self.t = s, t

    def forward(self, x):
        return x * self.s + self.t


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return [1.5, 0.25]
'''

ADDRESS_CACHE = _LOAD + '''

class ModelNew(nn.Module):
    def __init__(self, s, t):
        super().__init__()
        self.s, self.t = s, t

    def forward(self, x):
        return _ext.affine(x, self.s, self.t)
'''

AFFINE_PY = '''
import sys
import time
import types

import torch
import torch.nn as nn
{prelude}

class ModelNew(nn.Module):
    def __init__(self, s, t):
        super().__init__()
        self.s, self.t = s, t

    def forward(self, x):
        {body}
'''

HONEST = "return torch.addcmul(torch.full_like(x, self.t), x, torch.full_like(x, self.s))"
ZEROS = "return torch.zeros_like(x)"

# the fingerprint of the worker, made blind: what a candidate would do first if it knew the evaluator
BLIND = '''
for _name, _mod in list(sys.modules.items()):
    if _name.startswith("stark_ray") and hasattr(_mod, "Fingerprint"):
        _mod.Fingerprint.changed = lambda self: []
'''

# every function of every evaluator module that compares or checks, rebound to say "fine" in its own terms
REBIND_ALL = '''
class _Fine:
    ok = True
    problem = ""
    max_abs_err = 0.0
    rel_err = 0.0


_SAYS_FINE = {"compare": lambda *a, **k: _Fine(), "problem": lambda *a, **k: None, "check": lambda *a, **k: None,
              "same": lambda *a, **k: True, "identical": lambda *a, **k: True, "close": lambda *a, **k: True,
              "equal": lambda *a, **k: True, "changed": lambda *a, **k: []}

for _name, _mod in list(sys.modules.items()):
    if not _name.startswith("stark_ray") or not isinstance(_mod, types.ModuleType):
        continue
    for _attr, _value in list(vars(_mod).items()):
        for _word, _fine in _SAYS_FINE.items():
            if isinstance(_value, types.FunctionType) and _word in _attr:
                setattr(_mod, _attr, _fine)
                break
'''

ALLCLOSE = '''
torch.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, *args, **kwargs: torch.ones_like(a, dtype=torch.bool)
torch.equal = lambda *a, **k: True
'''

MATMUL_TASK = '''"""A matrix product of 384 x 384 (a few ms on a CPU)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        return x @ self.w


def get_inputs():
    return [torch.randn(384, 384)]


def get_init_inputs():
    return [384]
'''

MATMUL_PY = '''
import sys
import time
import types

import torch
import torch.nn as nn
{prelude}

class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        {body}
'''

# hides 80% of the time forward takes from time.perf_counter (which the CPU timer reads): an honest 1x claims 5x
HIDE_TIME = '''
_real = time.perf_counter
_hidden = [0.0]
time.perf_counter = lambda: _real() - _hidden[0]
'''
HIDE_BODY = '''started = _real()
        out = x @ self.w
        _hidden[0] += 0.8 * (_real() - started)
        return out'''


def matmul(body: str, prelude: str = "") -> str:
    return MATMUL_PY.format(body=body, prelude=prelude)


def py(body: str, prelude: str = "") -> str:
    return AFFINE_PY.format(body=body, prelude=prelude)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Task]:
    root = tmp_path_factory.mktemp("tasks")
    (root / "1_Mse.py").write_text(MSE_TASK)
    (root / "2_Affine.py").write_text(AFFINE_TASK)
    (root / "3_Matmul.py").write_text(MATMUL_TASK)
    return {name: load_task(root / f"{i}_{name.title()}.py") for i, name in enumerate(("mse", "affine", "matmul"), 1)}


@pytest.fixture(scope="module")
def service(shared_build_dir: str) -> Iterator[EvalService]:
    # a warm worker (64 candidates, the CPU's default before): what a candidate did must end it even there
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=10, check_timeout_s=120,
                     timing_timeout_s=120, tolerance="kernelbench", worker_candidates=64)
    with EvalService(cfg) as svc:
        yield svc


def judged(service: EvalService, task: Task, source: str) -> EvalResult:
    return service.evaluate(task, source)


def test_a_reduction_over_part_of_its_input_fails_and_the_whole_one_passes(service: EvalService,
                                                                          tasks: dict[str, Task]) -> None:
    """The paper's tolerance (1e-2) lets a mean over every 16th element pass on i.i.d. inputs (error ~0.2%);
    the sensitivity trial (a few elements multiplied strongly) and the blocks trial do not."""
    task = tasks["mse"]
    strided = judged(service, task, mse_candidate(16, False))
    prefix = judged(service, task, mse_candidate(1, True))
    honest = judged(service, task, mse_candidate(1, False))
    assert passed(honest), honest.error
    for cheat in (strided, prefix):
        assert cheat.stage == STAGE_CORRECTNESS and not cheat.accepted, cheat.error
        assert (cheat.error or "").startswith(("sensitivity trial", "blocks trial")), cheat.error
    assert "sensitivity trial" in (strided.error or "")


def test_an_output_cache_keyed_by_address_fails_the_same_address_trial(service: EvalService,
                                                                      tasks: dict[str, Task]) -> None:
    r = judged(service, tasks["affine"], ADDRESS_CACHE)
    assert r.stage == STAGE_CORRECTNESS and not r.accepted, r.error
    assert "values differ" in (r.error or ""), r.error  # a stale output, on whichever trial reused the address
    assert passed(judged(service, tasks["affine"], py(HONEST)))


@pytest.mark.parametrize(("name", "task", "source"), [
    ("rebinds every checking function of the evaluator", "affine", py(ZEROS, REBIND_ALL)),
    ("replaces torch.allclose, isclose and equal", "affine", py(ZEROS, ALLCLOSE)),
    ("patches time.perf_counter", "matmul", matmul(HIDE_BODY, HIDE_TIME)),
])
def test_a_candidate_that_patches_the_process_is_rejected_as_tampering(
        service: EvalService, tasks: dict[str, Task], name: str, task: str, source: str) -> None:
    for timed in {task, "affine"}:  # their references alone timed first (a task's first candidate would, in a
        service.reference(tasks[timed])  # fresh worker, where this judge has not: a start more to count)
    live = judged(service, tasks["affine"], py(HONEST))
    assert passed(live)
    starts = service.worker_starts + ended(live)  # a worker for the cheat: a start more where live's was ended
    r = judged(service, tasks[task], source)
    assert not r.accepted and "tampered" in r.flags, (name, r.stage, r.error)
    after = judged(service, tasks["affine"], py(HONEST))
    assert passed(after), after.error
    assert service.worker_starts == starts + 1  # its worker was replaced


@pytest.mark.parametrize(("name", "task", "source", "verdict"), [
    ("rebinds every checking function, returns zeros", "affine", py(ZEROS, BLIND + REBIND_ALL), "correctness"),
    ("replaces torch.allclose, returns zeros", "affine", py(ZEROS, BLIND + ALLCLOSE), "correctness"),
    ("hides 80% of its time from perf_counter", "matmul", matmul(HIDE_BODY, BLIND + HIDE_TIME), "suspicious"),
])
def test_with_the_fingerprint_blinded_the_judge_still_decides(
        service: EvalService, tasks: dict[str, Task], name: str, task: str, source: str, verdict: str) -> None:
    """The fingerprint is a backstop: blinded, the worker reports nothing, and still the judge — its own
    comparison with its own reference outputs, its own clock — rejects the candidate, or records no more than its
    own clock saw; a claim not borne out either way ends the worker it patched (one recorded at the judge's 1.01x
    once left its patches to the next candidate, which then passed a same-address trial it fails)."""
    service.reference(tasks[task])
    live = judged(service, tasks["affine"], py(HONEST))  # a live worker, which the cheat then gets (or, where the
    assert passed(live)  # judge ended live's for its figure of record, a fresh one: a start more)
    starts = service.worker_starts + ended(live)
    r = judged(service, tasks[task], source)
    assert "tampered" not in r.flags, f"{name}: {r.stage} {r.flags} {r.error}\n{r.log}"
    if verdict == "correctness":
        assert not r.accepted and r.stage == STAGE_CORRECTNESS and "values differ" in (r.error or ""), (name, r.error)
    elif r.accepted:  # a busy host: the judge's figure stands (its readings parted, or a claim of 2x or less)
        # never the worker's claim: the judge's own figure, which is what its clock saw of a 1.0x matmul — on a
        # loaded box once 2.17x (both readings: a Known limit of docs/evaluator.md), so no bound on it here; or a
        # claim so noisy that it counts only as far as its interval shows (before any clock of the judge's)
        capped = "a noisy gain counts as far as its interval shows" in (r.notes or "")
        assert "its figure stands" in (r.notes or "") or capped, r.notes
        if not capped:
            assert r.runtime_cv is None and r.speedup_err is None, r.notes  # the worker's figures all replaced
    else:
        assert "suspicious" in r.flags and "judge's wall clock" in (r.error or ""), (name, r.flags, r.error)
        assert r.speedup is not None and r.speedup > 2  # what the patched clock made the worker believe
        # a claim the wall clock does not bear out is measured once more (where the clock leaves time): a cheat
        # fails both
        assert ("measured again, its rounds pooled with the first's: suspicious" in (r.error or "")
                or "no time left" in (r.error or "")), r.error
    after = judged(service, tasks["affine"], py(HONEST))
    assert passed(after), after.error
    assert verdict == "correctness" or service.worker_starts == starts + 1  # its worker was replaced


@pytest.mark.parametrize(("off", "task", "source"), [
    (("sensitivity_trial", "blocks_trial"), "mse", mse_candidate(16, False)),  # a mean over every 16th element
    (("confirmation",), "matmul", matmul(HIDE_BODY, BLIND + HIDE_TIME)),  # 80% of its time hidden, blinded
])
def test_each_cheat_is_stopped_by_its_row_of_the_defence_table(service: EvalService, tasks: dict[str, Task],
                                                                off: tuple[str, ...], task: str, source: str) -> None:
    """The rows of the defence table are what stop these cheats: with them switched off (EvalConfig.defences_off,
    for tests and ablations) the same candidate gets past them — the sampled mean passes its checks, the hidden
    time is accepted — its result flagged ``defences_off`` with the rows named in its log; with them on it does not
    (the tests above: the special trials' verdict is certain, the judge's clock a measurement). A name the table
    does not hold is an error, not a switch silently ignored."""
    r = service.evaluate(tasks[task], source, replace(service.cfg, defences_off=off))
    assert "defences_off" in r.flags, r.flags
    assert f"defences switched off (EvalConfig.defences_off): {', '.join(sorted(off))}" in (r.log or ""), r.log
    if "confirmation" in off:
        assert r.accepted, (r.stage, r.flags, r.error)
    else:  # past its checks (its 16x less work may still be judged by the clock: not this row's verdict)
        assert r.passed_checks and r.stage == "ok", (r.stage, r.error)
        on = judged(service, tasks[task], source)
        assert not on.passed_checks and (on.error or "").startswith("sensitivity trial"), (on.stage, on.error)
    with pytest.raises(ValueError, match="no defence named"):
        service.evaluate(tasks[task], source, replace(service.cfg, defences_off=("sensitivty_trial",)))


# one output buffer per shape, written and returned by every call: each output is right when it is returned
REUSED_BUFFER = ("buf = _BUFS.get(tuple(x.shape))\n"
                 "        if buf is None:\n"
                 "            buf = _BUFS[tuple(x.shape)] = torch.empty_like(x)\n"
                 "        torch.mul(x, self.s, out=buf)\n"
                 "        return buf.add_(self.t)")
# an earlier output written later: each call adds one to the output it handed out before (a running buffer that
# mutates what it gave away)
WRITES_EARLIER = ("out = x * self.s + self.t\n"
                  "        for old in _HANDED:\n"
                  "            old.mul_(1.0)\n"
                  "            old.add_(1.0)\n"
                  "        _HANDED[:] = [out]\n"
                  "        return out")


def test_an_output_buffer_reused_by_every_call_fails_and_an_earlier_output_must_stay_intact(
        service: EvalService, tasks: dict[str, Task]) -> None:
    """Every output is right when it is returned, and each is compared before the next call: only the first
    output kept through the next call shows that a caller keeping two has the first overwritten."""
    reused = judged(service, tasks["affine"], py(REUSED_BUFFER, "_BUFS: dict[tuple[int, ...], torch.Tensor] = {}"))
    assert reused.stage == STAGE_CORRECTNESS and not reused.accepted, (reused.stage, reused.error)
    assert "shares memory with its output of the previous call" in (reused.error or ""), reused.error
    assert (reused.error or "").startswith("same-address trial"), reused.error
    written = judged(service, tasks["affine"], py(WRITES_EARLIER, "_HANDED: list[torch.Tensor] = []"))
    assert written.stage == STAGE_CORRECTNESS and "changed during this call" in (written.error or ""), written.error
    honest = judged(service, tasks["affine"], py(HONEST))
    assert passed(honest), honest.error


# correct until the timing's calls have shown it the same inputs a few times (its rotating sets), then wrong on
# inputs it never saw: a state the timed calls filled (a cache, a count), which the trials before it never reach
WRONG_AFTER_TIMING = (
    "key = float(x.sum())\n"
    "        _SEEN[key] = _SEEN.get(key, 0) + 1\n"
    "        out = x @ self.w\n"
    "        return out * 1.05 if max(_SEEN.values()) >= 3 and _SEEN[key] == 1 else out")


def test_a_candidate_wrong_once_timed_fails_the_trial_after_the_timing(service: EvalService,
                                                                       tasks: dict[str, Task]) -> None:
    """The judge's trial after the timing, on fresh inputs: a candidate correct through every trial and the timed
    calls (each checked in the worker) and wrong after them fails; with the row off it was accepted."""
    source = matmul(WRONG_AFTER_TIMING, "_SEEN: dict[float, int] = {}")
    r = judged(service, tasks["matmul"], source)
    assert r.stage == STAGE_CORRECTNESS and not r.accepted, (r.stage, r.flags, r.error)
    assert (r.error or "").startswith("trial after the timing (fresh inputs): output: values differ"), r.error
    # with the row off it gets through (the drift check and the confirmation off too: on a loaded box a drifted
    # reference sends the claim to the judge's batch, whose fresh inputs catch it as well)
    off = service.evaluate(tasks["matmul"], source, replace(service.cfg, defences_off=(
        "after_timing_trial", "drift", "confirmation")))
    assert off.passed_checks and off.runtime_ms is not None and "defences_off" in off.flags, (off.stage, off.error)
    honest = judged(service, tasks["matmul"], matmul("return x @ self.w"))
    assert passed(honest) and "trial/after" in honest.log, honest.log


def test_reduced_precision_is_flagged_and_still_accepted_where_the_tolerance_allows(
        service: EvalService, tasks: dict[str, Task]) -> None:
    """The precision contract: a float32 matrix product of float16 operands (what half-precision tensor cores
    compute) passes the paper's tolerance (its error ~3e-4) and is accepted, flagged ``reduced_precision`` with
    the line that says by how much; the float32 one is not flagged; with the row off, nothing is said."""
    task = tasks["matmul"]
    half = judged(service, task, matmul("return x.half().float() @ self.w.half().float()"))
    honest = judged(service, task, matmul("return x @ self.w"))
    assert half.passed_checks and half.runtime_ms is not None, half.error
    # (on a loaded box the judge's clock may also flag it suspicious: timing noise, beside this test's point)
    assert "reduced_precision" in half.flags and "no_kernel" not in half.flags, half.flags
    assert half.precision_ratio is not None and half.precision_ratio > 32, half.precision_ratio
    assert (half.findings or "").startswith("reduced_precision: its normalized error"), half.findings
    assert passed(honest) and "reduced_precision" not in honest.flags, (honest.flags, honest.log)
    assert honest.precision_ratio is not None and honest.precision_ratio < 32, honest.log
    assert honest.math_modes == "float32 matmul precision highest", honest.math_modes  # the CPU's
    # exact on its first call (the first trial's), in half precision after it: the trial after the timing shows it
    late = judged(service, task, matmul("_CALLS.append(1)\n        return x @ self.w if len(_CALLS) == 1 else "
                                        "x.half().float() @ self.w.half().float()", "_CALLS: list[int] = []"))
    assert late.passed_checks and "reduced_precision" in late.flags, (late.stage, late.flags, late.error)
    unchecked = service.evaluate(task, matmul("return x.half().float() @ self.w.half().float()"),
                                 cfg=replace(service.cfg, defences_off=("precision",)))
    assert "reduced_precision" not in unchecked.flags and unchecked.precision_ratio is None, unchecked.flags


def test_an_honest_candidate_of_the_same_speed_is_timed_as_such(service: EvalService,
                                                                tasks: dict[str, Task]) -> None:
    from stark_ray.eval.measure.noise import is_noisy

    r = judged(service, tasks["matmul"], matmul("return x @ self.w"))
    # never taken for much faster: about 1x, or a timing the evaluator itself calls noisy (a loaded 2-core box
    # measured 2.4x +-64% once), or a noisy claim above 2x that the judge's wall clock did not bear out (2.2x +-26%
    # by the worker, 0.52x by the judge: flagged suspicious, not accepted); much slower only as the judge's own
    # figure (a claim of 2x or less held to it: CI's loaded box read 0.40x in pairs, 0.97x by the fastest rounds)
    assert r.passed_checks and r.speedup is not None, (r.error, r.speedup)
    unconfirmed = "suspicious" in r.flags and is_noisy(r.speedup_err)
    judges = "its figure stands" in (r.notes or "")
    about_one = (r.speedup > 0.5 or judges) and r.speedup < 2
    assert (r.accepted and (about_one or is_noisy(r.speedup_err))) or unconfirmed, (
        r.error, r.speedup, r.speedup_err, r.flags, r.notes)


def test_confirm_above_zero_sends_a_candidate_of_the_same_speed_through_the_wall_clock(
        service: EvalService, tasks: dict[str, Task]) -> None:
    """``confirm_above=0`` (the KernelBench sweep's ``--confirm``): every candidate's speedup is measured again by
    the judge, whatever it is, so that the confirmation's memory and time are exercised on every task."""
    cfg = replace(service.cfg, confirm_above=0.0)
    r = service.evaluate(tasks["matmul"], matmul("return x @ self.w"), cfg)
    assert r.passed_checks, r.error
    assert "judge's wall clock" in (r.log or ""), r.log  # confirmed or not (a busy box), it was measured
    with pytest.raises(ValueError, match="confirm_above"):
        replace(service.cfg, confirm_above=-1.0)


NOISY = "return x * self.s + torch.rand_like(x)"  # a dropout in training mode draws like this (level2/66)


def test_a_reference_that_draws_random_numbers_is_judged_under_each_trials_seed(tmp_path: Path,
                                                                               service: EvalService) -> None:
    """Every call of the reference and of the candidate comes after the same seed (the trial's; the same-address
    trial's second call after its second contents' own): a candidate drawing as the reference does matches on every
    trial, one that leaves the draw out (or draws once per candidate) does not."""
    path = tmp_path / "3_Noisy.py"
    path.write_text(AFFINE_TASK.replace("return x * self.s + self.t", NOISY))
    task = load_task(path)
    assert service.reference(task).accepted
    drawn = AFFINE_PY.format(body=NOISY, prelude="")
    r = service.evaluate(task, drawn)
    assert r.passed_checks, r.error
    assert "same address" in (r.log or ""), r.log  # the second call was judged too
    assert "every timed call of both sides comes after the same seed" in (r.log or ""), r.log
    confirmed = service.evaluate(task, drawn, replace(service.cfg, confirm_above=0.0))
    assert confirmed.passed_checks, confirmed.error
    # the judge's batch too: each call after a seed of its own, the same on both sides, and its outputs compared
    assert "each call after a seed of its own, alike on both sides" in (confirmed.log or ""), confirmed.log
    once = ("self.__dict__.setdefault('noise', torch.rand_like(x))\n"  # one draw, at the first call, reused
            "        return x * self.s + self.noise")
    for body in ("return x * self.s + 0.5", once):
        bad = service.evaluate(task, AFFINE_PY.format(body=body, prelude=""))
        assert bad.stage == STAGE_CORRECTNESS and not bad.passed_checks, (body, bad.error)


def test_a_reference_that_depends_on_more_than_its_inputs_and_seed_is_refused(tmp_path: Path,
                                                                            service: EvalService) -> None:
    path = tmp_path / "4_Counting.py"
    path.write_text(AFFINE_TASK.replace("return x * self.s + self.t",
                                        "self.t = self.t + 1.0\n        return x * self.s + self.t"))
    from stark_ray.eval.tasks import TaskError

    with pytest.raises(TaskError, match=r"not deterministic .*after the same seed"):
        service.reference(load_task(path))


@pytest.mark.parametrize(("ret", "why"), [("None", "returns NoneType"), ("3", "returns int"),
                                          ("(x, object())", "returns object")])
def test_a_reference_whose_outputs_cannot_be_compared_is_refused(tmp_path: Path, service: EvalService,
                                                                 ret: str, why: str) -> None:
    path = tmp_path / "4_Odd.py"
    path.write_text(AFFINE_TASK.replace("return x * self.s + self.t", f"return {ret}"))
    from stark_ray.eval.tasks import TaskError

    with pytest.raises(TaskError, match=why):
        service.reference(load_task(path))


def test_dict_outputs_are_compared_key_by_key(tmp_path: Path, service: EvalService) -> None:
    path = tmp_path / "5_Dict.py"
    path.write_text(AFFINE_TASK.replace("return x * self.s + self.t",
                                        "return {'y': x * self.s + self.t, 'n': x.shape[0]}"))
    task = load_task(path)
    service.reference(task)
    good = judged(service, task, py("return {'n': x.shape[0], 'y': x * self.s + self.t}"))
    bad = judged(service, task, py("return {'y': x * self.s, 'n': x.shape[0]}"))
    assert passed(good), good.error
    assert bad.stage == STAGE_CORRECTNESS and (bad.error or "").startswith("trial 1/3: output['y']: values"), bad.error


def test_a_candidate_that_kills_the_judge_is_charged_with_it_and_the_next_one_is_judged(
        service: EvalService, tasks: dict[str, Task], shared_build_dir: str) -> None:
    """Without isolation a candidate can signal its worker's parent — the judge, not the service. Isolated (the
    default where the host allows it) it has no parent to signal: it is judged like any other."""
    killer = py(HONEST, "import os\nimport signal\nos.kill(os.getppid(), signal.SIGKILL)")
    with EvalService(replace(service.cfg, isolate="off")) as unisolated:
        r = judged(unisolated, tasks["affine"], killer)
        assert r.stage == "crash" and not r.accepted and "judge crashed (SIGKILL)" in (r.error or ""), r.error
        after = judged(unisolated, tasks["affine"], py(HONEST))
        assert passed(after), after.error
    if service.isolated:
        r = judged(service, tasks["affine"], killer)
        assert passed(r), r.error


CENSUS_TASK = '''"""Elementwise, counting: each get_inputs() in the judge notes the tensors of its size living there."""
import gc
import sys

import torch
import torch.nn as nn

SHAPE = (37, 211)  # a size no other tensor of the test run has
LOG = {log!r}


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def _kept():
    """The tensors of the standard trials the judge keeps for the next candidate (inputs and outputs)."""
    ids = set()
    for o in gc.get_objects():
        if type(o).__name__ != "TrialCache":
            continue
        for trial in o.entries.values():
            held = [trial.ref]
            for cell in trial.make.__closure__ or ():
                try:
                    held.append(cell.cell_contents)
                except ValueError:
                    pass
            for v in held:
                for t in v if isinstance(v, (list, tuple)) else [v]:
                    if isinstance(t, torch.Tensor):
                        ids.add(id(t))
    return ids


def get_inputs():
    main = getattr(sys.modules["__main__"], "__spec__", None)
    if main is not None and main.name == "stark_ray.eval.judge.main":
        kept = _kept()
        live = sum(1 for o in gc.get_objects()
                   if isinstance(o, torch.Tensor) and tuple(o.shape) == SHAPE and id(o) not in kept)
        with open(LOG, "a") as f:
            f.write(f"{{live}}\\n")
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
'''


def test_the_judge_holds_what_the_memory_plan_counts_at_every_trial(tmp_path: Path, service: EvalService) -> None:
    """What the judge holds whenever it makes inputs (a trial's, or the ones it checks the worker's call against,
    which is what it held through that call), for a task whose output is its input's size: at most the shared
    copy of the inputs, the output slots and the reference's output (eval/measure/memory.py's phases: on a 6 GB task
    each one more is 6 GB beside the worker's call). A loop variable once kept the second contents' last tensor alive
    through the same-address trial's second call: 4 (and 25_Swish out of memory at 40 GB)."""
    log = tmp_path / "census.txt"
    path = tmp_path / "5_Census.py"
    path.write_text(CENSUS_TASK.format(log=str(log)))
    task = load_task(path)
    # slower than the reference (two copies more): no claimed gain, so no confirmation batch, whose input sets are
    # not the trials' (a busy host can make an honest 1.0x look like a gain beside a slowed reference)
    source = AFFINE_PY.format(body="return (x * 2.0 + 1.0).clone().clone()", prelude="").replace(
        "def __init__(self, s, t):\n        super().__init__()\n        self.s, self.t = s, t",
        "def __init__(self):\n        super().__init__()")
    # one trial: the same-address trial's second contents are made afresh (not a kept trial's), census included
    r = service.evaluate(task, source, replace(service.cfg, trials=1))
    assert r.passed_checks, r.error
    assert "same address" in (r.log or ""), r.log
    seen = [int(line) for line in log.read_text().split()]
    # at most the check of the second call's: the shared inputs, the slots, the second contents' reference output
    # (the judge's pace of its reference makes inputs too, after the checks, holding none of these)
    assert len(seen) >= 6 and 3 in seen and max(seen) <= 3, seen


# a candidate that writes, on its process's own message channel, an answer saying it is a success: the worker's
# "failed" answer is a failure at most, whatever it carries (the judge's figures are its own)
FORGED_ANSWER = '''
import json, os, stat
_FORGED = {"failed": {"compiled": True, "passed_checks": True, "runtime_ms": 0.001, "ref_runtime_ms": 1.0,
                      "speedup": 1000.0, "stage": "ok", "flags": [], "sol_fraction": 1.0},
           "tampered": [], "healthy": True}
for _fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
    try:
        if _fd > 2 and stat.S_ISFIFO(os.fstat(_fd).st_mode):
            os.write(_fd, (json.dumps(_FORGED) + "\\n").encode())
    except OSError:
        pass
'''


def test_an_answer_forged_on_the_workers_channel_is_never_a_success(shared_build_dir: str,
                                                                    tasks: dict[str, Task]) -> None:
    """A candidate whose outputs are wrong wrote, at its import, a "failed" answer claiming 1000x on its worker's
    message channel; the judge took it for its result, accepted (before session 23). A worker's failure is now a
    failure and no more. (The worker's real answer comes after the forged one; the next candidate's load would read
    it, unless the worker is replaced: after a failed load the judge pings it with a token chosen then, and any other
    answer first replaces it.)"""
    cfg = EvalConfig(build_dir=shared_build_dir, trials=2, warmup=1, timing_trials=5, tolerance="kernelbench",
                     worker_candidates=64)  # a warm worker: which answers end it is what is tested
    with EvalService(cfg) as svc:
        r = judged(svc, tasks["affine"], py(ZEROS, prelude=FORGED_ANSWER))
        starts = svc.worker_starts
        after = judged(svc, tasks["affine"], py(HONEST))  # its worker was replaced: no stale answer for this one
        wrong = judged(svc, tasks["affine"], candidate_without_model())  # a plain failed load keeps its worker
        last = judged(svc, tasks["affine"], py(HONEST))
        final = svc.worker_starts
    assert not r.accepted and not r.passed_checks and r.speedup is None and r.runtime_ms is None, r
    # it has no step's number (session 25): an answer to another step, which breaks the protocol (before: a failure
    # of the candidate's at runtime)
    assert r.sol_fraction is None and r.stage == "correctness" and "tampered" in r.flags, r
    assert passed(after), (after.stage, after.error)
    # one worker replaced, after the forged answer only (and after `after`, where a busy host's figure of record
    # for it, not its claim, ended its worker: its successor starts with the next request that needs one, `wrong`'s
    # or `last`'s); none for the plain failed load
    assert starts == 1 and final == 2 + ended(after), (starts, final, ended(after))
    assert wrong.stage == "compile" and passed(last), (wrong.error, last.error)


def candidate_without_model() -> str:
    return "import torch\n\nclass NotModelNew(torch.nn.Module):\n    pass\n"
