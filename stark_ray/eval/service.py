"""One device's evaluator: a warm worker process for the device and a pool of compile processes.

``EvalService(cfg, device)`` serves any number of tasks. ``evaluate(task, source)`` is thread-safe: a
candidate whose backend builds at import (``cuda``) is first built in a compile process (CPU only, niced,
cache keyed by source, flags, torch/CUDA versions and architecture) while the device worker checks and times
other candidates; the device worker then loads the cached build and runs one candidate at a time.
``evaluate_many`` keeps the device busy with whatever has finished building. A worker that crashed, timed
out or was poisoned is replaced before the next candidate (:mod:`stark_ray.eval.runner`).
"""

from __future__ import annotations

import ast
import contextlib
import os
import socket
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import get_backend
from stark_ray.eval.build_cache import cache_root
from stark_ray.eval.diagnostics import clean_log, crash_location
from stark_ray.eval.hardware import usable_cpus
from stark_ray.eval.isolation import IsolationUnavailable, isolation_prefix
from stark_ray.eval.protocol import (
    MODE_CANDIDATE,
    MODE_COMPILE,
    MODE_REFERENCE,
    PHASE_CHECK,
    PHASE_COMPILE,
    PHASE_SETUP,
    PHASE_START,
    PHASE_TIME,
    WorkerRequest,
)
from stark_ray.eval.runner import (
    WorkerOutcome,
    WorkerProcess,
    WorkerSpec,
    WorkerStartError,
    run_once,
    visible_device,
)
from stark_ray.eval.tasks import Task, TaskError
from stark_ray.records import STAGE_COMPILE, STAGE_CRASH, STAGE_TIMEOUT, EvalResult, excerpt

SETUP_ALLOWANCE_S = 60.0  # task import and the reference's first run, on top of the check timeout
COMPILE_BASELINE_ALLOWANCE_S = 600.0  # torch.compile of the reference, once per task and worker

_DOING = {
    PHASE_START: "starting the worker",
    PHASE_SETUP: "loading the task and building the reference",
    PHASE_COMPILE: "importing (building) the candidate",
    PHASE_CHECK: "running the correctness trials",
    PHASE_TIME: "timing the candidate",
}


class EvaluatorError(RuntimeError):
    """The evaluator itself cannot work on this host (no GPU, no Triton, a worker that cannot start)."""


