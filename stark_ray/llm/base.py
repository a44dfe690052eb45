"""The provider protocol every agent talks to.

An agent builds an :class:`LLMRequest` (its role, a system prompt, the conversation so far, a temperature) and
gets back a :class:`Completion` with the text and an :class:`~stark_ray.records.LLMUsage`. Providers raise
:class:`LLMError` for failures that survive the retries (``llm/retry.py``); agents turn that into a failed
attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from stark_ray.records import LLMUsage

Role = Literal["plan", "code", "debug", "single"]


@dataclass(frozen=True)
class Message:
    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True)
class LLMRequest:
    role: str  # the agent role: plan | code | debug | single
    system: str
    messages: tuple[Message, ...]
    temperature: float
    max_tokens: int = 8192

    def prompt_text(self) -> str:
        """A canonical flattening of the request, used to compare a replayed prompt with the recorded one."""
        parts = [f"[system]\n{self.system}"] + [f"[{m.role}]\n{m.content}" for m in self.messages]
        return "\n".join(parts)


@dataclass
class Completion:
    text: str
    usage: LLMUsage
    truncated: bool = False  # the reply hit max_tokens
    extra: dict[str, object] = field(default_factory=dict)
    failed_tries: list[LLMUsage] = field(default_factory=list)  # tries before this one that failed (llm/retry.py)


# Failures that no retry and no other prompt can fix: a run stops on them instead of spending its budget.
FATAL_KINDS = frozenset({"auth", "permission", "not_found", "billing", "unreachable"})


class LLMError(Exception):
    """A call that failed for good (after its retries). ``kind`` is a short machine-readable tag."""

    def __init__(self, message: str, kind: str = "error", transient: bool = False,
                 usage: LLMUsage | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.transient = transient
        self.usage = usage
        self.retry_after = retry_after  # seconds the server asked to wait before another try
        self.failed_tries: list[LLMUsage] = []  # the tries before this last one, all failed (llm/retry.py)

    @property
    def fatal(self) -> bool:
        """The provider will refuse every call (bad key, no access, unknown model, no credit, an endpoint that
        cannot be reached)."""
        return self.kind in FATAL_KINDS


class ConfigError(Exception):
    """A user mistake in provider settings (missing key, unknown provider, bad cassette): one clear line."""


@runtime_checkable
class LLMClient(Protocol):
    provider: str
    model: str

    def complete(self, request: LLMRequest) -> Completion: ...
