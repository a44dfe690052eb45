"""A worker's hot spares: processes started ahead that have done their imports and wait to be told to go on.

A fresh worker for each candidate (``EvalConfig.worker_candidates`` 1, a GPU's default) costs a whole interpreter
start — torch imported (torch._dynamo too on a GPU), 7-9 s on the GPU machine — unless a spare waits ready; then it
costs a CUDA context. One spare keeps up only where requests come slower than a spare gets ready. Back to back on small
tasks (a reference and a candidate every 3 s in the KernelBench sweep) each start found the one spare still
importing and waited for the rest of its start: the reference's step went from 1.2 s, when a worker served many
candidates, to 7.2 s. So the pool grows with the pace of requests: one spare at first, and one more, up to
``most``, each time a start found none ready. Each spare holds an interpreter in host memory (no device memory:
it touches no device before it is promoted).

While a measurement is taken the spares are stopped (:meth:`Spares.paused`): a spare importing torch beside a timing
of the CPU slowed its calls 4.52x on a quiet 2-core host (``benchmarks/session_weight.py``; its imports' nice value
weighs nothing across sessions), and it finishes its imports at no fixed point of the request, so the worker's
timing and the judge's later rounds read the same calls at different speeds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from stark_ray.eval.proc.child_process import Child, end_process, wait_ready, write_all
from stark_ray.eval.proc.process_tree import freeze_tree, thaw


class Spares:
    """The spares of one worker, oldest first. Not thread-safe: its WorkerProcess's caller serializes."""

    def __init__(self, spawn: Callable[[], Child], most: int) -> None:
        self._spawn = spawn
        self.most = max(0, most)
        self.wanted = min(1, self.most)  # grows by one at each start that found no spare ready
        self.misses = 0  # starts that found spares, none of them ready
        self.stopped = 0  # spares stopped by :meth:`paused` so far (each time counted)
        self._waiting: list[Child] = []
        self._frozen: dict[int, set[int]] = {}  # a spare stopped now (its pid) -> the pids stopped with it

    def top_up(self) -> None:
        """Start spares until ``wanted`` wait (those that died waiting are ended and replaced)."""
        self._drop_dead()
        while len(self._waiting) < self.wanted:
            self._waiting.append(self._spawn())

    def take(self) -> tuple[Child | None, bool]:
        """The spare to promote — the oldest that is ready, else the oldest — and whether it was ready; (None,
        False) where none waits. A start that finds spares but none ready makes the pool one larger."""
        self._drop_dead()
        for i, child in enumerate(self._waiting):
            if wait_ready(child, 0.0):
                return self._waiting.pop(i), True
        if not self._waiting:
            return None, False
        self.misses += 1
        self.wanted = min(self.most, self.wanted + 1)
        return self._waiting.pop(0), False

    def promote(self, send_timeout_s: float) -> tuple[Child | None, str]:
        """A spare told to go on (:meth:`take`'s), and how the start goes: "spare" (it waited ready), "unready" (it
        is still importing), "fresh" (none waits, or it could not be told: a process of its own is needed)."""
        child, ready = self.take()
        if child is None:
            return None, "fresh"
        thaw(self._frozen.pop(child.proc.pid, set()))  # promoted while stopped (a restart inside :meth:`paused`)
        try:
            assert child.proc.stdin is not None
            write_all(child.proc.stdin.fileno(), b"go\n", time.monotonic() + send_timeout_s)
        except (OSError, AssertionError, TimeoutError):
            _end(child)
            return None, "fresh"
        return child, "spare" if ready else "unready"

    def ready(self, timeout_s: float = 0.0) -> bool:
        """Whether a spare waits with its imports done (waiting up to ``timeout_s`` for the oldest to say so)."""
        if any(wait_ready(child, 0.0) for child in self._waiting):
            return True
        return bool(self._waiting) and timeout_s > 0 and wait_ready(self._waiting[0], timeout_s)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Every waiting spare, and whatever runs below it (an isolated one's ``unshare`` and the worker inside),
        stopped (SIGSTOP) meanwhile and let go on after (SIGCONT): its imports take no CPU from a measurement. One
        still importing is that much later ready; one promoted meanwhile (a worker restarted inside the span) goes on
        first (:meth:`promote`); one started meanwhile is not stopped. A judge killed meanwhile takes its stopped
        spares with it where they die with their parent (``setpriv --pdeathsig``, :mod:`stark_ray.eval.proc.lifetime`;
        without it, a spare stopped before its own ``prctl`` outlives it until the service ends the judge's tree).
        Spares already stopped by an enclosing span are left to it."""
        mine: list[int] = []
        try:
            for child in self._waiting:
                pid = child.proc.pid
                if pid not in self._frozen and child.proc.poll() is None:
                    self._frozen[pid] = freeze_tree(pid)
                    mine.append(pid)
                    self.stopped += 1
            yield
        finally:
            for pid in mine:
                thaw(self._frozen.pop(pid, set()))

    def pids(self) -> list[int]:
        return [child.proc.pid for child in self._waiting]

    def __len__(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        """End every spare."""
        waiting, self._waiting = self._waiting, []
        for child in waiting:
            _end(child)

    def _drop_dead(self) -> None:
        for child in [c for c in self._waiting if c.proc.poll() is not None]:
            self._waiting.remove(child)
            _end(child)


def _end(child: Child) -> None:
    """At once: a spare still importing does not read its stdin, so it would not end by itself within the grace."""
    end_process(child.proc, child.workdir, kill=True, sock=child.sock, log_fd=child.log_fd)
