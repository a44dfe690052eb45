"""What an object ref the Ray driver waits on stands for: an agent call, an evaluation, the memory's
``add_next`` or ``next_many``, or a dead evaluator's ``where``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stark_ray.agents.base import AgentResult
from stark_ray.search.memory import Ticket

AGENT, EVAL, ADD, NEXT, BACK = "agent", "eval", "add", "next", "back"


@dataclass
class Work:
    """What an object ref the driver waits on stands for."""

    kind: str  # AGENT | EVAL | ADD (memory.add_next) | NEXT (memory.next_many) | BACK (a restarted evaluator)
    ticket: Ticket | None = None  # the expansion (agent, eval, add)
    step: AgentResult | None = None  # its agent step (eval, add)
    which: int = -1  # the agent worker (agent) or the evaluator (eval, back)
    limit: int = 0  # tickets asked for (add, next): room kept for them until they come back
    deaths: int = 0  # eval: evaluator deaths this candidate was in flight for (sent again after each)
    instance: str | None = None  # eval: the evaluator's actor process it was sent to
    since: float = field(default_factory=time.monotonic)  # when it was launched, sent or queued
