"""The evaluator of one task: a thin facade over an :class:`~stark_ray.eval.service.EvalService`.

``Evaluator(task, cfg)``: ``reference()`` validates the task and times it (TaskError, one line, when it
cannot serve as a reference); ``evaluate(source)`` builds, checks and times one candidate against the
reference in the same worker run and always returns an :class:`EvalResult`; ``hardware_description()`` is
what the agents' prompts say about the target. Several evaluators may share one service (one per device).
"""

from __future__ import annotations

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService, EvaluatorError, precheck
from stark_ray.eval.tasks import Task
from stark_ray.records import EvalResult

__all__ = ["Evaluator", "EvaluatorError", "make_evaluator", "precheck"]


class Evaluator:
    """Evaluates candidates for one task with one backend (``cfg.backend``)."""

    def __init__(self, task: Task, cfg: EvalConfig | None = None, service: EvalService | None = None) -> None:
        self.task = task
        self.cfg = cfg or (service.cfg if service else EvalConfig())
        self.service = service or EvalService(self.cfg)
        self._owns_service = service is None
        self.reference_result: EvalResult | None = None

    def reference(self) -> EvalResult:
        self.reference_result = self.service.reference(self.task, self.cfg)
        return self.reference_result

    def evaluate(self, source: str) -> EvalResult:
        return self.service.evaluate(self.task, source, self.cfg)

    def activity(self) -> dict[str, tuple[str, float]]:
        """What each candidate in evaluation is going through now (``EvalService.activity``)."""
        return self.service.activity()

    def hardware_description(self) -> str:
        return self.service.hardware_description()

    def device_kind(self) -> str:
        return self.service.device_kind()

    def close(self) -> None:
        if self._owns_service:
            self.service.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_evaluator(task: Task, cfg: EvalConfig) -> Evaluator:
    return Evaluator(task, cfg)
