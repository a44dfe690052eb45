"""The agent call as a stateless Ray task: a request (node + context windows) in, an AgentResult out.

The LLM client is made in the worker process from the run's AgentConfig (once per process and config), or by
``client_factory`` — a picklable callable, for scripted replies in tests and benchmarks. Transient provider
failures are retried by the SDKs; what still fails comes back as an AgentResult with its error, which the
search records as a failed attempt. The task itself is retried only when its worker process dies.
"""

from __future__ import annotations

from collections.abc import Callable

import ray

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.llm.base import LLMClient
from stark_ray.search.team import Request, make_team

ClientFactory = Callable[[], LLMClient]
AGENT_CPUS = 0.05  # an agent call waits on the network: many fit on one core


_CLIENTS: dict[str, LLMClient] = {}


def _client(cfg: AgentConfig) -> LLMClient:
    """One client per worker process and configuration (its HTTP connections are reused)."""
    key = repr(cfg)
    if key not in _CLIENTS:
        from stark_ray.llm.factory import make_client

        _CLIENTS[key] = make_client(cfg)
    return _CLIENTS[key]


def run_request(request: Request, agents: AgentConfig, search: SearchConfig, info: TaskInfo,
                client_factory: ClientFactory | None = None) -> AgentResult:
    """What the Ray task runs (callable in-process too)."""
    client = client_factory() if client_factory is not None else _client(agents)
    return make_team(client, agents, search, info).run(request)


expand = ray.remote(num_cpus=AGENT_CPUS, max_retries=2)(run_request)
