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
from stark_ray.prompts.messages import PromptTooLarge, plan_messages, plan_retry_message
from stark_ray.prompts.parser import parse_plan
from stark_ray.records import LLMUsage, Node, excerpt

ROLE = "plan"
MAX_ASKS = 2  # the first ask and one re-ask
REASK_QUOTE_CHARS = 16_000  # of a rejected reply, quoted back with the re-ask (its head and tail): a valid plan
# is the parent's code with anchors and instructions, so a reply far longer is mostly what was wrong


def reask_quote(text: str, parent_source: str) -> str:
    """The rejected reply as the re-ask quotes it: whole when it is about as long as a plan can be, else its head
    and tail (a 1 MB reply made a 1 MB re-ask)."""
    return excerpt(text, max(REASK_QUOTE_CHARS, 3 * len(parent_source)))


@dataclass
class PlanStep:
    """A validated plan (``error`` is None) or the reason there is none."""

    scaffold: str | None
    instructions: dict[int, str] = field(default_factory=dict)
    usage: list[LLMUsage] = field(default_factory=list)
    error: str | None = None
    warnings: tuple[str, ...] = ()
    asks: int = 0  # LLM calls made
    analysis: str = ""  # the plan's analysis (what limits the candidate now), passed on to the code agent

    @property
    def ok(self) -> bool:
        return self.error is None and self.scaffold is not None and bool(self.instructions)

    def instruction_text(self) -> str:
        """The numbered instructions joined, as recorded on the new node."""
        return "\n".join(f"{k}. {self.instructions[k].strip()}" for k in sorted(self.instructions))


def plan(client: LLMClient, cfg: AgentConfig, task: TaskInfo, node: Node, window: str,
         prompt_chars: int) -> PlanStep:
    """Ask for a grounded instruction for ``node`` (``window``: the rendered context window); re-ask once if the
    scaffold check fails. Never raises."""
    try:
        system, user = plan_messages(task, node, window, prompt_chars)
    except PromptTooLarge as e:
        return PlanStep(None, {}, [], str(e))
    messages = [Message("user", user)]
    usage: list[LLMUsage] = []
    error = "no reply"
    scaffold: str | None = None
    instructions: dict[int, str] = {}
    for asks in range(1, MAX_ASKS + 1):
        reply = ask(client, cfg, ROLE, system, messages)
        usage += reply.usages()
        if reply.error is not None or reply.text is None:
            return PlanStep(scaffold, instructions, usage, reply.error or "plan: empty reply", asks=asks)
        if reply.truncated:  # instructions cut short read as complete ones: not a plan to act on
            return PlanStep(None, {}, usage, "plan: the reply hit the token limit (max_tokens) and was cut",
                            asks=asks)
        outcome = parse_plan(reply.text, node.source)
        if outcome.ok:
            return PlanStep(outcome.scaffold, outcome.instructions, usage, None, outcome.warnings, asks,
                            outcome.analysis)
        scaffold, instructions = outcome.scaffold, outcome.instructions
        error = parse_error(ROLE, outcome.error or "invalid plan", reply)
        if asks < MAX_ASKS:
            messages += [Message("assistant", reask_quote(reply.text, node.source)),
                         Message("user", plan_retry_message(error.removeprefix(f"{ROLE}: "), node))]
    return PlanStep(scaffold, instructions, usage, f"{error} (still invalid after {MAX_ASKS} asks)",
                    asks=MAX_ASKS)
