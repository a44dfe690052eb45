"""The runoff (search/runoff.py): the top accepted candidates evaluated again side by side, in mirrored order, before
the best is named; the summary and best_kernel.py name the runoff's winner; the budget does not count it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest
from scripted_replies import SLOW, code_reply, plan_reply
from search_helpers import StandInEvaluator

from stark_ray.analysis.views import connect
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, EvalResult, Node
from stark_ray.run.local import optimize
from stark_ray.run.summary import summary_of
from stark_ray.search.runoff import ROUNDS, Runoff, contenders, mirrored, runoff, sitting
from stark_ray.search.tree import Tree

ROOT = Path(__file__).resolve().parents[1]
SLOWEST = SLOW.replace("time.sleep(0.03)", "time.sleep(0.3)")


def ok(speedup: float, err: float = 0.01) -> EvalResult:
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0 / speedup, ref_runtime_ms=1.0,
                      speedup=speedup, stage=STAGE_OK, speedup_err=err)


def tree_of(*speedups: float) -> Tree:
    """The reference and one accepted child of it per speedup, node i+1 with source 'k<i+1>'."""
    tree = Tree.with_reference("ref", ok(1.0))
    for i, s in enumerate(speedups, start=1):
        tree.attach(Node(id=i, parent=0, depth=1, source=f"k{i}", result=ok(s), agent="code"))
    return tree


def test_the_order_is_mirrored_so_a_drift_weighs_on_each_alike() -> None:
    assert mirrored(3) == [0, 1, 2, 2, 1, 0]
    assert mirrored(2, rounds=3) == [0, 1, 1, 0, 0, 1]


def test_fewer_than_two_accepted_or_runoff_off_is_no_runoff() -> None:
    assert contenders(tree_of(1.5), 3) == []
    assert contenders(tree_of(1.5, 1.2), 0) == []
    assert sitting(tree_of(1.5, 1.2, 1.1, 1.0), 0) is None
    assert [n.id for n in contenders(tree_of(1.5, 1.2, 1.9, 1.1), 3)] == [3, 1, 2]
    with pytest.raises(ValueError, match="runoff"):
        SearchConfig(runoff=1)


def test_the_runoff_names_the_best_by_its_own_figures_and_drops_what_did_not_hold() -> None:
    tree = tree_of(2.0, 1.8, 1.7)  # the search ranked node 1 first (its 2.0x the highest of noisy figures)
    asked: list[list[str]] = []

    def evaluate_all(sources: list[str]) -> list[EvalResult]:
        asked.append(sources)
        figures = {"k1": [1.5, 1.6], "k2": [1.9, 1.7], "k3": [1.8, None]}  # k3 fails its second round
        seen: dict[str, int] = {}
        out = []
        for s in sources:
            i = seen.get(s, 0)
            seen[s] = i + 1
            f = figures[s][i]
            out.append(ok(f) if f is not None else EvalResult.failed(STAGE_CORRECTNESS, "output 0 differs"))
        return out

    final = runoff(tree, 3, evaluate_all)
    assert asked == [["k1", "k2", "k3", "k3", "k2", "k1"]]
    assert final is not None and final.winner == 2 and final.reordered
    by_node = {e.node: e for e in final.entries}
    assert by_node[1].speedups == [1.5, 1.6] and by_node[1].search_speedup == 2.0
    assert math.isclose(by_node[2].speedup or 0, math.sqrt(1.9 * 1.7))
    assert by_node[3].speedup is None and by_node[3].out == "correctness: output 0 differs"
    # the spread between rounds widens the error beyond the rounds' own 1%
    assert (by_node[2].speedup_err or 0) > 0.04
    assert "node 2 named best" in final.line()

    summary = summary_of("t", "r", "/tmp/r", tree, "finished", 3, UsageTotals(), {}, 1.0, final)
    assert summary.best_node == 2 and summary.best_speedup == by_node[2].speedup
    assert summary.best_search_speedup == 1.8 and summary.runoff == final.to_record()
    assert Runoff.from_record(json.loads(json.dumps(summary.runoff))) == final


def test_none_held_or_not_held_leaves_the_search_best_standing() -> None:
    tree = tree_of(2.0, 1.8)
    final = runoff(tree, 3, lambda sources: [EvalResult.failed(STAGE_CORRECTNESS, "differs") for _ in sources])
    assert final is not None and final.winner is None and "search's best stands" in final.line()
    summary = summary_of("t", "r", "/tmp/r", tree, "finished", 3, UsageTotals(), {}, 1.0, final)
    assert summary.best_node == 1 and summary.best_speedup == 2.0
    lost = Runoff([], None, "its evaluator failed: actor died")
    assert "not held" in lost.line()
    assert summary_of("t", "r", "/tmp/r", tree, "finished", 3, UsageTotals(), {}, 1.0, lost).best_node == 1


@pytest.mark.slow
def test_a_local_run_holds_a_runoff_on_the_real_evaluator(tmp_path: Path, shared_build_dir: str) -> None:
    """Two accepted candidates of very different speed (SLOW sleeps 30 ms a call, SLOWEST 300 ms: on a loaded
    2-core box 30 and 80 ms swapped ranks in one sitting), the slower one first: the runoff evaluates both twice more,
    names SLOW and writes it as the best kernel; the attempts table holds the search's attempts only."""
    client = ScriptedClient({"plan": [plan_reply] * 4, "code": [code_reply(SLOWEST), code_reply(SLOW)]})
    summary = optimize(load_task(ROOT / "examples/tasks/1_LeakyReluScale.py"), client,
                       SearchConfig(budget=2, seed=0, epsilon=0.0, runoff=3), AgentConfig(model="scripted"),
                       EvalConfig(trials=2, warmup=1, timing_trials=3, build_dir=shared_build_dir), tmp_path / "runs")
    run = Path(summary.run_dir)
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["attempts"] == 2 and on_disk["runoff"] is not None, on_disk
    entries = {e["node"]: e for e in on_disk["runoff"]["entries"]}
    assert set(entries) == {1, 2} and on_disk["runoff"]["rounds"] == ROUNDS
    assert all(len(e["speedups"]) == ROUNDS and e["out"] is None for e in entries.values()), entries
    winner = on_disk["runoff"]["winner"]
    assert (run / "best_kernel.py").read_text() == SLOW and on_disk["best_node"] == winner, json.dumps(on_disk)
    assert on_disk["best_speedup"] == entries[winner]["speedup"] > entries[3 - winner]["speedup"]
    rows = duckdb.sql(f"SELECT count(*) FROM '{run}/attempts/*/*.parquet'").fetchall()[0]
    assert rows == (3,)  # the reference and the two attempts: the runoff's evaluations are not rows
    con = connect(tmp_path / "runs")
    try:
        named = con.execute("SELECT runoff_node_id, runoff_speedup FROM tasks").fetchall()
    finally:
        con.close()
    assert named == [(winner, on_disk["best_speedup"])]


