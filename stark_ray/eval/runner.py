"""Parent side of a process of the evaluator: start it, talk to it, watch each phase against its timeout, kill it.

A :class:`WorkerProcess` is long-lived: it serves request after request in one process (for a GPU: one CUDA
context, the loaded reference and the built extensions stay warm). The service starts the judge this way, and
the judge its worker (which runs the candidates). Whatever a candidate does — segfault, ``os._exit``, an endless
loop at import or in forward, a sticky CUDA error, a build that never ends — the caller gets a
:class:`Reply` or a :class:`WorkerOutcome`, never an exception, and the next request runs in a fresh process. A
timeout kills the process's whole tree (ninja and the compiler included).

Messages are JSON lines: requests on the process's stdin, answers on a private channel (its stdout, moved off
fd 1 at start). A process started with ``fd_channel`` also gets one end of a Unix socket pair for file
descriptors (the judge's shared buffers, :mod:`stark_ray.eval.exchange`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from stark_ray.eval.backends import backend_path
from stark_ray.eval.isolation import jailed
from stark_ray.eval.lifetime import kill_strays, spawn
from stark_ray.eval.phase_clock import START_TIMEOUT_S, PhaseClock
from stark_ray.eval.process_tree import children, kill_tree
from stark_ray.eval.protocol import (
    PHASE_START,
    STACK_DUMP_SIGNAL,
    STACK_DUMP_WAIT_S,
    WorkerRequest,
    result_from_message,
    send_fds,
)
from stark_ray.eval.sandbox_env import worker_env
from stark_ray.records import EvalResult

MAX_LINE = 64 << 20  # bytes in one message of a worker (a build request carries a candidate's sources)
MAX_LOG_READ = 8 << 20  # bytes of a worker's log read back at most (its last ones)
MAX_BUILDS = 32  # build requests one conversation may make; more is taken for a broken worker
SEND_TIMEOUT_S = 30.0  # a message to a worker that does not read it
EXIT_GRACE_S = 10.0  # an unhealthy or closing worker gets this long to exit on its own
MAX_REQUESTS = 64  # a worker is recycled after this many requests (loaded extensions only accumulate)


class WorkerStartError(RuntimeError):
    """The worker could not start at all: a problem of the host, not of a candidate."""


@dataclass(frozen=True)
class WorkerSpec:
    backend: str  # a backend name, or its import path (eval/backends: backend_path)
    build_dir: str
    threads: int
    compile_only: bool = False  # a compile-pool worker or a builder: no device
    device: int | None = None  # index among this process's visible GPUs (None: the default / no GPU)
    arch: str | None = None  # TORCH_CUDA_ARCH_LIST for builds (compile workers get the GPU worker's)
    isolate: bool = False  # in namespaces of its own: no other process visible, no network (eval/isolation.py)
    module: str = "stark_ray.eval.worker"  # what runs: the worker (candidates) or the judge
    fd_channel: bool = False  # a Unix socket for file descriptors beside the pipes (a device worker's)
    extra: tuple[str, ...] = ()  # more arguments for the module
    env: tuple[tuple[str, str], ...] = ()  # more environment variables for it
    hidden: tuple[str, ...] = ()  # isolated: paths it does not see (eval/isolation.py: hidden_paths)
    writable: tuple[str, ...] = ()  # isolated: what it may write beside its own directory (a builder's output)

    def argv(self, spare: bool = False, fd: int | None = None) -> list[str]:
        args = [sys.executable, "-m", self.module, "--backend", backend_path(self.backend),
                "--build-dir", self.build_dir, "--threads", str(self.threads), *self.extra]
        if self.compile_only:
            args.append("--compile-only")
        if self.arch:
            args += ["--arch", self.arch]
        if spare:
            args.append("--spare")
        if fd is not None:
            args += ["--fd-channel", str(fd)]
        if self.isolate:  # the cache read-only: what is missing there, a builder makes (eval/builds.py)
            args.append("--ask-builds")
            return jailed(args, writable=self.writable, readable=(self.build_dir,), hidden=self.hidden)
        return args


@dataclass
class Reply:
    """The answer to one message of a conversation: the message, or why there is none."""

    msg: dict[str, Any] | None
    phase: str  # the phase it ended in
    timed_out: bool = False
    dead: bool = False
    returncode: int | None = None  # set when the process ended
    log: str = ""  # what the process printed since the log was marked (kept when it died or timed out)

    @property
    def ok(self) -> bool:
        return self.msg is not None


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
    extra: dict[str, Any] = field(default_factory=dict)  # what else the final message said (the judge's stats)

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
    """The worker's control channel, a line each; a line longer than MAX_LINE ends it (taken for the worker's
    end: a hostile one could otherwise fill the parent's memory)."""
    try:
        while True:
            line = stream.readline(MAX_LINE + 1)
            if not line or len(line) > MAX_LINE:
                break
            q.put(line)
    finally:
        q.put(None)


