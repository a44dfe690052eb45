"""Parent side of a process of the evaluator: start it, talk to it, watch each phase against its timeout, kill it.

A :class:`WorkerProcess` is long-lived: it serves request after request in one process (for a GPU: one CUDA
context, the loaded reference and the built extensions stay warm). The service starts the judge this way, and
the judge its worker (which runs the candidates). Whatever a candidate does — segfault, ``os._exit``, an endless
loop at import or in forward, a sticky CUDA error, a build that never ends — the caller gets a
:class:`Reply` or a :class:`WorkerOutcome`, never an exception, and the next request runs in a fresh process. A
timeout kills the process's whole tree (ninja and the compiler included).

Messages are JSON lines: requests on the process's stdin, answers on a private channel (its stdout, moved off
fd 1 at start). A process started with ``fd_channel`` also gets one end of a Unix socket pair for file
descriptors (the judge's shared buffers, :mod:`stark_ray.eval.wire.exchange`). What a process is started as is
:mod:`stark_ray.eval.proc.launch`; one process's pipes, log and end are :mod:`stark_ray.eval.proc.child_process`.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stark_ray.eval.hardware import oom_kills
from stark_ray.eval.proc.child_process import (
    EXIT_GRACE_S,
    Child,
    dump_stack,
    end_process,
    log_size,
    next_message,
    read_log,
    spawn_child,
    write_all,
)
from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.eval.proc.lifetime import kill_strays, strays
from stark_ray.eval.proc.phase_clock import START_TIMEOUT_S, PhaseClock
from stark_ray.eval.proc.process_tree import exited, freeze_tree, thaw
from stark_ray.eval.proc.spares import Spares
from stark_ray.eval.wire.protocol import PHASE_START, WorkerRequest, result_from_message, send_fds
from stark_ray.records import EvalResult

MAX_BUILDS = 32  # build requests one conversation may make; more is taken for a broken worker
SEND_TIMEOUT_S = 30.0  # a message to a worker that does not read it
MAX_REQUESTS = 64  # a worker is recycled after this many requests (loaded extensions only accumulate)


class WorkerStartError(RuntimeError):
    """The worker could not start at all: a problem of the host, not of a candidate."""


@dataclass
class Reply:
    """The answer to one message of a conversation: the message, or why there is none."""

    msg: dict[str, Any] | None
    phase: str  # the phase it ended in
    timed_out: bool = False
    dead: bool = False
    returncode: int | None = None  # set when the process ended
    log: str = ""  # what the process printed since the log was marked (kept when it died or timed out)
    oom_killed: bool = False  # it died while the kernel's out-of-memory killer killed in its control group

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
    oom_killed: bool = False  # it died by the kernel's out-of-memory killer (Reply.oom_killed)
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


class WorkerProcess:
    """One worker process at a time, restarted on demand. Not thread-safe: callers serialize requests.

    With ``spares`` (a device worker) processes are started beside the one serving (:mod:`stark_ray.eval.proc.spares`):
    each does all its imports and then waits, touching no device, until a restart (a crash, a timeout, a poisoned
    context, the recycling after ``max_requests`` or after each candidate) promotes one — the next candidate then
    waits for a CUDA context (under a second), not for a whole interpreter start (seconds) — and another is started
    behind it; up to ``spares`` of them where starts come faster than one gets ready."""

    def __init__(self, spec: WorkerSpec, start_timeout_s: float = START_TIMEOUT_S,
                 max_requests: int = MAX_REQUESTS, spares: int = 0) -> None:
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self.max_requests = max_requests
        self.use_spare = spares > 0
        self.hello: dict[str, Any] = {}
        self.starts = 0  # processes started so far (1 + restarts)
        self.promotions = 0  # restarts served by a spare
        self.ahead: tuple[str, float] | None = None  # a start made between requests (start_ahead), until a step
        self.last_start = "fresh"  # the last start: "spare" (one waited ready), "unready" (promoted mid-start), "fresh"
        self.served = 0  # requests answered by the current process
        self._proc: subprocess.Popen[bytes] | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._workdir: Path | None = None
        self._log_fd = -1
        self._sock: socket.socket | None = None
        self.spares = Spares(lambda: self._spawn(spare=True), spares)
        self._mark = 0  # log offset of the conversation in progress
        # serves the builds an isolated worker asks for (eval/build/builder.py): (request, seconds left) -> answer
        self.on_build: Callable[[dict[str, Any], float], dict[str, Any]] | None = None
        self._builds = 0  # build requests since the log was marked (one conversation)
        self._oom_kills: int | None = None  # the control group's out-of-memory kills when the log was marked
        self._ended_strays = 0  # a candidate's processes that ended with their worker since the last sweep
        self._ending = threading.Lock()  # taken to end the serving process: it is ended once, whoever asks
        self.claims: list[str] = []  # a builder's word: the key of what it builds, said before its compiler runs

    # -- life cycle -------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        proc = self._proc  # once: another thread may end it meanwhile
        return proc is not None and proc.poll() is None

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """The serving process and everything below it stopped (SIGSTOP) meanwhile, and let go on after: a
        measurement of the parent's own then shares the host with nothing the candidate left running there (a
        thread that spins while the reference is timed). The processes a candidate started below it are killed
        first, not only after the request: a stopped process's work queued on a GPU runs on, in a CUDA context of
        its own, which ends with the process (the next :meth:`sweep` counts them)."""
        pids: set[int] = set()
        proc = self._proc
        try:
            if proc is not None and proc.poll() is None:
                pids = freeze_tree(proc.pid)
                self._ended_strays = self.sweep()  # (the earlier ones counted in) said by the request's own sweep
            yield
        finally:
            thaw(pids)

    def _spawn(self, spare: bool = False) -> Child:
        return spawn_child(self.spec, spare)

    def spare_ready(self, timeout_s: float = 0.0) -> bool:
        """Whether a spare waits with its imports done (waiting up to ``timeout_s`` for one to say so)."""
        return self.spares.ready(timeout_s)

    def start(self, fresh: bool = False) -> dict[str, Any]:
        """Start a fresh process (a spare, if one waits and not ``fresh``) and wait for its hello (the device's
        properties); ``last_start`` says how: "spare" (one waited ready), "unready" (one still importing), "fresh"."""
        self.close_current()
        child, self.last_start = (None, "fresh") if fresh else self.spares.promote(SEND_TIMEOUT_S)
        promoted = child is not None
        if child is None:
            child = self._spawn()
        with self._ending:  # all of its fields at once: one ending it meanwhile sees all of them or none
            self._proc, self._queue, self._workdir, self._sock = child.proc, child.queue, child.workdir, child.sock
            self._log_fd = child.log_fd
        self._mark = 0
        self._oom_kills = oom_kills()  # a new process: earlier kills are not its
        self.starts += 1
        self.served = 0
        go = time.monotonic()
        deadline = go + self.start_timeout_s
        while True:
            msg, dead = next_message(child.proc, self._queue, deadline)
            if msg is not None and "hello" in msg:
                self.hello = dict(msg["hello"])
                phases = self.hello.get("start_phases")
                if isinstance(phases, dict):  # the whole start as the parent saw it (interpreter start included)
                    phases["total_s"] = round(time.monotonic() - child.spawned, 3)
                    if promoted:
                        phases["promoted_s"] = round(time.monotonic() - go, 3)  # what a restart waited
                    phases["spare_was_ready"] = self.last_start == "spare"
                self.promotions += promoted
                if self.use_spare:
                    self.spares.top_up()
                return self.hello
            if dead or time.monotonic() >= deadline:
                log = self._read_log(0)
                why = "timed out" if not dead else "exited"
                self.kill()
                if promoted:  # the spare could not take over: a fresh start (not another spare) says whether
                    return self.start(fresh=True)  # the host can
                tail = " | ".join(log.strip().splitlines()[-3:]) if log.strip() else "no output"
                role = "judge" if self.spec.module.endswith("judge") else "worker"
                raise WorkerStartError(f"the {self.spec.backend} evaluator {role} {why} while starting: {tail}")

    def start_ahead(self) -> None:
        """Between requests: where the last one ended its process (a retired candidate's), the next one is started
        now — a spare promoted, its device context made — while the caller builds its next candidate, not once it
        asks. ``ahead`` says how and in how long, until the next step; a failed start is the next request's to say."""
        self.ahead = None
        if not self.use_spare:
            return
        try:
            lap = self.start_lap()
        except Exception:  # nothing of a start's failure ends the judge: the next request starts and says why
            return
        if lap is not None:
            self.ahead = (lap[0].replace("start/", "ahead/", 1), lap[1])

    def start_lap(self) -> tuple[str, float] | None:
        """Start a process where none serves: the lap that says how — ``start/spare`` (one waited ready),
        ``start/unready`` (one still importing), ``start/fresh`` (none) — and its seconds; None where one serves."""
        if self.alive:
            return None
        began = time.monotonic()
        self.start()
        return f"start/{self.last_start}", time.monotonic() - began

    def sweep(self) -> int:
        """Kill every process below this one that is not the serving process or a spare (nor, isolated, the
        worker inside each ``unshare``): what a candidate left running. How many there were, those that died with a
        worker ended since the last sweep included."""
        keep = self._keep()
        ended, self._ended_strays = self._ended_strays, 0
        return kill_strays(keep, keep if self.spec.isolate else ()) + ended

    def _keep(self) -> list[int]:
        """The processes that are no strays: the serving one and the spares."""
        return ([self._proc.pid] if self._proc is not None else []) + self.spares.pids()

    def _strays_below(self) -> int:
        """How many strays (:meth:`sweep`'s) run now: a candidate's, which end with the worker about to end."""
        keep = self._keep()
        return sum(not exited(p) for p in strays(keep, keep if self.spec.isolate else ()))

    def kill(self) -> None:
        """Kill the serving process (and everything in its group); the spares stay."""
        self._end_current(kill=True)

    def close_current(self) -> None:
        """Let the serving worker finish (end of its stdin), then make sure it and its group are gone."""
        self._end_current(kill=False)

    def _end_current(self, kill: bool) -> None:
        # one owner per process: a service closed under another thread's request ends it here while that thread may
        # end it too; the second waits, then finds nothing left to end (its descriptors closed twice would close
        # another's), and neither returns before the process is gone
        with self._ending:
            proc, workdir, sock, log_fd = self._proc, self._workdir, self._sock, self._log_fd
            if proc is None:
                return
            self._ended_strays += self._strays_below()  # they end with it: the next sweep says so
            self._proc = None
            self._workdir = None
            self._log_fd = -1
            self._sock = None
            end_process(proc, workdir, kill, sock, log_fd)

    def close(self) -> None:
        """End the serving worker and the spares."""
        self.close_current()
        self.spares.close()

    # -- requests ---------------------------------------------------------------------------------------------

    def mark_log(self) -> None:
        """What the process prints from now on is the log of the next replies (a candidate's, say)."""
        with self._ending:  # its descriptor is not closed meanwhile (see log_since_mark)
            self._mark = log_size(self._log_fd)
        self._builds = 0
        self._oom_kills = oom_kills()  # a death with more of them since: the host's memory, said as such

    def log_since_mark(self) -> str:
        """The log since :meth:`mark_log`; empty where the process was ended meanwhile. Read under the lock that ends
        it: another thread ending it closes the descriptor, whose number the next file opened may take."""
        return self._read_log(self._mark)

    def _read_log(self, offset: int) -> str:
        with self._ending:  # its descriptor is not closed (and its number taken) meanwhile; closed: "" (read_log)
            return read_log(self._log_fd, offset)

    def send(self, msg: dict[str, Any], fds: Sequence[int] = (), deadline: float | None = None) -> bool:
        """Write one message (and pass ``fds`` on the descriptor channel); False when the process is gone or does
        not read it before ``deadline`` (or SEND_TIMEOUT_S)."""
        proc, sock = self._proc, self._sock  # once: another thread may end it meanwhile
        if proc is None or proc.poll() is not None or proc.stdin is None:
            return False
        try:
            limit = time.monotonic() + SEND_TIMEOUT_S
            write_all(proc.stdin.fileno(), (json.dumps(msg) + "\n").encode(), min(deadline or limit, limit))
            if fds:
                if sock is None:
                    raise OSError("no descriptor channel")
                send_fds(sock, fds)
        except (OSError, TimeoutError):
            return False
        return True

    def await_reply(self, clock: PhaseClock) -> Reply:
        """The next message that is not a phase change (phase changes move ``clock`` on). When the process dies or
        the phase runs out of time (its stack is dumped first), it is killed and the Reply says so."""
        proc = self._proc  # held here: another thread may end it (and clear the field) while this one waits
        assert proc is not None
        while True:
            msg, dead = next_message(proc, self._queue, clock.deadline)
            if dead:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=EXIT_GRACE_S)  # let it finish its log
                reply = Reply(None, clock.phase, dead=True, returncode=proc.poll(), log=self.log_since_mark())
                now, before = oom_kills(), self._oom_kills
                reply.oom_killed = (reply.returncode == -signal.SIGKILL and now is not None and before is not None
                                    and now > before)
                self.kill()
                return reply
            if msg is None:  # the phase ran out of time
                dump_stack(proc, self.spec.isolate)
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
        self.ahead = None
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
                proc = self._proc
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=EXIT_GRACE_S)
                self.kill()
            else:
                self.served += 1
                if self.served >= self.max_requests:
                    self.close_current()
        outcome = WorkerOutcome(result, clock.phase, reply.returncode, reply.timed_out, log, wall, clock.spent, healthy,
                                oom_killed=reply.oom_killed)
        outcome.extra = {k: v for k, v in (reply.msg or {}).items() if k not in ("result", "healthy")}
        if self.claims:
            outcome.extra["claims"] = list(self.claims)
        return outcome


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
