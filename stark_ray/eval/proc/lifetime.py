"""No process of the evaluator outlives its parent, and no process a candidate starts outlives its request.

- **Death with the parent.** Every evaluator process (judge, worker, spare, compile worker) is started through
  ``setpriv --pdeathsig KILL``: the kernel kills it when the process that started it dies, ``kill -9`` included
  (a process waiting on a hanging kernel cannot run any code of its own to notice). The kernel ties that signal to
  the *thread* that forked the child, so every start goes through one long-lived thread (:func:`spawn`); a thread
  that started a worker and then ended would otherwise kill it. Where ``setpriv`` is missing, the child asks for
  the same itself as it starts (:func:`die_with_parent`).
- **Orphans stay in the tree.** Judge and workers are child subreapers (``PR_SET_CHILD_SUBREAPER``): what a
  candidate starts and detaches (a double fork) is re-parented to the nearest of them instead of to init, so it is
  still their descendant. After each candidate the judge kills every process below it that is not a worker
  (:func:`strays`); a worker reaps what was killed (:func:`reap`).

What remains without isolation: a process that a candidate detached survives a ``kill -9`` of the whole evaluator
at once (its subreapers die with it, and init adopts it). With isolation the PID namespace ends with the worker and
takes everything in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any

from stark_ray.eval.proc.process_tree import children, descendants, exited, kill_tree, parents

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_ENV = "STARK_RAY_PARENT"  # the pid a child expects as its parent (the fallback's check)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (not to init)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:
    """The fallback where ``setpriv`` is missing: SIGKILL when the parent dies; gone at once if it already has."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    expected = os.environ.get(PARENT_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        os._exit(0)


@functools.cache
def death_prefix() -> tuple[str, ...]:
    """``setpriv --pdeathsig KILL --`` where this host has it (probed once), else nothing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else ()


class _Spawner:
    """One thread that lives as long as the process and forks every evaluator process (see the module's doc)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[tuple[bool, Any]]]] = queue.Queue()
        self.pid = -1  # the process whose thread serves (a fork starts its own)

    def run(self, job: Callable[[], Any]) -> Any:
        with self.lock:
            if self.pid != os.getpid():
                self.jobs = queue.Queue()
                threading.Thread(target=self._serve, args=(self.jobs,), name="stark-spawner", daemon=True).start()
                self.pid = os.getpid()
        done: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.jobs.put((job, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    @staticmethod
    def _serve(jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[tuple[bool, Any]]]]) -> None:
        while True:
            job, done = jobs.get()
            try:
                done.put((True, job()))
            except BaseException as e:  # the caller raises it
                done.put((False, e))


_SPAWNER = _Spawner()


def spawn(argv: list[str], env: dict[str, str], direct: bool = True, **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` of ``argv`` that dies with this process (``setpriv``, or the child's own request).
    ``direct``: ``argv`` is the evaluator process itself (not a wrapper such as ``unshare``), so that where
    ``setpriv`` is missing it can check that its parent is still this process."""
    prefix = death_prefix()
    env = {k: v for k, v in env.items() if k != PARENT_ENV}  # never a grandparent's, passed down
    if direct and not prefix:
        env[PARENT_ENV] = str(os.getpid())
    return _SPAWNER.run(lambda: subprocess.Popen([*prefix, *argv], env=env, **popen))


def strays(keep: Iterable[int], wrappers: Iterable[int] = ()) -> list[int]:
    """Every process below this one that is not in ``keep`` (the workers) nor the one child of a ``wrappers``
    process (``unshare``: the worker inside it): what candidates left running. One snapshot of /proc, so that a
    wrapper's child that appears meanwhile is not taken for a stray."""
    kept, wrapped = set(keep), set(wrappers)
    snapshot = parents()
    return sorted(p for p in descendants(os.getpid(), snapshot)
                  if p not in kept and snapshot.get(p) not in wrapped)


def kill_strays(keep: Iterable[int], wrappers: Iterable[int] = ()) -> int:
    """Kill :func:`strays` (with everything below them) and reap those that were this process's children: how many
    of them still ran (a zombie ran nothing)."""
    found = strays(keep, wrappers)
    if not found:
        return 0
    # a killed worker's own process, reparented here, waits to be reaped: a candidate left nothing running there
    running = sum(not exited(pid) for pid in found)
    mine = set(children(os.getpid()))
    for pid in found:
        kill_tree(pid)
    for pid in found:
        if pid in mine:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
    return running


def reap() -> int:
    """Collect the exit status of every child that has ended (strays the judge killed): no zombies pile up. Only
    between requests: a child some code of this process still waits for would lose its status."""
    count = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return count
        if pid == 0:
            return count
        count += 1
