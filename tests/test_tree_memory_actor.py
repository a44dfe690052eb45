"""The TreeMemory actor's own logic, in this process (its plain class, no Ray cluster): group commits, and
``add_next`` (attach, then select, in one call)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from stark_ray.actors.tree_memory import GroupCommit, TaskSpec, TreeMemoryActor, write_specs
from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.records import STAGE_OK, EvalResult, LLMUsage
from stark_ray.store.location import locate
from stark_ray.store.read import attempt_rows, call_rows, load_trees

SOURCE = "class Model: ..."


def ok(speedup: float) -> EvalResult:
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0 / speedup, ref_runtime_ms=1.0, speedup=speedup,
                      stage=STAGE_OK)


def step(text: str) -> AgentResult:
    usage = [LLMUsage(role="plan", provider="scripted", model="m", input_tokens=10, output_tokens=5),
             LLMUsage(role="code", provider="scripted", model="m", input_tokens=20, output_tokens=7)]
    return AgentResult(source=f"class ModelNew: ...  # {text}", instruction="fuse", usage=usage)


def memory(root: Path, tasks: list[str], budget: int = 6, parallel: int = 1) -> Any:
    """The actor's class itself, made in this process (what Ray would run in the actor's)."""
    specs = [TaskSpec(TaskInfo(name, SOURCE, "cpu_cpp"), ok(1.0)) for name in tasks]
    (root / "run").mkdir(parents=True, exist_ok=True)
    write_specs(locate(root / "run"), specs)
    cls = TreeMemoryActor.__ray_actor_class__  # type: ignore[attr-defined]
    return cls(str(root), "run", SearchConfig(budget=budget, parallel=parallel, seed=0), AgentConfig())


def test_concurrent_adds_share_one_flush_and_each_returns_only_once_its_rows_are_on_disk(tmp_path: Path) -> None:
    names = [f"t{i}" for i in range(8)]
    mem = memory(tmp_path, names)
    run_dir = tmp_path / "run"
    flushes: list[int] = []
    flush = mem.store.flush

    def counted() -> None:
        flushes.append(threading.get_ident())
        flush()

    mem.commit.flush = counted

    async def main() -> None:
        tickets = await mem.next_many(len(names))
        assert len(tickets) == len(names)

        async def one(ticket: Any) -> None:
            node, more = await mem.add_next(ticket, step(ticket.task), ok(2.0))
            assert node is not None and more == []
            # acknowledged means written: the attempts row and both llm_calls rows are on disk now
            rows = [r for r in attempt_rows(run_dir) if r["task"] == ticket.task]
            assert sorted(r["seq"] for r in rows) == [0, node.id]
            assert len([r for r in call_rows(run_dir) if r["task"] == ticket.task]) == 2

        await asyncio.gather(*(one(t) for t in tickets))

    asyncio.run(main())
    assert len(flushes) == 1 and mem.commit.commits == 1  # eight adds of one burst: one flush
    assert flushes[0] != threading.get_ident()  # in a thread: the actor's event loop kept serving
    trees = load_trees(run_dir)  # what a restarted memory would restore: every acknowledged node
    assert all(len(trees[n]) == 2 for n in names)


def test_adds_arriving_during_a_flush_wait_for_the_next_one(tmp_path: Path) -> None:
    mem = memory(tmp_path, ["a", "b", "c"])
    release = threading.Event()
    started = threading.Event()
    flush = mem.store.flush
    on_disk: list[int] = []

    def slow() -> None:
        started.set()
        release.wait(10)
        flush()
        on_disk.append(len(attempt_rows(tmp_path / "run")))

    mem.commit.flush = slow

    async def main() -> None:
        a, b, c = await mem.next_many(3)
        first = asyncio.ensure_future(mem.add(a, step("a"), ok(2.0)))
        await asyncio.to_thread(started.wait, 10)  # the first flush is running (blocked)
        later = [asyncio.ensure_future(mem.add(t, step(t.task), ok(2.0))) for t in (b, c)]
        await asyncio.sleep(0.05)
        assert not first.done() and not any(f.done() for f in later)
        release.set()
        await asyncio.gather(first, *later)

    asyncio.run(main())
    assert mem.commit.commits == 2  # the two adds that came during the first flush shared the second
    assert on_disk[-1] == 3 + 3  # three references and three nodes


def test_a_flush_that_fails_is_tried_again_and_its_adds_return_once_written(tmp_path: Path) -> None:
    mem = memory(tmp_path, ["a"])
    flush = mem.store.flush
    calls = {"n": 0}

    def flaky() -> None:  # an object store's bad minute: two failed writes, then it answers again
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError("503 Slow Down")
        flush()

    mem.commit.flush, mem.commit.retry_delays = flaky, (0.01, 0.01)

    async def main() -> None:
        [a] = await mem.next_many(1)
        assert await mem.add(a, step("a"), ok(2.0)) is not None

    asyncio.run(main())
    assert calls["n"] == 3
    assert sorted(r["seq"] for r in attempt_rows(tmp_path / "run")) == [0, 1]  # written once


def test_a_failed_flush_fails_its_adds_and_keeps_the_rows_for_the_next(tmp_path: Path) -> None:
    mem = memory(tmp_path, ["a", "b"])
    flush = mem.store.flush
    calls = {"n": 0}

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk full")
        flush()

    mem.commit.flush, mem.commit.retry_delays = flaky, ()  # no retry: the add sees the failure

    async def main() -> None:
        a, b = await mem.next_many(2)
        with pytest.raises(OSError, match="disk full"):
            await mem.add(a, step("a"), ok(2.0))
        assert await mem.add(b, step("b"), ok(2.0)) is not None

    asyncio.run(main())
    assert sorted((r["task"], r["seq"]) for r in attempt_rows(tmp_path / "run")) == \
        [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_add_next_selects_right_after_its_attach(tmp_path: Path) -> None:
    mem = memory(tmp_path, ["a"], budget=3, parallel=1)

    async def main() -> None:
        [first] = await mem.next_many(5)
        node, [second] = await mem.add_next(first, step("1"), ok(2.0), 5)
        assert node is not None and second.parent in (0, node.id)  # one in flight: the width
        node2, none = await mem.add_next(second, step("2"), ok(3.0), 5, ["a"])
        assert node2 is not None and none == []  # an excluded task gets no work
        [third] = await mem.next_many(5)
        _, after = await mem.add_next(third, step("3"), ok(1.0), 5)
        assert after == [] and await mem.unfinished() == []  # the budget is spent

    asyncio.run(main())


def test_group_commit_on_its_own() -> None:
    written: list[int] = []
    buffered: list[int] = []

    def flush() -> None:
        written.extend(buffered)
        buffered.clear()

    commit = GroupCommit(flush)

    async def add(i: int) -> None:
        buffered.append(i)
        await commit.wait()
        assert i in written

    async def main() -> None:
        await asyncio.gather(*(add(i) for i in range(20)))
        await add(99)

    asyncio.run(main())
    assert commit.commits == 2 and sorted(written) == [*range(20), 99]


def test_commits_start_an_interval_apart_so_adds_meanwhile_share_one() -> None:
    """The first add is written at once; the adds that come while it is written, and while the interval after it
    runs, share the next commit (not one file each)."""
    written: list[list[int]] = []
    buffered: list[int] = []
    first_running, release = threading.Event(), threading.Event()

    def flush() -> None:
        taken = sorted(buffered)  # what was buffered when the flush began
        buffered.clear()
        if not written:
            first_running.set()
            release.wait(10)
        written.append(taken)

    commit = GroupCommit(flush, interval=2.0)

    async def add(i: int) -> None:
        buffered.append(i)
        await commit.wait()
        assert any(i in w for w in written)

    async def main() -> None:
        first = asyncio.ensure_future(add(0))
        await asyncio.to_thread(first_running.wait, 10)
        during = [asyncio.ensure_future(add(i)) for i in (1, 2, 3)]  # while the first flush runs
        release.set()
        await first
        await asyncio.sleep(0.05)
        after = [asyncio.ensure_future(add(i)) for i in (4, 5)]  # after it, within the interval
        await asyncio.gather(*during, *after)

    asyncio.run(main())
    assert written == [[0], [1, 2, 3, 4, 5]] and commit.commits == 2


def test_a_task_that_ends_has_its_part_files_compacted(tmp_path: Path) -> None:
    mem = memory(tmp_path, ["a", "b"], budget=3)

    async def main() -> None:
        for _ in range(3):
            for ticket in await mem.next_many(2):
                await mem.add(ticket, step(ticket.task), ok(2.0))
        assert await mem.unfinished() == []
        await asyncio.to_thread(mem.compactor.close, 120)  # the compactions under way, to their end
        await mem.close()  # (a campaign's close stops them: the driver compacts the whole run next)

    asyncio.run(main())
    for table in ("attempts", "llm_calls"):
        for task in ("a", "b"):
            assert len(list((tmp_path / "run" / table / task).glob("part-*.parquet"))) == 1, (table, task)
    assert {t: len(tree) for t, tree in load_trees(tmp_path / "run").items()} == {"a": 4, "b": 4}
