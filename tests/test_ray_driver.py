"""The Ray driver's loop against stand-ins for Ray (no cluster): the real TreeMemory actor class and Parquet store,
agent calls and evaluations answered at once, and every call finishing in a random order (a random share of the
outstanding calls runs each time the driver waits). Whatever the order, the run ends only when every task's
budget is spent, nothing is lost or doubled, the driver's mirror equals the memory's trees, and caps stop new
calls as soon as the spend reaches them."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from stark_ray.actors.tree_memory import TaskSpec, TreeMemoryActor, write_specs
from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import Task
from stark_ray.llm.base import LLMError
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, EvalResult, LLMUsage, source_digest
from stark_ray.run import evaluator_deaths, ray_driver
from stark_ray.run.campaign import Caps
from stark_ray.run.directory import RunError
from stark_ray.run.reporter import Reporter
from stark_ray.search.tree import Tree
from stark_ray.store.location import locate
from stark_ray.store.read import attempt_rows

SOURCE = "class Model: ..."


class FakeRef:
    def __init__(self, call: Callable[[], Any]) -> None:
        self.call, self.done, self.value, self.error = call, False, None, None

    def run(self) -> None:
        try:
            value = self.call()
            self.value = asyncio.run(value) if asyncio.iscoroutine(value) else value
        except RayActorError as e:  # the actor died: no task error around it
            self.error = e
        except Exception as e:  # as Ray hands it to the caller
            self.error = RayTaskError("call", "", e)
        self.done = True


class FakeRay:
    """``ray.wait`` / ``ray.get`` over FakeRefs. A call runs when the driver waits: each wait runs a random share
    of the calls not run yet, in a random order (a blocking wait at least one)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.calls = rng, []  # type: ignore[var-annotated]

    def submit(self, call: Callable[[], Any]) -> FakeRef:
        ref = FakeRef(call)
        self.calls.append(ref)
        return ref

    def wait(self, refs: list[FakeRef], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        todo = [r for r in self.calls if not r.done]
        self.rng.shuffle(todo)
        for ref in todo[:self.rng.randint(0 if timeout == 0 else 1, len(todo)) if todo else 0]:
            ref.run()
        ready = [r for r in refs if r.done][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, refs: Any) -> Any:
        out = []
        for ref in refs if isinstance(refs, list) else [refs]:
            if not ref.done:
                ref.run()
            if ref.error is not None:
                raise ref.error
            out.append(ref.value)
        return out if isinstance(refs, list) else out[0]

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(get_node_id=lambda: "node")

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": "live", "Alive": True}, {"NodeID": "lost", "Alive": False}]

    def cancel(self, ref: Any) -> None: ...

    def kill(self, actor: Any, no_restart: bool = True) -> None: ...


class Handle:
    """An actor handle: ``handle.method.remote(...)`` queues the call; arguments and results are copied, as Ray
    serializes them."""

    def __init__(self, fake: FakeRay, target: Any) -> None:
        self._fake, self._target = fake, target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        def remote(*args: Any) -> FakeRef:
            copied = copy.deepcopy(args)

            async def call_async() -> Any:
                return copy.deepcopy(await method(*copied))

            if asyncio.iscoroutinefunction(method):
                return self._fake.submit(call_async)
            return self._fake.submit(lambda: copy.deepcopy(method(*copied)))

        return SimpleNamespace(remote=remote)


class Agents:
    """A step at once: a candidate (or, one time in five, nothing usable), 5 tokens spent."""

    def __init__(self, fatal_after: int | None = None) -> None:
        self.calls, self.fatal_after = 0, fatal_after

    def run(self, request: Any, info: TaskInfo) -> AgentResult:
        self.calls += 1
        if self.fatal_after is not None and self.calls > self.fatal_after:
            raise LLMError("invalid API key", kind="auth")
        usage = [LLMUsage(role="code", provider="fake", model="m", input_tokens=3, output_tokens=2)]
        if self.calls % 5 == 0:
            return AgentResult(None, error="code: no code block", usage=usage)
        return AgentResult(f"class ModelNew: ...  # {info.name} from {request.node.id}, call {self.calls}",
                           instruction="fuse", usage=usage)


class Evaluator:
    def __init__(self) -> None:
        self.seen: list[str] = []  # the tasks of the candidates it evaluated

    def evaluate(self, task: Task, source: str) -> EvalResult:
        self.seen.append(task.name)
        digest = hashlib.sha256(source.encode()).digest()
        if digest[0] % 4 == 0:
            return EvalResult.failed(STAGE_CORRECTNESS, "mismatch", "log")
        speedup = 0.5 + digest[1] / 100
        return EvalResult(compiled=True, passed_checks=True, runtime_ms=1 / speedup, ref_runtime_ms=1.0,
                          speedup=speedup, stage=STAGE_OK)


def ok_reference() -> EvalResult:
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0, ref_runtime_ms=1.0, speedup=1.0,
                      stage=STAGE_OK)