def _write(fd: int, data: bytes, deadline: float) -> None:
    """All of ``data`` to a non-blocking pipe before ``deadline`` (TimeoutError after it: a worker that does not
    read its stdin cannot block its parent)."""
    view = memoryview(data)
    while view:
        _, ready, _ = select.select([], [fd], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError("the worker does not read its input")
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue


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
    sock: socket.socket | None = None  # our end of the file-descriptor channel
    ready: bool = False  # a spare that said it waits, its imports done
    log_fd: int = -1  # the log, as the parent opened it: read through this, never by its path (which the worker
    # could replace with a link to a file only the parent may read)


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
        self._log_fd = -1
        self._sock: socket.socket | None = None
        self._spare: _Child | None = None
        self._mark = 0  # log offset of the conversation in progress
        # serves the builds an isolated worker asks for (eval/builds.py): (request, seconds left) -> answer
        self.on_build: Callable[[dict[str, Any], float], dict[str, Any]] | None = None
        self._builds = 0  # build requests since the log was marked (one conversation)
        self.claims: list[str] = []  # a builder's word: the key of what it builds, said before its compiler runs

    # -- life cycle -------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _env(self, workdir: Path) -> dict[str, str]:
        env = worker_env(workdir, self.spec.threads)
        if self.spec.isolate:  # a cache that candidates write is theirs alone
            env["TRITON_CACHE_DIR"] = str(workdir / "triton")
        else:
            env.setdefault("TRITON_CACHE_DIR", str(Path(self.spec.build_dir) / "triton"))
        if self.spec.isolate:  # a home of its own: the evaluator's is not there (eval/jail.py)
            user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
            if user_site and os.path.isdir(user_site):  # what was installed with pip --user stays importable
                env["PYTHONPATH"] += os.pathsep + user_site
            env["HOME"] = str(workdir)
            env["XDG_CACHE_HOME"] = str(workdir / ".cache")
        if self.spec.compile_only:
            env["CUDA_VISIBLE_DEVICES"] = ""  # builds never touch a GPU (nor create a context on it)
        else:
            pinned = visible_device(self.spec.device, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if pinned is not None:
                env["CUDA_VISIBLE_DEVICES"] = pinned
        env.update(dict(self.spec.env))
        return env

    def _spawn(self, spare: bool = False) -> _Child:
        workdir = Path(tempfile.mkdtemp(prefix="stark-eval-"))
        ours, theirs = socket.socketpair() if self.spec.fd_channel else (None, None)
        log = os.open(workdir / "worker.log", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            proc = spawn(self.spec.argv(spare, theirs.fileno() if theirs else None), self._env(workdir),
                         direct=not self.spec.isolate, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=log, cwd=workdir, start_new_session=True,
                         pass_fds=[theirs.fileno()] if theirs else ())
        except BaseException:
            os.close(log)
            raise
        finally:
            if theirs is not None:
                theirs.close()
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)
        q: queue.Queue[bytes | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        return _Child(proc, q, workdir, time.monotonic(), ours, log_fd=log)

    def spare_ready(self, timeout_s: float = 0.0) -> bool:
        """Whether a spare waits with its imports done (waiting up to ``timeout_s`` for it to say so)."""
        child = self._spare
        deadline = time.monotonic() + timeout_s
        while child is not None and child.proc.poll() is None and not child.ready:
            try:
                line = child.queue.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return False
                continue
            if line is None:
                return False
            with contextlib.suppress(ValueError):
                child.ready = json.loads(line) == {"waiting": True}
        return child is not None and child.ready and child.proc.poll() is None

    def _take_spare(self) -> _Child | None:
        """The spare, told to go on (None when there is none, or it died waiting)."""
        child, self._spare = self._spare, None
        if child is None:
            return None
        try:
            assert child.proc.stdin is not None
            _write(child.proc.stdin.fileno(), b"go\n", time.monotonic() + SEND_TIMEOUT_S)
            return child
        except (OSError, AssertionError):
            _end(child.proc, child.workdir, sock=child.sock, log_fd=child.log_fd)
            return None

    def start(self) -> dict[str, Any]:
        """Start a fresh process (the spare, if one waits) and wait for its hello (the device's properties)."""
        self.close_current()
        child = self._take_spare()
        promoted = child is not None
        if child is None:
            child = self._spawn()
        self._proc, self._queue, self._workdir, self._sock = child.proc, child.queue, child.workdir, child.sock
        self._log_fd = child.log_fd
        self._mark = 0
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
                role = "judge" if self.spec.module.endswith("judge") else "worker"
                raise WorkerStartError(f"the {self.spec.backend} evaluator {role} {why} while starting: {tail}")

    def sweep(self) -> int:
        """Kill every process below this one that is not the serving process or the spare (nor, isolated, the
        worker inside each ``unshare``): what a candidate left running. How many there were."""
        keep = [p.pid for p in (self._proc, self._spare.proc if self._spare else None) if p is not None]
        return kill_strays(keep, keep if self.spec.isolate else ())

    def kill(self) -> None:
        """Kill the serving process (and everything in its group); the spare stays."""
        self._end_current(kill=True)

    def close_current(self) -> None:
        """Let the serving worker finish (end of its stdin), then make sure it and its group are gone."""
        self._end_current(kill=False)

    def _end_current(self, kill: bool) -> None:
        if self._proc is not None:
            _end(self._proc, self._workdir, kill, self._sock, self._log_fd)
        self._proc = None
        self._workdir = None
        self._log_fd = -1
        self._sock = None

    def close(self) -> None:
        """End the serving worker and the spare."""
        self.close_current()
        child, self._spare = self._spare, None
        if child is not None:
            _end(child.proc, child.workdir, sock=child.sock, log_fd=child.log_fd)

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
            except Exception:  # not JSON, or nested too deep to parse (RecursionError): not a message
                continue
            if isinstance(msg, dict):
                return msg, False

    def _log_size(self) -> int:
        try:
            return os.fstat(self._log_fd).st_size if self._log_fd >= 0 else 0
        except OSError:
            return 0

    def _read_log(self, offset: int) -> str:
        """The log from ``offset`` on, read through the parent's own descriptor; at most its last MAX_LOG_READ
        bytes."""
        size = self._log_size()
        start = max(offset, size - MAX_LOG_READ)
        if size <= start:
            return ""
        try:
            data = os.pread(self._log_fd, size - start, start)
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return f"[{start - offset} bytes of log left out]\n{text}" if start > offset else text

    def _dump_stack(self) -> None:
        """Ask the worker (not its compiler children) to print where it is stuck, and give it a moment."""
        assert self._proc is not None
        # an isolated worker is the child of `unshare`, which a SIGUSR1 would end (and the worker with it)
        pids = children(self._proc.pid)[:1] if self.spec.isolate else [self._proc.pid]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            for pid in pids:
                os.kill(pid, STACK_DUMP_SIGNAL)
            time.sleep(STACK_DUMP_WAIT_S)

    def mark_log(self) -> None:
        """What the process prints from now on is the log of the next replies (a candidate's, say)."""
        self._mark = self._log_size()
        self._builds = 0

    def log_since_mark(self) -> str:
        return self._read_log(self._mark)

    def send(self, msg: dict[str, Any], fds: Sequence[int] = (), deadline: float | None = None) -> bool:
        """Write one message (and pass ``fds`` on the descriptor channel); False when the process is gone or does
        not read it before ``deadline`` (or SEND_TIMEOUT_S)."""
        if not self.alive:
            return False
        assert self._proc is not None and self._proc.stdin is not None
        try:
            limit = time.monotonic() + SEND_TIMEOUT_S
            _write(self._proc.stdin.fileno(), (json.dumps(msg) + "\n").encode(), min(deadline or limit, limit))
            if fds:
                if self._sock is None:
                    raise OSError("no descriptor channel")
                send_fds(self._sock, fds)
        except (OSError, TimeoutError):
            return False
        return True

    def await_reply(self, clock: PhaseClock) -> Reply:
        """The next message that is not a phase change (phase changes move ``clock`` on). When the process dies or
        the phase runs out of time (its stack is dumped first), it is killed and the Reply says so."""
        assert self._proc is not None
        while True:
            msg, dead = self._next(clock.deadline)
            if dead:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=EXIT_GRACE_S)  # let it finish its log
                reply = Reply(None, clock.phase, dead=True, returncode=self._proc.poll(), log=self.log_since_mark())
                self.kill()
                return reply
            if msg is None:  # the phase ran out of time
                self._dump_stack()
                reply = Reply(None, clock.phase, timed_out=True, log=self.log_since_mark())
                self.kill()
                return reply
            if "phase" in msg and len(msg) == 1:
                clock.enter(str(msg["phase"]))
                continue
            if "build" in msg and len(msg) == 1:  # answered, and the wait goes on (the build is in its time)
                self._builds += 1
                if self._builds > MAX_BUILDS:  # a flood: a broken worker, ended
                    reply = Reply(None, clock.phase, dead=True, log=self.log_since_mark()
                                  + f"\nstark: the worker asked for more than {MAX_BUILDS} builds in one request")
                    self.kill()
                    return reply
                self.send(self._serve_build(msg["build"], clock), deadline=clock.deadline)
                continue
            if "claim" in msg and len(msg) == 1:
                self.claims.append(str(msg["claim"]))
                continue
            return Reply(msg, clock.phase)

    def _serve_build(self, request: Any, clock: PhaseClock) -> dict[str, Any]:
        if self.on_build is None or not isinstance(request, dict):
            return {"built": False, "error": "builds are not served to this process"}
        try:
            return self.on_build(request, max(0.0, clock.deadline - time.monotonic()))
        except Exception as e:  # the parent's fault, told as a failed build: the candidate's process waits
            return {"built": False, "error": f"the build could not be served: {type(e).__name__}: {e}"}

    def converse(self, msg: dict[str, Any], clock: PhaseClock, fds: Sequence[int] = ()) -> Reply:
        """Send ``msg`` and wait for its answer (starting the process first if it is not running)."""
        if not self.alive:
            self.start()
        if not self.send(msg, fds):
            return self.await_reply(clock)  # it died: the reply says how
        return self.await_reply(clock)

    def request(self, request: WorkerRequest, timeouts: dict[str, float],
                on_phase: Callable[[str], None] | None = None) -> WorkerOutcome:
        """Serve one request that ends with a result (the service to the judge, the pool to a compile worker);
        ``timeouts`` maps each phase to its own limit in seconds; ``on_phase`` hears each phase it enters."""
        if not self.alive:
            self.start()
        self.mark_log()
        self.claims = []
        started = time.monotonic()
        clock = PhaseClock(timeouts, self.start_timeout_s, on_enter=on_phase)
        reply = self.converse(json.loads(request.to_json()), clock)
        while reply.msg is not None and "result" not in reply.msg:  # anything else is not for us
            reply = self.await_reply(clock)
        clock.close()
        result = result_from_message(reply.msg["result"]) if reply.msg is not None else None
        healthy = reply.msg is not None and bool(reply.msg.get("healthy", True))
        wall = time.monotonic() - started
        log = reply.log if reply.msg is None else self.log_since_mark()  # before the process (and its log) ends
        if reply.msg is not None:
            if not healthy:  # it said it will exit: give it a moment, then make sure
                with contextlib.suppress(subprocess.TimeoutExpired):
                    assert self._proc is not None
                    self._proc.wait(timeout=EXIT_GRACE_S)
                self.kill()
            else:
                self.served += 1
                if self.served >= self.max_requests:
                    self.close_current()
        outcome = WorkerOutcome(result, clock.phase, reply.returncode, reply.timed_out, log, wall, clock.spent, healthy)
        outcome.extra = {k: v for k, v in (reply.msg or {}).items() if k not in ("result", "healthy")}
        if self.claims:
            outcome.extra["claims"] = list(self.claims)
        return outcome


def _end(proc: subprocess.Popen[bytes], workdir: Path | None, kill: bool = False,
         sock: socket.socket | None = None, log_fd: int = -1) -> None:
    """Make sure a worker process and its group are gone (``kill``: at once; else it may first exit by itself
    when its stdin ends), and remove its directory."""
    if sock is not None:
        sock.close()
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
    if log_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(log_fd)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def run_once(spec: WorkerSpec, request: WorkerRequest, timeouts: dict[str, float],
             on_build: Callable[[dict[str, Any], float], dict[str, Any]] | None = None) -> WorkerOutcome:
    """One request in a fresh worker that ends with it (the compile pool's way, and the safest); the builds it
    asks for served by ``on_build``. A builder's claim is in the outcome's ``extra["claims"]``."""
    worker = WorkerProcess(spec, start_timeout_s=timeouts.get(PHASE_START, START_TIMEOUT_S), max_requests=1)
    return serve_once(worker, request, timeouts, on_build)


def serve_once(worker: WorkerProcess, request: WorkerRequest, timeouts: dict[str, float],
               on_build: Callable[[dict[str, Any], float], dict[str, Any]] | None = None) -> WorkerOutcome:
    """One request on ``worker`` (started first where its process is not: its spare, if one waits), whose serving
    process ends with the request; the builds it asks for served by ``on_build``."""
    worker.on_build = on_build
    try:
        try:
            if not worker.alive:
                worker.start()
        except WorkerStartError as e:
            return WorkerOutcome(None, PHASE_START, None, False, str(e), 0.0, {}, False)
        return worker.request(request, timeouts)
    finally:
        worker.kill()
        worker.on_build = None
