"""`optimize` end to end: the run directory, its Parquet rows read back with DuckDB, and the offline demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from scripted_replies import SLOW, WRONG, code_reply, plan_reply

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.run.local import optimize
from stark_ray.search.tree import Tree

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_run_directory_holds_best_kernel_summary_and_parquet(tmp_path: Path) -> None:
    client = ScriptedClient({"plan": [plan_reply] * 3, "code": [code_reply(WRONG), code_reply(SLOW)]})
    summary = optimize(load_task(ROOT / "examples/tasks/1_LeakyReluScale.py"), client,
                       SearchConfig(budget=3, seed=0, epsilon=0.0), AgentConfig(model="scripted"),
                       EvalConfig(trials=2, warmup=1, timing_trials=3, build_dir=str(tmp_path / "build")),
                       tmp_path / "runs")
    run = Path(summary.run_dir)
    assert run.parent == tmp_path / "runs"
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["task"] == "1_LeakyReluScale" and on_disk["attempts"] == 3
    assert on_disk["status"] == "finished" and on_disk["cost"] == 0.0  # "scripted" has no price
    attempts = f"{run}/attempts/*/*.parquet"
    # what each attempt came to, beside any failure below (a loaded suite once left SLOW unaccepted, cause unknown)
    said = duckdb.sql(f"SELECT seq, stage, speedup, flags, left(error, 300), right(log, 600) FROM '{attempts}' "
                      "ORDER BY seq").fetchall()
    assert on_disk["success"] is True and on_disk["best_speedup"] == summary.best_speedup, said
    assert on_disk["tokens"]["input"] > 0 and on_disk["llm_calls"] == len(client.requests)
    assert (run / "best_kernel.py").read_text() == SLOW
    assert not list(run.rglob("*.tmp"))

    rows = duckdb.sql(f"SELECT seq, node_id, parent_id, agent, stage, passed_checks, speedup FROM '{attempts}' "
                      "ORDER BY seq").fetchall()
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert rows[0][3:6] == ("reference", "ok", True)
    # ε = 0: WRONG from the root, then SLOW from the root (still the best: SLOW sleeps); then no code is left
    assert [r[4] for r in rows[1:]] == ["correctness", "ok", "parse"]
    best = duckdb.sql(f"SELECT node_id, speedup FROM '{attempts}' WHERE passed_checks AND seq > 0 "
                      "ORDER BY runtime_ms LIMIT 1").fetchall()[0]
    assert best == (summary.best_node, summary.best_speedup)
    calls = duckdb.sql(f"SELECT role, count(*) FROM '{run}/llm_calls/*/*.parquet' GROUP BY role ORDER BY role")
    assert dict(calls.fetchall()) == {r: sum(1 for q in client.requests if q.role == r)
                                      for r in {q.role for q in client.requests}}
    # the rows rebuild the tree exactly
    records = duckdb.sql(f"SELECT * EXCLUDE (run_id, task, seq, recorded_at) FROM '{attempts}' "
                         "ORDER BY seq").to_arrow_table()
    tree = Tree.from_records(records.to_pylist())
    assert tree.to_records() == records.to_pylist()
    assert tree.best() is not None and tree.best().id == summary.best_node


def test_offline_demo_finds_a_correct_faster_kernel(tmp_path: Path, shared_build_dir: str) -> None:
    """The README's first command (after the install), as a user runs it; its builds get 15 minutes, not 5: beside
    the suite's other modules on a 2-core machine one took more than 300 s (a timeout where the cassette recorded a
    wrong result: the replay left the recorded path)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["COLUMNS"] = "160"
    proc = subprocess.run(
        [sys.executable, "-m", "stark_ray.cli", "optimize", "examples/tasks/2_FusedSwishScaleClamp.py",
         "--cassette", "examples/cassettes/2_FusedSwishScaleClamp.jsonl", "--budget", "5", "--seed", "5",
         "--out", str(tmp_path / "runs"), "--build-dir", shared_build_dir, "--compile-timeout", "900"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the replay followed the recorded path; where it did not, the message says where it left it and each verdict
    left = [line for line in (proc.stdout + proc.stderr).splitlines() if "differs from the recorded one" in line
            or line.lstrip().startswith("[")]
    assert "the cassette does not hold" not in proc.stdout + proc.stderr, "\n".join(left)
    [run] = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["attempts"] == 5 and summary["best_speedup"] > 0, summary  # how much faster: a figure
    rows = duckdb.sql(f"SELECT agent, speedup FROM '{run}/attempts/*/*.parquet' ORDER BY seq").fetchall()
    # the recorded path whatever the machine's timings (seed 5 explores where a greedy step would follow them)
    assert summary["success"] is True and summary["replay_mismatches"] == 0, summary
    # a candidate the judge's wall clock did not confirm on a loaded host is flagged `suspicious`: a failure at stage
    # "ok" (seen under a loaded CI run); the recorded path's own failures are these two
    assert {k: v for k, v in summary["failures_by_stage"].items() if k != "ok"} == {"compile": 1, "correctness": 1}
    assert [a for (a, _) in rows] == ["reference", "plan+code", "debug", "plan+code", "plan+code", "debug"]
    assert "std::exp(" in (run / "best_kernel.py").read_text()