class DyingEvaluator(Evaluator):
    """Dies while it evaluates the candidate of the second agent call (of it, or killed from outside at that moment:
    ``note`` says whether its restart names that candidate, as the real actor's note does). Ray restarts it: until
    Ray knows that it died, every call sent to it fails as well (its first ``where`` after the death too);
    afterwards it works again."""

    def __init__(self, note: bool = True, slow: int = 1, host: bool = False) -> None:
        super().__init__()
        self.note, self.slow = note, slow  # slow: its ``where`` calls that fail before the restart answers
        self.host = host  # killed by the host's memory monitor (Ray's error says so)
        self.dead = self.killed = False
        self.unnoticed = 0  # calls that reach the dead process before Ray knows
        self.died_running: str | None = None
        self.instance = "first"

    def hardware(self) -> dict[str, Any]:
        return {"description": "fake", "class": "fake", "start_phases": {}, "instance": self.instance, "node": "live"}

    def evaluate(self, task: Task, source: str) -> EvalResult:
        if self.dead:
            raise RayActorError()
        if source.endswith("call 2") and not self.killed:
            self.dead = self.killed = True
            self.unnoticed = self.slow
            self.died_running = source_digest(source) if self.note else None
            if self.host:  # the words of Ray's memory monitor (its ActorDiedError's message)
                raise RayActorError(error_msg="The actor died unexpectedly before finishing this task.\nTask was "
                                              "killed due to the node running low on memory.")
            raise RayActorError()
        return super().evaluate(task, source)

    def where(self) -> dict[str, Any]:
        if self.unnoticed:
            self.unnoticed -= 1
            raise RayActorError()
        self.dead, self.instance = False, "restarted"
        return {"pid": 1, "instance": self.instance, "died_running": self.died_running, "node": "live"}


def drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, tasks: int = 3, budget: int = 7,
          parallel: int = 2, max_in_flight: int = 64, caps: Caps | None = None,
          agents: Agents | None = None, evaluators: list[Evaluator] | None = None,
          classes: list[str] | None = None) -> tuple[ray_driver.RayDriver, Any]:
    fake = FakeRay(random.Random(seed))
    agents = agents or Agents()
    monkeypatch.setattr(ray_driver, "ray", fake)
    monkeypatch.setattr(ray_driver, "start_agents", lambda run: [Handle(fake, agents)])
    task_list = [Task(f"t{i}", tmp_path / f"t{i}.py", SOURCE) for i in range(tasks)]
    search = SearchConfig(budget=budget, parallel=parallel, seed=seed)
    run = ray_driver.RayRun(task_list, search, AgentConfig(), EvalConfig(), tmp_path, run_id="run",
                              max_in_flight=max_in_flight, caps=caps or Caps())
    driver = ray_driver.RayDriver(run, Reporter())
    driver.evaluators = [Handle(fake, e) for e in evaluators or [Evaluator()]]
    driver.infos = {t.name: TaskInfo(t.name, SOURCE, "cpu_cpp") for t in task_list}
    driver.dispatch.place([t.name for t in task_list], len(driver.evaluators))
    driver.dispatch.share(classes or ["gpu"] * len(driver.evaluators))
    driver.dir, driver.run_id = tmp_path / "run", "run"
    specs = [TaskSpec(driver.infos[t.name], ok_reference()) for t in task_list]
    driver.dir.mkdir()
    write_specs(locate(driver.dir), specs)
    memory = TreeMemoryActor.__ray_actor_class__(str(tmp_path), "run", search, AgentConfig())  # type: ignore[attr-defined]
    # each call runs in an event loop of its own here, so no two adds ever share a commit: the interval between
    # commits (which batches a busy actor's adds, tests/test_tree_memory_actor.py) would only add 0.2 s per add
    memory.commit.interval = 0.0
    driver.memory = Handle(fake, memory)
    driver.view.dir = driver.dir
    for t in task_list:
        driver.view.load(t.name, Tree.from_records(memory.memory.snapshot(t.name)))
    return driver, memory


