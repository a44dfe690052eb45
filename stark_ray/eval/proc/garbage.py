"""Garbage collection in the judge and the worker: what a candidate leaves goes back at once, at almost no cost.

A candidate's module, class and model are reference cycles (functions and their globals, a class and its methods),
and so is anything that holds a frame or a closure that calls itself: without a collection, the tensors they keep
(a 6 GB output cache, a large trial's inputs) outlive them until the collector happens to run — on a device shared
by two processes, long enough to run the next candidate out of memory. A full collection scans every object the
process has (~75 ms with torch imported), so everything that survives one is frozen (``gc.freeze``): the next
collection scans only what came after, the objects of one candidate. What a process frees that was frozen (a task
it stops keeping) is collected by :func:`collect_all`, which thaws everything first.

Even so a collection after a candidate costs 7-18 ms on the 2-core machine (a build's objects), which a failing
candidate of a small task (30-50 ms in all) would feel: after a candidate it runs only where its garbage can be
large (:func:`collect_after`).
"""

from __future__ import annotations

import gc

import torch

COLLECT_ABOVE = 64 << 20  # bytes: less than this left behind is left to the collector's own schedule


def collect() -> int:
    """Collect what became garbage since the last collection; freeze what survives."""
    found = gc.collect()
    gc.freeze()
    return found


def collect_all() -> int:
    """Collect everything that became garbage, frozen or not (after a task's state was dropped)."""
    gc.unfreeze()
    return collect()


def in_use(device: str) -> int | None:
    """The tensor memory this process holds on the device now (None on the CPU, where it is not counted)."""
    return torch.cuda.memory_allocated() if device == "cuda" else None


def collect_after(device: str, before: int | None, task_bytes: int) -> bool:
    """After a candidate: :func:`collect` where what it left may be large — the device memory in use grew by
    COLLECT_ABOVE or more since ``before`` or, where that is not counted, the task's inputs are that large."""
    now = in_use(device)
    grown = now - before if now is not None and before is not None else task_bytes
    if grown < COLLECT_ABOVE:
        return False
    collect()
    return True
