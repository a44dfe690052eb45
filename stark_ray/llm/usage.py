"""Token and cost accounting: the cost of one call, and a thread-safe running total over many."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

from stark_ray.config import AgentConfig
from stark_ray.records import LLMUsage


def call_cost(cfg: AgentConfig, model: str, input_tokens: int, output_tokens: int) -> float:
    """USD for one call, from the price table (USD per million tokens); 0 for a model without a price."""
    price_in, price_out = cfg.price(model)
    return (input_tokens * price_in + output_tokens * price_out) / 1_000_000


def priced_usage(cfg: AgentConfig, role: str, provider: str, model: str, input_tokens: int = 0,
                 output_tokens: int = 0, latency_s: float = 0.0) -> LLMUsage:
    """The usage record of one call, its cost from the price table."""
    return LLMUsage(role=role, provider=provider, model=model, input_tokens=input_tokens,
                    output_tokens=output_tokens, cost_usd=call_cost(cfg, model, input_tokens, output_tokens),
                    latency_s=latency_s)


@dataclass
class RoleTotals:
    calls: int = 0
    failed_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    replay_mismatches: int = 0  # replayed calls whose prompt the cassette did not hold (served in order)

    def add(self, usage: LLMUsage) -> None:
        self.calls += 1
        if usage.replay_match == "order":
            self.replay_mismatches += 1
        if not usage.ok:
            self.failed_calls += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cost_usd += usage.cost_usd
        self.latency_s += usage.latency_s


class UsageTotals:
    """Sums of :class:`LLMUsage` records, overall and per agent role. Safe to share between threads.

    Failed calls count as calls (and as ``failed_calls``); their tokens and cost are included, since a
    provider may bill a call whose reply was unusable.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = RoleTotals()
        self._by_role: dict[str, RoleTotals] = {}
        self._models: set[str] = set()

    def add(self, usage: LLMUsage) -> None:
        with self._lock:
            self._total.add(usage)
            self._by_role.setdefault(usage.role, RoleTotals()).add(usage)
            if usage.ok and usage.model:
                self._models.add(usage.model)

    @property
    def models(self) -> list[str]:
        """The models that answered (a replay: the cassette's), sorted."""
        with self._lock:
            return sorted(self._models)

    def add_all(self, usages: list[LLMUsage]) -> None:
        for u in usages:
            self.add(u)

    @property
    def calls(self) -> int:
        return self._total.calls

    @property
    def failed_calls(self) -> int:
        return self._total.failed_calls

    @property
    def input_tokens(self) -> int:
        return self._total.input_tokens

    @property
    def replay_mismatches(self) -> int:
        return self._total.replay_mismatches

    @property
    def output_tokens(self) -> int:
        return self._total.output_tokens

    @property
    def cost_usd(self) -> float:
        return self._total.cost_usd

    def role(self, role: str) -> RoleTotals:
        """A copy of one role's totals (zeros for a role never seen)."""
        with self._lock:
            return RoleTotals(**asdict(self._by_role.get(role, RoleTotals())))

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers: the totals, plus ``by_role`` with the same keys per role."""
        with self._lock:
            out: dict[str, Any] = asdict(self._total)
            out["by_role"] = {r: asdict(t) for r, t in sorted(self._by_role.items())}
            return out
