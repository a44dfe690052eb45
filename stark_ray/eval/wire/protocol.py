"""The protocols between the service, the judge and the worker.

Every process is started with its backend on the command line and answers ``{"hello": {...}}`` once it is ready
(the judge: the device's properties). It then reads messages, one JSON line each, on stdin, and exits at the end
of its stdin.

- Service -> judge (and compile pool -> compile worker): a :class:`WorkerRequest`; the answer is ``{"phase": ...}``
  lines as it moves on and ``{"result": {...}, "healthy": bool}`` last. The judge adds ``"worker"`` (its worker's
  starts and promotions) and, when the worker cannot start on this host, ``"evaluator_error"``.
- Judge -> worker: one ``{"op": ...}`` per step of a candidate (the ``OP_*`` below), each answered by one
  message (phase lines may come before it). Shared buffers travel as file descriptors on a Unix socket beside
  the pipes (:func:`send_fds`), counted in the message's ``"fds"``. The judge trusts nothing the worker says: a
  malformed answer ends the worker and rejects its candidate.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from stark_ray.records import STAGE_COMPILE, STAGE_CORRECTNESS, STAGE_PARSE, STAGE_RUNTIME, EvalResult, excerpt

FAILURE_STAGES = (STAGE_PARSE, STAGE_COMPILE, STAGE_RUNTIME, STAGE_CORRECTNESS)  # a reported failure's stage

MODE_REFERENCE = "reference"  # validate the task and time the reference alone
MODE_CANDIDATE = "candidate"  # build the candidate, check it, time it against the reference
MODE_COMPILE = "compile"  # only import the candidate (which builds its extension): the compile pool's job
# a builder: build the load_inline/load arguments sent, outside any candidate (eval/build/builder.py)
MODE_BUILD = "build"

PHASE_START = "start"  # interpreter start, torch import, device set-up (before the hello)
PHASE_SETUP = "setup"  # task import, reference model, reference outputs (cached per task in a warm worker)
PHASE_COMPILE = "compile"  # candidate import (which builds its extension) and ModelNew(...)
PHASE_CHECK = "check"  # correctness trials and guards
PHASE_TIME = "time"  # timing against the reference (and the optional torch.compile baseline)
PHASES = (PHASE_START, PHASE_SETUP, PHASE_COMPILE, PHASE_CHECK, PHASE_TIME)

# judge -> worker
OP_REFERENCE = "reference"  # time the reference against itself (nothing of a candidate is loaded)
OP_LOAD = "load"  # the task's reference for timing, then the candidate: import (its build) and ModelNew(...)
OP_RUN = "run"  # call the candidate once on shared inputs; copy its outputs into the shared slots
OP_TIME = "time"  # time the candidate against the reference, interleaved, on the worker's own inputs
OP_STAGE = "stage"  # map the input sets and slots of a confirmation batch
OP_GO = "go"  # run the staged batch: every set once, outputs into their slots, then one sync; digests back
OP_END = "end"  # forget the candidate; report what its fingerprint saw
OP_RELEASE = "release"  # other tasks' states down to a number of bytes (or the batch's mappings); cached blocks back
OP_PING = "ping"  # answer at once: the judge's measure of a message's round trip, before any candidate is loaded
FD_BATCH = 200  # file descriptors per sendmsg (the kernel's SCM_MAX_FD is 253)

STACK_DUMP_SIGNAL = signal.SIGUSR1  # on a timeout the worker gets this first: faulthandler prints its stack
STACK_DUMP_WAIT_S = 1.0


@dataclass
class WorkerRequest:
    mode: str
    task_name: str
    task_source: str
    cfg: dict[str, Any]  # EvalConfig as a dict
    candidate_source: str | None = None
    build: dict[str, Any] | None = None  # MODE_BUILD: what the candidate's process asked for, and where to build

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


def failure_from_message(payload: Any) -> EvalResult:
    """A failure that a process running candidate code reported (its import failed, its build failed), as no more
    than a failure: what went wrong (stage, error, log, flags, whether it compiled, the build's seconds) and
    nothing a candidate could forge into a success — passed checks, runtimes, speedups and every other figure are
    the judge's alone. A candidate can write to its process's message channel."""
    told = payload if isinstance(payload, dict) else {}
    stage = told.get("stage")
    flags = told.get("flags")
    compile_s = told.get("compile_s")
    return EvalResult(
        compiled=told.get("compiled") is True and stage != STAGE_COMPILE,
        stage=stage if stage in FAILURE_STAGES else STAGE_RUNTIME,
        error=str(told.get("error") or "the worker reported a failure without saying which")[:2000],
        log=excerpt(str(told.get("log") or "")),
        flags=[f for f in flags if isinstance(f, str)][:20] if isinstance(flags, list) else [],
        compile_s=float(compile_s) if isinstance(compile_s, int | float) and not isinstance(compile_s, bool) else None,
    )


def send_fds(sock: socket.socket, fds: Sequence[int]) -> None:
    """Send ``fds`` over a Unix socket (in batches; the receiver asks for exactly as many)."""
    for i in range(0, len(fds), FD_BATCH):
        socket.send_fds(sock, [b"f"], list(fds[i:i + FD_BATCH]))


def recv_fds(sock: socket.socket, count: int) -> list[int]:
    got: list[int] = []
    while len(got) < count:
        _, fds, _, _ = socket.recv_fds(sock, 1, min(FD_BATCH, count - len(got)))
        if not fds:
            raise OSError("the peer closed the descriptor channel")
        got.extend(fds)
    return got
