"""Build the configured LLM client; check credentials before any work starts."""

from __future__ import annotations

from pathlib import Path

from stark_ray.config import PROVIDERS, AgentConfig
from stark_ray.llm.base import ConfigError, LLMClient


def check_credentials(cfg: AgentConfig) -> None:
    """Raise ConfigError (one line) when ``cfg`` cannot make calls: unknown provider, no key, no cassette."""
    if cfg.provider == "openai":
        from stark_ray.llm.openai_provider import openai_api_key

        openai_api_key(cfg)
    elif cfg.provider == "anthropic":
        from stark_ray.llm.anthropic_provider import anthropic_api_key

        anthropic_api_key(cfg)
    elif cfg.provider == "replay":
        if not cfg.cassette:
            raise ConfigError("provider 'replay' needs a cassette: set cassette to a recorded JSONL file")
        if not Path(cfg.cassette).is_file():
            raise ConfigError(f"cassette not found: {cfg.cassette}")
    else:
        raise ConfigError(f"unknown provider {cfg.provider!r}; choose one of {', '.join(PROVIDERS)}")


def make_client(cfg: AgentConfig, replay_consumed: frozenset[int] = frozenset()) -> LLMClient:
    """The client for ``cfg.provider``, wrapped in a RecordingClient when ``cfg.record`` is set;
    ``replay_consumed``: the cassette lines a resumed run already served (replay only)."""
    check_credentials(cfg)
    client: LLMClient
    if cfg.provider == "openai":
        from stark_ray.llm.openai_provider import OpenAIClient

        client = OpenAIClient(cfg)
    elif cfg.provider == "anthropic":
        from stark_ray.llm.anthropic_provider import AnthropicClient

        client = AnthropicClient(cfg)
    else:
        from stark_ray.llm.replay import ReplayClient

        assert cfg.cassette is not None  # checked above
        client = ReplayClient(cfg.cassette, model=cfg.model, cfg=cfg, consumed=replay_consumed)
    if cfg.record:
        from stark_ray.llm.replay import RecordingClient

        client = RecordingClient(client, cfg.record)
    return client
