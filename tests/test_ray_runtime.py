"""The Ray runtime on a real local Ray cluster: TreeMemory actor, stateless agent tasks, Evaluator actor, Parquet
rows — end to end with scripted replies (plain-torch candidates, the cpu_cpp backend), and surviving the death
of each of its parts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray
import ray_replies

from stark_ray.actors.evaluator import EvaluatorActor
from stark_ray.agents.base import TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.records import STAGE_CRASH
from stark_ray.run.ray_driver import RayRun, run_ray
from stark_ray.search.memory import make_task_search
from stark_ray.search.tree import Tree
from stark_ray.store.read import attempt_rows, load_trees

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "1_LeakyReluScale.py"
WORKER_PATH = os.pathsep.join([str(REPO), str(REPO / "tests")])  # Ray workers import the scripted replies


def eval_cfg(build_dir: str) -> EvalConfig:
    return EvalConfig(trials=2, warmup=1, timing_trials=3, build_dir=build_dir)


def ray_run(tmp_path: Path, build_dir: str, budget: int = 6, parallel: int = 1, isolate: str | None = None,
            **kw: Any) -> RayRun:
    cfg = eval_cfg(build_dir) if isolate is None else replace(eval_cfg(build_dir), isolate=isolate)
    return RayRun([load_task(TASK)], SearchConfig(budget=budget, seed=0, parallel=parallel), AgentConfig(),
                  cfg, tmp_path / "runs", client_factory=kw.pop("client_factory", ray_replies.client), **kw)


def shape(tree: Tree) -> list[tuple[int, int | None, str, str]]:
    """What the search decided: (node, parent, agent, source) for every node."""
    return [(n.id, n.parent, n.agent, n.source) for n in sorted(tree, key=lambda n: n.id)]


def rows_by_seq(run_dir: Path) -> dict[int, dict[str, Any]]:
    rows = attempt_rows(run_dir)
    seqs = [r["seq"] for r in rows]
    assert len(seqs) == len(set(seqs)), f"a node was written twice: {sorted(seqs)}"
    return {r["seq"]: r for r in rows}


def test_the_live_view_hears_what_each_expansion_in_flight_is_doing(ray_cluster: str, tmp_path: Path,
                                                                    shared_build_dir: str) -> None:
    """The live view said nothing of an expansion between its start and its row (an LLM call, a 5-minute build,
    timing): the driver tells it each one's step, the evaluation's as its evaluator says."""
    from stark_ray.run.reporter import InFlight, Reporter

    class Heard(Reporter):
        shows_expansions = True

        def __init__(self) -> None:
            self.heard: list[InFlight] = []

        def expansions(self, doing: list[InFlight]) -> None:
            self.heard += doing

    heard = Heard()
    [summary] = run_ray(ray_run(tmp_path, shared_build_dir, budget=1, client_factory=ray_replies.sleepy_client),
                        heard)
    assert summary.attempts == 1
    steps = {d.doing for d in heard.heard}
    known = {"plan and code agents", "debug agent", "waiting for an evaluator", "evaluating", "building",
             "waiting for the device", "loading the task", "importing", "checking", "timing"}
    assert steps <= known and steps & {"checking", "timing"}, steps  # each forward sleeps 0.6 s: seen checking
    assert all(d.task == "1_LeakyReluScale" and d.parent >= 0 and d.seconds >= 0 for d in heard.heard)
    assert InFlight("t", 0, "checking", 2.2).describe() == "from node 0: checking 2 s"


def test_parallel_expansions_of_one_task_take_distinct_nodes(ray_cluster: str, tmp_path: Path,
                                                             shared_build_dir: str) -> None:
    task = load_task(TASK)
    info = TaskInfo(task.name, task.source, "cpu_cpp", "")
    tree = Tree.with_reference(task.source, load_trees_reference(tmp_path, shared_build_dir))
    state = make_task_search(task.name, tree, SearchConfig(budget=8, seed=0, parallel=2), AgentConfig(), info)
    first = state.next()
    assert first is not None and state.next() is None  # only the root is selectable: the second waits
    from stark_ray.agents.base import AgentResult

    state.add(first, AgentResult(ray_replies.SLOW), load_trees_reference(tmp_path, shared_build_dir))
    a, b = state.next(), state.next()
    assert a is not None and b is not None and a.parent != b.parent
    assert state.next() is None  # two in flight: that is the width
    # and a whole run with two in flight per task keeps to its budget
    [summary] = run_ray(ray_run(tmp_path, shared_build_dir, budget=6, parallel=2))
    assert summary.attempts == 6 and len(rows_by_seq(Path(summary.run_dir))) == 7


_REFERENCE: dict[str, Any] = {}


def load_trees_reference(tmp_path: Path, build_dir: str) -> Any:
    """The reference's result (once per session), as an evaluator gives it."""
    if "ref" not in _REFERENCE:
        from stark_ray.eval.evaluator import Evaluator

        with Evaluator(load_task(TASK), eval_cfg(build_dir)) as ev:
            _REFERENCE["ref"] = ev.reference()
    return _REFERENCE["ref"]


