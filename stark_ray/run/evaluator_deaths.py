"""Which candidates a dead evaluator costs: the Ray driver's bookkeeping of evaluator deaths (no Ray here).

A call to an Evaluator actor that fails as if the actor died leaves its candidate an *orphan* of that evaluator.
The first orphan pauses the evaluator (a call sent now could reach the dead process too) and the driver asks it
``where`` until it answers:

- **a new process**: it is back; its answer names the candidate its dead process was running (the actor's note,
  ``died_running``). That candidate is charged; the other orphans go again. Without a note (it died while they
  were built or queued, or came back on another host) every orphan goes again, and one that was in flight at
  two deaths is charged; any that was at :data:`MAX_DEATHS` is charged whatever the notes say.
- **the same process**, for :data:`ALIVE_AFTER_S`: it never died (Ray's ``ActorUnavailableError``: unreachable
  for a while); its orphans go again, uncharged.
- **no answer from a new process** for :data:`MOVE_AFTER_S` while its node is gone (Ray says the node is dead):
  its orphans are judged as without a note and go to its peers; it stays paused until it answers (on another
  node). On a live node a restart is waited for, since its answer names the candidate that killed it.
- **no answer** for :data:`RESTART_WAIT_S`: it is not coming back; the run goes on without it (and stops, in one
  line, when no evaluator is left).

A death that was the host's doing — Ray's memory monitor killed the actor because the node ran low on memory
(``host``: the driver reads it from Ray's error) — charges no candidate, whatever the note says: the monitor picks
its victim by when it was scheduled, not by its memory, and on a shared host the memory was other processes'
(a live search lost one of its six attempts so). Its orphans go again, and those kills count towards no other
rule; only the candidate the note names at :data:`MAX_DEATHS` of them is charged (it may be what fills the host).

An orphan whose call was sent to a process whose death was judged already (its error came after the restart's
answer) is judged at once by that restart's note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from stark_ray.records import source_digest

RESTART_WAIT_S = 900.0  # an evaluator that died and gives no answer for this long is not coming back
MOVE_AFTER_S = 30.0  # the orphans of an evaluator with no new process answering for this long go to its peers
ALIVE_AFTER_S = 10.0  # the same process answering for this long after an error was never dead
MAX_DEATHS = 3  # evaluator deaths a candidate may be in flight for before it is charged whatever the notes say


class Orphan(Protocol):
    deaths: int  # evaluator deaths this candidate was in flight for
    host_kills: int  # ... of them the host's doing
    instance: str | None  # the evaluator's process it was sent to


W = TypeVar("W", bound=Orphan)


@dataclass
class Verdict(Generic[W]):
    """What the driver does now about one evaluator."""

    pause: bool = False  # stop sending to it, and ask it ``where``
    ask_again: bool = False  # ask it ``where`` again, a little later
    gone: bool = False  # it is not coming back
    charge: list[W] = field(default_factory=list)  # recorded as crashed: the evaluator died of them
    resend: list[W] = field(default_factory=list)  # sent again, to any evaluator with room
    resume: bool = False  # send to it again


class EvaluatorDeaths(Generic[W]):
    """The deaths of a run's evaluators and the candidates they left behind."""

    def __init__(self, source_of: Callable[[W], str | None]) -> None:
        self.source_of = source_of  # a candidate's source, to match a note
        self.instances: dict[int, str | None] = {}  # evaluator -> the process it last answered from
        self.nodes: dict[int, str | None] = {}  # evaluator -> the Ray node it last answered from
        self.notes: dict[int, str | None] = {}  # evaluator -> what its last restart said it died running
        self.dead: dict[int, str | None] = {}  # evaluator -> the process that died (until an answer)
        self.orphans: dict[int, list[W]] = {}
        self.since: dict[int, float] = {}  # evaluator -> when its first orphan came back
        self.gone: set[int] = set()  # evaluators given up: an orphan of theirs is judged at once, without a note
        self.by_host: dict[int, bool] = {}  # evaluator -> its death (until an answer) was the host's doing
        self.host_killed: set[str] = set()  # the evaluator processes the host killed (a late orphan's is judged so)

    @property
    def waiting(self) -> bool:
        """Some candidate waits for its evaluator's answer."""
        return any(self.orphans.values())

    def lost(self, which: int, work: W, now: float, host: bool = False) -> Verdict[W]:
        """``work``'s call to evaluator ``which`` failed as if the actor died (``host``: Ray says its node's memory
        monitor killed it)."""
        host = host or (work.instance is not None and work.instance in self.host_killed)
        work.deaths += 1
        work.host_kills += host
        if which in self.gone:
            return self._judge([work], None, host)
        if work.instance is not None and which not in self.dead and work.instance != self.instances.get(which):
            return self._judge([work], self.notes.get(which), host)  # a death judged already
        self.orphans.setdefault(which, []).append(work)
        self.by_host[which] = self.by_host.get(which, False) or host
        if host and work.instance is not None:
            self.host_killed.add(work.instance)
        if which in self.dead:  # its death is known: one more orphan for its answer
            return Verdict()
        self.dead[which], self.since[which] = work.instance, now
        return Verdict(pause=True)

    def late(self, now: float) -> list[int]:
        """The dead evaluators whose orphans have waited :data:`MOVE_AFTER_S` for a new process."""
        return [w for w, orphans in self.orphans.items() if orphans and now - self.since.get(w, now) > MOVE_AFTER_S]

    def overdue(self, now: float, alive_nodes: set[str]) -> dict[int, Verdict[W]]:
        """The :meth:`late` evaluators whose node is not among ``alive_nodes`` (or unknown): their orphans are judged
        as without a note (sent to the peers, or charged after two deaths); the evaluator stays paused and is still
        asked."""
        gone = [w for w in self.late(now) if self.nodes.get(w) not in alive_nodes]
        return {which: self._judge(self.orphans.pop(which), None) for which in gone}

    def answered(self, which: int, where: dict[str, Any] | None, now: float) -> Verdict[W]:
        """Evaluator ``which`` answered ``where`` (None: the call failed too)."""
        waited = now - self.since.setdefault(which, now)
        if where is None:
            if waited <= RESTART_WAIT_S:
                return Verdict(ask_again=True)
            self.gone.add(which)
            self.dead.pop(which, None)
            self.since.pop(which, None)
            verdict = self._judge(self.orphans.pop(which, []), None)
            verdict.gone = True
            return verdict
        instance = where.get("instance")
        alive = instance is not None and instance == self.dead.get(which)
        if alive and waited < ALIVE_AFTER_S:  # the dying process answered, or a blip: ask again a little later
            return Verdict(ask_again=True)
        self.dead.pop(which, None)
        self.since.pop(which, None)
        orphans = self.orphans.pop(which, [])
        if alive:  # never dead: nothing of it is charged
            host = self.by_host.get(which, False)
            for orphan in orphans:
                orphan.deaths -= 1
                orphan.host_kills -= min(orphan.host_kills, int(host))
            verdict = self._judge(orphans, None)
        else:
            self.instances[which], self.notes[which] = instance, where.get("died_running")
            self.nodes[which] = where.get("node")
            verdict = self._judge(orphans, self.notes[which], self.by_host.get(which, False))
        self.by_host.pop(which, None)
        verdict.resume = True
        return verdict

    def _judge(self, orphans: list[W], died_running: str | None, host: bool = False) -> Verdict[W]:
        verdict: Verdict[W] = Verdict()
        for work in orphans:
            source = self.source_of(work)
            ran = died_running is not None and source is not None and source_digest(source) == died_running
            own = work.deaths - work.host_kills  # the deaths that were not the host's doing
            if host:  # the host's doing: the named candidate is charged only at MAX_DEATHS such kills
                (verdict.charge if ran and work.host_kills >= MAX_DEATHS else verdict.resend).append(work)
            elif ran or (died_running is None and own >= 2) or own >= MAX_DEATHS:
                verdict.charge.append(work)
            else:
                verdict.resend.append(work)
        return verdict
