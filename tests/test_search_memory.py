"""TreeMemory's core (no Ray): in-flight expansions, the budget counting work in flight, many tasks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.records import STAGE_OK, EvalResult
from stark_ray.search.memory import StaleTicket, Ticket, TreeMemory, UnknownParent, make_task_search
from stark_ray.search.team import MODE_IMPROVE, Request
from stark_ray.search.tree import Tree


def ok(speedup: float) -> EvalResult:
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0 / speedup, ref_runtime_ms=1.0, speedup=speedup,
                      stage=STAGE_OK)


def search_for(name: str, budget: int = 6, parallel: int = 1, seed: int = 0):  # type: ignore[no-untyped-def]
    tree = Tree.with_reference("class Model: ...", ok(1.0))
    info = TaskInfo(name, "class Model: ...", "cpu_cpp")
    return make_task_search(name, tree, SearchConfig(budget=budget, parallel=parallel, seed=seed), AgentConfig(),
                            info)


def step(text: str) -> AgentResult:
    return AgentResult(source=text, instruction="fuse")


def test_parallel_expansions_take_distinct_nodes_and_respect_the_width() -> None:
    s = search_for("t", budget=10, parallel=3)
    first = s.next()
    assert first is not None and first.parent == 0 and first.request.mode == MODE_IMPROVE
    assert s.next() is None  # the root is the only node, and it is being expanded
    s.add(first, step("a"), ok(2.0))
    s.add(s.next() or pytest.fail("expected work"), step("b"), ok(1.5))
    tickets = [s.next(), s.next(), s.next()]
    assert all(t is not None for t in tickets) and s.next() is None  # three in flight: the width
    assert len({t.parent for t in tickets if t is not None}) == 3


def test_the_budget_counts_work_in_flight() -> None:
    s = search_for("t", budget=2, parallel=4)
    a = s.next()
    assert a is not None
    s.add(a, step("a"), ok(2.0))
    b, c = s.next(), s.next()
    assert b is not None and c is None  # 1 attempt + 1 in flight = the budget
    assert not s.finished
    s.add(b, step("b"), ok(3.0))
    assert s.finished and s.next() is None


def test_a_released_ticket_frees_its_node_and_a_lost_parent_is_refused() -> None:
    s = search_for("t", budget=5, parallel=1)
    a = s.next()
    assert a is not None and s.next() is None
    s.release(a)
    again = s.next()
    assert again is not None and again.parent == 0
    stranger = Ticket("t", 99, Request(replace(again.request.node, id=7), MODE_IMPROVE, "plan+code", {}))
    with pytest.raises(UnknownParent):
        s.add(stranger, step("x"), ok(1.0))


def test_next_many_spreads_over_tasks_and_the_sink_sees_every_node() -> None:
    seen: list[tuple[str, int]] = []
    memory = TreeMemory(sink=lambda task, node, _step: seen.append((task, node.id)))
    for name in ("a", "b", "c"):
        memory.open(search_for(name, budget=2, parallel=1))
    tickets = memory.next_many(10)
    assert sorted(t.task for t in tickets) == ["a", "b", "c"]  # one each: each task's width is 1
    for t in tickets:
        memory.add(t, step(t.task), ok(2.0))
    assert sorted(seen) == [("a", 1), ("b", 1), ("c", 1)]
    assert len(memory.next_many(2)) == 2 and memory.unfinished() == ["a", "b", "c"]
    with pytest.raises(ValueError):
        memory.open(search_for("a"))


def test_one_in_flight_is_the_sequential_search_step_for_step() -> None:
    """The same seed and results give the same selections as the paper's loop (one expansion at a time)."""
    runs = []
    for _ in range(2):
        s = search_for("t", budget=8, parallel=1, seed=3)
        order = []
        while (t := s.next()) is not None:
            order.append(t.parent)
            s.add(t, step(f"n{len(order)}"), ok(1.0 + (len(order) % 3)))
        runs.append(order)
    assert runs[0] == runs[1] and len(runs[0]) == 8


def test_a_ticket_whose_node_id_now_names_another_node_is_refused() -> None:
    """A memory restarted from its rows may give a lost node's id to another node: a ticket cut from the lost one
    must not attach its child there."""
    s = search_for("t", budget=5, parallel=1)
    a = s.next()
    assert a is not None
    s.add(a, step("a"), ok(2.0))
    b = s.next()
    assert b is not None and b.parent == 1
    lost = replace(b, request=replace(b.request, node=replace(b.request.node, source="another node 1")))
    with pytest.raises(UnknownParent):
        s.add(lost, step("x"), ok(1.0))


