"""Parent side of a worker: start it, feed it, watch its phases against their timeouts, kill it if needed.

Whatever the candidate does — segfault, ``os._exit``, an endless loop at import or in forward, a build that
never ends — the parent gets a :class:`WorkerOutcome`, never an exception. A timeout kills the worker's whole
process tree (ninja and the compiler included, though ninja gives each command a process group of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from stark_ray.eval.process_tree import kill_tree
from stark_ray.eval.protocol import (
    PHASE_SETUP,
    STACK_DUMP_SIGNAL,
    STACK_DUMP_WAIT_S,
    WorkerRequest,
    result_from_message,
)
from stark_ray.eval.sandbox_env import worker_env
from stark_ray.records import EvalResult

EXIT_GRACE_S = 10.0  # after its result, the worker gets this long to exit on its own


@dataclass
class WorkerOutcome:
    result: EvalResult | None  # None when the worker died or timed out before reporting
    phase: str  # the last phase the worker reported
    returncode: int | None
    timed_out: bool
    log: str  # everything the worker (and the compiler it ran) printed
    wall_s: float
    phase_s: dict[str, float] = field(default_factory=dict)  # wall seconds spent in each phase

    def describe_exit(self) -> str:
        rc = self.returncode
        if rc is None:
            return "was killed"
        if rc < 0:
            try:
                return f"crashed ({signal.Signals(-rc).name})"
            except ValueError:
                return f"crashed (signal {-rc})"
        return f"exited with code {rc} before reporting"


def _dump_stack(proc: subprocess.Popen[bytes]) -> None:
    """Ask the worker (not its compiler children) to print where it is stuck, and give it a moment."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.send_signal(STACK_DUMP_SIGNAL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STACK_DUMP_WAIT_S)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _reader(stream: IO[bytes], q: queue.Queue[bytes | None]) -> None:
    try:
        for line in stream:
            q.put(line)
    finally:
        q.put(None)


def run_worker(request: WorkerRequest, timeouts: dict[str, float]) -> WorkerOutcome:
    """Run one request in a fresh worker process. ``timeouts`` maps each phase to its own limit in seconds."""
    workdir = Path(tempfile.mkdtemp(prefix="stark-eval-"))
    log_path = workdir / "worker.log"
    request.log_path = str(log_path)
    started = time.monotonic()
    result: EvalResult | None = None
    phase, timed_out = PHASE_SETUP, False
    phase_s: dict[str, float] = {}
    proc: subprocess.Popen[bytes] | None = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "stark_ray.eval.worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, cwd=workdir,
                                    env=worker_env(workdir, request.threads), start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        q: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(request.to_json().encode())
            proc.stdin.close()
        phase_start = started
        deadline = started + timeouts[phase]
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                _dump_stack(proc)
                kill_tree(proc.pid)
                break
            try:
                line = q.get(timeout=min(deadline - now, 0.5))
            except queue.Empty:
                if proc.poll() is not None and q.empty():
                    break  # dead, and a process it forked may hold the channel open: no EOF to wait for
                continue
            if line is None:  # the worker closed its channel: it finished or died
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "phase" in msg and msg["phase"] in timeouts:
                now = time.monotonic()
                phase_s[phase] = phase_s.get(phase, 0.0) + now - phase_start
                phase, phase_start = msg["phase"], now
                deadline = now + timeouts[phase]
            elif "result" in msg:
                result = result_from_message(msg["result"])
                break
        phase_s[phase] = phase_s.get(phase, 0.0) + time.monotonic() - phase_start
        try:
            proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
        _kill_group(proc)  # anything the candidate left running in the group
        text = log_path.read_bytes().decode("utf-8", errors="replace")
        wall = time.monotonic() - started
        return WorkerOutcome(result, phase, proc.returncode, timed_out, text, wall, phase_s)
    finally:
        if proc is not None and proc.poll() is None:  # the parent itself failed or was interrupted
            kill_tree(proc.pid)
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
