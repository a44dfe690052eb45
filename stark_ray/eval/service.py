"""One device's evaluator: the judge (with its warm worker) for the device, and a pool of compile processes.

``EvalService(cfg, device)`` serves any number of tasks. ``evaluate(task, source)`` is thread-safe: a
candidate whose backend builds at import (``cuda``) is first built in a compile process (CPU only, niced,
cache keyed by source, flags, torch/CUDA versions and architecture) while the device checks and times other
candidates; then the judge (:mod:`stark_ray.eval.judge.judge`) has its worker load the cached build and judges one
candidate at a time. ``evaluate_many`` keeps the device busy with whatever has finished building. A worker that
crashed, timed out, was poisoned or tampered is replaced before the next candidate; the judge itself never runs
a candidate's code.
"""

from __future__ import annotations

import ast
import contextlib
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend, backend_path, get_backend
from stark_ray.eval.build.builder import make_due_headers, serve_build
from stark_ray.eval.build.cache import cache_root, open_to_readers
from stark_ray.eval.build.pool import CompilePool
from stark_ray.eval.defences import check_off
from stark_ray.eval.hardware import host_memory_cap, usable_cpus
from stark_ray.eval.measure.memory import TRACE_ENV, OverBudget
from stark_ray.eval.ncu import profile as ncu_profile
from stark_ray.eval.proc.isolation import IsolationUnavailable, hidden_paths, resolve_isolation
from stark_ray.eval.proc.launch import WorkerSpec, visible_device
from stark_ray.eval.proc.outcome import BUILDS_KEPT, build_limit, build_time_out, limits_for, lost_result
from stark_ray.eval.proc.runner import WorkerOutcome, WorkerProcess, WorkerStartError
from stark_ray.eval.tasks import Task, TaskError
from stark_ray.eval.wire.protocol import (
    MODE_CANDIDATE,
    MODE_COMPILE,
    MODE_REFERENCE,
    PHASE_CHECK,
    PHASE_COMPILE,
    PHASE_SETUP,
    PHASE_START,
    PHASE_TIME,
    WorkerRequest,
    failure_from_message,
)
from stark_ray.records import STAGE_COMPILE, STAGE_CRASH, EvalResult, source_digest

CORES_PER_SPARE = 4  # hot spares beyond the first: one per this many cores (on 2 cores 3 spares importing at once
# slowed the candidates' timing, 1.24 -> 1.57 s each, for no gain: benchmarks/worker_turnover.py)
CLOSE_WAIT_S = 5.0  # a service closed while another thread's request holds the device waits this long, then kills
JUDGE_MARGIN_S = 60.0  # the judge enforces each phase's limit on its worker; the service allows it this more
DEVICE_PHASES = {PHASE_SETUP: "loading the task", PHASE_CHECK: "checking", PHASE_TIME: "timing"}


def device_words(backend: Backend) -> dict[str, str]:
    """A phase of the judge's conversation, in the live view's words: the worker's import of a candidate is its
    build where the backend builds there (cpu_cpp: g++ through load_inline, shown as "importing" for minutes)."""
    return {**DEVICE_PHASES, PHASE_COMPILE: backend.importing}


class EvaluatorError(RuntimeError):
    """The evaluator itself cannot work on this host (no GPU, no backend's package, a worker that cannot start)."""


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    """One line on stderr, once per process (every service of a campaign would repeat it)."""
    if line not in _SAID:
        _SAID.add(line)
        print(f"stark: {line}", file=sys.stderr, flush=True)


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


# a candidate whose evaluation ran out of memory in a way that may be the machine's (lost_to_memory) is evaluated this
# many times more before the verdict stands, and each time is said: the kernel's OOM killer taking a process while
# the candidate's own was held to worker_memory_gb (the host's memory ran out for others, most likely; with no cap,
# a GPU by default, the kill stands at once), or the judge's own device allocation failing (eval/judge/judge.py:
# _out_of_memory gives back all it holds but the task first). A candidate that fills the memory itself fails each time
MEMORY_AGAIN = 1


def lost_to_memory(result: EvalResult, capped: bool) -> str | None:
    """Why an evaluation that ran out of memory may be the machine's failure rather than the candidate's (None where
    it is the candidate's, or did not run out)."""
    if "judge_memory" in result.flags:
        return "the judge's own allocation ran out of device memory"
    if result.stage == STAGE_CRASH and "out_of_memory" in result.flags and capped:  # eval/proc/outcome.py
        return "the kernel's out-of-memory killer took a process of it"
    return None


