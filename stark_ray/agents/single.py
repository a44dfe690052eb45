"""The single agent of the ablation: one prompt plans, codes and debugs.

A failed node gets a fix, any other node an optimization. The reply carries a ``PLAN: ...`` line and the
complete module; a missing PLAN line is tolerated (recorded as such), a missing or broken module is not.
"""

from __future__ import annotations

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.agents.call import ask, usages
from stark_ray.agents.candidate import candidate_from
from stark_ray.config import AgentConfig
from stark_ray.llm.base import LLMClient, Message
from stark_ray.prompts.fences import normalise_newlines, strip_thinking
from stark_ray.prompts.messages import PromptTooLarge, single_messages
from stark_ray.prompts.parser import extract_plan_line
from stark_ray.records import Node

ROLE = "single"
NO_PLAN = "(no PLAN line given)"


def _instruction(node: Node, plan_line: str | None) -> str:
    plan = plan_line or NO_PLAN
    if node.is_root or node.result.accepted:
        return f"single: {plan}"
    return f"single: fix {node.result.stage} failure of node {node.id}: {plan}"


def single(client: LLMClient, cfg: AgentConfig, task: TaskInfo, node: Node, window: str,
           prompt_chars: int) -> AgentResult:
    """Fix ``node`` if it failed, else optimize it, in one call (``window``: the rendered context window). Never
    raises."""
    try:
        system, user = single_messages(task, node, window, prompt_chars)
    except PromptTooLarge as e:
        return AgentResult(None, _instruction(node, None), None, str(e))
    reply = ask(client, cfg, ROLE, system, [Message("user", user)])
    if reply.error is not None or reply.text is None:
        return AgentResult(None, _instruction(node, None), None, reply.error or "single: empty reply",
                           usages(reply))
    answer, _ = strip_thinking(normalise_newlines(reply.text))
    instruction = _instruction(node, extract_plan_line(answer))
    source, error = candidate_from(ROLE, reply)
    return AgentResult(source, instruction, None, error, usages(reply))
