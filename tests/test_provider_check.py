"""The provider check before any work (llm/factory.py: check_provider): one GET of the model's entry through the
official SDKs, against a local server speaking their protocols. A refused key, a dead endpoint or a refused model is
one line before the reference is timed; a server without the models endpoint, or a key restricted to chat, is not
refused (its first real call says what it says)."""

from __future__ import annotations

import socket

import pytest
from llm_server import FakeLLMServer, error, ok

from stark_ray.config import AgentConfig
from stark_ray.llm.base import ConfigError
from stark_ray.llm.factory import check_provider


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeLLMServer:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    with FakeLLMServer() as s:
        yield s


def openai_cfg(server: FakeLLMServer) -> AgentConfig:
    return AgentConfig(provider="openai", model="some-model", base_url=server.openai_base_url, max_retries=0)


def test_a_known_model_passes_and_the_check_is_one_get_of_it(server: FakeLLMServer) -> None:
    server.models(ok())
    check_provider(openai_cfg(server))
    [(path, headers)] = server.model_checks()
    assert path == "/v1/models/some-model" and headers.get("authorization") == "Bearer sk-test"
    assert server.received() == []  # no completion: no tokens spent


def test_a_refused_key_is_one_line_before_any_work(server: FakeLLMServer) -> None:
    server.models(error(401, "Incorrect API key provided: sk-test"))
    with pytest.raises(ConfigError, match=r"provider check failed before any work.*auth.*check the key") as info:
        check_provider(openai_cfg(server))
    assert "\n" not in str(info.value)


def test_a_key_restricted_to_chat_and_a_server_without_the_endpoint_are_not_refused(server: FakeLLMServer) -> None:
    server.models(error(401, "You have insufficient permissions for this operation. Missing scopes: api.model.read"))
    check_provider(openai_cfg(server))
    server.models(error(404, "no such route"))  # a base_url server: 404 may be the endpoint, not the model
    check_provider(openai_cfg(server))
    server.models(None)  # type: ignore[arg-type]  # unscripted: 501, a server without GET
    check_provider(openai_cfg(server))
    assert len(server.model_checks()) == 3


def test_anthropic_is_checked_alike(server: FakeLLMServer) -> None:
    cfg = AgentConfig(provider="anthropic", model="claude-x", base_url=server.url, max_retries=0)
    server.models(ok())
    check_provider(cfg)
    assert server.model_checks()[-1][0] == "/v1/models/claude-x"
    server.models(error(403, "This organization has been disabled."))
    with pytest.raises(ConfigError, match=r"anthropic claude-x.*permission"):
        check_provider(cfg)


def test_a_dead_endpoint_is_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = AgentConfig(provider="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(ConfigError, match=f"is http://127.0.0.1:{port}/v1 reachable from here"):
        check_provider(cfg)


def test_a_replay_checks_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cassette = tmp_path / "c.jsonl"
    cassette.write_text("")
    check_provider(AgentConfig(provider="replay", cassette=str(cassette)))


def test_a_server_named_by_the_sdks_own_variable_is_a_server_of_ones_own(server: FakeLLMServer,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """OPENAI_BASE_URL (read by the SDK itself, base_url unset): a 404 of its models endpoint is not a refusal."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
    server.models(error(404, "no such route"))
    check_provider(AgentConfig(provider="openai", model="org/model-7b", max_retries=0))
    assert server.model_checks()[-1][0] == "/v1/models/org%2Fmodel-7b"  # the SDK quotes the id
