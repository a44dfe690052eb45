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
from stark_ray.eval.process_tree import freeze_tree, thaw
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
    beside it than alone: the judge measures it, and its own figure (about 1x) stands."""
    r = service.evaluate(task, THREADS)
    assert not (r.accepted and r.speedup is not None and r.speedup > 1.4), f"{r.speedup}\n{r.log}"
    honest = service.evaluate(task, HONEST)
    assert honest.accepted, honest.error
    # its worker, ended after it (a worker per candidate), is no process the candidate left running
    assert "left running" not in honest.log, honest.log


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
        from stark_ray.eval.process_tree import kill_tree

        kill_tree(proc.pid)
        proc.wait()


def test_the_reference_alone_is_timed_where_this_judge_has_not(shared_build_dir: str, task: Task) -> None:
    """No reference mode first (a resumed run, a task another evaluator timed, or one this judge evicted): the judge
    times the reference alone before the candidate, so a slowed reference is still seen."""
    cfg = EvalConfig(build_dir=shared_build_dir, trials=3, warmup=2, timing_trials=20, worker_candidates=1)
    with EvalService(cfg) as svc:
        r = svc.evaluate(task, THREADS)
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
        r = svc.evaluate(task, THREADS)
    assert not (r.accepted and r.speedup is not None and r.speedup > 1.4), \
        f"{alone.runtime_ms} {r.speedup}\n{r.log}"
