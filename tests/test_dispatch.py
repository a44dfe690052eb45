"""Which evaluator times which candidate (stark_ray.run.dispatch): the home evaluator first, then the least busy peer
of its device class with room; nothing else; a candidate with no room waits, in order."""

from __future__ import annotations

from stark_ray.run.dispatch import EvalDispatch


def test_tasks_get_homes_round_robin_and_peers_of_their_class() -> None:
    d: EvalDispatch[str] = EvalDispatch(window=2)
    d.place(["a", "b", "c", "d"], 3)
    assert d.home == {"a": 0, "b": 1, "c": 2, "d": 0}
    assert d.peers == {"a": [0], "b": [1], "c": [2], "d": [0]}  # until the classes are known: home only
    d.share(["H200", "A100", "H200"])
    assert d.peers == {"a": [0, 2], "b": [1], "c": [2, 0], "d": [0, 2]}


def test_the_least_busy_peer_with_room_takes_a_candidate_and_the_rest_wait_in_order() -> None:
    d: EvalDispatch[str] = EvalDispatch(window=2)
    d.place(["a", "b"], 2)
    d.share(["H200", "H200"])
    for item in ["a1", "a2", "b1", "a3", "a4", "b2"]:
        d.put(item[0], item)
    assert d.ready() == [(0, "a1"), (1, "a2"), (1, "b1"), (0, "a3")]  # home on a tie, else the least busy
    assert [item for _, item in d.queue] == ["a4", "b2"] and d.running == 4
    assert d.ready() == []  # no room anywhere
    d.done(1)
    assert d.ready() == [(1, "a4")]  # the oldest waiting one first
    d.done(0)
    assert d.ready() == [(0, "b2")]
    assert d.load == [2, 2] and not d.queue


def test_a_task_never_leaves_its_device_class() -> None:
    d: EvalDispatch[str] = EvalDispatch(window=1)
    d.place(["a", "b"], 2)
    d.share(["H200", "A100"])
    d.put("a", "a1")
    d.put("a", "a2")
    assert d.ready() == [(0, "a1")]  # the A100 is idle, but a's reference was timed on an H200
    assert [item for _, item in d.queue] == ["a2"]


def test_a_restarting_evaluator_gets_nothing_until_it_is_back() -> None:
    d: EvalDispatch[str] = EvalDispatch(window=2)
    d.place(["a", "b"], 2)
    d.share(["H200", "H200"])
    d.pause(0)  # evaluator 0 died: Ray restarts it
    d.put("a", "a1")
    d.put("a", "a2")
    d.put("a", "a3")
    assert d.ready() == [(1, "a1"), (1, "a2")]  # its peer takes what it has room for; the rest wait
    assert [item for _, item in d.queue] == ["a3"]
    d.resume(0)
    assert d.ready() == [(0, "a3")]
