"""The judge's account of the device memory of one request: the budget in force, both processes' caps, the peak.

The judge and its worker take turns on the device: the judge makes and checks trials while the worker waits, the
worker runs and times while the judge waits. So the judge caps its own allocator, before its turn, at the budget
less what the worker said it holds and the shared buffers (:meth:`JudgeMemory.cap_self`), and sends the worker,
with each step, the budget less what the judge holds then (:meth:`JudgeMemory.fields`). The request's peak is the
largest of the judge's turns (its own peak beside what the worker holds) and the worker's steps (the worker's peak
in the step beside what the judge held when it sent it). What the worker says is its own word: it only moves its
cap and the recorded peak, clamped to the device. See :mod:`stark_ray.eval.measure.memory` for the budget and the plan.

That account adds peaks of different moments, so it can exceed what was ever in use at once (46 GB for a 40 GB
budget on a 6 GB task, while nvidia-smi saw 35 GB): the figure a result records is measured instead, by
:class:`DeviceSampler`, and the account stays in the result's log.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.measure.memory import (
    CONTEXTS_BYTES,
    GB,
    TRACE_ENV,
    apply_cap,
    give_back_cached,
    resolve_budget,
    within_reach,
)
from stark_ray.eval.proc.runner import WorkerProcess
from stark_ray.eval.wire.exchange import reset_shared_peak, shared_bytes, shared_peak
from stark_ray.eval.wire.protocol import OP_LOAD, OP_REFERENCE, OP_RUN, OP_STAGE, OP_TIME

CAPPED_STEPS = (OP_LOAD, OP_RUN, OP_TIME, OP_REFERENCE, OP_STAGE)  # the steps in which the worker allocates
SAMPLE_S = 0.005  # the device's memory in use is read this often during a request


def tracing() -> bool:
    """Whether the judge's steps are traced (:func:`mark`): a line that costs something to make is made only then."""
    return bool(os.environ.get(TRACE_ENV))


