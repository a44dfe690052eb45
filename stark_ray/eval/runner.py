"""Parent side of a worker: start it, feed it requests, watch each phase against its timeout, kill it if needed.

A :class:`WorkerProcess` is long-lived: it serves request after request in one process (for a GPU: one CUDA
context, the loaded reference and the built extensions stay warm). Whatever a candidate does — segfault,
``os._exit``, an endless loop at import or in forward, a sticky CUDA error, a build that never ends — the
parent gets a :class:`WorkerOutcome`, never an exception, and the next request runs in a fresh process. A
timeout kills the worker's whole process tree (ninja and the compiler included).
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
from typing import IO, Any

from stark_ray.eval.isolation import isolation_prefix
from stark_ray.eval.process_tree import children, kill_tree
from stark_ray.eval.protocol import (
    PHASE_SETUP,
    PHASE_START,
    STACK_DUMP_SIGNAL,
    STACK_DUMP_WAIT_S,
    WorkerRequest,
    result_from_message,
)
from stark_ray.eval.sandbox_env import worker_env
from stark_ray.records import EvalResult

EXIT_GRACE_S = 10.0  # an unhealthy or closing worker gets this long to exit on its own
START_TIMEOUT_S = 180.0  # interpreter, torch, CUDA context, device probe
MAX_REQUESTS = 64  # a worker is recycled after this many requests (loaded extensions only accumulate)


class WorkerStartError(RuntimeError):
    """The worker could not start at all: a problem of the host, not of a candidate."""


@dataclass(frozen=True)
class WorkerSpec:
    backend: str
    build_dir: str
    threads: int
    compile_only: bool = False  # a compile-pool worker: no device, builds only
    device: int | None = None  # index among this process's visible GPUs (None: the default / no GPU)
    arch: str | None = None  # TORCH_CUDA_ARCH_LIST for builds (compile workers get the GPU worker's)
    isolate: bool = False  # in namespaces of its own: no other process visible, no network (eval/isolation.py)

    def argv(self, spare: bool = False) -> list[str]:
        prefix = list(isolation_prefix()) if self.isolate else []
        args = [*prefix, sys.executable, "-m", "stark_ray.eval.worker", "--backend", self.backend,
                "--build-dir", self.build_dir, "--threads", str(self.threads)]
        if self.compile_only:
            args.append("--compile-only")
        if self.arch:
            args += ["--arch", self.arch]
        if spare:
            args.append("--spare")
        return args


@dataclass
class WorkerOutcome:
    result: EvalResult | None  # None when the worker died or timed out before reporting
    phase: str  # the last phase the worker reported
    returncode: int | None  # set when the worker ended during the request
    timed_out: bool
    log: str  # everything the worker (and the compiler it ran) printed during this request
    wall_s: float
    phase_s: dict[str, float] = field(default_factory=dict)  # wall seconds spent in each phase
    healthy: bool = True  # False: the worker was (or will be) replaced after this request

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


def _reader(stream: IO[bytes], q: queue.Queue[bytes | None]) -> None:
    try:
        for line in stream:
            q.put(line)
    finally:
        q.put(None)


def visible_device(device: int | None, base: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES for a worker pinned to ``device`` among the parent's visible GPUs (Ray sets the
    parent's list for a num_gpus=1 actor: the worker keeps exactly that one)."""
    if device is None:
        return None
    if base:
        ids = [x.strip() for x in base.split(",") if x.strip()]
        if device < len(ids):
            return ids[device]
    return str(device)


@dataclass
class _Child:
    """One spawned worker process: its pipes, the reader of its control channel, its private directory."""

    proc: subprocess.Popen[bytes]
    queue: queue.Queue[bytes | None]
    workdir: Path
    spawned: float