def shape(tree: Tree) -> list[tuple[int, int | None, str]]:
    return sorted((n.id, n.parent, n.source) for n in tree)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("parallel", "max_in_flight"), [(1, 64), (2, 64), (3, 4), (2, 1)])
def test_whatever_order_calls_finish_in_every_budget_is_spent_and_nothing_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, parallel: int, max_in_flight: int) -> None:
    driver, memory = drive(tmp_path, monkeypatch, seed, parallel=parallel, max_in_flight=max_in_flight)
    driver.loop()
    assert not driver.pending and driver.room.working == 0 and driver.room.reserved == 0
    for name in driver.tasks:
        search = memory.memory[name]
        assert search.tree.evaluated == 7 and not search.in_flight  # did not end early, did not overshoot
        assert shape(driver.view.trees[name]) == shape(search.tree)  # every acknowledged node, once
        assert not any(driver.view.orphans.get(name, {}).values())
        best = search.tree.best()
        assert driver.view.best[name] == (best.id if best else None)  # and best_kernel.py holds it
        if best is not None:
            assert (tmp_path / "run" / "tasks" / name / "best_kernel.py").read_text() == best.source
    memory.store.flush()
    rows = attempt_rows(tmp_path / "run")
    assert sorted((r["task"], r["seq"]) for r in rows) == sorted((n, s) for n in driver.tasks for s in range(8))


@pytest.mark.parametrize("seed", range(6))
def test_a_task_cap_stops_its_calls_as_soon_as_the_spend_reaches_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    agents = Agents()
    driver, memory = drive(tmp_path, monkeypatch, seed, parallel=1, caps=Caps(task_max_tokens=1), agents=agents)
    driver.loop()  # ends with budget left: every task is capped
    assert sorted(driver.capped) == ["t0", "t1", "t2"] and agents.calls == 3
    assert all(memory.memory[n].tree.evaluated == 1 and not memory.memory[n].in_flight for n in driver.tasks)


def test_a_campaign_cap_stops_every_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents = Agents()
    driver, memory = drive(tmp_path, monkeypatch, 0, max_in_flight=1, caps=Caps(max_tokens=12), agents=agents)
    driver.loop()
    assert agents.calls == 3 and len(driver.capped) == 3  # 5 tokens a call: the third reaches 12
    assert sum(memory.memory[n].tree.evaluated for n in driver.tasks) == 3


def test_a_fatal_llm_error_ends_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver, _ = drive(tmp_path, monkeypatch, 0, agents=Agents(fatal_after=4))
    with pytest.raises(LLMError, match="invalid API key"):
        driver.loop()


