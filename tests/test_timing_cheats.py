"""Claims inflated inside the worker, on the CPU, through real judge and worker processes (cases a red team wrote
against session 24's evaluator, each accepted then): a candidate that slows the reference it is timed beside, one
that leaves half its work to a thread after it returns, one that writes its own timing answer on the worker's
channel; and the worker stopped while the judge measures its own side."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval.proc.process_tree import freeze_tree, thaw
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import Task, load_task
from stark_ray.records import STAGE_CORRECTNESS

pytestmark = pytest.mark.slow

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "3_LinearGelu.py"

HEAD = '''
import json
import os
import stat
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def _timing_frame():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "time_interleaved":
            return f
        f = f.f_back
    return None
'''

HONEST = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(x))
'''

# the reference's own ops (a true 1.0x), but one thread for whatever runs after it in its process: the reference,
# timed next in the same worker
THREADS = HEAD + '''
_N = torch.get_num_threads()


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        torch.set_num_threads(_N)
        try:
            return F.gelu(self.linear(x))
        finally:
            torch.set_num_threads(1)
'''

# the reference's own ops (a true 1.0x), and everything else its forward can leave set as it returns, each undone
# as its own next call starts: one thread, grad mode on, the collector on at once, a dispatch mode that sees every op,
# a profile function on every Python call
LEFT_SET = HEAD + '''
import gc
from torch.utils._python_dispatch import TorchDispatchMode

_N = torch.get_num_threads()


class _Seen(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_mode = _Seen()


def _profile(*args):
    return None


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.left = False

    def forward(self, x):
        if self.left:
            sys.setprofile(None)
            _mode.__exit__(None, None, None)
        torch.set_num_threads(_N)
        grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            return F.gelu(self.linear(x))
        finally:
            torch.set_num_threads(1)
            torch.set_grad_enabled(True)
            gc.enable()
            gc.set_threshold(1)
            _mode.__enter__()
            sys.setprofile(_profile)
            self.left = True
'''

# the reference's own ops (a true 1.0x); a thread of its own keeps a core busy whenever its forward is not running
# (a hash lets the GIL go): the reference, timed next in the same worker, shares the cores with it. Nothing here is
# process state to undo: the drift check's to see
SPINNER = HEAD + '''
import hashlib

_idle = threading.Event()
_idle.set()
_BLOCK = bytes(1 << 18)
_spinning = []


def _spin():
    while True:
        _idle.wait()
        hashlib.sha256(_BLOCK).digest()


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        if not _spinning:
            _spinning.append(threading.Thread(target=_spin, daemon=True))
            _spinning[0].start()

    def forward(self, x):
        _idle.clear()
        try:
            return F.gelu(self.linear(x))
        finally:
            _idle.set()
'''

# in a timing round where the reference went first, its output (for the same inputs) is still held for the round's
# check: a copy of it is returned, the reference's own work at the cost of a copy (1.97x accepted before); an honest
# call otherwise. Here the copy is returned negated: one found fails its round, whatever the timings
STOLEN = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        f = _timing_frame()
        outs = f.f_locals.get("outs") if f is not None else None
        if isinstance(outs, list) and outs and isinstance(outs[0], torch.Tensor) and outs[0].shape == \\
                (x.shape[0], self.linear.out_features):
            return -outs[0]
        return F.gelu(self.linear(x))
'''

# the reference's own ops (a true 1.0x), and a hook on the reference's model in its worker (found among the
# process's objects) that sleeps after each of its calls
HOOKED = HEAD + '''
import gc


def _slow(module, args, out):
    time.sleep(0.004)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        for o in gc.get_objects():
            if isinstance(o, nn.Module) and type(o).__name__ == "Model":
                o.register_forward_hook(_slow)

    def forward(self, x):
        return F.gelu(self.linear(x))
'''

# its timed calls return a tensor subclass whose detach() does the work: the round's copy of the output (after the
# clock stopped) ran the candidate's code, and the check saw the right values (1.28-1.56x accepted before)
LAZY = HEAD + '''
import gc


class _Lazy(torch.Tensor):
    def detach(self):
        return self._work()


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        if gc.isenabled():  # not a timing round (the timing pauses the collector)
            return F.gelu(self.linear(x))
        out = torch.Tensor._make_subclass(_Lazy, torch.empty(0))
        out._work = lambda: F.gelu(self.linear(x))
        return out
'''

# first in a timing round, half its rows are left to a thread that goes on while the reference is timed
DEFERRED = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def _rows(self, x, out, a, b):
        out[a:b] = F.gelu(self.linear(x[a:b]))

    def forward(self, x):
        f = _timing_frame()
        if f is None or f.f_locals.get("i") != f.f_locals.get("order", [None])[0]:
            return F.gelu(self.linear(x))
        out = torch.empty(x.shape[0], self.linear.out_features)
        half = x.shape[0] // 2
        self._rows(x, out, 0, half)
        threading.Thread(target=self._rows, args=(x, out, half, x.shape[0]), daemon=True).start()
        return out
'''

# three times the reference's work; while timed, it writes an answer of its own (1.95x) on the worker's channel
# and swallows the judge's next line, so that the worker's real answer is read as the answer to that one
FORGED = HEAD + '''
_done = []


def _stats(ms):
    samples = [ms * (1 + 0.002 * ((k * 7) % 5 - 2)) for k in range(20)]
    return {"median": ms, "mean": ms, "std": ms * 0.002, "min": min(samples), "n": 20, "samples": samples}


def _writable_pipes():
    fds = []
    for n in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        try:
            if n > 2 and stat.S_ISFIFO(os.fstat(n).st_mode):
                flags = int(open(f"/proc/self/fdinfo/{n}").read().split("flags:")[1].split()[0], 8)
                if flags & 3 == os.O_WRONLY:
                    fds.append(n)
        except (OSError, ValueError, IndexError):
            pass
    return fds


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        t0 = time.perf_counter()
        for _ in range(2):
            F.gelu(self.linear(x))
        out = F.gelu(self.linear(x))
        if not _done and _timing_frame() is not None:
            _done.append(1)
            ms = (time.perf_counter() - t0) * 1e3 / 3
            forged = {"timed": {"ref": _stats(ms), "new": _stats(ms / 1.95), "compiled_ms": None, "flags": [],
                                "log": []}, "tampered": [], "healthy": True}
            for fd in _writable_pipes():
                os.write(fd, (json.dumps(forged) + "\\n").encode())
            sys.stdin.readline()
        return out
'''


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(TASK)


@pytest.fixture(scope="module")
def service(shared_build_dir: str, task: Task) -> Iterator[EvalService]:
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=20, worker_candidates=1)
    with EvalService(cfg) as svc:
        svc.reference(task)  # the reference alone, in a worker no candidate ran in: the yardstick of its drift
        yield svc


def test_a_candidate_that_slows_the_reference_beside_it_gains_nothing_by_it(service: EvalService,
                                                                            task: Task) -> None:
    """Its claim (1.7-1.8x on a quiet 2-core box, and accepted so in session 24) has a reference that ran slower
    beside it than alone: the judge measures it, and its own figure (about 1x) stands; and where the judge's batch
    itself reads more (CI: 1.50x, then 2.08x), the reference's time in the judge's rounds against the candidate's
    own holds it (0.97x)."""
    r = service.evaluate(task, SPINNER)
    assert not (r.accepted and r.speedup is not None and r.speedup > 1.4), f"{r.speedup}\n{r.log}"
    honest = service.evaluate(task, HONEST)
    assert honest.accepted, honest.error
    # its worker, ended after it (a worker per candidate), is no process the candidate left running
    assert "left running" not in honest.log, honest.log


def test_process_state_a_forward_leaves_set_is_undone_for_each_call_of_the_reference(service: EvalService,
                                                                                     task: Task) -> None:
    """One thread (1.7-1.8x on a quiet 2-core box before, and accepted so in session 24), grad mode, the collector,
    a dispatch mode, a profile function: each timed call of the reference beside it runs in the worker's own state,
    so it is no slower for them, and the log says what was found."""
    for cheat, found in ((THREADS, ("threads",)),
                         (LEFT_SET, ("threads", "grad", "gc", "torch_dispatch_mode", "profile_function"))):
        r = service.evaluate(task, cheat)
        note = next((line for line in r.log.splitlines() if "left the process's state changed" in line), "")
        assert all(name in note for name in found), r.log


def test_the_references_output_of_the_round_is_out_of_reach_while_the_candidate_runs(service: EvalService,
                                                                                      task: Task) -> None:
    """A copy of the reference's output of the same round (its own work done for it in every other round) claimed
    1.97x, under the 2x above which every claim is measured by the judge: the reference now runs last in each round,
    so no round ever holds its output while the candidate runs (a copy found would fail its round here)."""
    r = service.evaluate(task, STOLEN)
    assert r.passed_checks and "timing round" not in (r.error or ""), (r.stage, r.error)


def test_a_hook_on_the_reference_in_its_worker_is_tampering(service: EvalService, task: Task) -> None:
    r = service.evaluate(task, HOOKED)
    assert not r.accepted and "tampered" in r.flags, (r.speedup, r.flags, r.error)
    assert "the reference's model._forward_hooks" in (r.error or ""), r.error
    assert service.evaluate(task, HONEST).accepted


def test_an_output_whose_copy_does_the_work_fails_its_timing_round(service: EvalService, task: Task) -> None:
    r = service.evaluate(task, LAZY)
    assert not r.accepted and r.stage == STAGE_CORRECTNESS, (r.stage, r.speedup, r.error)
    assert "output is a _Lazy, not a plain torch.Tensor" in (r.error or ""), r.error


def test_work_left_to_a_thread_after_the_return_fails_its_timing_round(service: EvalService, task: Task) -> None:
    r = service.evaluate(task, DEFERRED)
    assert not r.accepted and r.stage == STAGE_CORRECTNESS, (r.stage, r.speedup, r.error)
    assert (r.error or "").startswith("timing round"), r.error


def test_a_timing_answer_written_by_the_candidate_is_never_its_result(service: EvalService, task: Task) -> None:
    r = service.evaluate(task, FORGED)
    assert not r.accepted and r.speedup is None, (r.speedup, r.error)
    assert "an answer to another step" in (r.error or ""), r.error
    assert service.evaluate(task, HONEST).accepted


def test_a_stopped_process_tree_runs_nothing_until_it_is_let_go_on(tmp_path: Path) -> None:
    """What the judge does to its worker while it times its own side: the worker and whatever it started."""
    counter = tmp_path / "count"
    child = ("import os, subprocess, sys, time\n"
             f"subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)'])\n"
             "n = 0\n"
             f"while True:\n    n += 1\n    open({str(counter)!r}, 'w').write(str(n))\n    time.sleep(0.01)\n")
    proc = subprocess.Popen([sys.executable, "-c", child])
    try:
        while not counter.exists() or not counter.read_text():
            time.sleep(0.05)
        stopped = freeze_tree(proc.pid)
        assert proc.pid in stopped and len(stopped) == 2  # itself and its child
        time.sleep(0.2)  # a write under way when the stop came lands now
        seen = counter.read_text()
        time.sleep(0.5)
        assert counter.read_text() == seen  # stopped: not one more count
        thaw(stopped)
        deadline = time.monotonic() + 60
        while counter.read_text() == seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counter.read_text() != seen
    finally:
        from stark_ray.eval.proc.process_tree import kill_tree

        kill_tree(proc.pid)
        proc.wait()


def test_the_reference_alone_is_timed_where_this_judge_has_not(shared_build_dir: str, task: Task) -> None:
    """No reference mode first (a resumed run, a task another evaluator timed, or one this judge evicted): the judge
    times the reference alone before the candidate, so a slowed reference is still seen."""
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=20, worker_candidates=1)
    with EvalService(cfg) as svc:
        r = svc.evaluate(task, SPINNER)
    assert not (r.accepted and r.speedup is not None and r.speedup > 1.4), f"{r.speedup}\n{r.log}"


def test_a_burst_on_the_host_while_the_reference_was_timed_alone_hides_no_slowed_reference(
        shared_build_dir: str, task: Task) -> None:
    """The reference's time alone is measured at another moment than its time beside the candidate: two spinning
    processes while it is timed alone lengthen it (as another test process compiling did on CI, where this cheat
    was accepted at 1.65x), and the judge's pace of its own reference, around that timing and again now, scales it
    back."""
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=20)
    with EvalService(cfg) as svc:
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            time.sleep(0.5)
            alone = svc.reference(task)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        r = svc.evaluate(task, SPINNER)
    assert not (r.accepted and r.speedup is not None and r.speedup > 1.4), \
        f"{alone.runtime_ms} {r.speedup}\n{r.log}"
