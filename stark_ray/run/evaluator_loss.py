"""The Ray driver's side of evaluator deaths: it carries out what :mod:`stark_ray.run.evaluator_deaths` decides
(pause an evaluator, ask it again, charge a candidate, send candidates again, give an evaluator up), and asks
the dead evaluators in turn, moving the candidates of one whose node is gone."""

from __future__ import annotations

import logging
import time
from typing import Any

from stark_ray.records import STAGE_CRASH, EvalResult
from stark_ray.run import evaluator_deaths
from stark_ray.run.directory import RunError
from stark_ray.run.evaluator_deaths import EvaluatorDeaths, Verdict

log = logging.getLogger(__name__)
ASK_EVERY_S = 0.2  # how often a dead evaluator is asked whether it is back


class EvaluatorLoss:
    """Part of the Ray driver (``ray_driver.RayDriver``), whose state it uses."""

    deaths: EvaluatorDeaths[Any]
    dispatch: Any
    evaluators: list[Any]
    cap: Any
    tasks: dict[str, Any]
    capped: dict[str, str]
    view: Any
    run: Any
    dir: Any
    ask_at: dict[int, float]  # a dead evaluator -> when to ask it ``where`` again
    _nodes_asked: float  # when Ray was last asked which nodes are alive

    def _await_restart(self, which: int) -> None:  # the driver's: one ``where`` call to evaluator ``which``
        raise NotImplementedError

    def _alive_nodes(self) -> set[str]:  # the driver's: Ray's nodes that are alive
        raise NotImplementedError

    def _resume(self, expansion: Any, value: Any) -> None:  # the driver's: an expansion goes on with ``value``
        raise NotImplementedError

    def _send_evaluations(self) -> None:
        raise NotImplementedError

    def _act(self, which: int, verdict: Verdict[Any]) -> None:
        """Carry out what :mod:`stark_ray.run.evaluator_deaths` decided about evaluator ``which``."""
        if verdict.gone:
            self.cap.evaluators = len(self.evaluators) - len(self.deaths.gone)
            left = [t for t in self.tasks if not set(self.dispatch.peers[t]) - self.deaths.gone
                    and t not in self.capped and self.view.trees[t].evaluated < self.run.search.budget]
            if left:
                raise RunError(f"evaluator {which} died and did not come back within "
                               f"{evaluator_deaths.RESTART_WAIT_S:.0f} s, and no evaluator is left for "
                               f"{len(left)} task(s) ({left[0]}, ...); every attempt acknowledged is recorded: "
                               f"continue with --resume {self.dir}")
            log.warning("evaluator %d died and did not come back: the run goes on without it", which)
        if verdict.pause:
            self.dispatch.pause(which)
            self._await_restart(which)
        if verdict.ask_again:
            self.ask_at[which] = time.monotonic() + ASK_EVERY_S
        for work in verdict.charge:
            self._resume(work.expansion, EvalResult.failed(
                STAGE_CRASH, "the evaluator actor died while evaluating this candidate (it is restarted; this "
                "candidate is not run again)"))
        for work in verdict.resend:
            assert work.ticket is not None
            self.dispatch.put(work.ticket.task, work)
        if verdict.resume:
            log.info("evaluator %d answers again", which)
            self.dispatch.resume(which)
        if verdict.resend or verdict.resume:
            self._send_evaluations()

    def _mind_the_dead(self) -> None:
        """Ask the dead evaluators whose next question is due; send the orphans of those that have not come back
        for a while to their peers (:mod:`stark_ray.run.evaluator_deaths`)."""
        if not self.deaths.dead:
            return
        now = time.monotonic()
        for which in [w for w, at in self.ask_at.items() if at <= now]:
            del self.ask_at[which]
            self._await_restart(which)
        if not self.deaths.late(now) or now - self._nodes_asked < 1.0:
            return
        self._nodes_asked = now  # Ray's GCS is asked at most once a second which nodes are alive
        for which, verdict in self.deaths.overdue(now, self._alive_nodes()).items():
            log.warning("evaluator %d has not come back for %.0f s and its node is gone: its %d candidate(s) go to "
                        "the others", which, evaluator_deaths.MOVE_AFTER_S, len(verdict.resend) + len(verdict.charge))
            self._act(which, verdict)
