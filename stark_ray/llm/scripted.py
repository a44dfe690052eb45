"""A provider whose replies are written in advance: per agent role, served in order.

It stands in for a model's *content* only (tests, dry runs, and writing demo cassettes through
``RecordingClient``); everything downstream — parsing, validation, evaluation — is the real machinery.
Token counts are estimated at four characters a token so that usage accounting has something to add up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from stark_ray.llm.base import Completion, LLMError, LLMRequest
from stark_ray.records import LLMUsage

Reply = str | Callable[[LLMRequest], str]


class ScriptedClient:
    provider = "scripted"

    def __init__(self, replies: Mapping[str, Sequence[Reply]], model: str = "scripted",
                 default: Reply | None = None) -> None:
        self.model = model
        self._queues = {role: list(seq) for role, seq in replies.items()}
        self._default = default
        self._lock = threading.Lock()
        self.requests: list[LLMRequest] = []

    def complete(self, request: LLMRequest) -> Completion:
        t0 = time.perf_counter()
        with self._lock:
            self.requests.append(request)
            queue = self._queues.get(request.role, [])
            if queue:
                reply = queue.pop(0)
            elif self._default is not None:
                reply = self._default
            else:
                raise LLMError(f"no scripted reply left for role {request.role!r}", kind="script_exhausted")
        text = reply(request) if callable(reply) else reply
        usage = LLMUsage(role=request.role, provider=self.provider, model=self.model,
                         input_tokens=len(request.prompt_text()) // 4, output_tokens=len(text) // 4,
                         latency_s=time.perf_counter() - t0)
        return Completion(text=text, usage=usage)

    def remaining(self, role: str) -> int:
        return len(self._queues.get(role, []))
