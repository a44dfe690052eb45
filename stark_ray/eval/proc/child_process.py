"""One process of the evaluator as its parent holds it (eval/proc/runner.py drives the conversation): spawned in a
private directory of its own, with its log; its control channel read a line at a time; messages written to it
without blocking; its log read back; its stack dumped; and its end, with its group and its directory.

Everything that comes from the process is taken for hostile: a line longer than MAX_LINE ends the channel, a
line that does not parse is no message, a write has a deadline, and the log is read through the descriptor the
parent opened (never by its path, which the process could replace with a link), at most its last MAX_LOG_READ
bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from stark_ray.eval.proc.launch import WorkerSpec, spec_env
from stark_ray.eval.proc.lifetime import spawn
from stark_ray.eval.proc.process_tree import children, descendants, exited, kill_tree
from stark_ray.eval.wire.protocol import STACK_DUMP_SIGNAL, STACK_DUMP_WAIT_S

MAX_LINE = 64 << 20  # bytes in one message of a worker (a build request carries a candidate's sources)
MAX_LOG_READ = 8 << 20  # bytes of a worker's log read back at most (its last ones)
EXIT_GRACE_S = 10.0  # an unhealthy or closing worker gets this long to exit on its own
GONE_WAIT_S = 2.0  # ... and the processes below a killed one this long to end


def read_lines(stream: IO[bytes], q: queue.Queue[bytes | None]) -> None:
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


def write_all(fd: int, data: bytes, deadline: float) -> None:
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


@dataclass
class Child:
    """One spawned worker process: its pipes, the reader of its control channel, its private directory."""

    proc: subprocess.Popen[bytes]
    queue: queue.Queue[bytes | None]
    workdir: Path
    spawned: float
    sock: socket.socket | None = None  # our end of the file-descriptor channel
    ready: bool = False  # a spare that said it waits, its imports done
    log_fd: int = -1  # the log, as the parent opened it: read through this, never by its path (which the worker
    # could replace with a link to a file only the parent may read)


def spawn_child(spec: WorkerSpec, spare: bool = False) -> Child:
    """A new process of ``spec`` (``spare``: one that waits, its imports done, to be told to go on)."""
    workdir = Path(tempfile.mkdtemp(prefix="stark-eval-"))
    ours, theirs = socket.socketpair() if spec.fd_channel else (None, None)
    log = os.open(workdir / "worker.log", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        proc = spawn(spec.argv(spare, theirs.fileno() if theirs else None), spec_env(spec, workdir),
                     direct=not spec.isolate, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
    threading.Thread(target=read_lines, args=(proc.stdout, q), daemon=True).start()
    return Child(proc, q, workdir, time.monotonic(), ours, log_fd=log)


def wait_ready(child: Child | None, timeout_s: float) -> bool:
    """Whether ``child`` (a spare) waits with its imports done (waiting up to ``timeout_s`` for it to say so)."""
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


def next_message(proc: subprocess.Popen[bytes], q: queue.Queue[bytes | None],
                 deadline: float) -> tuple[dict[str, Any] | None, bool]:
    """The next message of ``proc`` (read into ``q``) before ``deadline``: (message or None, whether the worker is
    gone)."""
    while True:
        now = time.monotonic()
        if now >= deadline:
            return None, False
        try:
            line = q.get(timeout=min(deadline - now, 0.5))
        except queue.Empty:
            if proc.poll() is not None and q.empty():
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


def log_size(log_fd: int) -> int:
    try:
        return os.fstat(log_fd).st_size if log_fd >= 0 else 0
    except OSError:
        return 0


def read_log(log_fd: int, offset: int) -> str:
    """The log from ``offset`` on, read through the parent's own descriptor; at most its last MAX_LOG_READ
    bytes."""
    size = log_size(log_fd)
    start = max(offset, size - MAX_LOG_READ)
    if size <= start:
        return ""
    try:
        data = os.pread(log_fd, size - start, start)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return f"[{start - offset} bytes of log left out]\n{text}" if start > offset else text


def dump_stack(proc: subprocess.Popen[bytes], isolate: bool) -> None:
    """Ask the worker (not its compiler children) to print where it is stuck, and give it a moment."""
    # an isolated worker is the child of `unshare`, which a SIGUSR1 would end (and the worker with it)
    pids = children(proc.pid)[:1] if isolate else [proc.pid]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        for pid in pids:
            os.kill(pid, STACK_DUMP_SIGNAL)
        time.sleep(STACK_DUMP_WAIT_S)


def end_process(proc: subprocess.Popen[bytes], workdir: Path | None, kill: bool = False,
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
    below = descendants(proc.pid)  # an isolated worker is the child of `unshare`: it must be gone too
    if proc.poll() is None:
        kill_tree(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=EXIT_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything the candidate left running in the group
    # killed, they end in a moment: until then the next sweep would count them as strays the candidate left
    deadline = time.monotonic() + GONE_WAIT_S
    while below and time.monotonic() < deadline:
        below = {pid for pid in below if not exited(pid)}
        if below:
            time.sleep(0.01)
    if log_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(log_fd)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
