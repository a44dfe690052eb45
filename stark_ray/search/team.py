"""Who expands a node: the STARK team (plan + code, debug) or the single agent of the ablation.

A team turns (tree, node) into a :class:`Request` — the node and the context windows its agents will see,
rendered to text under the prompt caps where the tree is — and runs a request into an :class:`AgentResult`. The
two halves are apart so that the tree can stay with its owner (the search loop, or the TreeMemory actor) while
the agents run anywhere, holding no state; a request carries only what its prompts show (the window's nodes'
sources and logs stay with the tree), so its size is bounded by ``prompt_chars`` and the selected node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stark_ray.agents import code as code_agent
from stark_ray.agents import debug as debug_agent
from stark_ray.agents import single as single_agent
from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.llm.base import LLMClient
from stark_ray.prompts.messages import window_room, window_section
from stark_ray.records import AGENT_DEBUG, AGENT_PLAN_CODE, AGENT_SINGLE, Node
from stark_ray.search.tree import Tree
from stark_ray.search.windows import code_window, debug_window, plan_window


@dataclass(frozen=True)
class Request:
    """One expansion, cut loose from the tree: the node, what the agents will see of the tree (their context
    windows, built when the node was selected), and who answers. Running it needs no tree (a stateless task)."""

    node: Node
    mode: str  # MODE_IMPROVE (a correct node: plan + code) | MODE_REPAIR (a failed one: debug)
    agent: str  # recorded on the child: plan+code, debug or single
    windows: dict[str, str]  # role -> the rendered window: plan/code for an improvement, debug (or single) for a repair


MODE_IMPROVE, MODE_REPAIR = "improve", "repair"


class Team(Protocol):
    def request(self, tree: Tree, node: Node) -> Request: ...
    def run(self, request: Request) -> AgentResult: ...


@dataclass
class _Members:
    """What every team holds. With ``feedback=False`` (Best-of-K, the ``ma_only`` ablation) each window holds
    only the node and the root, so samples do not learn from each other."""

    client: LLMClient
    agents: AgentConfig
    search: SearchConfig
    task: TaskInfo
    feedback: bool = True

    def nodes(self, role: str, tree: Tree, node: Node) -> list[Node]:
        """The nodes of a ``role`` window (``plan``, ``code`` or ``debug``)."""
        if not self.feedback:
            return [node] if node.is_root else [node, tree.root]
        if role == "plan":
            return plan_window(tree, node, self.search.top_r)
        return code_window(tree, node) if role == "code" else debug_window(tree, node)

    def window(self, role: str, tree: Tree, node: Node, shown_as: str | None = None) -> str:
        """The ``role`` window rendered for the prompt of ``shown_as`` (default: the same role), within both caps."""
        s = self.search
        room = window_room(shown_as or role, self.task, node, s.window_chars, s.prompt_chars, s.prompt_goal)
        return window_section(self.task, node, self.nodes(role, tree, node), room)


@dataclass
class StarkTeam(_Members):
    """Plan agent + code agent for correct nodes, debug agent for failed ones."""

    def request(self, tree: Tree, node: Node) -> Request:
        if node.accepted:
            return Request(node, MODE_IMPROVE, AGENT_PLAN_CODE, {"plan": self.window("plan", tree, node),
                                                                 "code": self.window("code", tree, node)})
        return Request(node, MODE_REPAIR, AGENT_DEBUG, {"debug": self.window("debug", tree, node)})

    def run(self, request: Request) -> AgentResult:
        w = request.windows
        if request.mode == MODE_IMPROVE:
            return code_agent.plan_and_code(self.client, self.agents, self.task, request.node, w["plan"], w["code"],
                                            self.search.prompt_chars)
        return debug_agent.debug(self.client, self.agents, self.task, request.node, w["debug"],
                                 self.search.prompt_chars)


@dataclass
class SingleAgentTeam(_Members):
    """The ``search_agent`` ablation: one agent plans, codes and debugs in one prompt. With
    ``feedback=False`` (``--policy best_of_k``) it is KernelBench's sampling agent: independent samples."""

    def request(self, tree: Tree, node: Node) -> Request:
        mode = MODE_IMPROVE if node.accepted else MODE_REPAIR
        role = "plan" if node.accepted else "debug"
        return Request(node, mode, AGENT_SINGLE, {"single": self.window(role, tree, node, shown_as="single")})

    def run(self, request: Request) -> AgentResult:
        return single_agent.single(self.client, self.agents, self.task, request.node, request.windows["single"],
                                   self.search.prompt_chars)


def make_team(client: LLMClient, agents: AgentConfig, search: SearchConfig, task: TaskInfo) -> Team:
    """``best_of_k`` and ``ma_only`` draw independent samples: their windows carry no feedback."""
    feedback = search.ablation != "ma_only" and search.policy != "best_of_k"
    if search.ablation == "search_agent":
        return SingleAgentTeam(client, agents, search, task, feedback=feedback)
    return StarkTeam(client, agents, search, task, feedback=feedback)
