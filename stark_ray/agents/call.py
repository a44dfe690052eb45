"""One LLM call for an agent: build the request with the role's temperature, never raise on LLM failure."""

from __future__ import annotations

from dataclasses import dataclass

from stark_ray.config import AgentConfig
from stark_ray.llm.base import LLMClient, LLMError, LLMRequest, Message
from stark_ray.records import LLMUsage, one_line


@dataclass(frozen=True)
class Reply:
    """The text of a reply, or the one-line error of a failed call; usage when the provider reported it."""

    text: str | None
    usage: LLMUsage | None
    error: str | None = None
    truncated: bool = False
    tries: tuple[LLMUsage, ...] = ()  # the failed tries before this call's last one (each its own row)

    def usages(self) -> list[LLMUsage]:
        """Every try of this call: the failed ones, then the last."""
        return [*self.tries, *([self.usage] if self.usage is not None else [])]


def request(cfg: AgentConfig, role: str, system: str, messages: list[Message]) -> LLMRequest:
    return LLMRequest(role=role, system=system, messages=tuple(messages), temperature=cfg.temperature(role),
                      max_tokens=cfg.max_tokens)


def ask(client: LLMClient, cfg: AgentConfig, role: str, system: str, messages: list[Message]) -> Reply:
    """Call the model once. LLMError (and any other exception from the client) becomes ``Reply.error``, except
    a fatal one (bad key, unknown model, ...), which is raised: every further call would fail the same way."""
    try:
        completion = client.complete(request(cfg, role, system, messages))
    except LLMError as exc:
        if exc.fatal:
            raise
        error = f"{role}: LLM call failed ({exc.kind}): {one_line(str(exc))}"
        return Reply(None, exc.usage or failed_usage(client, role, error), error, tries=tuple(exc.failed_tries))
    except Exception as exc:  # a provider bug must not end the search
        error = f"{role}: LLM call failed ({type(exc).__name__}): {one_line(str(exc))}"
        return Reply(None, failed_usage(client, role, error), error)
    text = completion.text if isinstance(completion.text, str) else ""
    return Reply(text, completion.usage, None, bool(completion.truncated),
                 tuple(getattr(completion, "failed_tries", ())))


def failed_usage(client: LLMClient, role: str, error: str) -> LLMUsage:
    """Every call leaves a usage record, also one whose provider reported none (it shows in llm_calls)."""
    return LLMUsage(role=role, provider=str(getattr(client, "provider", "?")),
                    model=str(getattr(client, "model", "?")), ok=False, error=error)


def parse_error(role: str, error: str, reply: Reply) -> str:
    """``role: error`` on one line, noting when the reply hit max_tokens."""
    hint = " (the reply hit max_tokens)" if reply.truncated else ""
    return f"{role}: {one_line(error)}{hint}"


def usages(*replies: Reply) -> list[LLMUsage]:
    return [u for r in replies for u in r.usages()]
