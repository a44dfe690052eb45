"""A worker's hot spares (eval/proc/spares.py): the pool grows by one each time a start finds none ready, never past its
most; a ready spare is taken before an older one still importing; a spare that died waiting is replaced; close ends
them all. Real processes: small Python programs that say they wait (after a delay) as a spare worker does."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from stark_ray.eval.proc.child_process import Child, read_lines, wait_ready
from stark_ray.eval.proc.process_tree import descendants
from stark_ray.eval.proc.spares import Spares


class Spawner:
    """Spawns spares, each ready (it says ``{"waiting": true}`` at once) or not (``slow``: it says nothing until its
    stdin ends, as one still importing), in the order of ``slow``; then ready ones."""

    def __init__(self, slow: list[bool]) -> None:
        self.slow = list(slow)
        self.spawned: list[Child] = []

    def __call__(self) -> Child:
        waits = "sys.stdin.read(); " if (self.slow.pop(0) if self.slow else False) else ""
        code = f"import sys; {waits}print('{{\"waiting\": true}}', flush=True); sys.stdin.readline()"
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        q: queue.Queue[bytes | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=read_lines, args=(proc.stdout, q), daemon=True).start()
        child = Child(proc, q, Path(tempfile.mkdtemp(prefix="stark-spare-test-")), time.monotonic())
        self.spawned.append(child)
        return child


def _until_ready(child: Child) -> None:
    assert wait_ready(child, 30.0)


def test_the_pool_grows_by_one_at_each_start_that_found_none_ready_up_to_its_most() -> None:
    spawn = Spawner([True, True, True, False])  # the first three still "import" when taken
    spares = Spares(spawn, most=2)
    try:
        assert spares.take() == (None, False)  # none started yet: no miss
        spares.top_up()
        assert len(spares) == 1 and spares.wanted == 1
        child, ready = spares.take()
        assert child is spawn.spawned[0] and not ready and spares.misses == 1 and spares.wanted == 2
        spares.top_up()  # two now, neither ready
        assert len(spares) == 2
        child, ready = spares.take()  # none ready: the oldest, still a miss, and the most stays 2
        assert child is spawn.spawned[1] and not ready and spares.misses == 2 and spares.wanted == 2
        spares.top_up()  # the third (slow) and a quick fourth
        _until_ready(spawn.spawned[3])
        assert spares.ready()
        child, ready = spares.take()  # the ready one, before the older
        assert child is spawn.spawned[3] and ready and spares.misses == 2
    finally:
        spares.close()
        for c in spawn.spawned:
            c.proc.kill()
            c.proc.wait()


def test_a_ready_spare_is_taken_before_an_older_one_still_importing() -> None:
    spawn = Spawner([True, False])
    spares = Spares(spawn, most=2)
    spares.wanted = 2
    try:
        spares.top_up()
        _until_ready(spawn.spawned[1])
        child, ready = spares.take()
        assert child is spawn.spawned[1] and ready and spares.misses == 0
        assert spares.pids() == [spawn.spawned[0].proc.pid]
    finally:
        spares.close()
    assert all(c.proc.poll() is not None for c in spawn.spawned[:1])  # closed: the one left waiting ended


def test_a_spare_that_died_waiting_is_replaced_and_close_ends_every_spare() -> None:
    spawn = Spawner([False, False])
    spares = Spares(spawn, most=3)
    spares.top_up()
    first = spawn.spawned[0]
    first.proc.kill()
    first.proc.wait()
    spares.top_up()  # the dead one dropped, a new one in its place
    assert len(spawn.spawned) == 2 and spares.pids() == [spawn.spawned[1].proc.pid]
    _until_ready(spawn.spawned[1])
    spares.close()
    assert len(spares) == 0 and spawn.spawned[1].proc.wait(timeout=10) is not None


def test_no_spares_at_all_where_most_is_zero() -> None:
    spawn = Spawner([])
    spares = Spares(spawn, most=0)
    spares.top_up()
    assert spawn.spawned == [] and spares.take() == (None, False) and not spares.ready()


def test_worker_spares_is_a_whole_number_of_at_least_zero() -> None:
    from stark_ray.config import EvalConfig

    assert EvalConfig(worker_spares=0).worker_spares == 0
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="worker_spares"):
            EvalConfig(worker_spares=bad)  # type: ignore[arg-type]


def _state_and_ticks(pid: int) -> tuple[str, int]:
    """A process's state letter and its CPU ticks so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


def test_paused_spares_and_what_they_started_take_no_cpu_until_let_go_on() -> None:
    """A spare still importing (here: spinning, with a spinning process of its own below it, as an isolated spare's
    worker runs below its ``unshare``) is stopped while the judge measures and goes on after."""
    def spawn() -> Child:
        code = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
                "print('{\"waiting\": true}', flush=True)\nwhile True: pass")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        q: queue.Queue[bytes | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=read_lines, args=(proc.stdout, q), daemon=True).start()
        return Child(proc, q, Path(tempfile.mkdtemp(prefix="stark-spare-test-")), time.monotonic())

    spares = Spares(spawn, most=1)
    spares.top_up()
    [pid] = spares.pids()
    try:
        deadline = time.monotonic() + 30
        while not descendants(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        below = descendants(pid)
        assert below, "the spare started nothing"
        pids = [pid, *below]
        with spares.paused():
            deadline = time.monotonic() + 30  # a stop takes effect when the process is next scheduled
            while any(_state_and_ticks(p)[0] != "T" for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            first = [_state_and_ticks(p) for p in pids]
            time.sleep(0.5)
            second = [_state_and_ticks(p) for p in pids]
        assert all(state == "T" for state, _ in first + second), (first, second)
        assert [t for _, t in first] == [t for _, t in second]  # a stopped process is given no CPU at all
        assert spares.stopped == 1
        deadline = time.monotonic() + 30
        while any(_state_and_ticks(p)[0] == "T" for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_state_and_ticks(p)[0] != "T" for p in pids)  # let go on
    finally:
        for p in descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        spares.close()


def test_a_spare_promoted_while_stopped_goes_on_and_the_span_leaves_the_others_to_their_own() -> None:
    """A worker restarted inside a measurement promotes a spare the span stopped: it must run again before it is
    told to go on (else the start waits out its whole limit); a span inside another stops and lets go of nothing
    the outer one holds."""
    spawn = Spawner([False, False])
    spares = Spares(spawn, most=2)
    spares.wanted = 2
    spares.top_up()
    try:
        for child in spawn.spawned:
            _until_ready(child)
        with spares.paused():
            assert all(_state(c.proc.pid) == "T" or _until_state(c.proc.pid, "T") for c in spawn.spawned)
            with spares.paused():  # nested: nothing more stopped, nothing let go on when it ends
                pass
            assert all(_until_state(c.proc.pid, "T") for c in spawn.spawned)
            child, how = spares.promote(5.0)
            assert child is spawn.spawned[0] and how == "spare"
            assert child.proc.wait(timeout=30) == 0  # running again: it read its "go" and ended (this spare's way)
            assert _state(spawn.spawned[1].proc.pid) == "T"  # the other still stopped
        assert _until_state(spawn.spawned[1].proc.pid, "S", "R")
    finally:
        spares.close()
        for c in spawn.spawned:
            c.proc.kill()
            c.proc.wait()


def _state(pid: int) -> str:
    return _state_and_ticks(pid)[0]


def _until_state(pid: int, *states: str) -> bool:
    deadline = time.monotonic() + 30
    while _state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.05)
    return _state(pid) in states
