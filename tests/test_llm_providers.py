"""The OpenAI and Anthropic providers, driven through the real SDKs against a local fake server."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
from llm_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Behaviour,
    FakeLLMServer,
    error,
    not_json,
    ok,
    overloaded,
    rate_limited,
    server_error,
    slow,
    unauthorized,
)

from stark_ray.config import AgentConfig
from stark_ray.llm.anthropic_provider import AnthropicClient
from stark_ray.llm.base import Completion, ConfigError, LLMClient, LLMError, LLMRequest, Message
from stark_ray.llm.openai_provider import OpenAIClient
from stark_ray.llm.retry import UNREACHABLE_AFTER, Reachability

REQUEST = LLMRequest(role="plan", system="You are a kernel engineer.",
                     messages=(Message("user", "Make it fast."),), temperature=0.7, max_tokens=321)


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    key_env: str
    key: str
    model: str
    make: Callable[[AgentConfig], LLMClient]

    def cfg(self, server: FakeLLMServer, **kw: object) -> AgentConfig:
        base = server.openai_base_url if self.name == "openai" else server.url
        values: dict[str, object] = {"provider": self.name, "model": self.model, "base_url": base,
                                     "timeout_s": 5.0, "max_retries": 2}
        values.update(kw)
        return AgentConfig(**values)  # type: ignore[arg-type]

    def sent_key(self, headers: dict[str, str]) -> str | None:
        if "x-api-key" in headers:
            return headers["x-api-key"]
        auth = headers.get("authorization", "")
        return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


CASES = [
    Case("openai", OPENAI_PATH, "OPENAI_API_KEY", "sk-test-123", "gpt-4o", OpenAIClient),
    Case("anthropic", ANTHROPIC_PATH, "ANTHROPIC_API_KEY", "ak-test-456", "claude-sonnet-4-20250514",
         AnthropicClient),
]


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Case:
    c: Case = request.param
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
                "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(c.key_env, c.key)
    return c


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as s:
        yield s


def _call(case: Case, server: FakeLLMServer, *behaviours: Behaviour, **cfg: object) -> Completion:
    server.script(case.path, *behaviours)
    return case.make(case.cfg(server, **cfg)).complete(REQUEST)


def _fail(case: Case, server: FakeLLMServer, *behaviours: Behaviour, **cfg: object) -> LLMError:
    with pytest.raises(LLMError) as info:
        _call(case, server, *behaviours, **cfg)
    return info.value


# --- success and accounting ------------------------------------------------------------------------------
def test_success_sends_the_request_and_accounts_usage(case: Case, server: FakeLLMServer) -> None:
    comp = _call(case, server, ok("fast kernel", input_tokens=1200, output_tokens=300))
    assert comp.text == "fast kernel"
    assert comp.truncated is False
    u = comp.usage
    assert (u.role, u.provider, u.model, u.ok) == ("plan", case.name, case.model, True)
    assert (u.input_tokens, u.output_tokens) == (1200, 300)
    p_in, p_out = AgentConfig().price(case.model)
    assert p_in > 0 and p_out > 0
    assert u.cost_usd == pytest.approx((1200 * p_in + 300 * p_out) / 1e6)
    assert u.latency_s > 0

    [req] = server.received(case.path)
    assert case.sent_key(req.headers) == case.key
    body = req.body
    assert body["model"] == case.model
    assert body["temperature"] == pytest.approx(0.7)
    assert body["max_tokens"] == 321
    if case.name == "openai":
        assert body["messages"] == [{"role": "system", "content": "You are a kernel engineer."},
                                    {"role": "user", "content": "Make it fast."}]
    else:
        assert body["system"] == "You are a kernel engineer."
        assert body["messages"] == [{"role": "user", "content": "Make it fast."}]


def test_overridden_price(case: Case, server: FakeLLMServer) -> None:
    comp = _call(case, server, ok(input_tokens=1_000_000, output_tokens=500_000),
                 prices={case.model: (1.0, 4.0)})
    assert comp.usage.cost_usd == pytest.approx(1.0 + 2.0)


def test_unpriced_model_costs_nothing(case: Case, server: FakeLLMServer) -> None:
    comp = _call(case, server, ok(), model="my-local-model")
    assert comp.usage.input_tokens == 11 and comp.usage.cost_usd == 0.0
    assert server.received(case.path)[0].body["model"] == "my-local-model"


def test_truncated_reply_is_flagged(case: Case, server: FakeLLMServer) -> None:
    comp = _call(case, server, ok("half a kern", truncated=True))
    assert comp.text == "half a kern" and comp.truncated is True


# --- retries and failures -----------------------------------------------------------------------------------
def test_rate_limit_then_success(case: Case, server: FakeLLMServer) -> None:
    comp = _call(case, server, rate_limited(retry_after_ms=300), ok("second time"))
    assert comp.text == "second time"
    first, second = server.received(case.path)
    assert second.at - first.at >= 0.25  # retry-after-ms was honoured (llm/retry.py)
    [failed] = comp.failed_tries  # the first try is on the record too
    assert not failed.ok and failed.error is not None and failed.error.startswith("rate_limit: HTTP 429")
    assert failed.role == "plan" and failed.provider == case.name


def test_a_body_that_is_not_json_is_a_bad_response_tried_again(case: Case, server: FakeLLMServer) -> None:
    comp = _call(case, server, not_json(), not_json(), ok("at last"))
    assert comp.text == "at last" and len(server.received(case.path)) == 3
    assert [u.error.split(":")[0] for u in comp.failed_tries if u.error] == ["bad_response", "bad_response"]
    server.fallback(case.path, not_json())
    err = _fail(case, server, max_retries=1)
    assert (err.kind, err.transient) == ("bad_response", True)  # not JSONDecodeError
    assert len(err.failed_tries) == 1 and err.usage is not None and not err.usage.ok


def test_persistent_server_error_after_retries(case: Case, server: FakeLLMServer) -> None:
    server.fallback(case.path, server_error())
    err = _fail(case, server, max_retries=3)  # not the SDKs' default (2), so the setting must reach them
    assert (err.kind, err.transient) == ("server", True)
    assert len(server.received(case.path)) == 1 + 3
    assert "500" in str(err) and len(err.failed_tries) == 3  # every try a row
    assert err.usage is not None and err.usage.ok is False and err.usage.role == "plan"


def test_persistent_rate_limit(case: Case, server: FakeLLMServer) -> None:
    server.fallback(case.path, rate_limited())
    err = _fail(case, server, max_retries=1)
    assert (err.kind, err.transient) == ("rate_limit", True)
    assert len(server.received(case.path)) == 2


def test_timeout(case: Case, server: FakeLLMServer) -> None:
    start = time.monotonic()
    err = _fail(case, server, slow(20.0), timeout_s=0.5, max_retries=0)
    assert time.monotonic() - start < 15  # cut off: the server answers after 20 s
    assert (err.kind, err.transient) == ("timeout", True)
    assert len(server.received(case.path)) == 1


def test_unauthorized_is_not_transient_and_not_retried(case: Case, server: FakeLLMServer) -> None:
    err = _fail(case, server, unauthorized(), max_retries=3)
    assert (err.kind, err.transient) == ("auth", False)
    assert len(server.received(case.path)) == 1
    assert "Incorrect API key" in str(err)


def test_bad_request(case: Case, server: FakeLLMServer) -> None:
    err = _fail(case, server, error(400, "messages: field required"), max_retries=3)
    assert (err.kind, err.transient) == ("bad_request", False)
    assert len(server.received(case.path)) == 1


def test_connection_refused(case: Case, server: FakeLLMServer) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = f"http://127.0.0.1:{port}"
    cfg = replace(case.cfg(server, max_retries=0), base_url=root + "/v1" if case.name == "openai" else root)
    with pytest.raises(LLMError) as info:
        case.make(cfg).complete(REQUEST)
    assert (info.value.kind, info.value.transient) == ("connection", True)


def test_an_endpoint_that_cannot_be_reached_call_after_call_is_fatal(case: Case, server: FakeLLMServer) -> None:
    """A dead --base-url spent a whole budget on failed calls and exited 0: the UNREACHABLE_AFTER-th call in a row
    that could not connect is fatal (the search ends in one line)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = f"http://127.0.0.1:{port}"
    client = case.make(replace(case.cfg(server, max_retries=0), base_url=root + "/v1" if case.name == "openai"
                               else root))
    kinds = []
    for _ in range(UNREACHABLE_AFTER):
        with pytest.raises(LLMError) as info:
            client.complete(REQUEST)
        kinds.append(info.value.kind)
    assert kinds == ["connection"] * (UNREACHABLE_AFTER - 1) + ["unreachable"]
    assert info.value.fatal and root in str(info.value) and "could not be reached" in str(info.value)