def test_a_store_that_stays_down_ends_the_run_in_one_line_and_loses_nothing_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory retries a failed write (test_tree_memory_actor); when the store is still down after that, the
    add fails and the driver stops with a RunError naming --resume, with every acknowledged attempt on disk."""
    driver, memory = drive(tmp_path, monkeypatch, 0, budget=6)
    flush, flushes = memory.store.flush, {"n": 0}

    def failing_after_a_while() -> None:
        flushes["n"] += 1
        if flushes["n"] > 3:
            raise OSError("503 Service Unavailable")
        flush()

    memory.commit.flush, memory.commit.retry_delays = failing_after_a_while, (0.0,)
    with pytest.raises(RunError, match=r"could not be written \(503 Service Unavailable\).*--resume"):
        driver.loop()
    on_disk = {(r["task"], r["seq"]) for r in attempt_rows(tmp_path / "run")}
    acknowledged = {(n, node.id) for n, tree in driver.view.trees.items() for node in tree}
    assert acknowledged <= on_disk


class UnreachableEvaluator(Evaluator):
    """Unreachable for one call (Ray's ActorUnavailableError: the process lives on); its where() always answers
    from the same process."""

    def __init__(self) -> None:
        super().__init__()
        self.blipped = False

    def hardware(self) -> dict[str, Any]:
        return {"description": "fake", "class": "fake", "start_phases": {}, "instance": "only"}

    def evaluate(self, task: Task, source: str) -> EvalResult:
        if source.endswith("call 2") and not self.blipped:
            self.blipped = True
            raise ActorUnavailableError("the actor is temporarily unavailable", None)
        return super().evaluate(task, source)

    def where(self) -> dict[str, Any]:
        return {"pid": 1, "instance": "only", "died_running": None}


def test_an_evaluator_that_was_only_unreachable_charges_nothing_and_the_run_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same process answering after an error was never dead: its candidates go again, nothing is charged
    (the driver used to ask it forever)."""
    monkeypatch.setattr(evaluator_deaths, "ALIVE_AFTER_S", 0.3)
    evaluator = UnreachableEvaluator()
    driver, memory = drive(tmp_path, monkeypatch, 0, tasks=1, budget=5, parallel=2, evaluators=[evaluator])
    driver.loop()
    tree = memory.memory["t0"].tree
    assert evaluator.blipped and tree.evaluated == 5 and not [n for n in tree if n.result.stage == "crash"]


def test_an_evaluator_that_never_comes_back_ends_the_run_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Gone(Evaluator):
        def evaluate(self, task: Task, source: str) -> EvalResult:
            raise RayActorError()

        def where(self) -> dict[str, Any]:
            raise RayActorError()

    monkeypatch.setattr(evaluator_deaths, "RESTART_WAIT_S", 0.5)
    driver, _ = drive(tmp_path, monkeypatch, 0, tasks=1, budget=3, evaluators=[Gone()])
    with pytest.raises(RunError, match=r"evaluator 0 died and did not come back within 0 s.*--resume"):
        driver.loop()


class LostWithItsNode(Evaluator):
    """Dies with its node during its second evaluation; Ray finds no room to restart it, so every later call fails
    (``where`` included) and no new process ever answers."""

    def __init__(self) -> None:
        super().__init__()
        self.lost, self.calls = False, 0

    def hardware(self) -> dict[str, Any]:
        return {"description": "fake", "class": "fake", "start_phases": {}, "instance": "lost", "node": "lost"}

    def evaluate(self, task: Task, source: str) -> EvalResult:
        self.calls += 1
        if self.lost or self.calls == 2:
            self.lost = True
            raise ActorUnavailableError("The actor was restarted", None)
        return super().evaluate(task, source)

    def where(self) -> dict[str, Any]:
        raise ActorUnavailableError("The actor is restarting", None)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("move_after", "restart_wait"), [(0.2, 60.0), (60.0, 0.05)], ids=["moved", "given-up"])
def test_an_evaluator_lost_with_its_node_hands_its_candidates_to_the_others_and_the_run_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, move_after: float, restart_wait: float) -> None:
    """No new process answers: after MOVE_AFTER_S its candidates go to the evaluator left (it stays paused and
    asked), or it is given up after RESTART_WAIT_S with the same effect; either way each candidate is evaluated
    once and nothing is charged (one death, no note), and the run finishes."""
    monkeypatch.setattr(evaluator_deaths, "MOVE_AFTER_S", move_after)
    monkeypatch.setattr(evaluator_deaths, "RESTART_WAIT_S", restart_wait)
    lost, kept = LostWithItsNode(), Evaluator()
    driver, memory = drive(tmp_path, monkeypatch, seed, tasks=3, budget=6, evaluators=[lost, kept])
    driver.deaths.nodes = {0: "lost", 1: "live"}  # Ray says its node is dead
    driver.loop()
    assert lost.lost and 0 in driver.dispatch.paused and driver.deaths.gone == ({0} if restart_wait < 1 else set())
    for name in driver.tasks:
        tree = memory.memory[name].tree
        assert tree.evaluated == 6 and not memory.memory[name].in_flight
        assert not [n for n in tree if n.result.stage == "crash"]  # nothing charged
        evaluated = [n for n in tree if n.id and n.result.stage != "parse"]
        assert sorted(s for s in lost.seen + kept.seen if s == name) == [name] * len(evaluated)  # each once
    memory.store.flush()
    rows = attempt_rows(tmp_path / "run")
    assert sorted((r["task"], r["seq"]) for r in rows) == sorted((n, s) for n in driver.tasks for s in range(7))


