"""One task, optimized in-process: the local executor behind ``stark optimize``.

It wires the core together — task, evaluator, LLM client, tree, policy, team — runs Algorithm 1, streams
every attempt and LLM call to Parquet, and writes ``best_kernel.py`` and ``summary.json``.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.evaluator import make_evaluator
from stark_ray.eval.tasks import Task
from stark_ray.llm.base import LLMClient
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import Node, attempt_schema, llm_call_schema
from stark_ray.search.loop import search
from stark_ray.search.policy import make_policy
from stark_ray.search.team import make_team
from stark_ray.search.tree import Tree
from stark_ray.store.parquet import PartWriter, safe_name


@dataclass
class RunSummary:
    task: str
    run_id: str
    run_dir: str
    attempts: int
    budget: int
    best_correct: bool
    best_speedup: float | None
    best_node: int | None
    best_runtime_ms: float | None
    ref_runtime_ms: float | None
    failures: int
    failures_by_stage: dict[str, int]
    tokens: dict[str, int]
    cost_usd: float
    llm_calls: int
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)


class Reporter:
    """What the CLI shows while a run goes on; the default shows nothing."""

    def start(self, task: Task, budget: int, reference: Node) -> None: ...
    def attempt(self, node: Node, step: AgentResult, tree: Tree, usage: UsageTotals) -> None: ...
    def finish(self, summary: RunSummary) -> None: ...


def new_run_dir(out: Path, task_name: str) -> tuple[str, Path]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_id = f"{safe_name(task_name)}-{stamp}"
    run_dir, n = out / run_id, 1
    while run_dir.exists():
        n += 1
        run_dir = out / f"{run_id}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir.name, run_dir


def optimize(task: Task, client: LLMClient, search_cfg: SearchConfig, agent_cfg: AgentConfig,
             eval_cfg: EvalConfig, out: Path, reporter: Reporter | None = None,
             evaluator_factory: Callable[[Task, EvalConfig], Any] = make_evaluator) -> RunSummary:
    """Run STARK on one task. Raises TaskError when the reference itself cannot be evaluated."""
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    evaluator = evaluator_factory(task, eval_cfg)
    try:
        reference = evaluator.reference()  # validates the task: TaskError when its forward fails
        run_id, run_dir = new_run_dir(out, task.name)
        attempts = PartWriter(run_dir, "attempts", task.name, attempt_schema(), flush_rows=1)
        calls = PartWriter(run_dir, "llm_calls", task.name, llm_call_schema(), flush_rows=8)
        usage = UsageTotals()
        tree = Tree.with_reference(task.source, reference)
        common = {"run_id": run_id, "task": task.name}
        attempts.append({**common, "seq": 0, **tree.root.to_record()})
        reporter.start(task, search_cfg.budget, tree.root)

        def on_attempt(node: Node, step: AgentResult) -> None:
            attempts.append({**common, "seq": node.id, **node.to_record()})
            for u in step.usage:
                u.node_id = node.id
                usage.add(u)
                calls.append({**common, "seq": node.id, **u.to_record()})
            reporter.attempt(node, step, tree, usage)

        info = TaskInfo(name=task.name, reference_source=task.source, backend=eval_cfg.backend,
                        hardware=evaluator.hardware_description())
        policy = make_policy(search_cfg.policy, search_cfg.ablation, search_cfg.epsilon, search_cfg.n_root,
                             search_cfg.n_child, search_cfg.max_debug_chain, search_cfg.k)
        team = make_team(client, agent_cfg, search_cfg, info)
        try:
            best = search(tree, policy, team, evaluator.evaluate, search_cfg.budget,
                          random.Random(search_cfg.seed), on_attempt)
        finally:
            attempts.close()
            calls.close()
    finally:
        evaluator.close()

    if best is not None:
        (run_dir / "best_kernel.py").write_text(best.source)
    summary = RunSummary(
        task=task.name, run_id=run_id, run_dir=str(run_dir), attempts=tree.evaluated, budget=search_cfg.budget,
        best_correct=best is not None, best_speedup=best.result.speedup if best else None,
        best_node=best.id if best else None, best_runtime_ms=best.result.runtime_ms if best else None,
        ref_runtime_ms=reference.runtime_ms, failures=tree.failures(),
        failures_by_stage=dict(Counter(n.result.stage for n in tree if not n.is_root and not n.correct)),
        tokens={"input": usage.input_tokens, "output": usage.output_tokens},
        cost_usd=round(usage.cost_usd, 6), llm_calls=usage.calls, wall_s=round(time.monotonic() - t0, 2),
        settings={"search": asdict(search_cfg), "agents": _public(asdict(agent_cfg)), "eval": asdict(eval_cfg)},
    )
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    reporter.finish(summary)
    return summary


def _public(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "prices" or v}
