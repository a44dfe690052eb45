"""What ends a candidate's way through the judge early: :class:`Decided`, carrying the result a step decided, and
the results of a worker that tampered or broke the protocol."""

from __future__ import annotations

from stark_ray.records import STAGE_CORRECTNESS, EvalResult


class Decided(Exception):
    """A step decided the candidate's result (the worker died, timed out or broke the protocol; a trial failed);
    ``recycle``: the worker must not serve another candidate."""

    def __init__(self, result: EvalResult, recycle: bool = False) -> None:
        super().__init__(result.error)
        self.result = result
        self.recycle = recycle


def tampered(names: list[str]) -> EvalResult:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, flags=["tampered"],
                      error=f"the candidate replaced part of torch or of the evaluator ({shown}); rejected")


def protocol_broken(why: str) -> EvalResult:
    return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, flags=["tampered"],
                      error=f"the worker broke the evaluator's protocol ({why}); rejected")
