"""What a run says of each task when it ends (``summary.json``), alike whichever executor ran it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stark_ray.llm.usage import UsageTotals
from stark_ray.records import STAGE_PARSE
from stark_ray.search.runoff import Runoff
from stark_ray.search.tree import Tree

STATUS_FINISHED, STATUS_INTERRUPTED, STATUS_FAILED = "finished", "interrupted", "failed"


@dataclass
class RunSummary:
    task: str
    run_id: str
    run_dir: str
    status: str  # finished | interrupted | failed
    attempts: int
    budget: int
    success: bool  # an accepted candidate exists (the best one below)
    best_speedup: float | None
    best_node: int | None
    best_runtime_ms: float | None
    best_ref_runtime_ms: float | None  # the reference as timed beside the best candidate
    best_speedup_err: float | None  # its relative standard error (eval/measure/noise.py), where known
    ref_runtime_ms: float | None  # the reference timed alone, at the start
    failures: int
    failures_by_stage: dict[str, int]
    tokens: dict[str, int]
    cost: float  # USD
    llm_calls: int
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    replay_mismatches: int = 0  # replayed calls whose prompt the cassette did not hold (each served in order)
    # how close the best candidate comes to the speed of light (eval/judge/sol.py)
    best_sol_fraction: float | None = None
    models: list[str] = field(default_factory=list)  # the models that answered (a replay: the cassette's)
    # the top candidates evaluated again side by side before the best was named (search/runoff.py): rounds, the node
    # named, each contender's figures; the best_* fields above are then the runoff's figures of the node it named
    runoff: dict[str, Any] | None = None
    best_search_speedup: float | None = None  # the named node's speedup as the search measured it

    @property
    def nothing_evaluated(self) -> bool:
        """Attempts were made and not one of them produced a candidate to evaluate (every LLM call failed, or no
        reply held code): a run that exits non-zero."""
        return self.attempts > 0 and self.failures_by_stage.get(STAGE_PARSE, 0) == self.attempts


def summary_of(task: str, run_id: str, run_dir: str, tree: Tree, status: str, budget: int, usage: UsageTotals,
               settings: dict[str, Any], wall_s: float, runoff: Runoff | None = None) -> RunSummary:
    """A task's summary from its tree and what its LLM calls cost (either executor); with a ``runoff``, the node it
    named and its figures (none held: the search's best, as measured by the search)."""
    best = tree.best()
    entry = None
    if runoff is not None and runoff.winner is not None:
        best = tree.nodes[runoff.winner]
        entry = next(e for e in runoff.entries if e.node == runoff.winner)
    summary = RunSummary(
        task=task, run_id=run_id, run_dir=run_dir, status=status, attempts=tree.evaluated,
        budget=budget, success=best is not None,
        best_speedup=best.result.speedup if best else None, best_node=best.id if best else None,
        best_runtime_ms=best.result.runtime_ms if best else None,
        best_ref_runtime_ms=best.result.ref_runtime_ms if best else None,
        best_speedup_err=best.result.speedup_err if best else None,
        ref_runtime_ms=tree.root.result.runtime_ms, failures=tree.failures(),
        failures_by_stage=dict(Counter(n.result.stage for n in tree if not n.is_root and not n.accepted)),
        tokens={"input": usage.input_tokens, "output": usage.output_tokens}, cost=round(usage.cost_usd, 6),
        llm_calls=usage.calls, wall_s=round(wall_s, 2), settings=settings,
        replay_mismatches=usage.replay_mismatches, best_sol_fraction=best.result.sol_fraction if best else None,
        models=usage.models, runoff=runoff.to_record() if runoff is not None else None,
        best_search_speedup=best.result.speedup if best else None,
    )
    if entry is not None:  # the runoff's figures: all taken in one sitting, the reference timed beside each
        summary.best_speedup, summary.best_speedup_err = entry.speedup, entry.speedup_err
        summary.best_runtime_ms, summary.best_ref_runtime_ms = entry.runtime_ms, entry.ref_runtime_ms
        sol_ms = best.result.sol_ms if best is not None else None
        summary.best_sol_fraction = (round(sol_ms / entry.runtime_ms, 4) if sol_ms and entry.runtime_ms else None)
    return summary