def test_a_candidate_that_kills_its_evaluator_actor_is_recorded_and_the_run_goes_on(
        ray_cluster: str, tmp_path: Path, shared_build_dir: str) -> None:
    factory = ray_replies.killer_client_factory(tmp_path / "killed-once")
    # unisolated: isolated, the candidate sees no process to kill (tests/test_eval.py shows that)
    [summary] = run_ray(ray_run(tmp_path, shared_build_dir, budget=5, client_factory=factory, isolate="off"))
    assert summary.status == "finished" and summary.attempts == 5
    tree = load_trees(Path(summary.run_dir))["1_LeakyReluScale"]
    crashed = [n for n in tree if n.result.stage == STAGE_CRASH]
    assert len(crashed) == 1 and "evaluator actor died" in (crashed[0].result.error or ""), crashed[0].result
    assert "os.kill(int(_stat" in crashed[0].source
    later = [n for n in tree if n.id > crashed[0].id]
    assert later and any(n.result.compiled for n in later)  # the restarted actor evaluated the next ones


def test_an_evaluator_killed_from_outside_costs_only_the_candidate_it_was_running(
        ray_cluster: str, tmp_path: Path, shared_build_dir: str) -> None:
    """The Evaluator actor's process is killed (as the OOM killer or a user would) while it evaluates a candidate,
    with a second expansion in flight: that candidate alone is charged, every later one is evaluated by the
    restarted actor, and the dead actor's judge and worker are gone."""
    marker = tmp_path / "held"
    run = ray_run(tmp_path, shared_build_dir, budget=6, parallel=2, isolate="off",
                  client_factory=ray_replies.held_client_factory(marker), run_id="evaluator-kill")
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("summary", run_ray(run)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert thread.is_alive() and time.monotonic() < deadline, "the held candidate was never evaluated"
        time.sleep(0.1)
    actor = int(marker.read_text())
    below = _descendants(actor)
    assert below, "the evaluator actor has no processes below it"
    os.kill(actor, signal.SIGKILL)
    thread.join(timeout=600)
    assert not thread.is_alive()
    [summary] = out["summary"]
    assert summary.status == "finished" and summary.attempts == 6
    tree = load_trees(Path(summary.run_dir))["1_LeakyReluScale"]
    crashed = [n for n in tree if n.result.stage == STAGE_CRASH]
    assert [("MARKER = " in n.source) for n in crashed] == [True], [(n.id, n.result.error) for n in crashed]
    assert "evaluator actor died" in (crashed[0].result.error or "")
    others = [n for n in tree if n.id not in (0, crashed[0].id) and n.source]
    assert len(others) == 5 and all(n.result.compiled for n in others), [(n.id, n.result.error) for n in others]
    gone_by = time.monotonic() + 60
    while (alive := [p for p in below if _alive(p)]) and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert not alive, f"the dead actor's processes {alive} outlived it"


def _descendants(pid: int) -> list[int]:
    from stark_ray.eval.proc.process_tree import descendants

    return list(descendants(pid))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _refusing_isolation() -> tuple[str, ...]:
    from stark_ray.eval.proc.isolation import IsolationUnavailable

    raise IsolationUnavailable("this host cannot create the namespaces for isolation (test: refused)")


@ray.remote(max_restarts=-1, max_task_retries=0)
class NoIsolationEvaluator(EvaluatorActor.__ray_actor_class__):  # type: ignore[misc, name-defined]
    """The real Evaluator actor on a host that refuses isolation (a container without namespaces)."""

    def __init__(self, cfg: EvalConfig) -> None:
        import stark_ray.eval.proc.isolation as isolation

        isolation.isolation_prefix = _refusing_isolation
        super().__init__(replace(cfg, isolate="on"))


def test_an_evaluator_that_cannot_work_ends_the_run_in_one_line(ray_cluster: str, tmp_path: Path,
                                                                 shared_build_dir: str) -> None:
    """Its service fails as the actor starts: every call says why, and the driver raises that EvaluatorError (the
    CLI's one line). An __init__ that raised would reach the driver as Ray's ActorDiedError, a traceback."""
    from stark_ray.eval.service import EvaluatorError

    outcome: dict[str, BaseException] = {}

    def go() -> None:
        try:
            run_ray(ray_run(tmp_path, shared_build_dir, budget=2, evaluator_cls=NoIsolationEvaluator))
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the run waits on an evaluator that cannot start"
    error = outcome.get("error")
    assert isinstance(error, EvaluatorError) and "test: refused" in str(error) and "\n" not in str(error)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run directory made


@pytest.mark.parametrize("padding", [0, 400_000], ids=["small", "large-specs"])
def test_the_tree_memory_actor_restarts_from_its_rows(ray_cluster: str, tmp_path: Path, shared_build_dir: str,
                                                      padding: int) -> None:
    """Also when what the actor is made from is large (a campaign of hundreds of tasks; here one task file of
    400 kB): Ray keeps such arguments in its object store, where a restart could not find them again."""
    run = ray_run(tmp_path, shared_build_dir, budget=8, run_id="memory-kill")
    if padding:
        big = tmp_path / "big" / TASK.name
        big.parent.mkdir()
        big.write_text(TASK.read_text() + "\n" + "# padding\n" * (padding // 10))
        run = replace(run, tasks=[load_task(big)])
    run_dir = run.out / "memory-kill"
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("summary", run_ray(run)), daemon=True)
    thread.start()
    _wait_for_rows(run_dir, 3, thread)
    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if str(a["name"]).startswith("stark-memory-memory-kill"))
    memory = ray.get_actor(name, namespace=ray.get_runtime_context().namespace)
    old_pid = ray.get(memory.status.remote())["pid"]
    ray.kill(memory, no_restart=False)
    deadline = time.monotonic() + 120
    while (status := ray.get(memory.status.remote(), timeout=120))["pid"] == old_pid:
        assert time.monotonic() < deadline, "the TreeMemory actor was not restarted"
        time.sleep(0.1)
    assert status["restored"].get("1_LeakyReluScale", 0) >= 3  # at least the rows seen on disk before the kill
    thread.join(timeout=300)
    [summary] = out["summary"]
    assert summary.status == "finished" and summary.attempts >= 8
    rows = rows_by_seq(run_dir)  # no node written twice
    assert sorted(rows) == list(range(len(rows)))
    assert len(load_trees(run_dir)["1_LeakyReluScale"]) == summary.attempts + 1


def driver_script(tmp_path: Path, out: str, run_id: str, address: str, build_dir: str) -> Path:
    """A driver of one 10-attempt run of TASK (scripted replies) joining the session's cluster, as a script to
    start in a process of its own (and kill)."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
        from pathlib import Path
        import ray_replies
        from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
        from stark_ray.eval.tasks import load_task
        from stark_ray.run.ray_driver import RayRun, run_ray
        run = RayRun([load_task(Path({str(TASK)!r}))], SearchConfig(budget=10, seed=0), AgentConfig(),
                     EvalConfig(trials=2, warmup=1, timing_trials=3, build_dir={build_dir!r}),
                     {out!r}, run_id={run_id!r}, address={address!r}, client_factory=ray_replies.client,
                     runtime_env={{"env_vars": {{"PYTHONPATH": {WORKER_PATH!r}}}}})
        run_ray(run)
    """))
    return script