def mark(what: str) -> None:
    """Where ``STARK_MEMORY_TRACE`` names a file: a line of what the judge does now, the moment (``time.monotonic``,
    one clock for every process of the host) and the judge's device memory (its allocator's, the shared buffers'):
    beside nvidia-smi's samples of each process (``benchmarks/memory_timeline.py``), what held the memory when."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    held = (f"allocated {torch.cuda.memory_allocated() / GB:.2f} GB, reserved {torch.cuda.memory_reserved() / GB:.2f}"
            f" GB, shared {shared_bytes() / GB:.2f} GB") if torch.cuda.is_initialized() else "no device"
    with contextlib.suppress(OSError), open(path, "a") as f:
        f.write(f"{time.monotonic():.6f}\t{what}\t{held}\n")


class DeviceSampler:
    """The device's memory in use (every process on it, CUDA contexts included: what nvidia-smi shows), read by a
    thread of the judge every SAMPLE_S while a request runs; its highest. A peak shorter than the interval can be
    missed; on a device shared with other work, theirs counts too."""

    def __init__(self) -> None:
        self.high = 0
        self.request = 0  # which request the samples are for: one read before start() never counts after it
        self.lock = threading.Lock()
        self.active = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self.lock:
            self.request += 1
            self.high = self._used()
        self.active.set()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="device-sampler", daemon=True)
            self.thread.start()

    def stop(self) -> int:
        """The highest since start()."""
        self.active.clear()
        self._sample(self.request)
        return self.high

    def _run(self) -> None:
        while True:
            self.active.wait()
            self._sample(self.request)
            time.sleep(SAMPLE_S)

    def _sample(self, request: int) -> None:
        used = self._used()
        with self.lock:
            if request == self.request:
                self.high = max(self.high, used)

    @staticmethod
    def _used() -> int:
        """The device's memory in use, or 0 where the device cannot say (a sticky error: the request's answer
        says what happened; the judge must still give one)."""
        try:
            free, total = torch.cuda.mem_get_info()
        except RuntimeError:
            return 0
        return int(total - free)


class JudgeMemory:
    def __init__(self, device: str, free_at_start: int, worker: WorkerProcess) -> None:
        self.on_gpu = device == "cuda"
        self.free_at_start = free_at_start  # the device's free memory when the judge started (the default budget)
        self.worker = worker
        self.budget = 0  # bytes, for the request in progress (0: none, off the GPU)
        self.worker_reserved = 0  # the worker's device memory as its last answer said ...
        self.reported_by = -1  # ... and the worker process that said it (WorkerProcess.starts)
        self.peak = 0  # the request's device memory at its peak, judge and worker together
        self.own_peak = 0  # the judge's own allocations at their peak over the request
        self.judge_then = 0  # the judge's memory while the worker does a step
        self.plan: dict[str, Any] = {}  # the task's plan, sent to the worker with each step
        self.busy = ""  # why the request's budget is less than the one asked (other processes on the GPU)
        self.sampler = DeviceSampler() if self.on_gpu else None

    def set_budget(self, cfg: EvalConfig) -> None:
        """The request's budget: the one asked for (by default a share of the free memory at the judge's start),
        no more than the device less what other processes hold now (``busy`` says so where it is less)."""
        if self.on_gpu:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            asked = resolve_budget(cfg.memory_budget_gb, self.free_at_start, total)
            free, _ = torch.cuda.mem_get_info()
            self.budget, others = within_reach(asked, total, free, self._held())
            self.busy = "" if self.budget >= asked else (
                f"the GPU is in use: other processes hold {others / GB:.1f} GB of its {total / GB:.1f} GB, which "
                f"leaves this evaluation {self.budget / GB:.1f} GB of the {asked / GB:.1f} GB asked")

    def worker_held(self) -> int:
        """The worker's device memory as the running worker process last said (none for a fresh or gone one)."""
        alive = self.worker.alive and self.reported_by == self.worker.starts
        return self.worker_reserved if alive else 0

    def cap_self(self, coming: int = 0) -> None:
        """This process's allocator capped at the budget less the worker's memory, the shared buffers and the
        shared buffers ``coming`` next."""
        if self.budget:
            apply_cap(self.budget - CONTEXTS_BYTES - self.worker_held() - shared_bytes() - coming)

    def _held(self) -> int:
        """The contexts, this process's memory, the shared buffers and the worker's, now."""
        return CONTEXTS_BYTES + torch.cuda.memory_reserved() + shared_bytes() + self.worker_held()

    def room(self) -> int | None:
        """What the budget leaves now beside what is held (None without a budget). Cached blocks are not held: they
        go back to the device first (the confirmation's batch is made of shared buffers, outside torch's
        allocator, which could not reuse them; a forward's workspaces can leave GBs cached)."""
        if not self.budget:
            return None
        give_back_cached()
        return max(0, self.budget - self._held())

    def room_for_shared(self, nbytes: int) -> None:
        """torch.OutOfMemoryError where ``nbytes`` more of shared buffers would not fit in the budget (they are made
        outside torch's allocator, which the caps hold)."""
        room = self.room()
        if room is not None and nbytes > room:
            raise torch.OutOfMemoryError(f"the trial's shared buffers ({nbytes / GB:.2f} GB) do not fit in the memory "
                                         f"budget of {self.budget / GB:.1f} GB ({room / GB:.2f} GB left)")

    def fields(self, op: str) -> dict[str, Any]:
        """What a step tells the worker of memory: its cap (the budget less the judge's memory, cached blocks given
        back first) and the task's plan."""
        if not self.budget or op not in CAPPED_STEPS:
            return {}
        give_back_cached()
        cap = self.budget - CONTEXTS_BYTES - torch.cuda.memory_reserved() - shared_bytes()
        return {"memory": {"cap": cap, **self.plan}}

    def note(self, msg: dict[str, Any]) -> None:
        """The worker's memory as its answer says: held now, and at its peak during the step."""
        mem = msg.get("memory")
        if not (isinstance(mem, dict) and self.on_gpu):
            return
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        with contextlib.suppress(TypeError, ValueError, OverflowError):  # the worker's word: only numbers count
            self.worker_reserved = min(max(0, int(mem.get("reserved", 0))), total)
            self.reported_by = self.worker.starts
            peak = min(max(0, int(mem.get("peak", 0))), total)
            self.peak = max(self.peak, self.judge_then + peak)
            mark(f"the worker says: reserved {self.worker_reserved / GB:.2f} GB, at its peak in the step "
                 f"{peak / GB:.2f} GB")
        self.cap_self()  # the judge's turn again: its cap follows what the worker holds now

    def close_interval(self) -> None:
        """The judge's own turn since the last step (its allocator and the shared buffers at their peaks), beside
        the worker's memory: folded into the request's peak; the counters start again."""
        if not self.on_gpu:
            return
        self.own_peak = max(self.own_peak, torch.cuda.max_memory_allocated())
        self.peak = max(self.peak, torch.cuda.max_memory_reserved() + shared_peak() + self.worker_held())
        torch.cuda.reset_peak_memory_stats()
        reset_shared_peak()
        self.judge_then = torch.cuda.memory_reserved() + shared_bytes()

    def peak_bytes(self) -> int | None:
        """The device's memory in use at its highest during the request, as measured (:class:`DeviceSampler`);
        the account (:attr:`peak`) closed too."""
        if self.sampler is None:
            return None
        self.close_interval()
        return self.sampler.stop()

    def reset(self) -> None:
        """A new request."""
        self.peak = self.own_peak = self.judge_then = 0
        if self.on_gpu:
            torch.cuda.reset_peak_memory_stats()
            reset_shared_peak()
        if self.sampler is not None:
            self.sampler.start()
