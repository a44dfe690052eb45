"""How many expansions a Ray run may start now, and when to ask the memory for more: the driver's flow control.

The driver keeps at most ``cap.value`` expansions in flight (:mod:`stark_ray.run.in_flight`). An expansion counts
from its ticket's arrival to the ``add_next`` that hands its attempt to the memory (``working``); tickets asked of
the memory count from the question to the answer (``reserved``), so that two questions never take the same room.
The memory offers work in two ways: ``add_next``, which selects the work that takes an attempt's place in the round
trip that attaches it, and ``next_many`` (at most one outstanding: ``asking``), sent only when the memory may hold
work that no request has offered yet (``dirty``: at the start, and after a request got all it asked for).
"""

from __future__ import annotations

from dataclasses import dataclass

from stark_ray.run.in_flight import InFlightCap


@dataclass
class Room:
    cap: InFlightCap
    working: int = 0  # expansions with an agent call or an evaluation outstanding
    reserved: int = 0  # tickets asked of the memory (add_next, next_many) and not come back yet
    dirty: bool = True  # the memory may hold work that no request has offered
    asking: bool = False  # a next_many is outstanding

    def free(self) -> int:
        """Expansions that may still be started."""
        return self.cap.value - self.working - self.reserved

    def ask_next(self) -> int:
        """The tickets a ``next_many`` asks for now, kept for it (0: none is due)."""
        room = self.free()
        if not self.dirty or self.asking or room <= 0:
            return 0
        self.reserved += room
        self.asking, self.dirty = True, False
        return room

    def ask_add(self, wanted: bool) -> int:
        """The tickets an ``add_next`` asks for, kept for it (``wanted``: some task may still get work)."""
        limit = max(0, self.free()) if wanted else 0
        self.reserved += limit
        if limit > 0:
            self.dirty = False  # the memory selects after this attach: whatever was there is offered
        return limit

    def came_back(self, asked: int, got: int, next_many: bool) -> None:
        """A request's answer: its room is free again; the memory may hold more when it got all it asked for (or
        asked for nothing)."""
        self.reserved -= asked
        self.asking = self.asking and not next_many
        if got >= asked:
            self.dirty = True