def test_tickets_from_before_a_restart_never_take_the_budget_of_those_issued_since() -> None:
    """A restarted memory rebuilt from the rows knows nothing of the tickets in flight: it issues its own for the
    room it sees. An old ticket coming back is accepted only while the budget has room beside those: every task
    ends with its budget, never more (a lost worker node's candidates, sent again, came back after the new ones)."""
    before = search_for("t", budget=3, parallel=2)
    a = before.next()
    assert a is not None
    before.add(a, step("a"), ok(2.0))
    old = [before.next(), before.next()]  # in flight when the memory dies
    assert all(t is not None for t in old)
    after = make_task_search("t", Tree.from_records(before.tree.to_records()), SearchConfig(budget=3, parallel=2),
                             AgentConfig(), TaskInfo("t", "class Model: ...", "cpu_cpp"))
    new = [after.next(), after.next()]
    assert all(t is not None for t in new)
    with pytest.raises(StaleTicket):  # its place went to the new ones
        after.add(old[0], step("old"), ok(1.0))  # type: ignore[arg-type]
    for t in new:
        after.add(t, step("new"), ok(1.0))  # type: ignore[arg-type]
    assert after.tree.evaluated == 3 and after.finished
    other = make_task_search("t", Tree.from_records(before.tree.to_records()), SearchConfig(budget=3, parallel=2),
                             AgentConfig(), TaskInfo("t", "class Model: ...", "cpu_cpp"))
    other.add(old[1], step("old"), ok(1.0))  # type: ignore[arg-type]  # room left: accepted
    assert other.tree.evaluated == 2


def test_a_slim_ticket_carries_no_windows_and_is_added_alike() -> None:
    s = search_for("t", budget=5, parallel=1)
    a = s.next()
    assert a is not None and a.request.windows
    slim = a.slim()
    assert slim.request.windows == {} and (slim.task, slim.id, slim.parent) == (a.task, a.id, a.parent)
    node = s.add(slim, step("a"), ok(2.0))
    assert node.parent == 0 and s.tree.evaluated == 1 and not s.in_flight


def _next_many_from_scratch(memory: TreeMemory, limit: int, exclude: set[str]) -> list[Ticket]:
    """What next_many hands out, by its definition: every task in the order opened, as long as each gives work."""
    out: list[Ticket] = []
    for name, search in memory.searches.items():
        if name in exclude:
            continue
        while len(out) < limit and not search.finished and (ticket := search.next()) is not None:
            out.append(ticket)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_next_many_walks_only_open_searches_and_hands_out_what_the_definition_does(seed: int) -> None:
    """next_many scanned every task on every call (O(tasks) at 2,500 tasks); it now walks the searches not known
    to be finished and stops at ``limit``. Two memories, driven alike, one asked the old way, agree throughout."""
    import random

    rng = random.Random(seed)
    names = [f"t{i}" for i in range(30)]

    def memory() -> TreeMemory:
        m = TreeMemory()
        for i, name in enumerate(names):
            m.open(search_for(name, budget=1 + i % 4, parallel=1 + i % 3, seed=seed))
        return m

    fast, slow = memory(), memory()
    in_flight: list[tuple[Ticket, Ticket]] = []
    for _ in range(400):
        if in_flight and rng.random() < 0.5:
            a, b = in_flight.pop(rng.randrange(len(in_flight)))
            speedup = rng.choice([0.5, 1.5, 3.0])
            if rng.random() < 0.1:
                fast.release(a)
                slow.release(b)
            else:
                fast.add(a, step(f"s{a.id}"), ok(speedup))
                slow.add(b, step(f"s{b.id}"), ok(speedup))
            continue
        limit, exclude = rng.randrange(1, 8), set(rng.sample(names, rng.randrange(3)))
        expected = _next_many_from_scratch(slow, limit, exclude)
        got = fast.next_many(limit, exclude)
        assert [(t.task, t.parent) for t in got] == [(t.task, t.parent) for t in expected]
        in_flight += list(zip(got, expected, strict=True))
        assert fast.unfinished() == slow.unfinished()
    while in_flight:
        a, b = in_flight.pop()
        fast.add(a, step("x"), ok(2.0))
        slow.add(b, step("x"), ok(2.0))
    while got := fast.next_many(50):  # to the end of every search
        for t in got:
            fast.add(t, step("y"), ok(2.0))
    assert fast.unfinished() == [] and fast._open == {}


def test_a_task_at_its_asked_share_of_the_speed_of_light_takes_no_more_work() -> None:
    """``stop_at_sol`` (the Ray memory and the local loop share this): once the best candidate runs at that share of
    the task's speed of light, nothing new is handed out and the search is finished, with budget left; work already
    in flight still comes back."""
    tree = Tree.with_reference("class Model: ...", ok(1.0))
    s = make_task_search("t", tree, SearchConfig(budget=10, parallel=2, stop_at_sol=0.8), AgentConfig(),
                         TaskInfo("t", "class Model: ...", "cpu_cpp"))
    first, second = s.next(), None
    assert first is not None
    s.add(first, step("a"), replace(ok(2.0), sol_ms=0.3, sol_fraction=0.6))  # not yet near
    second, third = s.next(), s.next()
    assert second is not None and third is not None and not s.finished
    s.add(second, step("b"), replace(ok(3.0), sol_ms=0.3, sol_fraction=0.9))  # the best, and near enough
    assert s.next() is None and not s.finished  # the third is still in flight
    s.add(third, step("c"), ok(1.2))
    assert s.finished and tree.evaluated == 3 < s.budget
