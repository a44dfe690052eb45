"""OpenAI chat completions through the official SDK; any OpenAI-compatible server via ``base_url``.

vLLM, SGLang, Ollama and the like speak the same protocol: point ``AgentConfig.base_url`` at their ``/v1``
root. Such local servers need no key, so a placeholder is sent when ``base_url`` is set and ``OPENAI_API_KEY``
is not.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import openai

from stark_ray.config import AgentConfig
from stark_ray.llm.base import Completion, ConfigError, LLMRequest
from stark_ray.llm.errors import empty_reply, from_sdk_error
from stark_ray.llm.model_entry import retrieve_model
from stark_ray.llm.retry import Reachability, with_retries
from stark_ray.llm.usage import priced_usage

KEY_ENV = "OPENAI_API_KEY"
PLACEHOLDER_KEY = "EMPTY"


def openai_api_key(cfg: AgentConfig) -> str:
    """The key to send; raises ConfigError when the official API is targeted and no key is set."""
    key = os.environ.get(KEY_ENV, "").strip()
    if key:
        return key
    if cfg.base_url:
        return PLACEHOLDER_KEY
    raise ConfigError(f"{KEY_ENV} is not set: export it, or set base_url to an OpenAI-compatible server")


class OpenAIClient:
    """An :class:`~stark_ray.llm.base.LLMClient` over ``chat.completions``."""

    provider = "openai"

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.model = cfg.model
        self._client = openai.OpenAI(api_key=openai_api_key(cfg), base_url=cfg.base_url,
                                     timeout=cfg.timeout_s, max_retries=0)  # llm/retry.py retries
        self._reach = Reachability(f"the openai endpoint {cfg.base_url or 'https://api.openai.com/v1'}")
        # Newer OpenAI models reject `max_tokens` (and some reject a non-default temperature); the first
        # 400 saying so switches these for the rest of the client's life.
        self._token_param = "max_tokens"
        self._send_temperature = True

    def complete(self, request: LLMRequest) -> Completion:
        return self._reach.call(lambda: with_retries(lambda: self._try(request), self.cfg.max_retries))

    def check(self) -> None:
        """One cheap request (the model's own entry: no tokens spent): LLMError where it fails (llm/factory.py)."""
        retrieve_model(self._client, openai, self.model, f"openai {self.model}",
                       priced_usage(self.cfg, "check", self.provider, self.model))

    def _try(self, request: LLMRequest) -> Completion:
        label = f"openai {self.model}"
        start = time.monotonic()
        try:
            resp = self._create(request)
        except (openai.OpenAIError, json.JSONDecodeError) as exc:  # a body that is not JSON
            usage = priced_usage(self.cfg, request.role, self.provider, self.model,
                                 latency_s=time.monotonic() - start)
            raise from_sdk_error(exc, openai, label, usage) from exc
        latency = time.monotonic() - start
        in_tok = int(getattr(resp.usage, "prompt_tokens", 0) or 0)
        out_tok = int(getattr(resp.usage, "completion_tokens", 0) or 0)
        usage = priced_usage(self.cfg, request.role, self.provider, self.model, in_tok, out_tok, latency)
        if not resp.choices:
            raise empty_reply(label, "no choices", usage)
        choice = resp.choices[0]
        text = choice.message.content
        if not text:
            raise empty_reply(label, f"no content (finish_reason={choice.finish_reason})", usage)
        return Completion(text=text, usage=usage, truncated=choice.finish_reason == "length",
                          extra={"finish_reason": choice.finish_reason, "response_model": resp.model,
                                 "id": resp.id})

    def _messages(self, request: LLMRequest) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": request.system}] if request.system else []
        msgs += [{"role": m.role, "content": m.content} for m in request.messages]
        return msgs

    def _create(self, request: LLMRequest) -> Any:
        while True:
            kwargs: dict[str, Any] = {"model": self.model, "messages": self._messages(request),
                                      self._token_param: request.max_tokens}
            if self._send_temperature:
                kwargs["temperature"] = request.temperature
            try:
                return self._client.chat.completions.create(**kwargs)
            except openai.BadRequestError as exc:
                if not self._adapt(str(exc).lower()):
                    raise

    def _adapt(self, message: str) -> bool:
        """Switch a parameter the server said it does not support; False when there is nothing to switch."""
        if self._token_param == "max_tokens" and "max_completion_tokens" in message:
            self._token_param = "max_completion_tokens"
            return True
        if self._send_temperature and "temperature" in message and "support" in message:
            self._send_temperature = False
            return True
        return False
