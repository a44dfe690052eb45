"""The in-flight cap: fixed by --max-in-flight, else derived from the evaluators and the measured agent and
evaluation times (Little's law with a margin), between a floor and a ceiling."""

from __future__ import annotations

from stark_ray.run.in_flight import CEILING, FLOOR, MARGIN, InFlightCap


def test_a_fixed_cap_is_what_was_asked_whatever_is_measured() -> None:
    cap = InFlightCap(fixed=7, evaluators=16)
    for _ in range(20):
        cap.agent_done(60.0)
        cap.evaluated(1.0)
    assert cap.value == 7 and cap.ceiling == 7


def test_before_any_measurement_the_derived_cap_is_the_floor() -> None:
    cap = InFlightCap(fixed=None, evaluators=8)
    assert cap.value == FLOOR and cap.ceiling == CEILING
    cap.agent_done(30.0)  # no evaluation measured yet
    assert cap.value == FLOOR


def test_slow_llm_calls_and_many_gpus_raise_the_cap_by_littles_law() -> None:
    """With 64 fixed, 20-60 s LLM calls capped a campaign at 1-3 attempts/s whatever the number of GPUs."""
    cap = InFlightCap(fixed=None, evaluators=8)
    for _ in range(50):
        cap.agent_done(40.0)
        cap.evaluated(5.0)
    assert abs(cap.agent_s - 40.0) < 1e-6 and abs(cap.eval_s - 5.0) < 1e-6  # type: ignore[operator]
    assert cap.value == round(8 * (40 + 5) / 5 * MARGIN)  # 108: eight evaluators kept busy
    one_gpu = InFlightCap(fixed=None, evaluators=1, agent_s=40.0, eval_s=5.0)
    assert one_gpu.value == FLOOR  # 14 needed: the floor stands
    huge = InFlightCap(fixed=None, evaluators=256, agent_s=60.0, eval_s=2.0)
    assert huge.value == CEILING


def test_the_averages_follow_a_change_and_ignore_missing_evaluation_times() -> None:
    cap = InFlightCap(fixed=None, evaluators=4, agent_s=5.0, eval_s=5.0)
    cap.evaluated(None)
    cap.evaluated(0.0)
    assert cap.eval_s == 5.0
    for _ in range(40):
        cap.agent_done(50.0)
    assert 49 < cap.agent_s < 50.1  # type: ignore[operator]


def test_the_room_asks_the_memory_once_until_it_may_hold_more() -> None:
    """The driver's flow control (run/room.py): a next_many asks for all the room there is and keeps it; no second
    one while it is out, nor after an answer with less than asked (the memory had no more); an answer that filled
    its ask means there may be more."""
    from stark_ray.run.room import Room

    room = Room(InFlightCap(fixed=4))
    assert room.ask_next() == 4 and room.reserved == 4 and room.free() == 0
    assert room.ask_next() == 0  # one outstanding at most
    room.came_back(4, 1, next_many=True)  # one ticket: the memory had less than asked
    room.working += 1
    assert room.free() == 3 and not room.dirty and room.ask_next() == 0  # nothing unoffered: no question
    room.working -= 1  # its attempt goes back; the add_next asks for the room there is
    assert room.ask_add(wanted=True) == 4 and room.reserved == 4
    room.came_back(4, 4, next_many=False)  # it got all it asked for: there may be more
    room.working += 4
    assert room.dirty and room.ask_next() == 0  # but no room left
    room.working -= 1
    assert room.ask_next() == 1
    assert Room(InFlightCap(fixed=4)).ask_add(wanted=False) == 0  # every task capped: no work asked for
