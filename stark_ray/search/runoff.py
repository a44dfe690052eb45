"""The runoff: before a task's best candidate is named, its top accepted candidates are evaluated again, side by side.

A search names its best by the highest speedup among many evaluations, each taken at its own time under its own load:
the highest of several noisy figures is biased upward (one candidate evaluated three times read 1.14x, 1.34x and
1.66x), and two candidates timed minutes apart are not compared under the same conditions. The runoff takes the top
``n`` of the leaderboard (at least two: with one there is nothing to choose) and has the evaluator judge them again in
one sitting, in mirrored order (A B C, then C B A: a drift in the machine's speed over the sitting weighs on each
alike). Each evaluation is a whole verdict — correctness checks included — with the reference timed beside the
candidate, so each figure is a paired ratio. The best is named by the runoff's figures: the geometric mean of a
contender's rounds. A contender that is not accepted again is out, and the runoff says why (its verdict depended on
the sitting: a flaky result). The runoff is the machine's own choice, not an attempt: it never counts against the
budget and its evaluations are not rows of the tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from stark_ray.records import EvalResult, Node
from stark_ray.search.tree import Tree

ROUNDS = 2  # each contender is evaluated this many times, in mirrored order


@dataclass
class Entry:
    """One contender of the runoff."""

    node: int
    search_speedup: float  # what the search measured (the figure it was ranked by)
    speedups: list[float] = field(default_factory=list)  # the runoff's figures, one per round it was accepted in
    speedup: float | None = None  # their geometric mean: None when it was not accepted in every round
    speedup_err: float | None = None  # its relative standard error (the rounds' own errors and their spread)
    runtime_ms: float | None = None  # its mean runtime over the rounds, and the reference's beside it
    ref_runtime_ms: float | None = None
    out: str | None = None  # why it left the runoff: the verdict of the round it was not accepted in

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Runoff:
    entries: list[Entry]
    winner: int | None  # the node named best: the highest runoff speedup among the contenders that held
    error: str | None = None  # why the runoff could not be held (its evaluator lost): the search's best stands

    @property
    def reordered(self) -> bool:
        """The runoff named another node than the search's best."""
        return bool(self.entries) and self.winner != self.entries[0].node

    def line(self) -> str:
        """One line for the run's output: who took part, with what figures, and who was named."""
        parts = []
        for e in self.entries:
            figure = f"{e.speedup:.2f}x" if e.speedup is not None else f"out ({e.out})"
            parts.append(f"node {e.node} {e.search_speedup:.2f}x -> {figure}")
        if self.error is not None:
            return f"runoff not held ({self.error}): the search's best stands"
        named = f"node {self.winner} named best" if self.winner is not None else "none held: the search's best stands"
        return f"runoff ({ROUNDS} rounds): " + "; ".join(parts) + f": {named}"

    def to_record(self) -> dict[str, Any]:
        return {"rounds": ROUNDS, "winner": self.winner, "entries": [e.to_record() for e in self.entries],
                "error": self.error}

    @staticmethod
    def from_record(record: dict[str, Any]) -> Runoff:
        return Runoff([Entry(**e) for e in record["entries"]], record["winner"], record.get("error"))


def contenders(tree: Tree, n: int) -> list[Node]:
    """The top ``n`` accepted candidates of the tree, best first; none where fewer than two (or ``n`` < 2)."""
    board = tree.leaderboard(n) if n >= 2 else []
    return board if len(board) >= 2 else []


def mirrored(count: int, rounds: int = ROUNDS) -> list[int]:
    """The order in which ``count`` contenders are evaluated: forwards, then backwards, and so on."""
    order: list[int] = []
    for r in range(rounds):
        order.extend(range(count) if r % 2 == 0 else reversed(range(count)))
    return order


@dataclass
class Sitting:
    """The evaluations a runoff asks for: its contenders, best first, and the order they are evaluated in."""

    nodes: list[Node]
    order: list[int]

    @property
    def sources(self) -> list[str]:
        return [self.nodes[i].source for i in self.order]

    def decide(self, results: Sequence[EvalResult]) -> Runoff:
        """The runoff's verdict from the results of :attr:`sources`, in their order."""
        if len(results) != len(self.order):
            raise ValueError(f"the runoff asked for {len(self.order)} evaluations and got {len(results)}")
        mine: list[list[EvalResult]] = [[] for _ in self.nodes]
        for i, r in zip(self.order, results, strict=True):
            mine[i].append(r)
        return decide(self.nodes, mine)


def sitting(tree: Tree, n: int) -> Sitting | None:
    """The runoff of the tree's top ``n``; None where there is nothing to choose between."""
    nodes = contenders(tree, n)
    return Sitting(nodes, mirrored(len(nodes))) if nodes else None


def decide(nodes: Sequence[Node], results: Sequence[Sequence[EvalResult]]) -> Runoff:
    """The runoff's verdict from each contender's results (in the order of ``nodes``, one result per round)."""
    entries = []
    for node, mine in zip(nodes, results, strict=True):
        entry = Entry(node=node.id, search_speedup=float(node.result.speedup or 0.0))
        for r in mine:
            if not r.accepted or not r.speedup:
                entry.out = f"{r.stage}: {r.error or ', '.join(r.flags) or 'not accepted'}"[:300]
                break
            entry.speedups.append(r.speedup)
        if entry.out is None and entry.speedups:
            entry.speedup = math.exp(sum(math.log(s) for s in entry.speedups) / len(entry.speedups))
            entry.speedup_err = spread_err(entry.speedups, [r.speedup_err for r in mine])
            entry.runtime_ms = mean([r.runtime_ms for r in mine])
            entry.ref_runtime_ms = mean([r.ref_runtime_ms for r in mine])
        entries.append(entry)
    held = [e for e in entries if e.speedup is not None]
    winner = max(held, key=lambda e: e.speedup or 0.0).node if held else None
    return Runoff(entries, winner)


def spread_err(speedups: Sequence[float], errs: Sequence[float | None]) -> float:
    """The relative standard error of the mean of ``speedups``: the rounds' own errors, or their spread between
    rounds where that is larger (what one evaluation's paired calls do not see)."""
    n = len(speedups)
    own = [e for e in errs if e is not None]
    within = math.sqrt(sum(e * e for e in own) / len(own)) / math.sqrt(n) if own else 0.0
    if n < 2:
        return within
    logs = [math.log(s) for s in speedups]
    m = sum(logs) / n
    between = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1)) / math.sqrt(n)
    return max(within, between)


def mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def runoff(tree: Tree, n: int, evaluate_all: Callable[[list[str]], list[EvalResult]]) -> Runoff | None:
    """Evaluate the tree's top ``n`` again side by side (``evaluate_all``: sources in, results in the same order,
    evaluated one after another in that order) and decide; None where there is nothing to choose between."""
    plan = sitting(tree, n)
    return plan.decide(evaluate_all(plan.sources)) if plan is not None else None
