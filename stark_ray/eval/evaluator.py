"""The evaluator: every candidate (and the reference) is evaluated in a fresh worker process.

``Evaluator(task, cfg)``: ``reference()`` validates the task and times it (TaskError, one line, when it
cannot serve as a reference); ``evaluate(source)`` builds, checks and times one candidate against the
reference in the same worker run and always returns an :class:`EvalResult`. ``evaluate`` may be called from
several threads at once (each call is its own process); timings are cleanest one at a time.
"""

from __future__ import annotations

import ast
from dataclasses import asdict

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import get_backend
from stark_ray.eval.build_cache import cache_root
from stark_ray.eval.diagnostics import clean_log, crash_location
from stark_ray.eval.hardware import usable_cpus
from stark_ray.eval.protocol import (
    MODE_CANDIDATE,
    MODE_REFERENCE,
    PHASE_COMPILE,
    PHASE_RUN,
    PHASE_SETUP,
    WorkerRequest,
)
from stark_ray.eval.runner import WorkerOutcome, run_worker
from stark_ray.eval.tasks import Task, TaskError
from stark_ray.records import (
    STAGE_COMPILE,
    STAGE_CRASH,
    STAGE_TIMEOUT,
    EvalResult,
    excerpt,
)

SETUP_ALLOWANCE_S = 60.0  # interpreter start, torch import, task import: on top of the run timeout

_DOING = {
    PHASE_SETUP: "loading the task and building the reference",
    PHASE_COMPILE: "importing (building) the candidate",
    PHASE_RUN: "running the candidate (correctness and timing)",
}


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


def outcome_to_result(outcome: WorkerOutcome, cfg: EvalConfig, limits: dict[str, float]) -> EvalResult:
    """The worker's own result, or a failed one when it died or ran out of time."""
    if outcome.result is not None:
        result = outcome.result
    else:
        where = crash_location(outcome.log)
        at = f" at {where}" if where else ""
        if outcome.timed_out:
            stage, error = STAGE_TIMEOUT, f"timed out after {limits[outcome.phase]:g} s while "
        else:
            stage, error = STAGE_CRASH, f"worker {outcome.describe_exit()} while "
        result = EvalResult(compiled=outcome.phase == PHASE_RUN, stage=stage,
                            error=f"{error}{_DOING[outcome.phase]}{at}", log=excerpt(clean_log(outcome.log)))
    if result.compile_s is None and PHASE_COMPILE in outcome.phase_s:
        result.compile_s = outcome.phase_s[PHASE_COMPILE]
    result.eval_s = outcome.wall_s
    return result


class Evaluator:
    """Evaluates candidates for one task with one backend (``cfg.backend``) in isolated worker processes."""

    def __init__(self, task: Task, cfg: EvalConfig | None = None) -> None:
        self.task = task
        self.cfg = cfg or EvalConfig()
        self.backend = get_backend(self.cfg.backend)  # ValueError for a backend this host does not offer
        self.build_dir = cache_root(self.cfg.build_dir)
        self.threads = usable_cpus()
        self.limits = {
            PHASE_SETUP: self.cfg.run_timeout_s + SETUP_ALLOWANCE_S,
            PHASE_COMPILE: self.cfg.compile_timeout_s,
            PHASE_RUN: self.cfg.run_timeout_s,
        }
        self.reference_result: EvalResult | None = None

    def _request(self, mode: str, source: str | None) -> WorkerRequest:
        return WorkerRequest(mode=mode, task_name=self.task.name, task_source=self.task.source,
                             cfg=asdict(self.cfg), build_dir=str(self.build_dir), threads=self.threads,
                             candidate_source=source)

    def reference(self) -> EvalResult:
        """Validate the task in a worker (build, forward, determinism) and time the reference alone."""
        outcome = run_worker(self._request(MODE_REFERENCE, None), self.limits)
        result = outcome_to_result(outcome, self.cfg, self.limits)
        if not result.ok:
            error = result.error or "unknown failure"
            if "task_error" not in result.flags:
                error = f"task {self.task.name}: reference {error}"
            raise TaskError(error)
        self.reference_result = result
        return result

    def evaluate(self, source: str) -> EvalResult:
        """Build, check and time one candidate (``class ModelNew``); its faults never raise here."""
        early = precheck(source)
        if early is not None:
            early.eval_s = 0.0
            return early
        outcome = run_worker(self._request(MODE_CANDIDATE, source), self.limits)
        return outcome_to_result(outcome, self.cfg, self.limits)

    def hardware_description(self) -> str:
        return self.backend.describe_hardware(self.threads)

    def close(self) -> None:
        """Nothing held between evaluations (each runs in its own process); kept for the actor interface."""

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


CpuEvaluator = Evaluator  # the cpu_cpp backend is the default of EvalConfig


def make_evaluator(task: Task, cfg: EvalConfig) -> Evaluator:
    return Evaluator(task, cfg)
