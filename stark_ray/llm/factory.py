"""Build the configured LLM client; check credentials before any work starts."""

from __future__ import annotations

from dataclasses import replace
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


# what a failed check means for a run: these stop it before any work; any other failure is left to the first call
CHECK_STOPS = frozenset({"auth", "permission", "billing", "connection", "timeout", "not_found"})


BASE_URL_ENV = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}  # what each SDK reads itself
OFFICIAL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
CHECK_TRIES = 2  # a connection refused or a timeout is asked once more (a server still starting)


def check_provider(cfg: AgentConfig) -> None:
    """One cheap request to the provider before any work (its model's entry: no tokens): ConfigError (one line)
    where the key is refused, the endpoint cannot be reached or the model is unknown — found in seconds, not after
    the reference was timed. A server of one's own (``base_url``, or the SDK's environment variable) that does not
    serve the models endpoint (404 there, 405, 501) is not refused: its first call says what it says; nor is a key
    restricted to chat. Replays, and an SDK without the models endpoint, check nothing."""
    if cfg.provider not in ("openai", "anthropic"):
        return
    import os
    import time

    from stark_ray.llm.base import LLMError

    client = make_client(replace(cfg, record=None))  # nothing recorded of the check
    check = getattr(client, "check", None)
    if check is None:
        return
    own = cfg.base_url or os.environ.get(BASE_URL_ENV[cfg.provider], "").strip() or None
    where = own or OFFICIAL[cfg.provider]
    for tried in range(1, CHECK_TRIES + 1):
        try:
            check()
            return
        except LLMError as e:
            if e.kind in ("connection", "timeout") and tried < CHECK_TRIES:
                time.sleep(2.0)
                continue
            if e.kind not in CHECK_STOPS or (e.kind == "not_found" and own):
                return
            if e.kind in ("auth", "permission") and any(w in str(e).lower()
                                                        for w in ("scope", "insufficient permission")):
                return  # a key restricted to what a run uses (chat, not the models list): its calls will tell
            hint = {"connection": f"is {where} reachable from here?", "timeout": f"{where} did not answer in time",
                    "not_found": f"is {cfg.model!r} a model of {cfg.provider}?"}.get(
                        e.kind, "check the key (and its access)")
            raise ConfigError(f"the provider check failed before any work: {e} ({hint})") from None


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