def test_a_call_that_connects_starts_the_unreachable_count_again() -> None:
    reach = Reachability("the endpoint x", after=2)

    def failing(kind: str) -> Callable[[], Completion]:
        def attempt() -> Completion:
            raise LLMError("no", kind, transient=True)
        return attempt

    for kind in ("connection", "server", "connection", "timeout", "connection"):  # never two refusals in a row
        with pytest.raises(LLMError) as info:
            reach.call(failing(kind))
        assert info.value.kind == kind and not info.value.fatal
    with pytest.raises(LLMError) as info:
        reach.call(failing("connection"))
    assert info.value.kind == "unreachable" and info.value.fatal


def test_empty_reply(case: Case, server: FakeLLMServer) -> None:
    err = _fail(case, server, ok(None, input_tokens=50, output_tokens=321, truncated=True))
    assert (err.kind, err.transient) == ("empty", False)
    assert err.usage is not None and err.usage.output_tokens == 321 and err.usage.ok is False


def test_missing_key(case: Case, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(case.key_env)
    cfg = case.cfg(server)
    if case.name == "openai":
        cfg = replace(cfg, base_url=None)  # the official API needs a key
    with pytest.raises(ConfigError, match=case.key_env) as info:
        case.make(cfg)
    assert "\n" not in str(info.value)
    assert server.received() == []


# --- provider-specific ----------------------------------------------------------------------------------
@pytest.fixture
def openai_case() -> Case:
    return CASES[0]


@pytest.fixture
def anthropic_case() -> Case:
    return CASES[1]


def test_openai_local_server_needs_no_key(openai_case: Case, server: FakeLLMServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    comp = _call(openai_case, server, ok("from vllm"))
    assert comp.text == "from vllm"
    assert server.received()[0].headers["authorization"] == "Bearer EMPTY"


def test_openai_no_choices(openai_case: Case, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    err = _fail(openai_case, server, ok(no_choices=True))
    assert err.kind == "empty"


def test_openai_falls_back_to_max_completion_tokens(openai_case: Case, server: FakeLLMServer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    msg = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens'."
    server.script(OPENAI_PATH, error(400, msg), ok("one"), ok("two"))
    client = openai_case.make(openai_case.cfg(server, model="o3"))
    assert client.complete(REQUEST).text == "one"
    assert client.complete(REQUEST).text == "two"
    first, second, third = (r.body for r in server.received())
    assert first["max_tokens"] == 321 and "max_completion_tokens" not in first
    for body in (second, third):  # switched once, for good
        assert body["max_completion_tokens"] == 321 and "max_tokens" not in body


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_unsupported_temperature_is_dropped(which: str, server: FakeLLMServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    c = CASES[0] if which == "openai" else CASES[1]
    monkeypatch.setenv(c.key_env, c.key)
    msg = "Unsupported value: 'temperature' does not support 0.7 with this model."
    comp = _call(c, server, error(400, msg), ok("no temperature"))
    assert comp.text == "no temperature"
    first, second = (r.body for r in server.received())
    assert first["temperature"] == pytest.approx(0.7) and "temperature" not in second


def test_anthropic_ignores_thinking_blocks(anthropic_case: Case, server: FakeLLMServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak")
    comp = _call(anthropic_case, server, ok("the answer", thinking="let me think"))
    assert comp.text == "the answer"


def test_anthropic_only_thinking_is_empty(anthropic_case: Case, server: FakeLLMServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak")
    err = _fail(anthropic_case, server, ok(None, thinking="ran out of tokens while thinking", truncated=True))
    assert err.kind == "empty"


def test_anthropic_overloaded(anthropic_case: Case, server: FakeLLMServer,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak")
    assert _call(anthropic_case, server, overloaded(), ok("recovered")).text == "recovered"
    server.fallback(ANTHROPIC_PATH, overloaded())
    err = _fail(anthropic_case, server, max_retries=1)
    assert (err.kind, err.transient) == ("overloaded", True)
    assert len(server.received()) == 2 + 2
