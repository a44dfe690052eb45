"""A prompt stays under ``prompt_chars``, fixed parts included, and an agent request carries the rendered windows
(what the prompts show), not the window's nodes with their whole sources and logs."""

from __future__ import annotations

import pickle

import pytest

from stark_ray.agents import code as code_agent
from stark_ray.agents import debug as debug_agent
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.prompts.messages import cut_window, window_room
from stark_ray.search.team import MODE_IMPROVE, MODE_REPAIR, make_team
from stark_ray.search.tree import Tree
from tests.test_agents import TASK, ScriptedClient, code_reply, deep_tree, plan_reply


def big_tree(n: int = 120, source_chars: int = 40_000) -> Tree:
    """test_agents' deep tree as a Tree: large candidates (40 kB of code each), long logs on the failed ones."""
    return Tree.from_records(node.to_record() for node in deep_tree(n, source_chars))


def test_a_request_carries_rendered_windows_of_bounded_size() -> None:
    """It carried every window member with its full source and log: about 1 MB per call on a large tree."""
    tree = big_tree()
    search = SearchConfig(window_chars=24_000, prompt_chars=100_000)
    team = make_team(None, AgentConfig(), search, TASK)  # type: ignore[arg-type]  # windows only
    node = next(n for n in tree.nodes.values() if n.accepted and n.id > 50)
    request = team.request(tree, node)
    assert request.mode == MODE_IMPROVE and set(request.windows) == {"plan", "code"}
    assert all(isinstance(text, str) and len(text) <= search.window_chars for text in request.windows.values())
    size = len(pickle.dumps(request))
    members = sum(len(n.source) + len(n.result.log) for n in tree.nodes.values())
    assert size <= 2 * search.window_chars + 2 * len(node.source) + 5000, size
    assert members > 20 * size  # what the nodes behind the windows weigh


@pytest.mark.parametrize("prompt_chars", [60_000, 90_000, 140_000])
def test_every_prompt_stays_under_prompt_chars_with_its_fixed_parts(prompt_chars: int) -> None:
    """The window was bounded, the reference, the selected code, the scaffold and the log were not: a selected
    candidate of 40 kB made a plan prompt of 24 kB window + 40 kB code + ..., over any cap."""
    tree = big_tree()
    search = SearchConfig(window_chars=60_000, prompt_chars=prompt_chars)
    team = make_team(None, AgentConfig(), search, TASK)  # type: ignore[arg-type]
    accepted = next(n for n in tree.nodes.values() if n.accepted and n.id > 50)
    failed = next(n for n in tree.nodes.values() if not n.accepted and n.id > 50)
    improve, repair = team.request(tree, accepted), team.request(tree, failed)
    assert improve.mode == MODE_IMPROVE and repair.mode == MODE_REPAIR
    # the scaffold: the selected code with anchors, a little longer than it (more than the reserve is not needed)
    client = ScriptedClient([plan_reply(accepted.source, {1: (3, 5), 2: (9, 11)}), code_reply(), code_reply()])
    result = code_agent.plan_and_code(client, AgentConfig(), TASK, accepted, improve.windows["plan"],
                                      improve.windows["code"], search.prompt_chars)
    debug_agent.debug(client, AgentConfig(), TASK, failed, repair.windows["debug"], search.prompt_chars)
    prompts = [r.messages[0].content for r in client.requests]
    assert result.error is None and len(prompts) == 3
    assert all(len(p) <= prompt_chars for p in prompts), [len(p) for p in prompts]
    assert all("## Node" in p for p in prompts)  # each still shows related attempts


def test_a_prompt_whose_fixed_parts_exceed_the_cap_fails_the_attempt_without_a_call() -> None:
    tree = big_tree(12)
    search = SearchConfig(prompt_chars=30_000)  # below one 40 kB candidate
    team = make_team(None, AgentConfig(), search, TASK)  # type: ignore[arg-type]
    failed = tree.nodes[4]
    request = team.request(tree, failed)
    assert request.windows["debug"] == ""  # no room left for it
    client = ScriptedClient([code_reply()])
    result = debug_agent.debug(client, AgentConfig(), TASK, failed, request.windows["debug"], search.prompt_chars)
    assert client.requests == []
    assert result.source is None and "over the cap of 30,000 (prompt_chars)" in (result.error or "")
    assert "\n" not in (result.error or "")


def test_the_default_caps_leave_ordinary_prompts_as_they_were() -> None:
    """Replays match prompts: with the default prompt_chars a window is rendered under window_chars alone."""
    tree = big_tree(30, 4000)
    search = SearchConfig()
    node = tree.nodes[7]
    for role in ("plan", "code", "debug", "single"):
        assert window_room(role, TASK, node, search.window_chars, search.prompt_chars) == search.window_chars


def test_a_cut_window_keeps_whole_nodes_and_says_so() -> None:
    window = "\n\n".join(f"## Node {i}\n" + "x" * 100 for i in range(10))
    cut = cut_window(window, 400)
    assert len(cut) <= 400 and cut.endswith("(more related attempts omitted to fit the prompt)")
    assert cut.count("## Node") == 3 and "## Node 2\n" + "x" * 100 + "\n\n(more" in cut
    assert cut_window(window, len(window)) == window and cut_window(window, 10) == ""