def precheck(source: str) -> EvalResult | None:
    """A failed result for a candidate that cannot even be parsed or defines no ModelNew; None otherwise."""
    try:
        tree = ast.parse(source, filename="candidate.py")
    except SyntaxError as e:
        return EvalResult.failed(STAGE_COMPILE, f"candidate.py:{e.lineno}: syntax error: {e.msg}")
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)}
    names |= {(a.asname or a.name) for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    if "ModelNew" not in names:
        return EvalResult.failed(STAGE_COMPILE, "the candidate defines no ModelNew at module level")
    return None


def limits_for(cfg: EvalConfig) -> dict[str, float]:
    time_limit = cfg.timing_timeout_s + (COMPILE_BASELINE_ALLOWANCE_S if cfg.baseline == "compile" else 0.0)
    return {
        PHASE_SETUP: cfg.check_timeout_s + SETUP_ALLOWANCE_S,
        PHASE_COMPILE: cfg.compile_timeout_s,
        PHASE_CHECK: cfg.check_timeout_s,
        PHASE_TIME: time_limit,
    }


def outcome_to_result(outcome: WorkerOutcome, limits: dict[str, float]) -> EvalResult:
    """The worker's own result, or a failed one when it died or ran out of time."""
    if outcome.result is not None:
        result = outcome.result
    else:
        where = crash_location(outcome.log)
        at = f" at {where}" if where else ""
        if outcome.timed_out:
            stage = STAGE_TIMEOUT
            error = f"timed out after {limits.get(outcome.phase, 0):g} s while "
        else:
            stage, error = STAGE_CRASH, f"worker {outcome.describe_exit()} while "
        result = EvalResult(compiled=outcome.phase in (PHASE_CHECK, PHASE_TIME), stage=stage,
                            error=f"{error}{_DOING.get(outcome.phase, outcome.phase)}{at}",
                            log=excerpt(clean_log(outcome.log)))
    if result.compile_s is None and PHASE_COMPILE in outcome.phase_s:
        result.compile_s = outcome.phase_s[PHASE_COMPILE]
    result.eval_s = outcome.wall_s
    return result


def default_compile_workers(cpus: int) -> int:
    """One build per core but two: the device worker keeps a core to launch and time on (builds run niced)."""
    return max(1, cpus - 2)


class EvalService:
    """Evaluates candidates of any task with one backend on one device. Thread-safe; close() when done."""

    def __init__(self, cfg: EvalConfig | None = None, device: int | None = None,
                 compile_workers: int | None = None) -> None:
        self.cfg = cfg or EvalConfig()
        self.backend = get_backend(self.cfg.backend)  # ValueError for a backend this version does not offer
        self.build_dir = cache_root(self.cfg.build_dir)
        self.threads = usable_cpus()
        self.compile_workers = compile_workers or default_compile_workers(self.threads)
        # a GPU's worker has a hot spare: a restart (crash, timeout, recycling) costs a CUDA context, not a start
        if self.cfg.isolate:
            try:
                isolation_prefix()  # probed before any worker starts
            except IsolationUnavailable as e:
                raise EvaluatorError(str(e)) from None
        self.worker = WorkerProcess(WorkerSpec(self.cfg.backend, str(self.build_dir), self.threads, device=device,
                                               isolate=self.cfg.isolate), spare=device is not None)
        self._device_lock = threading.Lock()
        self._compile_slots = threading.BoundedSemaphore(self.compile_workers)
        self._hello: dict[str, Any] | None = None
        self._arch: str | None = None
        self._visible = visible_device(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._warmed = threading.Event()
        self.device_label = f"{socket.gethostname()}:" + ("cpu" if device is None else f"gpu{self._visible}")
        self._finalizer = weakref.finalize(self, self.worker.close)

    # -- the device worker ------------------------------------------------------------------------------------
    def hello(self) -> dict[str, Any]:
        """The device's facts (starting the worker the first time; they do not change with restarts)."""
        if self._hello is None:
            with self._device_lock:
                if self._hello is None:
                    self._start()
        return dict(self._hello or {})

    def _start(self) -> None:
        try:
            self._hello = self.worker.start()
        except WorkerStartError as e:
            raise EvaluatorError(str(e)) from None

    def hardware_description(self) -> str:
        return self.backend.describe_hardware(self.hello(), self.threads)

    def hardware_class(self) -> str:
        """Devices of one class are interchangeable for timing (see ``Backend.hardware_class``)."""
        return self.backend.hardware_class(self.hello(), self.threads)

    def _on_device(self, request: WorkerRequest, cfg: EvalConfig) -> WorkerOutcome:
        limits = limits_for(cfg)
        with self._device_lock:
            if not self.worker.alive:
                self._start()
            return self.worker.request(request, limits)

    def _request(self, mode: str, task: Task, cfg: EvalConfig, source: str | None = None) -> WorkerRequest:
        return WorkerRequest(mode=mode, task_name=task.name, task_source=task.source, cfg=asdict(cfg),
                             candidate_source=source)

    # -- evaluation -------------------------------------------------------------------------------------------
    def reference(self, task: Task, cfg: EvalConfig | None = None) -> EvalResult:
        """Validate the task in the worker (build, forward, determinism) and time the reference alone;
        TaskError (one line) when it cannot serve as a reference."""
        cfg = cfg or self.cfg
        outcome = self._on_device(self._request(MODE_REFERENCE, task, cfg), cfg)
        result = outcome_to_result(outcome, limits_for(cfg))
        result.device = self.device_label
        if not result.ok:
            error = result.error or "unknown failure"
            if "task_error" not in result.flags:
                error = f"task {task.name}: reference {error}"
            raise TaskError(error)
        return result

    def _build(self, task: Task, source: str, cfg: EvalConfig) -> tuple[EvalResult | None, float]:
        """Build in a compile process: (a result when that already decides the candidate — a build error, a
        crash or a hang at import — else None, the seconds the build took)."""
        self._warm_toolchain()
        spec = WorkerSpec(cfg.backend, str(self.build_dir), max(1, self.threads // self.compile_workers),
                          compile_only=True, arch=self._build_arch(), isolate=self.cfg.isolate)
        limits = {PHASE_SETUP: cfg.compile_timeout_s, PHASE_COMPILE: cfg.compile_timeout_s}
        with self._compile_slots:
            outcome = run_once(spec, self._request(MODE_COMPILE, task, cfg, source), limits)
        result = outcome_to_result(outcome, limits)
        build_s = outcome.phase_s.get(PHASE_COMPILE, 0.0)
        if outcome.phase == PHASE_START and outcome.result is None:
            return None, 0.0  # the compile process could not start: let the device worker build it
        if result.stage == STAGE_COMPILE and "build_error" in result.flags:
            result.flags.remove("build_error")  # the pool's own signal, not a finding for the agents
            return result, build_s
        if outcome.result is None:  # the build hung or crashed: it would do the same on the device worker
            return result, build_s
        return None, build_s  # built (or failed for a reason the device worker should see for itself)

    def _build_arch(self) -> str | None:
        """The device's architecture for the compile pool: the worker's own word once it has said hello; before
        that, nvidia-smi's, so builds need not wait for the device worker to start."""
        if self._hello is not None:
            return self._hello.get("arch_list")
        if self._arch is None:
            self._arch = self.backend.build_arch(self._visible) or self.hello().get("arch_list")
        return self._arch

    def _warm_toolchain(self) -> None:
        if self._warmed.is_set():
            return
        self._warmed.set()

        def warm() -> None:
            with contextlib.suppress(Exception):  # only a head start: the builds work without it
                self.backend.warm_toolchain(self.build_dir)

        threading.Thread(target=warm, name="stark-warm-toolchain", daemon=True).start()

    def evaluate(self, task: Task, source: str, cfg: EvalConfig | None = None) -> EvalResult:
        """Build, check and time one candidate (``class ModelNew``); its faults never raise here."""
        cfg = cfg or self.cfg
        result = self._evaluate(task, source, cfg)
        result.device = self.device_label
        return result

    def _evaluate(self, task: Task, source: str, cfg: EvalConfig) -> EvalResult:
        early = precheck(source)
        if early is not None:
            early.eval_s = 0.0
            return early
        build_s = 0.0
        if self.backend.precompile:
            decided, build_s = self._build(task, source, cfg)
            if decided is not None:
                return decided
        outcome = self._on_device(self._request(MODE_CANDIDATE, task, cfg, source), cfg)
        result = outcome_to_result(outcome, limits_for(cfg))
        if build_s:  # the pool's build plus the device worker's (cached) load
            result.compile_s = build_s + (result.compile_s or 0.0)
            result.eval_s = build_s + (result.eval_s or 0.0)
        return result

    def evaluate_many(self, task: Task, sources: Sequence[str], cfg: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate several candidates of one task (see :meth:`evaluate_batch`)."""
        return self.evaluate_batch([(task, s) for s in sources], cfg)

    def evaluate_batch(self, items: Sequence[tuple[Task, str]], cfg: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate (task, source) pairs, of any tasks, in order: all builds start at once (as many at a time as
        there are compile workers) and the device checks and times each as soon as it is built."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(len(items), self.compile_workers + 1) + 1) as pool:
            pool.submit(self._start_quietly)  # the device worker starts while the first builds run
            return list(pool.map(lambda item: self.evaluate(item[0], item[1], cfg), items))

    def _start_quietly(self) -> None:
        with contextlib.suppress(EvaluatorError):  # said again, to the candidate that needs the device
            self.hello()

    def close(self) -> None:
        with self._device_lock:
            self.worker.close()

    def __enter__(self) -> EvalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
