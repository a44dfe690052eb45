"""The agent call, run by Ray: a request (node + context windows) in, an AgentResult out.

Agent calls run in the threads of a few long-lived :class:`AgentWorker` actors (a pool the driver starts with
the run), each taking up to ``max_concurrency`` calls at once: an agent call mostly waits on the provider, and
a thread per call in a warm process costs neither a Ray worker process per concurrent call (each paying its
imports, started and reaped by Ray as bursts come and go) nor a scheduling round per call.

The LLM client is made in the worker process from the run's AgentConfig (once per process and config, shared by
its threads), or by ``client_factory`` — a picklable callable, for scripted replies in tests and benchmarks.
Transient provider failures are retried by the SDKs; what still fails comes back as an AgentResult with its
error, which the search records as a failed attempt. A call is retried only when its process dies.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import ray

from stark_ray.agents.base import AgentResult, TaskInfo
from stark_ray.config import AgentConfig, SearchConfig
from stark_ray.llm.base import LLMClient
from stark_ray.search.team import Request, make_team

ClientFactory = Callable[[], LLMClient]
AGENT_CPUS = 0.05  # an agent call waits on the network: many fit on one core
AGENT_WORKERS = 4  # at most this many AgentWorker processes per run


_CLIENTS: dict[str, LLMClient] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(cfg: AgentConfig, replay_consumed: frozenset[int] = frozenset()) -> LLMClient:
    """One client per worker process and configuration (its HTTP connections are reused)."""
    key = repr((cfg, sorted(replay_consumed)))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            from stark_ray.llm.factory import make_client

            _CLIENTS[key] = make_client(cfg, replay_consumed)
        return _CLIENTS[key]


def run_request(request: Request, agents: AgentConfig, search: SearchConfig, info: TaskInfo,
                client_factory: ClientFactory | None = None,
                replay_consumed: frozenset[int] = frozenset()) -> AgentResult:
    """What a Ray agent call runs (callable in-process too)."""
    client = client_factory() if client_factory is not None else _client(agents, replay_consumed)
    return make_team(client, agents, search, info).run(request)



@ray.remote
class AgentWorker:
    """Agent calls in the threads of one warm process (a threaded actor: ``max_concurrency`` at once). The run's
    settings come once, with the actor; a call carries only its request and its task's facts."""

    def __init__(self, agents: AgentConfig, search: SearchConfig, client_factory: ClientFactory | None = None,
                 replay_consumed: frozenset[int] = frozenset()) -> None:
        self.agents, self.search, self.client_factory = agents, search, client_factory
        self.replay_consumed = replay_consumed

    def warm(self) -> None:
        """Make the LLM client now (the SDK's import and the client: 0.8 s of one core), not in the run's first call;
        the driver asks once the references are timed, while the memory actor starts, so that it takes no core from
        the evaluators' start. One that cannot be made is no failure here: the call says why."""
        if self.client_factory is None:
            with contextlib.suppress(Exception):
                _client(self.agents, self.replay_consumed)

    def run(self, request: Request, info: TaskInfo) -> AgentResult:
        return run_request(request, self.agents, self.search, info, self.client_factory, self.replay_consumed)


def agent_pool(workers: int, concurrency: int, agents: AgentConfig, search: SearchConfig,
               client_factory: ClientFactory | None = None, replay_consumed: frozenset[int] = frozenset(),
               **options: Any) -> list[Any]:
    """``workers`` AgentWorker actors, each running up to ``concurrency`` calls at once; restarted (and the calls
    they held retried) when their process dies. A replayed run's worker skips the cassette entries in
    ``replay_consumed`` (those a resumed run's rows show were served; a worker restarted within a run starts from
    the same set, so it may serve again what its dead process served since the run began)."""
    return [AgentWorker.options(num_cpus=AGENT_CPUS, max_concurrency=max(1, concurrency),  # type: ignore[attr-defined]
                                max_restarts=-1, max_task_retries=2, **options).remote(
                                    agents, search, client_factory, replay_consumed)
            for _ in range(max(1, workers))]
