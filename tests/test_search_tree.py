from __future__ import annotations

import pytest
from search_helpers import add, bad, hand_built, ok, reference_tree

from stark_ray.records import AGENT_DEBUG, AGENT_SINGLE, STAGE_PARSE, Node
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


def test_debug_chain_counts_consecutive_repairs_whoever_wrote_them() -> None:
    t = reference_tree()
    a = add(t, 0, bad())
    b = add(t, a, bad(), AGENT_DEBUG)
    c = add(t, b, bad(), AGENT_DEBUG)
    assert [t.debug_chain(x) for x in (a, b, c)] == [0, 1, 2]
    # the single agent of the search_agent ablation repairs too: its fixes count the same
    d = add(t, 0, bad(), AGENT_SINGLE)
    e = add(t, d, bad(), AGENT_SINGLE)
    f = add(t, e, ok(3.0), AGENT_SINGLE)
    g = add(t, f, bad(), AGENT_SINGLE)  # an improvement of a correct node starts a new chain
    assert [t.debug_chain(x) for x in (d, e, f, g)] == [0, 1, 2, 0]


def test_rebuild_rejects_inconsistent_records() -> None:
    recs = hand_built().to_records()
    with pytest.raises(ValueError, match="exactly once"):
        Tree.from_records(recs[:3] + recs[4:])  # a lost row
    bad_depth = [dict(r) for r in recs]
    bad_depth[9]["depth"] = 7
    with pytest.raises(ValueError, match="depth"):
        Tree.from_records(bad_depth)


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


def test_memo_keeps_a_value_until_a_node_is_attached() -> None:
    t = reference_tree()
    calls: list[int] = []

    def size(tree: Tree) -> int:
        calls.append(len(tree))
        return len(tree)

    assert t.memo("size", size) == 1 and t.memo("size", size) == 1 and calls == [1]
    add(t, 0, ok(5.0))
    assert t.memo("size", size) == 2 and calls == [1, 2]
    assert t.memo("other", size) == 2 and calls == [1, 2, 2]  # one value per key
