"""The debug agent: fix a failed candidate, keeping the intent of the instruction that produced it."""

from __future__ import annotations

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.agents.call import ask, usages
from stark_ray.agents.candidate import candidate_from
from stark_ray.config import AgentConfig
from stark_ray.llm.base import LLMClient, Message
from stark_ray.prompts.messages import PromptTooLarge, debug_messages
from stark_ray.records import Node

ROLE = "debug"


def debug_instruction(node: Node) -> str:
    """What the new node records: ``debug: fix <stage> failure of node N`` plus the intent it keeps."""
    head = f"debug: fix {node.result.stage} failure of node {node.id}"
    intent = node.instruction.strip()
    return f"{head}\nintent: {intent}" if intent else head


def debug(client: LLMClient, cfg: AgentConfig, task: TaskInfo, node: Node, window: str,
          prompt_chars: int) -> AgentResult:
    """Ask for a fixed version of ``node.source`` given its error and log excerpt (``window``: the rendered context
    window). Never raises."""
    instruction = debug_instruction(node)
    try:
        system, user = debug_messages(task, node, window, prompt_chars)
    except PromptTooLarge as e:
        return AgentResult(None, instruction, None, str(e))
    reply = ask(client, cfg, ROLE, system, [Message("user", user)])
    if reply.error is not None:
        return AgentResult(None, instruction, None, reply.error, usages(reply))
    source, error = candidate_from(ROLE, reply)
    return AgentResult(source, instruction, None, error, usages(reply))
