"""The parent↔worker protocol.

A worker is started with its backend on the command line and answers ``{"hello": {...}}`` once it is ready
(for a GPU backend: the device's properties). It then reads requests, one JSON line each, on stdin; for each
it reports ``{"phase": ...}`` as it moves on and ends with ``{"result": {...}, "healthy": bool}``. An unhealthy
worker (a sticky CUDA error, a candidate that replaced part of torch) exits after its answer; the parent
starts a fresh one for the next request. A worker also exits at the end of its stdin.
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, fields
from typing import Any

from stark_ray.records import EvalResult

MODE_REFERENCE = "reference"  # validate the task and time the reference alone
MODE_CANDIDATE = "candidate"  # build the candidate, check it, time it against the reference
MODE_COMPILE = "compile"  # only import the candidate (which builds its extension): the compile pool's job

PHASE_START = "start"  # interpreter start, torch import, device set-up (before the hello)
PHASE_SETUP = "setup"  # task import, reference model, reference outputs (cached per task in a warm worker)
PHASE_COMPILE = "compile"  # candidate import (which builds its extension) and ModelNew(...)
PHASE_CHECK = "check"  # correctness trials and guards
PHASE_TIME = "time"  # timing against the reference (and the optional torch.compile baseline)
PHASES = (PHASE_START, PHASE_SETUP, PHASE_COMPILE, PHASE_CHECK, PHASE_TIME)

STACK_DUMP_SIGNAL = signal.SIGUSR1  # on a timeout the worker gets this first: faulthandler prints its stack
STACK_DUMP_WAIT_S = 1.0


@dataclass
class WorkerRequest:
    mode: str
    task_name: str
    task_source: str
    cfg: dict[str, Any]  # EvalConfig as a dict
    candidate_source: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> WorkerRequest:
        return WorkerRequest(**json.loads(text))


def result_to_message(result: EvalResult, healthy: bool = True) -> dict[str, Any]:
    return {"result": asdict(result), "healthy": healthy}


def result_from_message(payload: dict[str, Any]) -> EvalResult:
    names = {f.name for f in fields(EvalResult)}
    return EvalResult(**{k: v for k, v in payload.items() if k in names})
