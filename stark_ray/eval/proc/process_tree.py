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
