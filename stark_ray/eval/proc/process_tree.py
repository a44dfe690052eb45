"""Kill a process and everything it started, including children that left its process group.

ninja starts every compiler command in a process group of its own, so killing the worker's group leaves a
running ``cc1plus`` behind. The tree is frozen top-down first (SIGSTOP until no new descendant shows up: a
stopped process cannot fork), then everything is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")


def parents() -> dict[int, int]:
    """pid -> ppid for every process visible in /proc."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
        if len(fields) > 1:
            parents[int(entry.name)] = int(fields[1])
    return parents


def exited(pid: int) -> bool:
    """Whether ``pid`` is gone or has ended and waits to be reaped (a zombie: it runs nothing)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:][:1] in ("Z", "X")


def descendants(pid: int, snapshot: dict[int, int] | None = None) -> set[int]:
    children: dict[int, list[int]] = {}
    for child, parent in (parents() if snapshot is None else snapshot).items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (as this process's /proc shows them), by pid."""
    return sorted(child for child, parent in parents().items() if parent == pid)


def session_nice(value: int, pid: int | None = None) -> None:
    """The CPU weight of the session of ``pid`` (None: this process), and of the sessions below it: its autogroup,
    where Linux groups a session's threads for the scheduler. A nice value per thread or process weighs only against
    the rest of its own session there, and every evaluator process is a session of its own (an isolated worker's
    below its ``unshare``), so a spare's imports would otherwise take as much of the CPU as the worker that times
    beside them: on two cores, one of them. Back to 0 needs no privilege; where the
    kernel has no autogroups (or /proc cannot be written), nothing changes."""
    for target in ("self",) if pid is None else (pid, *sorted(descendants(pid))):
        with contextlib.suppress(OSError), open(PROC / str(target) / "autogroup", "w") as f:
            f.write(str(value))


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def freeze_tree(pid: int, rounds: int = 20) -> set[int]:
    """SIGSTOP ``pid`` and all its descendants, top-down until no new one shows up (a stopped process cannot
    fork): the pids stopped."""
    frozen: set[int] = set()
    for _ in range(rounds):
        try:
            new = ({pid} | descendants(pid)) - frozen
        except OSError:  # /proc unreadable: what is stopped so far is what the caller lets go on
            break
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        frozen |= new
    return frozen


def thaw(pids: set[int]) -> None:
    """SIGCONT each of ``pids`` (what :func:`freeze_tree` stopped)."""
    for p in pids:
        _signal(p, signal.SIGCONT)


def kill_tree(pid: int, rounds: int = 20) -> None:
    """SIGKILL ``pid``, its process group, and all its descendants wherever their group is."""
    frozen = freeze_tree(pid, rounds)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in frozen | {pid}:
        _signal(p, signal.SIGKILL)
