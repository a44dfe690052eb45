"""Who expands a node: the STARK team (plan + code, debug) or the single agent of the ablation.

A team turns (tree, node) into an :class:`AgentResult`, building the role's context window itself, so the
loop does not care which agents are behind it.
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
from stark_ray.records import AGENT_DEBUG, AGENT_PLAN_CODE, AGENT_SINGLE, Node
from stark_ray.search.tree import Tree
from stark_ray.search.windows import code_window, debug_window, plan_window


class Team(Protocol):
    def improve(self, tree: Tree, node: Node) -> AgentResult: ...
    def repair(self, tree: Tree, node: Node) -> AgentResult: ...
    def agent_name(self, mode: str) -> str: ...


@dataclass
class _Members:
    """What every team holds. With ``feedback=False`` (Best-of-K, the ``ma_only`` ablation) each window holds
    only the node and the root, so samples do not learn from each other."""

    client: LLMClient
    agents: AgentConfig
    search: SearchConfig
    task: TaskInfo
    feedback: bool = True

    def window(self, role: str, tree: Tree, node: Node) -> list[Node]:
        if not self.feedback:
            return [node] if node.is_root else [node, tree.root]
        if role == "plan":
            return plan_window(tree, node, self.search.top_r)
        return code_window(tree, node) if role == "code" else debug_window(tree, node)


@dataclass
class StarkTeam(_Members):
    """Plan agent + code agent for correct nodes, debug agent for failed ones."""

    def improve(self, tree: Tree, node: Node) -> AgentResult:
        return code_agent.plan_and_code(self.client, self.agents, self.task, node, self.window("plan", tree, node),
                                        self.window("code", tree, node), self.search.window_chars)

    def repair(self, tree: Tree, node: Node) -> AgentResult:
        return debug_agent.debug(self.client, self.agents, self.task, node, self.window("debug", tree, node),
                                 self.search.window_chars)

    def agent_name(self, mode: str) -> str:
        return AGENT_PLAN_CODE if mode == "improve" else AGENT_DEBUG


@dataclass
class SingleAgentTeam(_Members):
    """The ``search_agent`` ablation: one agent plans, codes and debugs in one prompt. With
    ``feedback=False`` (``--policy best_of_k``) it is KernelBench's sampling agent: independent samples."""

    def improve(self, tree: Tree, node: Node) -> AgentResult:
        return self._ask(node, self.window("plan", tree, node))

    def repair(self, tree: Tree, node: Node) -> AgentResult:
        return self._ask(node, self.window("debug", tree, node))

    def _ask(self, node: Node, window: list[Node]) -> AgentResult:
        return single_agent.single(self.client, self.agents, self.task, node, window, self.search.window_chars)

    def agent_name(self, mode: str) -> str:
        return AGENT_SINGLE


def make_team(client: LLMClient, agents: AgentConfig, search: SearchConfig, task: TaskInfo) -> Team:
    """``best_of_k`` and ``ma_only`` draw independent samples: their windows carry no feedback."""
    feedback = search.ablation != "ma_only" and search.policy != "best_of_k"
    if search.ablation == "search_agent":
        return SingleAgentTeam(client, agents, search, task, feedback=feedback)
    return StarkTeam(client, agents, search, task, feedback=feedback)