def test_kill_9_of_the_driver_then_resume_loses_and_doubles_nothing(ray_cluster: str, tmp_path: Path,
                                                                    shared_build_dir: str) -> None:
    script = driver_script(tmp_path, str(tmp_path / "runs"), "killed", ray_cluster, shared_build_dir)
    run_dir = tmp_path / "runs" / "killed"
    kill_driver_once_recorded(script, run_dir, 4)
    before = rows_by_seq(run_dir)
    recorded = load_trees(run_dir)["1_LeakyReluScale"]
    assert 4 <= len(before) < 11
    [summary] = run_ray(resume_of(run_dir, client_factory=ray_replies.client))
    after = rows_by_seq(run_dir)  # raises on a node written twice
    assert summary.status == "finished" and summary.attempts == 10 and len(after) == 11
    for seq, row in before.items():  # nothing recorded before the kill was lost or changed
        assert after[seq] == row
    final = load_trees(run_dir)["1_LeakyReluScale"]
    assert final.to_records()[: len(recorded)] == recorded.to_records()


def kill_driver_once_recorded(script: Path, run_dir: Path, rows: int) -> None:
    """Run a driver script in a process of its own and kill -9 it once ``rows`` attempts rows are on disk."""
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_rows(run_dir, rows, proc=proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def resume_of(run_dir: Path, **kw: Any) -> RayRun:
    """The RayRun that continues ``run_dir`` with its recorded tasks and settings (what --resume builds)."""
    from stark_ray.run.resume import resumed

    r = resumed(run_dir)
    return RayRun(r.tasks, r.search, r.agents, r.eval, run_dir.parent, resume=run_dir, **kw)


def _wait_for_rows(run_dir: Path, n: int, thread: threading.Thread | None = None,
                   proc: subprocess.Popen[bytes] | None = None, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "attempts").is_dir():
            try:
                if len(attempt_rows(run_dir)) >= n:
                    return
            except Exception:
                pass
        if thread is not None and not thread.is_alive():
            raise AssertionError("the run ended before it could be interrupted")
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            raise AssertionError(f"the driver exited early: {err}")
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} rows in {run_dir} after {timeout} s")


