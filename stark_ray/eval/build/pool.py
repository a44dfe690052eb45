"""The service's compile processes, started ahead of the builds they serve.

Each candidate is built in a fresh process that ends with its build (nothing one candidate's import leaves behind
reaches the next), as :func:`runner.run_once` does. Started on demand, that process cost every candidate an
interpreter start and torch's import — 4 s of an 8 s evaluation of a KernelBench task on an H200, more than the
checks. Here the first MAX_SPARES slots keep a spare (:class:`runner.WorkerProcess` with one of ``spares``): a process
that has done its imports and waits, touching nothing, for the build it will serve. A build promotes its slot's
spare (a 'go', then its hello: a fraction of a second) and a new spare starts behind it, importing while that build
and the candidate's checks and timing run. The service starts the first one while its reference is timed
(:meth:`CompilePool.prestart`). Further slots, used only when builds run side by side, start their process on
demand, as before: an idle interpreter with torch imported holds ~0.4 GB of host memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.eval.proc.runner import WorkerOutcome, WorkerProcess, WorkerStartError, serve_once
from stark_ray.eval.wire.protocol import WorkerRequest

OnBuild = Callable[[dict[str, Any], float], dict[str, Any]]
MAX_SPARES = 2  # slots that keep a started spare


class CompilePool:
    """``slots`` compile processes at a time (the first MAX_SPARES with a started spare). Thread-safe."""

    def __init__(self, slots: int) -> None:
        self._gate = threading.Semaphore(max(1, slots))
        self._lock = threading.Lock()
        self._idle: list[WorkerProcess] = []
        self._spares = 0  # slots made with a spare, idle or serving
        self._closed = False
        self.promoted = 0  # builds served by a spare that was waiting, its imports done

    def run(self, spec: WorkerSpec, request: WorkerRequest, limits: dict[str, float],
            on_build: OnBuild | None = None) -> WorkerOutcome:
        """One request in a fresh process that ends with it (the spare of a slot, where one waits)."""
        with self._gate:
            worker = self._take(spec)
            before = worker.promotions
            try:
                return serve_once(worker, request, limits, on_build)  # its spare stays
            finally:
                with self._lock:
                    self.promoted += worker.promotions - before
                self._give(worker)

    def prestart(self, spec: WorkerSpec) -> None:
        """A slot's process and its spare started now (in the background), before the first build needs them."""
        def start() -> None:
            if not self._gate.acquire(blocking=False):
                return  # the builds have begun: they start what they need
            try:
                worker = self._take(spec)
                try:
                    if not worker.alive:
                        worker.start()
                except WorkerStartError:
                    worker.kill()  # the first build says why
                finally:
                    self._give(worker)
            finally:
                self._gate.release()

        threading.Thread(target=start, name="stark-compile-prestart", daemon=True).start()

    def close(self) -> None:
        """End the idle slots' processes and spares now, those serving a build when it ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            self._end(worker)

    def _take(self, spec: WorkerSpec) -> WorkerProcess:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is not None and worker.spec != spec:  # another backend or architecture: started afresh
            self._end(worker)
            worker = None
        if worker is None:
            with self._lock:
                spare = self._spares < MAX_SPARES
                self._spares += spare
            worker = WorkerProcess(spec, max_requests=1, spares=int(spare))
        return worker

    def _give(self, worker: WorkerProcess) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        self._end(worker)

    def _end(self, worker: WorkerProcess) -> None:
        worker.close()
        with self._lock:
            self._spares -= worker.use_spare