class WorkerProcess:
    """One worker process at a time, restarted on demand. Not thread-safe: callers serialize requests.

    With ``spare=True`` (a device worker) a second process is started beside the one serving: it does all its
    imports and then waits, touching no device, until a restart (a crash, a timeout, a poisoned context, the
    recycling after ``max_requests``) promotes it — the next candidate then waits for a CUDA context (under a
    second), not for a whole interpreter start (seconds) — and a new spare is started behind it."""

    def __init__(self, spec: WorkerSpec, start_timeout_s: float = START_TIMEOUT_S,
                 max_requests: int = MAX_REQUESTS, spare: bool = False) -> None:
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self.max_requests = max_requests
        self.use_spare = spare
        self.hello: dict[str, Any] = {}
        self.starts = 0  # processes started so far (1 + restarts)
        self.promotions = 0  # restarts served by the spare
        self.served = 0  # requests answered by the current process
        self._proc: subprocess.Popen[bytes] | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._workdir: Path | None = None
        self._log_path: Path | None = None
        self._spare: _Child | None = None

    # -- life cycle -------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _env(self, workdir: Path) -> dict[str, str]:
        env = worker_env(workdir, self.spec.threads)
        env.setdefault("TRITON_CACHE_DIR", str(Path(self.spec.build_dir) / "triton"))
        if self.spec.compile_only:
            env["CUDA_VISIBLE_DEVICES"] = ""  # builds never touch a GPU (nor create a context on it)
        else:
            pinned = visible_device(self.spec.device, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if pinned is not None:
                env["CUDA_VISIBLE_DEVICES"] = pinned
        return env

    def _spawn(self, spare: bool = False) -> _Child:
        workdir = Path(tempfile.mkdtemp(prefix="stark-eval-"))
        with open(workdir / "worker.log", "wb") as log:
            proc = subprocess.Popen(self.spec.argv(spare), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, cwd=workdir, env=self._env(workdir), start_new_session=True)
        q: queue.Queue[bytes | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        return _Child(proc, q, workdir, time.monotonic())

    def spare_ready(self, timeout_s: float = 0.0) -> bool:
        """Whether a spare waits with its imports done (waiting up to ``timeout_s`` for it to say so)."""
        child = self._spare
        deadline = time.monotonic() + timeout_s
        while child is not None and child.proc.poll() is None:
            try:
                line = child.queue.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return False
                continue
            if line is None:
                return False
            with contextlib.suppress(ValueError):
                if json.loads(line) == {"waiting": True}:
                    return True
        return False

    def _take_spare(self) -> _Child | None:
        """The spare, told to go on (None when there is none, or it died waiting)."""
        child, self._spare = self._spare, None
        if child is None:
            return None
        try:
            assert child.proc.stdin is not None
            child.proc.stdin.write(b"go\n")
            child.proc.stdin.flush()
            return child
        except (OSError, AssertionError):
            _end(child.proc, child.workdir)
            return None

    def start(self) -> dict[str, Any]:
        """Start a fresh process (the spare, if one waits) and wait for its hello (the device's properties)."""
        self.close_current()
        child = self._take_spare()
        promoted = child is not None
        if child is None:
            child = self._spawn()
        self._proc, self._queue, self._workdir = child.proc, child.queue, child.workdir
        self._log_path = child.workdir / "worker.log"
        self.starts += 1
        self.served = 0
        go = time.monotonic()
        deadline = go + self.start_timeout_s
        while True:
            msg, dead = self._next(deadline)
            if msg is not None and "hello" in msg:
                self.hello = dict(msg["hello"])
                phases = self.hello.get("start_phases")
                if isinstance(phases, dict):  # the whole start as the parent saw it (interpreter start included)
                    phases["total_s"] = round(time.monotonic() - child.spawned, 3)
                    if promoted:
                        phases["promoted_s"] = round(time.monotonic() - go, 3)  # what a restart waited
                self.promotions += promoted
                if self.use_spare:
                    self._spare = self._spawn(spare=True)
                return self.hello
            if dead or time.monotonic() >= deadline:
                log = self._read_log(0)
                why = "timed out" if not dead else "exited"
                self.kill()
                if promoted:  # the spare could not take over: a fresh start says whether the host can
                    return self.start()
                tail = " | ".join(log.strip().splitlines()[-3:]) if log.strip() else "no output"
                raise WorkerStartError(f"the {self.spec.backend} evaluator worker {why} while starting: {tail}")

    def kill(self) -> None:
        """Kill the serving process (and everything in its group); the spare stays."""
        self._end_current(kill=True)

    def close_current(self) -> None:
        """Let the serving worker finish (end of its stdin), then make sure it and its group are gone."""
        self._end_current(kill=False)

    def _end_current(self, kill: bool) -> None:
        if self._proc is not None:
            _end(self._proc, self._workdir, kill)
        self._proc = None
        self._workdir = self._log_path = None

    def close(self) -> None:
        """End the serving worker and the spare."""
        self.close_current()
        child, self._spare = self._spare, None
        if child is not None:
            _end(child.proc, child.workdir)

    # -- requests ---------------------------------------------------------------------------------------------
    def _next(self, deadline: float) -> tuple[dict[str, Any] | None, bool]:
        """The next message before ``deadline``: (message or None, whether the worker is gone)."""
        assert self._proc is not None
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None, False
            try:
                line = self._queue.get(timeout=min(deadline - now, 0.5))
            except queue.Empty:
                if self._proc.poll() is not None and self._queue.empty():
                    return None, True  # dead, and a process it forked may hold the channel open
                continue
            if line is None:
                return None, True
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                return msg, False

    def _log_size(self) -> int:
        try:
            return self._log_path.stat().st_size if self._log_path else 0
        except OSError:
            return 0

    def _read_log(self, offset: int) -> str:
        if self._log_path is None:
            return ""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _dump_stack(self) -> None:
        """Ask the worker (not its compiler children) to print where it is stuck, and give it a moment."""
        assert self._proc is not None
        # an isolated worker is the child of `unshare`, which a SIGUSR1 would end (and the worker with it)
        pids = children(self._proc.pid)[:1] if self.spec.isolate else [self._proc.pid]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            for pid in pids:
                os.kill(pid, STACK_DUMP_SIGNAL)
            time.sleep(STACK_DUMP_WAIT_S)

    def request(self, request: WorkerRequest, timeouts: dict[str, float]) -> WorkerOutcome:
        """Serve one request; ``timeouts`` maps each phase to its own limit in seconds."""
        if not self.alive:
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        offset = self._log_size()
        started = time.monotonic()
        result: EvalResult | None = None
        phase, timed_out, healthy, dead = PHASE_SETUP, False, True, False
        phase_s: dict[str, float] = {}
        try:
            self._proc.stdin.write((request.to_json() + "\n").encode())
            self._proc.stdin.flush()
        except OSError:
            dead = True
        phase_start = started
        deadline = started + timeouts.get(phase, self.start_timeout_s)
        while not dead:
            msg, dead = self._next(deadline)
            if dead:
                break
            if msg is None:  # the phase ran out of time
                timed_out = True
                self._dump_stack()
                break
            if "phase" in msg:
                now = time.monotonic()
                phase_s[phase] = phase_s.get(phase, 0.0) + now - phase_start
                phase, phase_start = str(msg["phase"]), now
                deadline = now + timeouts.get(phase, self.start_timeout_s)
            elif "result" in msg:
                result = result_from_message(msg["result"])
                healthy = bool(msg.get("healthy", True))
                break
        phase_s[phase] = phase_s.get(phase, 0.0) + time.monotonic() - phase_start
        returncode: int | None = None
        if result is None or not healthy:
            healthy = False
            if not timed_out:  # it is dying (or said it will): give it a moment to finish its log
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=EXIT_GRACE_S)
            returncode = self._proc.poll()
        log = self._read_log(offset)
        wall = time.monotonic() - started
        if not healthy:
            self.kill()
        else:
            self.served += 1
            if self.served >= self.max_requests:
                self.close_current()
        return WorkerOutcome(result, phase, returncode, timed_out, log, wall, phase_s, healthy)


def _end(proc: subprocess.Popen[bytes], workdir: Path | None, kill: bool = False) -> None:
    """Make sure a worker process and its group are gone (``kill``: at once; else it may first exit by itself
    when its stdin ends), and remove its directory."""
    if not kill and proc.poll() is None and proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=EXIT_GRACE_S)
    if proc.poll() is None:
        kill_tree(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=EXIT_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything the candidate left running in the group
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def run_once(spec: WorkerSpec, request: WorkerRequest, timeouts: dict[str, float]) -> WorkerOutcome:
    """One request in a fresh worker that ends with it (the compile pool's way, and the safest)."""
    worker = WorkerProcess(spec, start_timeout_s=timeouts.get(PHASE_START, START_TIMEOUT_S), max_requests=1)
    try:
        try:
            worker.start()
        except WorkerStartError as e:
            return WorkerOutcome(None, PHASE_START, None, False, str(e), 0.0, {}, False)
        return worker.request(request, timeouts)
    finally:
        worker.kill()