def test_a_full_disk_is_one_line_naming_resume_whatever_else_fails_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' store fails for good (ENOSPC) while best_kernel.py and every summary.json fail too: the run stops
    with the store's one line (the summaries' failures, in the run's ``finally``, used to replace it with a
    traceback of their own)."""
    import errno

    from stark_ray.run import directory as run_directory
    from stark_ray.run import mirror as run_mirror

    def full(path: Any, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_mirror, "write_atomic", full)
    monkeypatch.setattr(run_directory, "write_atomic", full)
    driver, memory = drive(tmp_path, monkeypatch, 0, budget=6)
    flush, flushes = memory.store.flush, {"n": 0}

    def failing_after_a_while() -> None:
        flushes["n"] += 1
        if flushes["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        flush()

    memory.commit.flush, memory.commit.retry_delays = failing_after_a_while, (0.0,)
    with pytest.raises(RunError, match=r"could not be written \(\[Errno 28\] No space left on device\).*--resume"):
        try:
            driver.loop()
        finally:
            driver.finish("failed", 1.0)  # what run_ray's finally does
    assert driver.unwritten is not None and "summary could not be written" in driver.unwritten


def test_a_summary_that_cannot_be_written_ends_a_finished_run_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from stark_ray.run import directory as run_directory
    from stark_ray.run import mirror as run_mirror

    def full(path: Any, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_mirror, "write_atomic", full)
    monkeypatch.setattr(run_directory, "write_atomic", full)
    driver, _ = drive(tmp_path, monkeypatch, 0, tasks=1, budget=4)
    driver.loop()  # best_kernel.py fails quietly during the run: the rows hold every node
    driver.finish("finished", 1.0)
    assert driver.unwritten == "t0's summary could not be written ([Errno 28] No space left on device)"


@pytest.mark.parametrize("seed", range(4))
def test_evaluators_of_one_device_class_share_every_tasks_candidates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    evaluators = [Evaluator(), Evaluator()]
    driver, memory = drive(tmp_path, monkeypatch, seed, tasks=3, budget=12, evaluators=evaluators)
    most = [0, 0]
    ready = driver.dispatch.ready

    def watched() -> list[tuple[int, Any]]:
        sent = ready()
        most[:] = [max(m, load) for m, load in zip(most, driver.dispatch.load, strict=True)]
        return sent

    monkeypatch.setattr(driver.dispatch, "ready", watched)
    driver.loop()
    assert max(most) <= ray_driver.EVAL_WINDOW  # the choice stays late: no evaluator holds a queue
    assert not driver.dispatch.queue and driver.dispatch.running == 0
    for name in driver.tasks:
        assert memory.memory[name].tree.evaluated == 12
    seen = [set(e.seen) for e in evaluators]
    assert seen[0] | seen[1] == set(driver.tasks)
    home = driver.dispatch.home
    assert any(home[name] != i for i in (0, 1) for name in seen[i])  # not a fixed share of the tasks each


def test_a_task_stays_on_its_home_device_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    evaluators = [Evaluator(), Evaluator(), Evaluator()]
    driver, memory = drive(tmp_path, monkeypatch, 0, tasks=3, budget=9, evaluators=evaluators,
                           classes=["H200", "A100", "H200"])
    driver.loop()
    assert driver.dispatch.home == {"t0": 0, "t1": 1, "t2": 2}
    assert set(evaluators[1].seen) == {"t1"}  # the only A100 serves the only task whose reference it timed
    assert set(evaluators[0].seen) | set(evaluators[2].seen) == {"t0", "t2"}
    for name in driver.tasks:
        assert memory.memory[name].tree.evaluated == 9


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("parallel", "slow"), [(1, 1), (3, 1), (2, 6)], ids=["p1", "p3", "slow-restart"])
def test_a_candidate_that_kills_its_evaluator_is_charged_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, parallel: int, slow: int) -> None:
    """Only the killer (named by the restarted actor) is charged; the candidates in flight beside it, and those sent
    before the driver knew, go again: nothing is sent to the evaluator until it answers after its restart. A
    restart slower than MOVE_AFTER_S on a node that is alive is waited for (its answer names the killer)."""
    monkeypatch.setattr(evaluator_deaths, "MOVE_AFTER_S", 0.1)
    evaluator = DyingEvaluator(slow=slow)
    driver, memory = drive(tmp_path, monkeypatch, seed, tasks=1, budget=6, parallel=parallel,
                           evaluators=[evaluator])
    driver.deaths.nodes = {0: "live"}
    driver.loop()
    assert evaluator.killed and not evaluator.dead
    tree = memory.memory["t0"].tree
    assert tree.evaluated == 6
    crashed = [n for n in tree if n.result.stage == "crash"]
    assert [n.source.endswith("call 2") for n in crashed] == [True], [n.result.error for n in crashed]
    assert "evaluator actor died" in (crashed[0].result.error or "")
    with_code = [n for n in tree if n.id and n.source]
    assert len(evaluator.seen) == len(with_code) - 1  # every other candidate was evaluated


@pytest.mark.parametrize("seed", range(4))
def test_an_evaluator_killed_from_outside_charges_no_candidate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Killed while it built or queued (no note: the restart names no candidate), every candidate in flight goes
    again and is evaluated."""
    evaluator = DyingEvaluator(note=False)
    driver, memory = drive(tmp_path, monkeypatch, seed, tasks=2, budget=5, parallel=2, evaluators=[evaluator])
    driver.loop()
    assert evaluator.killed
    for name in driver.tasks:
        tree = memory.memory[name].tree
        assert tree.evaluated == 5 and not [n for n in tree if n.result.stage == "crash"]
    assert len(evaluator.seen) == sum(1 for name in driver.tasks for n in memory.memory[name].tree if n.id and n.source)


