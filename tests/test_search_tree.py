from __future__ import annotations

from search_helpers import add, bad, hand_built, ok, reference_tree

from stark_ray.records import AGENT_DEBUG, STAGE_PARSE, Node
from stark_ray.search.tree import Tree
from stark_ray.search.windows import code_window, debug_window, plan_window


def ids(nodes: list[Node]) -> list[int]:
    return [n.id for n in nodes]


def test_structure_and_leaderboard() -> None:
    t = hand_built()
    assert t.evaluated == 10
    assert t[9].depth == 3 and t[9].parent == 4
    assert ids(t.siblings(4)) == [5, 6]
    assert ids(t.ancestors(9)) == [4, 1, 0]
    assert sorted(ids(t.descendants(1))) == [4, 5, 6, 8, 9]
    assert ids(t.leaderboard()) == [9, 4, 8, 6, 1, 10, 7, 3]
    assert ids(t.leaderboard(3)) == [9, 4, 8]
    assert t.best() is not None and t.best().id == 9
    assert t.failures() == 2
    assert sorted(ids(t.leaves())) == [6, 7, 8, 9, 10]


def test_reference_is_not_on_the_leaderboard_even_when_fastest() -> None:
    t = reference_tree()
    add(t, 0, ok(20.0))
    assert ids(t.leaderboard()) == [1]  # slower than the reference, but it is the only candidate


def test_debug_chain_counts_consecutive_fixes() -> None:
    t = reference_tree()
    a = add(t, 0, bad())
    b = add(t, a, bad(), AGENT_DEBUG)
    c = add(t, b, bad(), AGENT_DEBUG)
    assert [t.debug_chain(x) for x in (a, b, c)] == [0, 1, 2]


def test_records_round_trip_exactly() -> None:
    t = hand_built()
    add(t, 7, bad(STAGE_PARSE))
    t2 = Tree.from_records(t.to_records())
    assert t2.to_records() == t.to_records()
    assert {n.id: n.children for n in t2} == {n.id: n.children for n in t}
    assert t2[8].result.flags == t[8].result.flags


def test_plan_window_membership() -> None:
    t = hand_built()
    # plan(i) = {i, root} ∪ D(i) ∪ top-r(C)
    assert set(ids(plan_window(t, t[1], top_r=2))) == {1, 0, 4, 5, 6, 9}
    assert set(ids(plan_window(t, t[3], top_r=3))) == {3, 0, 7, 9, 4, 8}
    assert set(ids(plan_window(t, t[0], top_r=0))) == {0, 1, 2, 3}
    assert ids(plan_window(t, t[1], top_r=2))[:2] == [1, 0]


def test_code_window_membership() -> None:
    t = hand_built()
    # code(i) = {i, root} ∪ D(i) ∪ {j : p(j) ∈ S(i)}
    assert set(ids(code_window(t, t[4]))) == {4, 0, 9, 8}  # D(4)={9}; siblings 5, 6 -> children {8}
    assert set(ids(code_window(t, t[1]))) == {1, 0, 4, 5, 6, 10, 7}  # siblings 2, 3 -> {10, 7}
    assert set(ids(code_window(t, t[0]))) == {0, 1, 2, 3}


def test_debug_window_membership() -> None:
    t = hand_built()
    # debug(i) = {i, root} ∪ S(i)
    assert set(ids(debug_window(t, t[5]))) == {5, 0, 4, 6}
    assert set(ids(debug_window(t, t[2]))) == {2, 0, 1, 3}
    assert ids(debug_window(t, t[0])) == [0]


def test_windows_bounded_on_wide_trees() -> None:
    t = reference_tree()
    for _ in range(50):
        add(t, 0, ok(9.0))
    w = code_window(t, t[0], max_nodes=8)
    assert len(w) == 8 and w[0].id == 0
    w = debug_window(t, t[3], max_nodes=5)
    assert ids(w)[:2] == [3, 0] and len(w) == 5
