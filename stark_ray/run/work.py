"""What an object ref the Ray driver waits on stands for: an agent call, an evaluation, the memory's
``add_next`` or ``next_many``, or a dead evaluator's ``where``; and the expansion (a generator, see
``ray_driver.RayDriver._expansion``) that waits for it."""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from stark_ray.agents.base import AgentResult
from stark_ray.search.memory import Ticket

AGENT, EVAL, ADD, NEXT, BACK = "agent", "eval", "add", "next", "back"
# one expansion: it yields the Work it waits for and is sent that work's value (an agent step, an evaluation's
# result, the memory's (node, tickets))
Expansion = Generator["Work", Any, None]


@dataclass
class Work:
    """What an object ref the driver waits on stands for."""

    kind: str  # AGENT | EVAL | ADD (memory.add_next) | NEXT (memory.next_many) | BACK (a restarted evaluator)
    ticket: Ticket | None = None  # the expansion (agent, eval, add)
    step: AgentResult | None = None  # its agent step (eval, add)
    which: int = -1  # the agent worker (agent) or the evaluator (eval, back)
    limit: int = 0  # tickets asked for (add, next): room kept for them until they come back
    deaths: int = 0  # eval: evaluator deaths this candidate was in flight for (sent again after each)
    host_kills: int = 0  # eval: ... of them the host's doing (Ray's memory monitor): never the candidate's
    instance: str | None = None  # eval: the evaluator's actor process it was sent to
    since: float = field(default_factory=time.monotonic)  # when it was launched, sent or queued
    ref: Any = None  # the object ref it stands for (an evaluation: once sent to an evaluator)
    expansion: Expansion | None = None  # the expansion waiting for it (agent, eval, add)


def ticket_of(work: Work) -> Ticket:
    """The expansion's ticket of an agent call, an evaluation or an ``add_next``."""
    assert work.ticket is not None
    return work.ticket
