"""The parent↔worker protocol: a JSON request on the worker's stdin; JSON lines back on a private channel
(``{"phase": ...}`` as the worker moves on, then ``{"result": {...}}``)."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, fields
from typing import Any

from stark_ray.records import EvalResult

MODE_REFERENCE = "reference"  # validate the task and time the reference alone
MODE_CANDIDATE = "candidate"  # build the candidate, check it, time it against the reference

PHASE_SETUP = "setup"  # interpreter start, task import, reference model
PHASE_COMPILE = "compile"  # candidate import (which builds its extension) and ModelNew(...)
PHASE_RUN = "run"  # correctness trials and timing

STACK_DUMP_SIGNAL = signal.SIGUSR1  # on a timeout the worker gets this first: faulthandler prints its stack
STACK_DUMP_WAIT_S = 1.0


@dataclass
class WorkerRequest:
    mode: str
    task_name: str
    task_source: str
    cfg: dict[str, Any]  # EvalConfig as a dict
    build_dir: str
    threads: int
    candidate_source: str | None = None
    log_path: str = ""  # the worker's own stdout/stderr file (set by the parent)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> WorkerRequest:
        return WorkerRequest(**json.loads(text))


def result_to_message(result: EvalResult) -> dict[str, Any]:
    return {"result": asdict(result)}


def result_from_message(payload: dict[str, Any]) -> EvalResult:
    names = {f.name for f in fields(EvalResult)}
    return EvalResult(**{k: v for k, v in payload.items() if k in names})
