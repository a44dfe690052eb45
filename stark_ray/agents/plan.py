"""The plan agent: a grounded instruction — the parent code with span anchors, one instruction per anchor.

The reply is validated (:func:`stark_ray.prompts.parser.parse_plan`) before anything else runs. On a
rejected scaffold the agent asks once more in the same conversation (its reply, then the error), and gives up
after that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stark_ray.agents.base import TaskInfo
from stark_ray.agents.call import ask, parse_error
from stark_ray.config import AgentConfig
from stark_ray.llm.base import LLMClient, Message
from stark_ray.prompts.messages import plan_messages, plan_retry_message
from stark_ray.prompts.parser import parse_plan
from stark_ray.records import LLMUsage, Node

ROLE = "plan"
MAX_ASKS = 2  # the first ask and one re-ask


@dataclass
class PlanStep:
    """A validated plan (``error`` is None) or the reason there is none."""

    scaffold: str | None
    instructions: dict[int, str] = field(default_factory=dict)
    usage: list[LLMUsage] = field(default_factory=list)
    error: str | None = None
    warnings: tuple[str, ...] = ()
    asks: int = 0  # LLM calls made

    @property
    def ok(self) -> bool:
        return self.error is None and self.scaffold is not None and bool(self.instructions)

    def instruction_text(self) -> str:
        """The numbered instructions joined, as recorded on the new node."""
        return "\n".join(f"{k}. {self.instructions[k].strip()}" for k in sorted(self.instructions))


def plan(client: LLMClient, cfg: AgentConfig, task: TaskInfo, node: Node, window: list[Node],
         window_chars: int) -> PlanStep:
    """Ask for a grounded instruction for ``node``; re-ask once if the scaffold check fails. Never raises."""
    system, user = plan_messages(task, node, window, window_chars)
    messages = [Message("user", user)]
    usage: list[LLMUsage] = []
    error = "no reply"
    scaffold: str | None = None
    instructions: dict[int, str] = {}
    for asks in range(1, MAX_ASKS + 1):
        reply = ask(client, cfg, ROLE, system, messages)
        if reply.usage is not None:
            usage.append(reply.usage)
        if reply.error is not None or reply.text is None:
            return PlanStep(scaffold, instructions, usage, reply.error or "plan: empty reply", asks=asks)
        outcome = parse_plan(reply.text, node.source)
        if outcome.ok:
            return PlanStep(outcome.scaffold, outcome.instructions, usage, None, outcome.warnings, asks)
        scaffold, instructions = outcome.scaffold, outcome.instructions
        error = parse_error(ROLE, outcome.error or "invalid plan", reply)
        if asks < MAX_ASKS:
            messages += [Message("assistant", reply.text),
                         Message("user", plan_retry_message(error.removeprefix(f"{ROLE}: "), node))]
    return PlanStep(scaffold, instructions, usage, f"{error} (still invalid after {MAX_ASKS} asks)",
                    asks=MAX_ASKS)
