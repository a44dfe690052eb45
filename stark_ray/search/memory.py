"""Tree memory: the trees, policies and in-flight expansions of any number of tasks, in one place.

Algorithm 1 cut at its seams. :meth:`TaskSearch.next` selects a node (not one being expanded now) and cuts a
:class:`~stark_ray.search.team.Request` loose from the tree; whoever holds the :class:`Ticket` runs the agents
and the evaluator anywhere; :meth:`TaskSearch.add` attaches the child. With one expansion in flight at a time
this is the paper's sequential search step for step (same seed, same tree); with ``parallel`` K, K expansions
of one task run at once on different nodes. The budget counts attempts attached plus those in flight, so a
search never overshoots it.

:class:`TreeMemory` holds one :class:`TaskSearch` per task and hands every attached node to a ``sink`` (the
Parquet store) before ``add`` returns. It is what the TreeMemory actor wraps; the local executor drives one
TaskSearch directly.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.llm.base import LLMClient
from stark_ray.records import STAGE_PARSE, EvalResult, Node
from stark_ray.search.policy import Policy, make_policy
from stark_ray.search.team import Request, Team, make_team
from stark_ray.search.tree import Tree


@dataclass(frozen=True)
class Ticket:
    """One expansion in flight: what its worker needs, and what ``add`` needs back."""

    task: str
    id: int
    request: Request

    @property
    def parent(self) -> int:
        return self.request.node.id

    def slim(self) -> Ticket:
        """The ticket as ``add`` needs it back: without the context windows (the bulk of a request)."""
        return replace(self, request=replace(self.request, windows={})) if self.request.windows else self


class UnknownParent(LookupError):
    """The ticket's node is not in the tree (it was lost with a restart before it was written): redo the work."""


class StaleTicket(UnknownParent):
    """A ticket issued before a restart whose place in the budget the restarted memory has given to another:
    its attempt is dropped (the other one does the work)."""


def no_candidate(step: AgentResult) -> EvalResult:
    """The result of an agent step that produced nothing to evaluate (it still costs one attempt)."""
    return EvalResult.failed(STAGE_PARSE, step.error or "the agent returned no candidate")