@pytest.mark.parametrize("seed", range(4))
def test_an_evaluator_killed_by_the_hosts_memory_monitor_charges_no_candidate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Ray's memory monitor killed the evaluator while a candidate ran on it: the restart names that candidate,
    but the host's memory was not its doing (the monitor picks by when a worker was scheduled, and other processes
    filled the host): it goes again, is evaluated, and its row says what happened."""
    evaluator = DyingEvaluator(host=True)
    driver, memory = drive(tmp_path, monkeypatch, seed, tasks=1, budget=5, parallel=2, evaluators=[evaluator])
    driver.deaths.nodes = {0: "live"}
    driver.loop()
    assert evaluator.killed
    tree = memory.memory["t0"].tree
    assert tree.evaluated == 5 and not [n for n in tree if n.result.stage == "crash"]
    again = [n for n in tree if n.source.endswith("call 2")]
    assert len(again) == 1 and "killed by the host's memory monitor" in again[0].result.log, again[0].result.log
    assert ray_driver.killed_by_host(RayActorError(error_msg="Task was killed due to the node running low on memory"))
    assert not ray_driver.killed_by_host(RayActorError())


def test_a_candidate_in_flight_at_every_host_kill_is_charged_at_the_limit() -> None:
    """The host's kills charge no candidate, up to MAX_DEATHS: one in flight at that many may be what fills it."""
    from dataclasses import dataclass as _dataclass

    @_dataclass
    class Orphan:
        source: str
        deaths: int = 0
        host_kills: int = 0
        instance: str | None = "a"

    deaths: evaluator_deaths.EvaluatorDeaths[Orphan] = evaluator_deaths.EvaluatorDeaths(lambda w: w.source)
    work = Orphan("class ModelNew: ...")
    deaths.instances[0] = "a"  # the process it was sent to, as the evaluator's hardware() said
    for n in range(1, evaluator_deaths.MAX_DEATHS + 1):
        assert deaths.lost(0, work, float(n), host=True).pause
        verdict = deaths.answered(0, {"instance": f"p{n}", "died_running": source_digest(work.source)}, n + 20.0)
        work.instance = f"p{n}"
        if n < evaluator_deaths.MAX_DEATHS:
            assert verdict.resend == [work] and verdict.charge == []
        else:
            assert verdict.charge == [work] and work.host_kills == n
