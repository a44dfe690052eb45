"""What ends a candidate's way through the judge early: :class:`Decided`, carrying the result a step decided, and
the results of a worker that tampered or broke the protocol."""

from __future__ import annotations

from typing import Any

from stark_ray.records import STAGE_CORRECTNESS, STAGE_RUNTIME, EvalResult, excerpt


class Decided(Exception):
    """A step decided the candidate's result (the worker died, timed out or broke the protocol; a trial failed);
    ``recycle``: the worker must not serve another candidate."""

    def __init__(self, result: EvalResult, recycle: bool = False) -> None:
        super().__init__(result.error)
        self.result = result
        self.recycle = recycle


class DeviceMemory(Decided):
    """What the candidate's process raised was the device running out of memory (the worker's word on the
    exception's type): decided as any raise, except where the judge sized what ran out (a confirmation batch),
    which makes the batch smaller instead."""


def tampered(names: list[str]) -> EvalResult:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, flags=["tampered"],
                      error=f"the candidate replaced part of torch, of the evaluator or of the reference ({shown}); "
                            "rejected")


def protocol_broken(why: str) -> EvalResult:
    return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, flags=["tampered"],
                      error=f"the worker broke the evaluator's protocol ({why}); rejected")


def checked_answer(msg: dict[str, Any], label: str, seq: int) -> dict[str, Any]:
    """A worker's answer to the step numbered ``seq`` (``label`` says where), or the Decided it makes: one without
    its fingerprint, or answering another step (written ahead of the worker's own, on its channel), breaks the
    protocol; a changed fingerprint is tampering; what the candidate raised fails it."""
    changed = msg.get("tampered")
    if not isinstance(changed, list) or "healthy" not in msg:
        raise Decided(protocol_broken("an answer without its fingerprint"), recycle=True)
    if msg.get("seq") != seq:
        raise Decided(protocol_broken(f"an answer to another step than {label or 'this one'}"), recycle=True)
    if changed:
        raise Decided(tampered([str(c) for c in changed]), recycle=True)
    if "error" in msg:
        raise Decided(protocol_broken(str(msg["error"])[:200]), recycle=True)
    if "raised" in msg:
        raised = msg["raised"] if isinstance(msg["raised"], dict) else {}
        error = f"{label}: {raised.get('error', '?')}"
        memory = raised.get("host_memory") is True  # the worker's word on the exception's type: a failure either way
        if memory:
            error = f"out of memory on the host (the candidate's process is held to worker_memory_gb): {error}"
        kind = DeviceMemory if raised.get("device_memory") is True else Decided
        raise kind(EvalResult(compiled=True, stage=STAGE_RUNTIME, error=error[:300],
                              log=excerpt(str(raised.get("log", ""))), flags=["out_of_memory"] if memory else []),
                   recycle=not msg.get("healthy") or memory)
    return msg