def judge_limits(cfg: EvalConfig) -> dict[str, float]:
    """The service's limits on the judge: the candidate's, and a margin for the judge's own work."""
    return {phase: limit + JUDGE_MARGIN_S for phase, limit in limits_for(cfg).items()}


def outcome_to_result(outcome: WorkerOutcome, limits: dict[str, float], who: str = "worker") -> EvalResult:
    """The process's own result, or a failed one when it died or ran out of time."""
    if outcome.result is not None:
        result = outcome.result
    else:
        result = lost_result(outcome.phase, outcome.timed_out, outcome.returncode, outcome.log,
                             limits.get(outcome.phase, 0.0), who, oom_killed=outcome.oom_killed)
    if result.compile_s is None and PHASE_COMPILE in outcome.phase_s:
        result.compile_s = outcome.phase_s[PHASE_COMPILE]
    result.eval_s = outcome.wall_s
    return result


@contextlib.contextmanager
def running_note(note: Path | None, source: str | None) -> Iterator[None]:
    """While a candidate is on the device, ``note`` holds its digest (written whole through a file of its own,
    never through a link; removed after). Bookkeeping only: a note that cannot be written fails nothing."""
    if note is None or source is None:
        yield
        return
    written = False
    tmp = note.with_name(f"{note.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(source_digest(source))
        os.replace(tmp, note)
        written = True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    try:
        yield
    finally:
        if written:
            with contextlib.suppress(OSError):
                note.unlink()


def default_compile_workers(cpus: int) -> int:
    """One build per core but two: the device worker keeps a core to launch and time on (builds run niced)."""
    return max(1, cpus - 2)


class EvalService:
    """Evaluates candidates of any task with one backend on one device. Thread-safe; close() when done."""

    def __init__(self, cfg: EvalConfig | None = None, device: int | None = None,
                 compile_workers: int | None = None, spare: bool | None = None) -> None:
        self.cfg = cfg or EvalConfig()
        self.backend = get_backend(self.cfg.backend)  # ValueError for a backend this version does not offer
        try:
            check_off(self.cfg.defences_off)
        except ValueError as e:
            raise EvaluatorError(str(e)) from None
        if self.cfg.profile == "ncu" and self.backend.device != "cuda":
            raise EvaluatorError(f"--profile ncu counts a GPU's kernels: backend {self.cfg.backend} runs on the CPU")
        self.build_dir = cache_root(self.cfg.build_dir)
        self.threads = usable_cpus()
        self.compile_workers = compile_workers or default_compile_workers(self.threads)
        try:  # probed before any worker starts
            self.isolated, self.isolation_note = resolve_isolation(self.cfg.isolate)
        except IsolationUnavailable as e:
            raise EvaluatorError(str(e)) from None
        if self.isolation_note:
            _say_once(self.isolation_note)
        # a GPU's worker has hot spares: a restart (crash, timeout, recycling) costs a CUDA context, not a start
        extra: list[str] = []
        self.hidden = hidden_paths(self.cfg.hidden_paths) if self.isolated else ()
        self.disk_bytes = int(self.cfg.worker_disk_gb * (1 << 30))  # what generated code may write
        if self.isolated:
            open_to_readers(self.build_dir)
        if self.isolated:
            extra += ["--isolate-worker", *(a for path in self.hidden for a in ("--hide", path))]
        extra += ["--worker-disk-bytes", str(self.disk_bytes)]
        self.memory_bytes = host_memory_cap(self.cfg.worker_memory_gb, self.backend.device)
        if self.memory_bytes:
            extra += ["--worker-memory-bytes", str(self.memory_bytes)]
        # a spare wherever workers come and go: each candidate's own (on a CPU too), or a GPU's (crashes, recycling)
        if (device is not None or self.cfg.candidates_per_worker() == 1) if spare is None else spare:
            extra += ["--worker-spares", str(min(self.cfg.worker_spares, max(1, self.threads // CORES_PER_SPARE)))]
        # OpenMP threads wait passively in the judge and in its worker: a process spinning after its last operation
        # takes the cores the other's batch runs on (on the CPU backend a candidate's batch ran at half speed)
        policy = (("OMP_WAIT_POLICY", "PASSIVE"),)
        if trace := os.environ.get(TRACE_ENV):  # the judge's steps traced (benchmarks/memory_timeline.py)
            policy += ((TRACE_ENV, trace),)
        self.judge = WorkerProcess(WorkerSpec(self.cfg.backend, str(self.build_dir), self.threads, device=device,
                                              module="stark_ray.eval.judge.main", extra=tuple(extra), env=policy))
        self.worker_starts = 0  # the judge's word: worker processes started so far, and restarts by the spare
        self.worker_promotions = 0
        self.worker_start_phases: dict[str, Any] = {}  # where the current worker's start went
        self.worker_spare_ready = False  # a spare waited, its imports done, at the end of the last request
        self.worker_spares = (0, 0)  # the spares the worker keeps now, and the starts that found none ready
        self.worker_spares_stopped = 0  # spares the judge has stopped while it measured (Judge.spares_paused), so far
        self._device_lock = threading.Lock()
        # where the candidate on the device is named while it is there (the Evaluator actor's: a restarted actor
        # reads it to tell which candidate its previous process died of); None: nowhere
        self.running_note: Path | None = None
        self._compilers = CompilePool(self.compile_workers)  # each build in a fresh process, started ahead
        self._hello: dict[str, Any] | None = None
        self._arch: str | None = None
        self._visible = visible_device(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._warmed = threading.Event()
        self._headers: threading.Thread | None = None  # the precompiled headers being made (_make_headers)
        self._headers_lock = threading.Lock()
        self._headers_again = False  # builds counted since the headers thread last looked
        self._doing: dict[str, tuple[str, float]] = {}  # candidate digest -> (what it goes through, since)
        self._doing_lock = threading.Lock()
        self._build_times: deque[float] = deque(maxlen=BUILDS_KEPT)  # seconds of the latest builds (told to an
        # agent whose build ran out of time)
        self._finalizer = weakref.finalize(self, self.judge.close)

    # -- the judge ------------------------------------------------------------------------------------------
    def hello(self) -> dict[str, Any]:
        """The device's facts (starting the judge the first time; they do not change with restarts)."""
        if self._hello is None:
            with self._device_lock:
                if self._hello is None:
                    self._start()
        return dict(self._hello or {})

    def _start(self) -> None:
        try:
            hello = self.judge.start()
        except WorkerStartError as e:
            raise EvaluatorError(str(e)) from None
        if hello.get("worker_error"):
            self.judge.kill()
            raise EvaluatorError(str(hello["worker_error"]))
        self._hello = hello

    @property
    def device_label(self) -> str:
        """Where this service evaluates, as the attempt rows say it: ``<host>:gpu<index>`` (the physical GPU: its index
        among the host's, through CUDA_VISIBLE_DEVICES) where the judge runs on a GPU — with no device given, the first
        visible one, which is where the judge's processes run — else ``<host>:cpu``."""
        on_gpu = self._visible is not None or (self._hello or {}).get("device") == "cuda"
        if not on_gpu:
            return f"{socket.gethostname()}:cpu"
        index = self._visible or visible_device(0, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return f"{socket.gethostname()}:gpu{index}"

    def hardware_description(self) -> str:
        return self.backend.describe_hardware(self.hello(), self.threads)

    def device_kind(self) -> str:
        """Where candidates run: "cuda" or "cpu" (the worker's word)."""
        return "cuda" if self.hello().get("device") == "cuda" else "cpu"

    def hardware_class(self) -> str:
        """Devices of one class are interchangeable for timing (see ``Backend.hardware_class``)."""
        return self.backend.hardware_class(self.hello(), self.threads)

    def _on_device(self, request: WorkerRequest, cfg: EvalConfig, key: str | None = None) -> WorkerOutcome:
        with self._device_lock:
            if not self.judge.alive:
                self._start()
            words = device_words(self.backend)
            on_phase = None if key is None else lambda phase: self._doing_now(key, words.get(phase, phase))
            with running_note(self.running_note, request.candidate_source):
                outcome = self.judge.request(request, judge_limits(cfg), on_phase)
        stats = outcome.extra.get("worker")
        if isinstance(stats, dict):
            self.worker_starts = int(stats.get("starts", self.worker_starts))
            self.worker_promotions = int(stats.get("promotions", self.worker_promotions))
            phases = stats.get("start_phases")
            self.worker_start_phases = dict(phases) if isinstance(phases, dict) else {}
            self.worker_spare_ready = bool(stats.get("spare_ready"))
            self.worker_spares = (int(stats.get("spares", 0)), int(stats.get("spare_misses", 0)))
            self.worker_spares_stopped = int(stats.get("spares_stopped", 0))
        if outcome.extra.get("evaluator_error"):
            raise EvaluatorError(str(outcome.extra["evaluator_error"]))
        return outcome

    def _request(self, mode: str, task: Task, cfg: EvalConfig, source: str | None = None) -> WorkerRequest:
        # the backend by its import path: the evaluator's processes know no backend registered here
        return WorkerRequest(mode=mode, task_name=task.name, task_source=task.source,
                             cfg={**asdict(cfg), "backend": backend_path(cfg.backend)}, candidate_source=source)

    # -- evaluation -------------------------------------------------------------------------------------------
    def reference(self, task: Task, cfg: EvalConfig | None = None) -> EvalResult:
        """Validate the task in the judge (build, forward, comparable outputs, determinism) and time the reference
        alone; TaskError (one line) when it cannot serve as a reference."""
        cfg = cfg or self.cfg
        if self.backend.precompile:  # the candidates' compile process and its spare start while this runs
            self._compilers.prestart(self._compile_spec(cfg))
        outcome = self._on_device(self._request(MODE_REFERENCE, task, cfg), cfg)
        result = outcome_to_result(outcome, judge_limits(cfg), "judge")
        result.device = self.device_label
        if not result.accepted:
            error = result.error or "unknown failure"
            if "task_error" not in result.flags:
                error = f"task {task.name}: reference {error}"
            raise (OverBudget if "over_budget" in result.flags else TaskError)(error)
        return result

    def _build(self, task: Task, source: str, cfg: EvalConfig) -> tuple[EvalResult | None, float]:
        """Build in a compile process: (a result when that already decides the candidate — a build error, a
        crash or a hang at import — else None, the seconds the build took)."""
        self._warm_toolchain()
        spec = self._compile_spec(cfg)
        limit = build_limit(cfg.compile_timeout_s, self._build_times, cfg.compile_timeout_scale)  # this host's pace
        limits = {PHASE_SETUP: limit, PHASE_COMPILE: limit}
        def on_build(request: dict[str, Any], seconds: float) -> dict[str, Any]:
            return serve_build(request, spec, self.build_dir, seconds)

        # isolated, it cannot write the cache: its builds are made outside (eval/build/builder.py)
        outcome = self._compilers.run(spec, self._request(MODE_COMPILE, task, cfg, source), limits,
                                      on_build if self.isolated else None)
        result = outcome_to_result(outcome, limits)
        if outcome.result is not None:  # the compile process imported the candidate: its word is a failure's at most
            result = replace(failure_from_message(asdict(result)), eval_s=result.eval_s)
        build_s = outcome.phase_s.get(PHASE_COMPILE, 0.0)
        self._make_headers()  # a header its flags have earned, made now, outside any candidate's time
        if outcome.phase == PHASE_START and outcome.result is None:
            return None, 0.0  # the compile process could not start: let the device worker build it
        if outcome.timed_out and outcome.phase == PHASE_COMPILE:
            return build_time_out(result, outcome.log, limits[PHASE_COMPILE], list(self._build_times)), build_s
        if outcome.result is not None and build_s:
            self._build_times.append(build_s)
        if result.stage == STAGE_COMPILE and "build_error" in result.flags:
            result.flags.remove("build_error")  # the pool's own signal, not a finding for the agents
            return result, build_s
        if outcome.result is None:  # the build hung or crashed: it would do the same on the device worker
            return result, build_s
        return None, build_s  # built (or failed for a reason the device worker should see for itself)

    def _compile_spec(self, cfg: EvalConfig) -> WorkerSpec:
        return WorkerSpec(cfg.backend, str(self.build_dir), max(1, self.threads // self.compile_workers),
                          compile_only=True, arch=self._build_arch(), isolate=self.isolated, hidden=self.hidden,
                          disk_bytes=self.disk_bytes)

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

    def _make_headers(self) -> None:
        """Build the precompiled headers that builds have made due (eval/build/builder.py: make_due_headers) in one
        background thread of the service's, never inside a candidate's build: one at a time, while builds go on
        without them."""
        with self._headers_lock:
            self._headers_again = True  # a thread already making headers may have looked before this build counted
            if self._headers is not None and self._headers.is_alive():
                return

            def make() -> None:
                while True:
                    with self._headers_lock:
                        if not self._headers_again:
                            self._headers = None
                            return
                        self._headers_again = False
                    with contextlib.suppress(Exception):  # only a head start: the builds work without them
                        make_due_headers(self.build_dir)

            self._headers = threading.Thread(target=make, name="stark-headers", daemon=True)
            self._headers.start()

    def wait_for_headers(self, timeout: float | None = None) -> bool:
        """Wait until the precompiled headers being made in the background are done (or ``timeout`` seconds):
        whether none is being made any more."""
        with self._headers_lock:
            thread = self._headers
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def _checked(self, cfg: EvalConfig | None) -> EvalConfig:
        """The configuration of one call (the service's own, checked when it was made, where none is given)."""
        if cfg is None or cfg is self.cfg:
            return self.cfg
        check_off(cfg.defences_off)
        return cfg

    def evaluate(self, task: Task, source: str, cfg: EvalConfig | None = None) -> EvalResult:
        """Build, check and time one candidate (``class ModelNew``); its faults never raise here (a ``cfg`` that
        names a defence there is none of, or one that cannot be switched off: ValueError)."""
        cfg = self._checked(cfg)
        key = source_digest(source)
        try:
            result = self._evaluate(task, source, cfg, key)
        finally:
            with self._doing_lock:
                self._doing.pop(key, None)
        result.device = self.device_label
        return result

    def activity(self) -> dict[str, tuple[str, float]]:
        """What each candidate in evaluation is going through now, by its digest (``records.source_digest``):
        building, waiting for the device, loading the task, importing, checking or timing; and for how many
        seconds so far."""
        now = time.monotonic()
        with self._doing_lock:
            return {key: (doing, now - since) for key, (doing, since) in self._doing.items()}

    def _doing_now(self, key: str, doing: str) -> None:
        with self._doing_lock:
            self._doing[key] = (doing, time.monotonic())

    def _evaluate(self, task: Task, source: str, cfg: EvalConfig, key: str) -> EvalResult:
        early = precheck(source)
        if early is not None:
            early.eval_s = 0.0
            return early
        build_s = 0.0
        if self.backend.precompile:
            self._doing_now(key, "building")
            decided, build_s = self._build(task, source, cfg)
            if decided is not None:
                return decided
        lost: list[str] = []  # why each evaluation so far may have been the machine's
        for _ in range(1 + MEMORY_AGAIN):
            self._doing_now(key, "waiting for the device")
            outcome = self._on_device(self._request(MODE_CANDIDATE, task, cfg, source), cfg, key)
            self._make_headers()  # the worker's builds (cpu_cpp builds there) may have earned one
            result = outcome_to_result(outcome, judge_limits(cfg), "judge")
            why = lost_to_memory(result, bool(self.memory_bytes))
            if why is None:
                break
            lost.append(why)
        if lost and why is not None:  # every evaluation ran out: the verdict stands, charged
            result.add_line(f"evaluated {len(lost)} times: each time {why}" if len(set(lost)) == 1 else
                            f"evaluated {len(lost)} times: {'; then '.join(lost)}")
        elif lost:
            result.add_line(f"evaluated again: in the first evaluation {lost[0]} (the machine's memory, not this "
                            "candidate's verdict)")
        if build_s:  # the pool's build plus the device worker's (cached) load
            result.compile_s = build_s + (result.compile_s or 0.0)
            result.eval_s = build_s + (result.eval_s or 0.0)
        if cfg.profile == "ncu" and result.accepted:  # Nsight Compute on its top kernel, the device ours meanwhile
            self._doing_now(key, "profiling (ncu)")
            started = time.perf_counter()
            with self._device_lock, running_note(self.running_note, source):
                result.profile = ncu_profile(replace(self.judge.spec, isolate=self.isolated, hidden=self.hidden),
                                             task.name, task.source, source, result.kernels, cfg.seed)
            result.eval_s = (result.eval_s or 0.0) + time.perf_counter() - started
        return result

    def evaluate_many(self, task: Task, sources: Sequence[str], cfg: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate several candidates of one task (see :meth:`evaluate_batch`)."""
        return self.evaluate_batch([(task, s) for s in sources], cfg)

    def evaluate_batch(self, items: Sequence[tuple[Task, str]], cfg: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate (task, source) pairs, of any tasks, in order: all builds start at once (as many at a time as
        there are compile workers) and the device checks and times each as soon as it is built."""
        if not items:
            return []
        cfg = self._checked(cfg)
        with ThreadPoolExecutor(max_workers=min(len(items), self.compile_workers + 1) + 1) as pool:
            pool.submit(self._start_quietly)  # the device worker starts while the first builds run
            return list(pool.map(lambda item: self.evaluate(item[0], item[1], cfg), items))

    def _start_quietly(self) -> None:
        with contextlib.suppress(EvaluatorError):  # said again, to the candidate that needs the device
            self.hello()

    def close(self) -> None:
        self._compilers.close()
        if self._device_lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                self.judge.close()
            finally:
                self._device_lock.release()
            return
        # a request another thread still runs (an interrupted run's: a resumed run's reference timed beside its first
        # agent call) holds the device: its judge is ended under it, not waited for to the end of its limits
        self.judge.kill()
        self.judge.close()  # its spares

    def __enter__(self) -> EvalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
