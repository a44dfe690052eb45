"""Algorithm 1 end to end: scripted replies, real agents and parsers, real evaluation in worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_replies import BROKEN, SLOW, SLOWER, WRONG, code_reply, plan_reply, single_reply

from stark_ray.agents.base import TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.evaluator import Evaluator
from stark_ray.eval.tasks import load_task
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.records import AGENT_DEBUG, AGENT_PLAN_CODE, AGENT_SINGLE, STAGE_PARSE, EvalResult
from stark_ray.search.loop import search
from stark_ray.search.policy import make_policy
from stark_ray.search.team import make_team
from stark_ray.search.tree import Tree

pytestmark = pytest.mark.slow
TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "1_LeakyReluScale.py"


class Harness:
    """One evaluator and one reference measurement shared by the searches of this module."""

    def __init__(self, build_dir: Path) -> None:
        self.task = load_task(TASK)
        self.evaluator = Evaluator(self.task, EvalConfig(trials=2, warmup=1, timing_trials=3,
                                                         build_dir=str(build_dir)))
        self.reference = self.evaluator.reference()
        self.info = TaskInfo(self.task.name, self.task.source, "cpu_cpp", "test CPU")
        self.cache: dict[str, EvalResult] = {}

    def evaluate(self, source: str) -> EvalResult:
        # each distinct source is evaluated for real once; repeats reuse that observation
        if source not in self.cache:
            self.cache[source] = self.evaluator.evaluate(source)
        return self.cache[source]

    def run(self, client: ScriptedClient, cfg: SearchConfig) -> Tree:
        tree = Tree.with_reference(self.task.source, self.reference)
        policy = make_policy(cfg)
        team = make_team(client, AgentConfig(), cfg, self.info)
        search(tree, policy, team, self.evaluate, cfg.budget, cfg.seed)
        return tree


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    return Harness(tmp_path_factory.mktemp("build"))


def stark_client() -> ScriptedClient:
    codes = [code_reply(s) for s in (WRONG, SLOW, BROKEN, SLOWER, WRONG, SLOW)]
    return ScriptedClient({"plan": [plan_reply] * 8, "code": codes, "debug": [code_reply(SLOWER)] * 8})


def shape(tree: Tree) -> list[tuple[int, int | None, str, str]]:
    return [(n.id, n.parent, n.agent, n.result.stage) for n in tree]


def test_full_stark_search_grows_a_tree_with_all_three_agents(harness: Harness) -> None:
    client = stark_client()
    tree = harness.run(client, SearchConfig(budget=7, seed=3, epsilon=0.5))
    assert tree.evaluated == 7
    agents = {n.agent for n in tree if not n.is_root}
    assert agents == {AGENT_PLAN_CODE, AGENT_DEBUG}
    for n in tree:
        if n.agent == AGENT_DEBUG:
            assert not tree[n.parent].accepted  # the debug agent only ever repairs failures
    best = tree.best()
    assert best is not None and best.result.accepted and best.source in (SLOW, SLOWER)
    assert {n.result.stage for n in tree if not n.accepted} <= {"correctness", "runtime"}
    # feedback: once the root has children, the plan agent at the root sees them (D(i) of its window)
    root_plans = [r.messages[0].content for r in client.requests
                  if r.role == "plan" and "## Node 0 (selected, reference)" in r.messages[0].content]
    assert len(root_plans) >= 2 and "## Node 1 " in root_plans[-1]


def test_same_seed_and_replies_give_the_same_tree(harness: Harness) -> None:
    """Given the same observations (the harness evaluates each source once), the tree is the same."""
    cfg = SearchConfig(budget=7, seed=3, epsilon=0.5)
    first, second = harness.run(stark_client(), cfg), harness.run(stark_client(), cfg)
    assert shape(first) == shape(second)
    assert [n.source for n in first] == [n.source for n in second]


def test_search_agent_ablation_uses_the_single_agent(harness: Harness) -> None:
    client = ScriptedClient({"single": [single_reply(s) for s in (WRONG, SLOW, SLOWER, SLOW)]})
    tree = harness.run(client, SearchConfig(budget=4, seed=1, ablation="search_agent"))
    assert tree.evaluated == 4
    assert {n.agent for n in tree if not n.is_root} == {AGENT_SINGLE}
    assert {r.role for r in client.requests} == {"single"}
    assert "fuse the chain" in tree[1].instruction


def test_ma_only_ablation_samples_the_root_and_repairs_each_sample(harness: Harness) -> None:
    client = ScriptedClient({"plan": [plan_reply] * 6,
                             "code": [code_reply(s) for s in (WRONG, SLOW, BROKEN)],
                             "debug": [code_reply(WRONG), code_reply(SLOWER)]})
    tree = harness.run(client, SearchConfig(budget=5, ablation="ma_only"))
    # sample 1 wrong -> fix wrong -> fix ... chain of 2 fixes; then sample 2 (correct), sample 3 ...
    assert shape(tree)[1:] == [
        (1, 0, AGENT_PLAN_CODE, "correctness"),
        (2, 1, AGENT_DEBUG, "correctness"),
        (3, 2, AGENT_DEBUG, "ok"),
        (4, 0, AGENT_PLAN_CODE, "ok"),
        (5, 0, AGENT_PLAN_CODE, "runtime"),
    ]
    # no feedback between samples: the plan agent of a later sample sees no earlier sample
    later_plan = [r for r in client.requests if r.role == "plan"][-1].messages[0].content
    assert "## Node 0 (selected, reference)" in later_plan
    assert "## Node 1" not in later_plan and "## Node 4" not in later_plan


def test_a_model_that_stops_answering_costs_budget_but_never_stops_the_search(harness: Harness) -> None:
    client = ScriptedClient({"plan": [plan_reply], "code": [code_reply(SLOW)]})  # then LLMError forever
    tree = harness.run(client, SearchConfig(budget=4, seed=0))
    assert tree.evaluated == 4
    stages = [n.result.stage for n in tree if not n.is_root]
    assert stages[0] == "ok" and stages[1:] == [STAGE_PARSE] * 3
    assert all("no scripted reply" in (n.result.error or "") for n in tree if n.result.stage == STAGE_PARSE)
    assert tree.best() is not None and tree.best().id == 1


def test_a_search_stops_once_its_best_reaches_the_asked_share_of_the_speed_of_light(harness: Harness,
                                                                                    tmp_path: Path) -> None:
    """``--stop-at-sol``: real evaluations on this CPU give every accepted candidate its share of the task's speed
    of light; asked for a share any accepted one reaches, the search ends at its first accepted candidate, with
    budget left, and the task's summary says why."""
    from stark_ray.llm.usage import UsageTotals
    from stark_ray.run.directory import task_summary

    cfg = SearchConfig(budget=8, seed=0, stop_at_sol=0.0001)
    tree = Tree.with_reference(harness.task.source, harness.reference)
    client = stark_client()
    search(tree, make_policy(cfg), make_team(client, AgentConfig(), cfg, harness.info), harness.evaluate,
           cfg.budget, cfg.seed, stop_at_sol=cfg.stop_at_sol)
    accepted = [n for n in tree if n.accepted and not n.is_root]
    assert len(accepted) == 1 and tree.evaluated < cfg.budget  # nothing was tried after the first accepted one
    assert max(n.id for n in tree) == accepted[0].id and accepted[0].result.sol_fraction is not None
    summary = task_summary(harness.task, tree, tmp_path, "r", "finished", 1.0, cfg, AgentConfig(), EvalConfig(),
                           UsageTotals(), "local")
    assert summary.settings["stopped_by"].startswith("speed of light: the best candidate runs at")
    again = SearchConfig(budget=8, seed=0)  # off: the same search spends its budget
    assert "stopped_by" not in task_summary(harness.task, tree, tmp_path, "r", "finished", 1.0, again,
                                            AgentConfig(), EvalConfig(), UsageTotals(), "local").settings
