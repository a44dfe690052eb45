"""``--resume`` (stark_ray/run/resume.py): a finished run says so at once, --budget and --parallel continue the same
search (and are kept in run.json), any other setting is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest
import ray_replies
from scripted_replies import SLOW, code_reply, plan_reply
from search_helpers import StandInEvaluator

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import TaskError, load_task
from stark_ray.llm.base import LLMRequest
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.records import EvalResult
from stark_ray.run.directory import RunError
from stark_ray.run.local import optimize
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


class Gated(StandInEvaluator):
    """An evaluator for a resumed run whose reference answers only once the first agent call was made: a run that
    waits for the reference before its first call never gets one (the test's wait ends it)."""

    def __init__(self, asked: threading.Event, fails: bool = False) -> None:
        self.asked, self.fails, self.order = asked, fails, []

    def reference(self) -> EvalResult:
        assert self.asked.wait(120), "the resumed run waited for the reference before its first agent call"
        self.order.append("reference")
        if self.fails:
            raise TaskError("task 1_LeakyReluScale: its forward fails now")
        return super().reference()

    def evaluate(self, source: str) -> EvalResult:
        self.order.append("evaluate")
        return super().evaluate(source)


@pytest.mark.parametrize("fails", [False, True])
def test_a_resumed_local_run_asks_its_first_agent_before_the_reference_is_timed_again(tmp_path: Path,
                                                                                      fails: bool) -> None:
    """Resume to the first call took 57-69 s, 12 s of it the reference timed again before anything else: the prompts
    need only the recorded reference, so the first agent call runs beside it; the first evaluation waits for it,
    and a task that no longer serves still ends the run with its one line."""
    task = load_task(TASK)
    ready = threading.Event()
    ready.set()
    cfg = (AgentConfig(model="scripted"), EvalConfig(), tmp_path)
    optimize(task, ScriptedClient({"plan": [plan_reply], "code": [code_reply(SLOW)]}),
             SearchConfig(budget=1, seed=0, epsilon=0.0, runoff=0), *cfg,
             evaluator_factory=lambda t, c: Gated(ready))
    [run] = [d for d in tmp_path.iterdir() if d.is_dir()]
    asked = threading.Event()

    def plan(request: LLMRequest) -> str:
        asked.set()
        return plan_reply(request)

    gated = Gated(asked, fails)
    again = (task, ScriptedClient({"plan": [plan], "code": [code_reply(SLOW)]}),
             SearchConfig(budget=2, seed=0, epsilon=0.0, runoff=0), *cfg)
    if fails:
        with pytest.raises(TaskError, match="forward fails now"):
            optimize(*again, evaluator_factory=lambda t, c: gated, resume=run)
        assert gated.order == ["reference"]  # no candidate evaluated against a task that no longer serves
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["llm_calls"] == 4  # the calls made beside it are counted
        calls = duckdb.sql(f"SELECT node_id, role FROM '{run}/llm_calls/*/*.parquet' ORDER BY node_id, role").fetchall()
        assert calls == [(1, "code"), (1, "plan"), (2, "code"), (2, "plan")]  # and recorded, for the id they were for
        return
    summary = optimize(*again, evaluator_factory=lambda t, c: gated, resume=run)
    assert gated.order == ["reference", "evaluate"] and summary.attempts == 2