@dataclass
class TaskSearch:
    """One task's search: tree, policy, team (for the context windows), budget, RNG, what is in flight."""

    name: str
    tree: Tree
    policy: Policy
    team: Team
    budget: int
    seed: int
    parallel: int = 1
    stop_at_sol: float = 0.0  # stop once the best candidate reaches this share of the speed of light (0: never)
    in_flight: dict[int, Ticket] = field(default_factory=dict)
    # ticket ids start at a random offset: a memory restarted from its rows must not take a ticket still in flight
    # from before the restart for one of its own
    _tickets: int = field(default_factory=lambda: secrets.randbits(40) << 16)
    _exhausted: bool = False

    @property
    def busy(self) -> set[int]:
        return {t.parent for t in self.in_flight.values()}

    @property
    def finished(self) -> bool:
        """Nothing in flight and nothing more to do: the budget is spent, the policy has nothing left, or the best
        candidate is as close to the speed of light as asked."""
        return not self.in_flight and (self.tree.evaluated >= self.budget or self._exhausted or self.near_light)

    @property
    def near_light(self) -> bool:
        """The best candidate has reached ``stop_at_sol`` of the task's speed of light (``--stop-at-sol``)."""
        return sol_reached(self.tree, self.stop_at_sol)

    def next(self) -> Ticket | None:
        """The next expansion, or None: budget spent (counting work in flight), ``parallel`` expansions already
        running, or nothing selectable until one of them comes back."""
        if (self.tree.evaluated + len(self.in_flight) >= self.budget or len(self.in_flight) >= self.parallel
                or self.near_light):
            return None
        node = self.policy.select(self.tree, selection_rng(self.seed, self.tree.evaluated + len(self.in_flight)),
                                  self.busy)
        if node is None:
            self._exhausted = not self.in_flight  # nothing selectable and nothing coming back: done
            return None
        self._tickets += 1
        ticket = Ticket(self.name, self._tickets, self.team.request(self.tree, node))
        self.in_flight[ticket.id] = ticket
        return ticket

    def add(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> Node:
        """Attach the child the ticket's expansion produced. A ticket this search did not issue (the memory was
        restarted since) is accepted while its node is in the tree and the budget has room beside the tickets issued
        since: every attempt counts once against the budget."""
        known = self.in_flight.pop(ticket.id, None) is not None
        parent = self.tree.nodes.get(ticket.parent)
        if parent is None or not _same_node(parent, ticket.request.node):
            raise UnknownParent(f"task {self.name}: node {ticket.parent} is not in the tree")
        if not known and self.tree.evaluated + len(self.in_flight) >= self.budget:
            raise StaleTicket(f"task {self.name}: a ticket from before a restart, its budget taken by newer ones")
        self._exhausted = False
        return self.tree.add(ticket.parent, step.source or "", ticket.request.agent, result, step.instruction,
                             step.scaffold, step.usage)

    def release(self, ticket: Ticket) -> None:
        """Give a ticket back without an attempt (cancelled, or lost with a worker): it may be selected again."""
        self.in_flight.pop(ticket.id, None)


def _same_node(a: Node, b: Node) -> bool:
    """The node a ticket was cut from, as the tree holds it now (a memory restarted from its rows may have given
    a lost node's id to another one)."""
    return a.parent == b.parent and a.agent == b.agent and a.source == b.source


def make_task_search(name: str, tree: Tree, search: SearchConfig, agents: AgentConfig, info: TaskInfo,
                     client: LLMClient | None = None) -> TaskSearch:
    """A task's search as the run's settings say (a tree rebuilt from records, for a resume or a restarted memory,
    continues as the uninterrupted search would: see :func:`selection_rng`)."""
    policy = make_policy(search)
    team = make_team(client, agents, search, info)  # type: ignore[arg-type]  # no client: windows only
    return TaskSearch(name, tree, policy, team, search.budget, search.seed, search.parallel, search.stop_at_sol)


SOL_BEYOND = 1.1  # a share of the speed of light above this is not taken at its word (TF32 or lower precision, a
# probe that measured low): it does not stop a search


def sol_reached(tree: Tree, stop_at_sol: float) -> bool:
    """The tree's best candidate runs at ``stop_at_sol`` of its speed of light or closer (0: never)."""
    best = tree.best() if stop_at_sol > 0 else None
    return sol_share_reached(best.result.sol_fraction if best is not None else None, stop_at_sol)


def sol_share_reached(share: float | None, stop_at_sol: float) -> bool:
    """A best candidate at ``share`` of the speed of light is as close as ``stop_at_sol`` asks (0: never)."""
    return stop_at_sol > 0 and share is not None and stop_at_sol <= share <= SOL_BEYOND


def selection_rng(seed: int, index: int) -> random.Random:
    """The random state of a search's ``index``-th selection (attempts attached plus in flight when it is made):
    a function of the seed and of what is recorded, never of the process's history. With one expansion in flight
    (``parallel`` 1, the paper's search) a run killed anywhere and resumed, or a TreeMemory actor restarted from
    its rows, makes the selections the uninterrupted run makes; with more, the order results come back in already
    shapes the tree, and a resume continues it with the same rule."""
    return random.Random(f"stark-select/{seed}/{index}")


Sink = Callable[[str, Node, AgentResult], None]  # (task, new node, the step that made it)


class TreeMemory:
    """The searches of many tasks; every attached node goes to ``sink`` before :meth:`add` returns."""

    def __init__(self, sink: Sink | None = None) -> None:
        self.searches: dict[str, TaskSearch] = {}
        self.sink = sink
        # the searches not known to be finished, in the order they were opened: next_many and unfinished walk
        # these, not every task (a finished search leaves when a walk meets it, and comes back if work reaches it)
        self._open: dict[str, TaskSearch] = {}

    def open(self, search: TaskSearch) -> None:
        if search.name in self.searches:
            raise ValueError(f"task {search.name} is already open")
        self.searches[search.name] = search
        self._open[search.name] = search

    def __getitem__(self, task: str) -> TaskSearch:
        try:
            return self.searches[task]
        except KeyError:
            raise KeyError(f"no search open for task {task!r}") from None

    def next(self, task: str) -> Ticket | None:
        return self[task].next()

    def next_many(self, limit: int, exclude: Collection[str] = ()) -> list[Ticket]:
        """Up to ``limit`` expansions over all tasks but ``exclude``, one task after the other as each has work to
        give (one call for a driver that keeps many tasks busy)."""
        out: list[Ticket] = []
        ended: list[str] = []
        for search in self._open.values():
            if len(out) >= limit:
                break
            if search.finished:
                ended.append(search.name)
                continue
            if search.name in exclude:
                continue
            while len(out) < limit and not search.finished and (ticket := search.next()) is not None:
                out.append(ticket)
        for name in ended:
            del self._open[name]
        return out

    def add(self, ticket: Ticket, step: AgentResult, result: EvalResult) -> Node:
        search = self[ticket.task]
        node = search.add(ticket, step, result)
        self._reopen(search)
        if self.sink is not None:
            self.sink(ticket.task, node, step)
        return node

    def release(self, ticket: Ticket) -> None:
        search = self[ticket.task]
        search.release(ticket)
        self._reopen(search)

    def _reopen(self, search: TaskSearch) -> None:
        """A search that work came back to may have more to give (a finished one has not)."""
        if search.name not in self._open and not search.finished:
            self._open[search.name] = search

    def finished(self, task: str) -> bool:
        return self[task].finished

    def unfinished(self) -> list[str]:
        return [name for name, s in self._open.items() if not s.finished]

    def leaderboard(self, task: str, r: int | None = None) -> list[dict[str, Any]]:
        return [n.to_record() for n in self[task].tree.leaderboard(r)]

    def snapshot(self, task: str) -> list[dict[str, Any]]:
        """The task's tree as plain records (``Tree.from_records`` rebuilds it)."""
        return self[task].tree.to_records()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per task: attempts, budget, in flight, best speedup, finished."""
        out = {}
        for name, s in self.searches.items():
            best = s.tree.best()
            out[name] = {"attempts": s.tree.evaluated, "budget": s.budget, "in_flight": len(s.in_flight),
                         "best_speedup": best.result.speedup if best else None, "finished": s.finished}
        return out
