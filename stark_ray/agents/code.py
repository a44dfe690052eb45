"""The code agent: resolve every anchor of a validated plan into a complete candidate module.

:func:`plan_and_code` is the STARK "improve" step: plan agent, then code agent.
"""

from __future__ import annotations

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.agents.call import ask, usages
from stark_ray.agents.candidate import candidate_from
from stark_ray.agents.plan import PlanStep, plan
from stark_ray.config import AgentConfig
from stark_ray.llm.base import LLMClient, Message
from stark_ray.prompts.messages import PromptTooLarge, code_messages
from stark_ray.records import Node

ROLE = "code"


def code(client: LLMClient, cfg: AgentConfig, task: TaskInfo, node: Node, plan_step: PlanStep,
         window: str, prompt_chars: int) -> AgentResult:
    """Implement ``plan_step`` on ``node``. Output that keeps an anchor or lacks ``ModelNew`` is rejected."""
    instruction = plan_step.instruction_text()
    if not plan_step.ok or plan_step.scaffold is None:
        return AgentResult(None, instruction, plan_step.scaffold, plan_step.error or "plan: no valid plan")
    try:
        system, user = code_messages(task, node, plan_step.scaffold, plan_step.instructions, window, prompt_chars,
                                     plan_step.analysis)
    except PromptTooLarge as e:
        return AgentResult(None, instruction, plan_step.scaffold, str(e))
    reply = ask(client, cfg, ROLE, system, [Message("user", user)])
    if reply.error is not None:
        return AgentResult(None, instruction, plan_step.scaffold, reply.error, usages(reply))
    source, error = candidate_from(ROLE, reply)
    return AgentResult(source, instruction, plan_step.scaffold, error, usages(reply))


def plan_and_code(client: LLMClient, cfg: AgentConfig, task: TaskInfo, node: Node, plan_window: str,
                  code_window: str, prompt_chars: int) -> AgentResult:
    """Plan agent then code agent (each given its rendered context window); the result carries the scaffold, the
    joined instructions, both usages."""
    step = plan(client, cfg, task, node, plan_window, prompt_chars)
    if not step.ok:
        return AgentResult(None, step.instruction_text(), step.scaffold, step.error, list(step.usage))
    result = code(client, cfg, task, node, step, code_window, prompt_chars)
    result.usage = [*step.usage, *result.usage]
    return result