def test_many_tasks_through_the_pipelined_driver_spend_every_budget_once(ray_cluster: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The orchestration benchmark's stand-ins (scripted replies, an evaluator that answers at once) through the
    real actors: with little room in flight (the memory hands out work in the same round trip as each add), every
    task ends with its whole budget, each node written once, the driver's best_kernel.py the memory's best."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as the Ray workers have it
    import orchestration

    tasks = orchestration.write_tasks(tmp_path / "tasks", 4)
    run = RayRun(tasks, SearchConfig(budget=6, parallel=2, seed=0), AgentConfig(), EvalConfig(), tmp_path / "runs",
                 run_id="many", max_in_flight=3, client_factory=orchestration.scripted_client,
                 evaluator_cls=orchestration.InstantEvaluator)
    summaries = run_ray(run)
    assert [s.status for s in summaries] == ["finished"] * 4 and all(s.attempts == 6 for s in summaries)
    run_dir = tmp_path / "runs" / "many"
    trees = load_trees(run_dir)
    rows = attempt_rows(run_dir)
    assert sorted((r["task"], r["seq"]) for r in rows) == sorted((t.name, s) for t in tasks for s in range(7))
    for t in tasks:
        best = trees[t.name].best()
        if best is not None:
            assert (run_dir / "tasks" / t.name / "best_kernel.py").read_text() == best.source


def test_a_campaign_skips_a_task_that_does_not_fit_the_memory_budget_in_one_line(
        ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A task whose reference cannot fit the evaluator's memory budget is one line, and the campaign goes on without
    it (not in run.json, no rows); alone, it is the run's error."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import json

    import orchestration

    from stark_ray.eval.measure.memory import OverBudget

    tasks = orchestration.write_tasks(tmp_path / "tasks", 3)
    big = replace(tasks[1], name="t001_Big")
    run = RayRun([tasks[0], big, tasks[2]], SearchConfig(budget=2, seed=0), AgentConfig(), EvalConfig(),
                 tmp_path / "runs", run_id="skip", client_factory=orchestration.scripted_client,
                 evaluator_cls=orchestration.OverBudgetEvaluator)
    summaries = run_ray(run)
    assert sorted(s.task for s in summaries) == sorted([tasks[0].name, tasks[2].name])
    assert all(s.status == "finished" for s in summaries)
    assert "stark: skipped: task t001_Big needs 52.0 GB; budget 40.0 GB" in capfd.readouterr().err
    run_dir = tmp_path / "runs" / "skip"
    assert [t["name"] for t in json.loads((run_dir / "run.json").read_text())["tasks"]] == [tasks[0].name,
                                                                                          tasks[2].name]
    assert {r["task"] for r in attempt_rows(run_dir)} == {tasks[0].name, tasks[2].name}
    alone = replace(run, tasks=[big], run_id="alone")
    with pytest.raises(OverBudget, match=r"needs 52\.0 GB"):
        run_ray(alone)


PACED_DRIVER = """
import sys
sys.path[:0] = {paths!r}
from pathlib import Path
import orchestration, ray_replies
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import load_task
from stark_ray.run.ray_driver import RayRun, run_ray
run = RayRun([load_task(Path({task!r}))], SearchConfig(budget={budget}, seed={seed}, epsilon={epsilon}), {agents},
             EvalConfig(), {out!r}, run_id={run_id!r}, address={address!r}, client_factory={client_factory},
             evaluator_cls=ray_replies.paced_evaluator_cls({speedup}, {hold!r}, {hold_after}),
             runtime_env={{"env_vars": {{"PYTHONPATH": {worker_path!r}}}}})
run_ray(run)
"""


def test_a_run_killed_anywhere_and_resumed_grows_the_tree_of_the_uninterrupted_run(
        ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of the driver after 1, 4 and 8 of 12 attempts, then --resume: node for node (parent, agent, source,
    result) the tree of the same seed and replies run without a stop. Replies and results are functions of the
    prompt and the source (scripted replies, the paced stand-in evaluator)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import orchestration


    # a seed whose search debugs too: the scripted replies follow the prompts, so a change of them can call for another
    budget, seed = 12, 6
    worker_path = os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")])

    def grown(run_id: str) -> list[tuple[Any, ...]]:
        tree = load_trees(tmp_path / "runs" / run_id)["1_LeakyReluScale"]
        return [(*s, n.result.stage, n.result.speedup) for s, n in zip(shape(tree), sorted(tree, key=lambda n: n.id),
                                                                        strict=True)]

    whole = RayRun([load_task(TASK)], SearchConfig(budget=budget, seed=seed), AgentConfig(), EvalConfig(),
                   tmp_path / "runs", run_id="whole", client_factory=orchestration.scripted_client,
                   evaluator_cls=ray_replies.paced_evaluator_cls())
    [summary] = run_ray(whole)
    assert summary.attempts == budget
    expected = grown("whole")
    assert len({row[2] for row in expected}) > 2  # the search took more than one kind of step
    for kill_at in (1, 4, 8):
        run_id = f"killed-{kill_at}"
        script = tmp_path / f"{run_id}.py"
        script.write_text(PACED_DRIVER.format(paths=[str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")],
                                              task=str(TASK), budget=budget, seed=seed, out=str(tmp_path / "runs"),
                                              agents="AgentConfig()", client_factory="orchestration.scripted_client",
                                              epsilon=SearchConfig.epsilon, speedup=None,
                                              hold=str(tmp_path / f"{run_id}.hold"), hold_after=kill_at,
                                              run_id=run_id, address=ray_cluster, worker_path=worker_path))
        (tmp_path / f"{run_id}.hold").touch()  # evaluations after kill_at wait: the kill lands there
        kill_driver_once_recorded(script, tmp_path / "runs" / run_id, kill_at + 1)  # the reference, kill_at attempts
        recorded = len(attempt_rows(tmp_path / "runs" / run_id))
        assert kill_at + 1 <= recorded < budget + 1, f"{recorded - 1} attempts recorded at the kill after {kill_at}"
        [summary] = run_ray(resume_of(tmp_path / "runs" / run_id, client_factory=orchestration.scripted_client,
                                      evaluator_cls=ray_replies.paced_evaluator_cls()))
        assert summary.attempts == budget
        assert grown(run_id) == expected, f"killed after {recorded - 1} attempts"


def test_a_resumed_replay_serves_no_recorded_reply_twice(ray_cluster: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A replayed run killed after 2 of 5 attempts and resumed: every reply of the cassette is served once (the
    resumed run used to serve the first code reply again and then run out). Every candidate is correct and slower
    than the reference (ε = 0): each plan is for the reference, as the recorded ones are."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from scripted_replies import SLOW

    from stark_ray.store.read import call_rows

    cassette = tmp_path / "c.jsonl"
    plan = ("Fuse it.\n\n```python\n" + TASK.read_text().rstrip("\n") + "\n# <<<IMPROVE BEGIN 1>>>\n"
            "# <<<IMPROVE END 1>>>\n```\n\nINSTRUCTION 1: Fuse the chain.\n")
    lines = []
    for i in range(5):  # five distinct candidates, one per plan (the root takes at most five children)
        lines += [{"role": "plan", "prompt_sha256": "-", "reply": plan},
                  {"role": "code", "prompt_sha256": "-", "reply": f"Here.\n\n```python\n{SLOW}# take {i}\n```\n"}]
    cassette.write_text("".join(json.dumps(x) + "\n" for x in lines))
    agents = f"AgentConfig(provider='replay', cassette={str(cassette)!r})"
    worker_path = os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")])
    script = tmp_path / "driver.py"
    script.write_text(PACED_DRIVER.format(paths=[str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")],
                                          task=str(TASK), budget=5, seed=0, out=str(tmp_path / "runs"),
                                          agents=agents, client_factory=None, run_id="replayed", epsilon=0.0,
                                          speedup=0.8, hold=str(tmp_path / "hold"), hold_after=2,
                                          address=ray_cluster, worker_path=worker_path))
    run_dir = tmp_path / "runs" / "replayed"
    (tmp_path / "hold").touch()  # the third evaluation waits: the kill lands after two attempts
    kill_driver_once_recorded(script, run_dir, 3)
    assert len(attempt_rows(run_dir)) == 3
    [summary] = run_ray(resume_of(run_dir, evaluator_cls=ray_replies.paced_evaluator_cls(0.8)))
    assert summary.status == "finished" and summary.attempts == 5
    calls = [r for r in call_rows(run_dir) if r["ok"]]
    served = [r["replay_entry"] for r in calls]
    assert len(served) == 10 and sorted(served) == list(range(10)), served
    takes = sorted(n.source.rsplit("# take ", 1)[1].strip() for n in load_trees(run_dir)["1_LeakyReluScale"]
                   if n.id and n.source)
    assert takes == [str(i) for i in range(5)]
