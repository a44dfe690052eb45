"""Anthropic messages through the official SDK.

The temperature travels in ``extra_body`` (SDK 1.x removed the argument, the API kept the field); a model that
answers 400 about temperature gets requests without it from then on.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import anthropic

from stark_ray.config import AgentConfig
from stark_ray.llm.base import Completion, ConfigError, LLMRequest
from stark_ray.llm.errors import empty_reply, from_sdk_error
from stark_ray.llm.model_entry import retrieve_model
from stark_ray.llm.retry import Reachability, with_retries
from stark_ray.llm.usage import priced_usage

KEY_ENV = "ANTHROPIC_API_KEY"
TRUNCATED_STOPS = ("max_tokens", "model_context_window_exceeded")


def anthropic_api_key(cfg: AgentConfig) -> str:
    """The key to send; raises ConfigError when it is not set."""
    key = os.environ.get(KEY_ENV, "").strip()
    if not key:
        raise ConfigError(f"{KEY_ENV} is not set: export it to use provider 'anthropic' (model {cfg.model})")
    return key


class AnthropicClient:
    """An :class:`~stark_ray.llm.base.LLMClient` over ``messages.create``."""

    provider = "anthropic"

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.model = cfg.model
        self._client = anthropic.Anthropic(api_key=anthropic_api_key(cfg), base_url=cfg.base_url,
                                           timeout=cfg.timeout_s, max_retries=0)  # llm/retry.py retries
        self._reach = Reachability(f"the anthropic endpoint {cfg.base_url or 'https://api.anthropic.com'}")
        self._send_temperature = True

    def complete(self, request: LLMRequest) -> Completion:
        return self._reach.call(lambda: with_retries(lambda: self._try(request), self.cfg.max_retries))

    def check(self) -> None:
        """One cheap request (the model's own entry: no tokens spent): LLMError where it fails (llm/factory.py)."""
        retrieve_model(self._client, anthropic, self.model, f"anthropic {self.model}",
                       priced_usage(self.cfg, "check", self.provider, self.model))

    def _try(self, request: LLMRequest) -> Completion:
        label = f"anthropic {self.model}"
        start = time.monotonic()
        try:
            resp = self._create(request)
        except (anthropic.AnthropicError, json.JSONDecodeError) as exc:  # a body that is not JSON
            usage = priced_usage(self.cfg, request.role, self.provider, self.model,
                                 latency_s=time.monotonic() - start)
            raise from_sdk_error(exc, anthropic, label, usage) from exc
        latency = time.monotonic() - start
        in_tok = int(resp.usage.input_tokens or 0)
        out_tok = int(resp.usage.output_tokens or 0)
        usage = priced_usage(self.cfg, request.role, self.provider, self.model, in_tok, out_tok, latency)
        # Only text blocks make the reply; thinking / redacted_thinking / tool blocks are dropped.
        text = "".join(b.text for b in resp.content if isinstance(b, anthropic.types.TextBlock))
        if not text:
            raise empty_reply(label, f"no text blocks (stop_reason={resp.stop_reason})", usage)
        return Completion(text=text, usage=usage, truncated=resp.stop_reason in TRUNCATED_STOPS,
                          extra={"stop_reason": resp.stop_reason, "response_model": resp.model,
                                 "id": resp.id})

    def _create(self, request: LLMRequest) -> Any:
        while True:
            kwargs: dict[str, Any] = {
                "model": self.model,
                "max_tokens": request.max_tokens,
                "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            }
            if request.system:
                kwargs["system"] = request.system
            if self._send_temperature:
                # SDK 1.x dropped the `temperature` argument; the API still takes it for most models.
                kwargs["extra_body"] = {"temperature": request.temperature}
            try:
                return self._client.messages.create(**kwargs)
            except anthropic.BadRequestError as exc:
                if not (self._send_temperature and "temperature" in str(exc).lower()):
                    raise
                self._send_temperature = False  # a model that rejects sampling parameters
