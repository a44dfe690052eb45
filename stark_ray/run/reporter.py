"""What a run tells the one who watches it (the CLI's live view), whichever executor runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stark_ray.agents.base import AgentResult
from stark_ray.eval.tasks import Task
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import Node
from stark_ray.run.summary import RunSummary
from stark_ray.search.tree import Tree

AGENT_WORDS = {"plan+code": "plan and code agents", "debug": "debug agent", "single": "agent"}  # the live view's


class Reporter:
    """What the CLI shows while a run goes on; the default shows nothing."""

    def phase(self, what: str) -> None:
        """What the run is doing before its search begins (starting Ray, the evaluators, timing references):
        these take tens of seconds."""

    def start(self, task: Task, budget: int, tree: Tree) -> None:
        """A task's search begins: its tree as it stands (the reference only, or a resumed run's attempts)."""
    def attempt(self, node: Node, step: AgentResult, tree: Tree, usage: UsageTotals) -> None: ...
    def finish(self, summary: RunSummary) -> None: ...
    def status(self, stats: dict[str, Any]) -> None:
        """A campaign's figures now (tasks, attempts, spend, evaluators busy): called a few times a second."""

    shows_expansions = False  # True: the driver tells :meth:`expansions` what each expansion in flight is doing

    def expansions(self, doing: list[InFlight]) -> None:
        """The expansions in flight and what each is going through (called about once a second)."""

    def close(self) -> None:
        """The run is over, however it ended: whatever the view keeps on screen is ended (the CLI calls it)."""


@dataclass(frozen=True)
class InFlight:
    """One expansion in flight, as the live view shows it."""

    task: str
    parent: int  # the node it expands
    doing: str  # "plan and code agents", "debug agent", "waiting for an evaluator", "building", "timing", ...
    seconds: float  # in that step so far

    def describe(self, with_task: bool = False) -> str:
        where = f"{self.task}: " if with_task else ""
        return f"{where}from node {self.parent}: {self.doing} {self.seconds:.0f} s"
