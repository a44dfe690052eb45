"""make_client / check_credentials, and UsageTotals."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from stark_ray.config import AgentConfig
from stark_ray.llm import UsageTotals, check_credentials, make_client
from stark_ray.llm.anthropic_provider import AnthropicClient
from stark_ray.llm.base import ConfigError, LLMClient, LLMRequest, Message
from stark_ray.llm.openai_provider import OpenAIClient
from stark_ray.llm.replay import RecordingClient, ReplayClient
from stark_ray.llm.usage import RoleTotals
from stark_ray.records import LLMUsage


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


def test_openai_needs_a_key_for_the_official_api(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = AgentConfig(provider="openai")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        check_credentials(cfg)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        make_client(cfg)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-1")
    check_credentials(cfg)
    assert isinstance(make_client(cfg), OpenAIClient)


def test_openai_compatible_server_needs_no_key() -> None:
    cfg = AgentConfig(provider="openai", model="qwen", base_url="http://127.0.0.1:8000/v1")
    check_credentials(cfg)
    client = make_client(cfg)
    assert isinstance(client, OpenAIClient) and client.model == "qwen"


def test_anthropic_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = AgentConfig(provider="anthropic", model="claude-opus-4-1", base_url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        check_credentials(cfg)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak")
    client = make_client(cfg)
    assert isinstance(client, AnthropicClient) and isinstance(client, LLMClient)


def test_replay_needs_an_existing_cassette(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cassette"):
        check_credentials(AgentConfig(provider="replay"))
    with pytest.raises(ConfigError, match=r"missing\.jsonl"):
        make_client(AgentConfig(provider="replay", cassette=str(tmp_path / "missing.jsonl")))
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"role": "plan", "prompt": "p", "reply": "r", "model": "gpt-4o"}) + "\n")
    client = make_client(AgentConfig(provider="replay", model="gpt-4o", cassette=str(path)))
    assert isinstance(client, ReplayClient) and client.model == "gpt-4o"


def test_unknown_provider() -> None:
    with pytest.raises(ConfigError, match="unknown provider 'gemini'"):
        make_client(AgentConfig(provider="gemini"))


def test_record_wraps_the_client(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"role": "code", "prompt": "[system]\ns\n[user]\nu", "reply": "done",
                               "input_tokens": 3, "output_tokens": 4}) + "\n")
    out = tmp_path / "out" / "copy.jsonl"
    client = make_client(AgentConfig(provider="replay", cassette=str(src), record=str(out)))
    assert isinstance(client, RecordingClient) and isinstance(client.inner, ReplayClient)
    comp = client.complete(LLMRequest("code", "s", (Message("user", "u"),), 0.1))
    assert comp.text == "done"
    [line] = out.read_text().splitlines()
    assert json.loads(line)["reply"] == "done"


# --- UsageTotals ------------------------------------------------------------------------------------------
def u(role: str, i: int, o: int, cost: float, ok: bool = True) -> LLMUsage:
    return LLMUsage(role=role, provider="p", model="m", input_tokens=i, output_tokens=o, cost_usd=cost,
                    latency_s=0.5, ok=ok, error=None if ok else "timeout: slow")


def test_usage_totals() -> None:
    t = UsageTotals()
    t.add_all([u("plan", 10, 1, 0.5), u("code", 20, 2, 0.25), u("plan", 5, 0, 0.0, ok=False)])
    assert (t.calls, t.failed_calls, t.input_tokens, t.output_tokens) == (3, 1, 35, 3)
    assert t.cost_usd == pytest.approx(0.75)
    d = t.as_dict()
    assert d["calls"] == 3 and d["latency_s"] == pytest.approx(1.5)
    assert d["by_role"]["plan"] == {"calls": 2, "failed_calls": 1, "input_tokens": 15, "output_tokens": 1,
                                    "cost_usd": 0.5, "latency_s": 1.0, "replay_mismatches": 0}
    assert set(d["by_role"]) == {"plan", "code"}
    assert t.role("debug").calls == 0 and t.role("code").input_tokens == 20
    json.dumps(d)  # plain numbers only


def test_usage_totals_thread_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    # Widen the race window: a read-modify-write that yields in the middle. Without UsageTotals' lock,
    # concurrent adds lose updates; with it, none are lost.
    def racy_add(self: RoleTotals, usage: LLMUsage) -> None:
        calls, tokens = self.calls, self.input_tokens
        time.sleep(0)
        self.calls, self.input_tokens = calls + 1, tokens + usage.input_tokens

    monkeypatch.setattr(RoleTotals, "add", racy_add)
    t = UsageTotals()

    def work() -> None:
        for _ in range(300):
            t.add(u("code", 1, 2, 0.001))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert (t.calls, t.input_tokens) == (2400, 2400)
    assert t.as_dict()["by_role"]["code"]["calls"] == 2400


def test_an_agent_worker_makes_its_client_when_asked_not_in_its_first_call() -> None:
    """The SDK's import and the client took 0.8 s in an AgentWorker's first call, the run's first LLM call waiting
    on it; the driver has the worker make it while the memory actor starts. One that cannot be made is no failure
    there: the call says why, as before."""
    from stark_ray.actors import agents
    from stark_ray.config import SearchConfig

    worker_cls = agents.AgentWorker.__ray_actor_class__  # type: ignore[attr-defined]  # Ray's decorator
    cfg = AgentConfig(provider="openai", model="warm", base_url="http://127.0.0.1:8000/v1")
    key = repr((cfg, []))
    agents._CLIENTS.pop(key, None)
    worker_cls(cfg, SearchConfig()).warm()
    assert isinstance(agents._CLIENTS.pop(key), OpenAIClient)
    keyless = AgentConfig(provider="anthropic", model="warm")  # no key in the environment: no client, no raise
    worker_cls(keyless, SearchConfig()).warm()
    assert repr((keyless, [])) not in agents._CLIENTS
