"""``--resume`` (stark_ray/run/resume.py): a finished run says so at once, --budget and --parallel continue the same
search (and are kept in run.json), any other setting is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray_replies

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.run.directory import RunError
from stark_ray.run.ray_driver import RayRun, run_ray
from stark_ray.run.resume import resumed
from stark_ray.store.read import load_trees

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "1_LeakyReluScale.py"


def stark(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.run([sys.executable, "-m", "stark_ray.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_resume_continues_the_same_search_further_and_refuses_other_changes(
        ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import orchestration

    run = RayRun([load_task(TASK)], SearchConfig(budget=3, seed=1), AgentConfig(), EvalConfig(), tmp_path,
                 run_id="done", client_factory=orchestration.scripted_client,
                 evaluator_cls=ray_replies.paced_evaluator_cls())
    [summary] = run_ray(run)
    run_dir = tmp_path / "done"
    assert summary.status == "finished" and summary.attempts == 3

    finished = stark("optimize", "--resume", str(run_dir))  # no key is set: nothing is started, nothing called
    assert finished.returncode == 0, finished.stderr
    assert "finished, 1 task(s), 3 of 3 attempts recorded" in finished.stdout
    assert not finished.stderr

    for args, said in ((["--seed", "3"], "--seed cannot change"),
                       (["--model", "o3", "--epsilon", "0.5"], "--model, --epsilon cannot change"),
                       ([str(TASK)], "TASK cannot change"),
                       (["--budget", "2"], "--budget 2 is below the 3 attempts already recorded"),
                       (["--parallel", "0"], "parallel")):
        proc = stark("optimize", "--resume", str(run_dir), *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and said in lines[0], (args, proc.stderr)
    proc = stark("campaign", "--resume", str(run_dir), "--backend", "cuda")
    assert proc.returncode == 2 and "--backend cannot change" in proc.stderr, proc.stderr

    again = resumed(run_dir, budget=6, parallel=2)  # what the CLI builds for --budget 6 --parallel 2
    assert not again.finished and (again.search.budget, again.search.parallel, again.search.seed) == (6, 2, 1)
    [summary] = run_ray(RayRun(again.tasks, again.search, again.agents, again.eval, tmp_path, resume=run_dir,
                               client_factory=orchestration.scripted_client,
                               evaluator_cls=ray_replies.paced_evaluator_cls()))
    assert summary.attempts == 6 and load_trees(run_dir)["1_LeakyReluScale"].evaluated == 6
    recorded = json.loads((run_dir / "run.json").read_text())["search"]
    assert (recorded["budget"], recorded["parallel"]) == (6, 2)  # the next resume continues from there
    assert resumed(run_dir).finished
    with pytest.raises(RunError, match="below the 6 attempts"):
        resumed(run_dir, budget=5)