class StandIn(StandInEvaluator):
    """An evaluator whose every candidate is accepted at a speedup of its source's length, and which fails (as an
    evaluator of the machine fails) from its ``fail_after``-th evaluation on: a runoff that meets it."""

    def __init__(self, task: object, cfg: object, fail_after: int = 2, interrupt: bool = False) -> None:
        self.calls, self.fail_after, self.interrupt = 0, fail_after, interrupt

    def reference(self) -> EvalResult:
        return ok(1.0)

    def evaluate(self, source: str) -> EvalResult:
        self.calls += 1
        if self.calls > self.fail_after:
            if self.interrupt:
                raise KeyboardInterrupt
            raise RuntimeError("the evaluator's worker could not start")
        return ok(1.0 + len(source) % 7 / 10)


@pytest.mark.parametrize("interrupt", [False, True])
def test_a_runoff_the_evaluator_fails_or_ctrl_c_stops_leaves_the_search_finished_and_said(
        tmp_path: Path, interrupt: bool) -> None:
    client = ScriptedClient({"plan": [plan_reply] * 4, "code": [code_reply(SLOWEST), code_reply(SLOW)]})
    factory = lambda task, cfg: StandIn(task, cfg, interrupt=interrupt)  # noqa: E731
    args = (load_task(ROOT / "examples/tasks/1_LeakyReluScale.py"), client,
            SearchConfig(budget=2, seed=0, epsilon=0.0), AgentConfig(model="scripted"), EvalConfig(), tmp_path)
    if interrupt:
        with pytest.raises(KeyboardInterrupt):
            optimize(*args, evaluator_factory=factory)
    else:
        optimize(*args, evaluator_factory=factory)
    [run] = [d for d in tmp_path.iterdir() if d.is_dir()]
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["status"] == "finished" and on_disk["attempts"] == 2
    said = on_disk["runoff"]["error"]
    assert said == ("interrupted (Ctrl-C)" if interrupt else
                    "the evaluator failed: RuntimeError: the evaluator's worker could not start"), said
    assert on_disk["best_node"] is not None and (run / "best_kernel.py").exists()  # the search's best stands


def test_an_evaluator_that_fails_mid_search_leaves_the_steps_calls_recorded(tmp_path: Path) -> None:
    """The machine's failure during an evaluation gives no verdict, but the step's LLM calls were made: recorded and
    counted, for the attempt they were for (a resume redoes the attempt)."""
    client = ScriptedClient({"plan": [plan_reply], "code": [code_reply(SLOW)]})
    with pytest.raises(RuntimeError, match="could not start"):
        optimize(load_task(ROOT / "examples/tasks/1_LeakyReluScale.py"), client,
                 SearchConfig(budget=2, seed=0, epsilon=0.0), AgentConfig(model="scripted"), EvalConfig(), tmp_path,
                 evaluator_factory=lambda task, cfg: StandIn(task, cfg, fail_after=0))
    [run] = [d for d in tmp_path.iterdir() if d.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["attempts"] == 0 and summary["llm_calls"] == 2
    calls = duckdb.sql(f"SELECT node_id, role FROM '{run}/llm_calls/*/*.parquet' ORDER BY role").fetchall()
    assert calls == [(1, "code"), (1, "plan")]
