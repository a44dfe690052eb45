"""The driver's mirror of the run keeps the live view's figures as nodes come; they equal a count over the trees."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stark_ray.agents.base import AgentResult
from stark_ray.records import AGENT_PLAN_CODE, STAGE_CORRECTNESS, STAGE_OK, EvalResult, Node
from stark_ray.run.mirror import RunMirror, status_from_scratch
from stark_ray.search.tree import Tree
from stark_ray.store.location import locate


def result(rng: random.Random) -> EvalResult:
    if rng.random() < 0.3:
        return EvalResult.failed(STAGE_CORRECTNESS, "wrong")
    speedup = rng.choice([0.5, 1.2, 2.0, 3.5])
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=1 / speedup, ref_runtime_ms=1.0, speedup=speedup,
                      stage=STAGE_OK)


@pytest.mark.parametrize("seed", range(3))
def test_the_live_figures_kept_as_nodes_come_equal_a_count_over_the_trees(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    names = [f"t{i}" for i in range(12)]
    budget = 6
    mirror = RunMirror(names)
    mirror.dir = locate(str(tmp_path))
    truth: dict[str, Tree] = {}
    for name in names:  # a resumed run: some trees come with recorded nodes
        tree = Tree.with_reference("ref", result(rng))
        for _ in range(rng.randrange(3)):
            tree.add(rng.choice(list(tree.nodes)), f"s{len(tree.nodes)}", AGENT_PLAN_CODE, result(rng))
        truth[name] = tree
        mirror.load(name, Tree.from_records(tree.to_records()))
    late: list[tuple[str, Node]] = []
    for _ in range(150):
        name = rng.choice(names)
        tree = truth[name]
        if tree.evaluated < budget + 2:
            node = tree.add(rng.choice(list(tree.nodes)), f"s{len(tree.nodes)}", AGENT_PLAN_CODE, result(rng))
            late.append((name, node))
        if late and rng.random() < 0.7:  # acknowledgements reach the driver late and out of order
            task, node = late.pop(rng.randrange(len(late)))
            mirror.attach(task, node, AgentResult(node.source))
        if rng.random() < 0.3:
            running = set(rng.sample(names, rng.randrange(4)))
            capped = set(rng.sample(names, rng.randrange(2)))
            status = mirror.status(running, budget, capped)
            assert {k: status[k] for k in ("done", "attempts", "accepted", "best")} == \
                status_from_scratch(mirror.trees, running, budget, capped)
            assert status["tasks"] == len(names) and status["running"] == len(running)
