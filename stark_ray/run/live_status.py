"""The Ray driver's live view: the run's status twice a second, and once a second what each expansion in flight is
doing (its agent call, its wait for an evaluator, or the step of its evaluation as the evaluator last said)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
from ray.exceptions import RayError

from stark_ray.records import source_digest
from stark_ray.run.reporter import InFlight
from stark_ray.run.work import AGENT, EVAL, Work

AGENT_WORDS = {"plan+code": "plan and code agents", "debug": "debug agent", "single": "agent"}


class LiveStatus:
    """Part of the Ray driver (``ray_driver.RayDriver``), whose state it reads."""

    reporter: Any
    pending: dict[Any, Work]
    dispatch: Any
    evaluators: list[Any]
    view: Any
    spend: Any
    cap: Any
    capped: dict[str, str]
    run: Any

    def start_live_status(self) -> None:
        self._last_progress = 0.0
        self._last_look = 0.0  # when the evaluators were last asked what their candidates go through
        self._looking: dict[Any, int] = {}  # activity() asked and not answered yet -> the evaluator
        self._steps: dict[int, dict[str, tuple[str, float]]] = {}  # each evaluator's last answer

    def _progress(self, final: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_progress < 0.5 and not final:
            return
        self._last_progress = now
        if getattr(self.reporter, "shows_expansions", False) and now - self._last_look >= 1.0:
            self._last_look = now
            self.reporter.expansions(self._in_flight(now))
        report = getattr(self.reporter, "status", None)
        if report is None:
            return
        running = {w.ticket.task for w in self.pending.values() if w.ticket is not None}
        running |= {task for task, _ in self.dispatch.queue}
        report({
            **self.view.status(running, self.run.search.budget, set(self.capped)),
            "cost": self.spend.total.cost, "tokens": self.spend.total.tokens,
            "evaluators": len(self.evaluators),
            "evaluating": self.dispatch.running, "waiting": len(self.dispatch.queue),
            "busy": sum(1 for load in self.dispatch.load if load), "in_flight_cap": self.cap.value,
            "capped": dict(self.capped),
        })

    def _in_flight(self, now: float) -> list[InFlight]:
        """What each expansion in flight is doing: its agent call, its wait for an evaluator, or its evaluation's
        step as its evaluator last said. The evaluators are asked without waiting: an answer is used once it has
        come (a busy host answers late; the driver never blocks on it)."""
        answered = ray.wait(list(self._looking), num_returns=len(self._looking), timeout=0)[0] if self._looking else []
        for ref in answered:
            which = self._looking.pop(ref)
            with contextlib.suppress(RayError):
                self._steps[which] = ray.get(ref)
        busy = {w.which for w in self.pending.values() if w.kind == EVAL}
        for which in busy - set(self._looking.values()):
            self._looking[self.evaluators[which].activity.remote()] = which
        steps = {key: step for which in busy for key, step in self._steps.get(which, {}).items()}
        out = []
        for w in self.pending.values():
            if w.ticket is None or w.kind not in (AGENT, EVAL):
                continue
            if w.kind == AGENT:
                out.append(InFlight(w.ticket.task, w.ticket.parent, AGENT_WORDS.get(w.ticket.request.agent, "agent"),
                                    now - w.since))
            else:
                doing, seconds = steps.get(source_digest(w.step.source if w.step else ""), ("evaluating",
                                                                                            now - w.since))
                out.append(InFlight(w.ticket.task, w.ticket.parent, doing, seconds))
        out += [InFlight(task, w.ticket.parent, "waiting for an evaluator", now - w.since)
                for task, w in self.dispatch.queue if w.ticket is not None]
        return out
