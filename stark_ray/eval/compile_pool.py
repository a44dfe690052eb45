"""The service's compile processes, started ahead of the builds they serve.

Each candidate is built in a fresh process that ends with its build (nothing one candidate's import leaves behind
reaches the next), as :func:`runner.run_once` does. Started on demand, that process cost every candidate an
interpreter start and torch's import — 4 s of a 7.5 s evaluation of a KernelBench task on an H200, more than the
checks. Here each slot keeps a spare beside it (:class:`runner.WorkerProcess` with ``spare=True``): a process that
has done its imports and waits, touching nothing, for the build it will serve; when one build ends, the spare is
promoted and the next spare starts behind it while the candidate is checked and timed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from stark_ray.eval.protocol import PHASE_START, WorkerRequest
from stark_ray.eval.runner import WorkerOutcome, WorkerProcess, WorkerSpec, WorkerStartError

OnBuild = Callable[[dict[str, Any], float], dict[str, Any]]


class CompilePool:
    """``slots`` compile processes at a time, each with a started spare. Thread-safe."""

    def __init__(self, slots: int) -> None:
        self._gate = threading.Semaphore(max(1, slots))
        self._idle: queue.LifoQueue[WorkerProcess] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.promoted = 0  # builds served by a spare that was waiting, its imports done

    def run(self, spec: WorkerSpec, request: WorkerRequest, limits: dict[str, float],
            on_build: OnBuild | None = None) -> WorkerOutcome:
        """One request in a fresh process that ends with it (the spare of a slot, where one waits)."""
        with self._gate:
            worker = self._take(spec)
            worker.on_build = on_build
            try:
                before = worker.promotions
                try:
                    if not worker.alive:
                        worker.start()
                except WorkerStartError as e:
                    return WorkerOutcome(None, PHASE_START, None, False, str(e), 0.0, {}, False)
                finally:
                    with self._lock:
                        self.promoted += worker.promotions - before
                return worker.request(request, limits)
            finally:
                worker.kill()  # the process that served ends with its request; the spare stays
                worker.on_build = None
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
                self._give(worker)
            finally:
                self._gate.release()

        threading.Thread(target=start, name="stark-compile-prestart", daemon=True).start()

    def close(self) -> None:
        """End the idle slots' processes and spares now, those serving a build when it ends."""
        with self._lock:
            self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def _take(self, spec: WorkerSpec) -> WorkerProcess:
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            worker = None
        if worker is not None and worker.spec != spec:  # another backend or architecture: started afresh
            worker.close()
            worker = None
        return worker or WorkerProcess(spec, max_requests=1, spare=True)

    def _give(self, worker: WorkerProcess) -> None:
        with self._lock:
            closed = self._closed
        if closed:
            worker.close()
        else:
            self._idle.put(worker)
