"""The two executors are two placements of one search: the same seeded scripted search run in-process (the local
executor) and on Ray gives the same tree, the same rows and the same run directory, file for file; a local run
resumes like a Ray one, and the ``runs`` view reads both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray_replies

from stark_ray.actors.tree_memory import SPECS_FILE
from stark_ray.analysis.views import connect
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.run.local import optimize
from stark_ray.run.ray_driver import RayRun, run_ray
from stark_ray.run.resume import resumed
from stark_ray.search.tree import Tree
from stark_ray.store.read import attempt_rows, call_rows, load_trees

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "1_LeakyReluScale.py"
NAME = "1_LeakyReluScale"
# what differs between two runs of one search: where and when, and what was measured (times, their spread, a
# candidate's peak memory, the log that reports them, and the prompts' tokens: prompts show the runtimes);
# everything else in a row is the search's own doing
MEASURED = {"run_id", "recorded_at", "runtime_ms", "ref_runtime_ms", "speedup", "speedup_err", "compile_s", "eval_s",
            "ref_compile_runtime_ms", "runtime_cv", "ref_runtime_cv", "peak_memory_gb", "sol_ms", "sol_bound",
            "sol_fraction", "log", "latency_s", "notes",  # the judge's notes: whether it timed again follows the noise
            "input_tokens", "cost_usd"}


def eval_cfg(build_dir: str) -> EvalConfig:
    return EvalConfig(trials=2, warmup=1, timing_trials=3, build_dir=build_dir)


def shape(tree: Tree) -> list[tuple[int, int | None, str, str, str]]:
    """What the search decided and what came of it: (node, parent, agent, source, stage) for every node."""
    return [(n.id, n.parent, n.agent, n.source, n.result.stage) for n in sorted(tree, key=lambda n: n.id)]


def files(run_dir: Path) -> list[str]:
    """The run directory's files, part files named by their table and task only (how many there are depends on
    when rows were flushed)."""
    return sorted({str(p.relative_to(run_dir).parent / "part") if p.suffix == ".parquet" else
                  str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()})


def unmeasured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in r.items() if k not in MEASURED} for r in rows),
                  key=lambda r: (r["seq"], str(r.get("role"))))


def test_the_local_and_the_ray_executor_make_the_same_run(ray_cluster: str, tmp_path: Path,
                                                          shared_build_dir: str) -> None:
    # ε = 1 (always a uniformly drawn expandable leaf): the decisions depend on the seed, the tree and which
    # candidates are correct, not on timing noise between two equally fast candidates
    search = SearchConfig(budget=6, seed=0, epsilon=1.0)
    task = load_task(TASK)
    [on_ray] = run_ray(RayRun([task], search, AgentConfig(), eval_cfg(shared_build_dir), tmp_path / "runs",
                              client_factory=ray_replies.client))
    local = optimize(task, ray_replies.client(), search, AgentConfig(), eval_cfg(shared_build_dir),
                     tmp_path / "runs")
    ray_dir, local_dir = Path(on_ray.run_dir), Path(local.run_dir)
    assert on_ray.status == local.status == "finished" and on_ray.attempts == local.attempts == 6

    # alike but for what the memory actor is made from (Ray's placement: read again when the actor restarts)
    assert [f for f in files(ray_dir) if f != SPECS_FILE] == files(local_dir)
    assert {"run.json", "summary.json", "best_kernel.py"} <= set(files(local_dir))
    ray_record, local_record = (json.loads((d / "run.json").read_text()) for d in (ray_dir, local_dir))
    assert (ray_record.pop("executor"), local_record.pop("executor")) == ("ray", "local")
    assert ray_record == local_record

    ray_tree, local_tree = load_trees(ray_dir)[NAME], load_trees(local_dir)[NAME]
    assert len(local_tree) == 7 and shape(local_tree) == shape(ray_tree)
    assert unmeasured(attempt_rows(local_dir)) == unmeasured(attempt_rows(ray_dir))
    assert unmeasured(call_rows(local_dir, NAME)) == unmeasured(call_rows(ray_dir, NAME))
    assert len(call_rows(local_dir, NAME)) == local.llm_calls > 0

    ray_summary, local_summary = (json.loads((d / "summary.json").read_text()) for d in (ray_dir, local_dir))
    assert set(ray_summary) == set(local_summary)
    assert (ray_summary["settings"].pop("executor"), local_summary["settings"].pop("executor")) == ("ray", "local")
    same = ("task", "status", "attempts", "budget", "success", "failures", "failures_by_stage", "llm_calls",
            "settings", "replay_mismatches")
    assert {k: ray_summary[k] for k in same} == {k: local_summary[k] for k in same}
    assert ray_summary["tokens"]["output"] == local_summary["tokens"]["output"] > 0
    # both held the runoff of the same contenders (search/runoff.py) and wrote the node it named as the best kernel
    accepted = len(local_tree.leaderboard())
    assert accepted >= 2  # the scripted search accepts several: the runoff is exercised on both executors
    for summary, run_dir, tree in ((ray_summary, ray_dir, ray_tree), (local_summary, local_dir, local_tree)):
        held = summary["runoff"]
        assert held is not None and held["error"] is None, held
        assert len(held["entries"]) == min(3, accepted)
        assert all(len(e["speedups"]) == held["rounds"] for e in held["entries"] if e["out"] is None), held
        assert held["winner"] == summary["best_node"]
        assert (run_dir / "best_kernel.py").read_text() == tree.nodes[summary["best_node"]].source

    con = connect(tmp_path / "runs")  # both run directories, as `stark sql` reads them
    try:
        runs = con.execute("SELECT executor, provider, backend, policy, budget, tasks FROM runs "
                           "ORDER BY executor").fetchall()
    finally:
        con.close()
    assert runs == [("local", "openai", "cpu_cpp", "epsilon_greedy", 6, 1),
                    ("ray", "openai", "cpu_cpp", "epsilon_greedy", 6, 1)]


def test_a_local_run_resumes_to_the_tree_of_the_uninterrupted_run(tmp_path: Path, shared_build_dir: str) -> None:
    """A local run stopped at 3 attempts and resumed to 6 (with either executor, from its run.json) grows the tree
    that one run of 6 grows; what its earlier calls cost stays counted."""
    task = load_task(TASK)
    cfg = eval_cfg(shared_build_dir)
    # no runoff: the trees are the point (the runoff is the same-run test's)
    whole = optimize(task, ray_replies.client(), SearchConfig(budget=6, seed=2, epsilon=1.0, runoff=0), AgentConfig(),
                     cfg, tmp_path / "whole")
    first = optimize(task, ray_replies.client(), SearchConfig(budget=3, seed=2, epsilon=1.0, runoff=0), AgentConfig(),
                     cfg, tmp_path / "parts")
    run_dir = Path(first.run_dir)
    assert first.attempts == 3 and resumed(run_dir).finished and resumed(run_dir).executor == "local"
    again = resumed(run_dir, budget=6)
    assert not again.finished
    done = optimize(task, ray_replies.client(), again.search, again.agents, again.eval, run_dir.parent,
                    resume=run_dir)
    assert done.run_dir == str(run_dir) and done.attempts == 6 and done.status == "finished"
    assert shape(load_trees(run_dir)[NAME]) == shape(load_trees(Path(whole.run_dir))[NAME])
    assert done.llm_calls == whole.llm_calls and len(call_rows(run_dir, NAME)) == whole.llm_calls
    assert json.loads((run_dir / "run.json").read_text())["search"]["budget"] == 6
    assert resumed(run_dir).finished
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}  # nothing is started, nothing called
    said = subprocess.run([sys.executable, "-m", "stark_ray.cli", "optimize", "--resume", str(run_dir)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert said.returncode == 0 and "finished, 1 task(s), 6 of 6 attempts recorded" in said.stdout, said.stderr
