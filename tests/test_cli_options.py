"""Options are defined once, in the config dataclasses: every option of ``stark optimize``, ``stark eval`` and
``stark campaign`` that sets a field of SearchConfig, AgentConfig or EvalConfig defaults to that field's default
(a campaign's options default to None: unset, the TOML's value or the config's is taken)."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import pytest

from stark_ray.cli.campaign import campaign
from stark_ray.cli.eval import eval_candidate
from stark_ray.cli.optimize import optimize
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig

CONFIGS = (SearchConfig(), AgentConfig(), EvalConfig())
FIELD_OF = {"timeout": "timeout_s", "compile_timeout": "compile_timeout_s", "memory_budget": "memory_budget_gb"}
# options whose default is worked out from others (provider: replay with --cassette; model: by provider)
DERIVED = {"provider", "model"}


def settings(command: Any) -> dict[str, list[tuple[str, Any, Any]]]:
    """Per option that names a config field: (config, the option's default, the field's default)."""
    out: dict[str, list[tuple[str, Any, Any]]] = {}
    for name, param in inspect.signature(command).parameters.items():
        field = FIELD_OF.get(name, name)
        for cfg in CONFIGS:
            if field in {f.name for f in fields(cfg)}:
                out.setdefault(name, []).append((type(cfg).__name__, param.default, getattr(cfg, field)))
    return out


@pytest.mark.parametrize("command", [optimize, eval_candidate], ids=["optimize", "eval"])
def test_an_options_default_is_its_configs(command: Any) -> None:
    found = settings(command)
    assert len(found) >= (20 if command is optimize else 8)  # the mapping above still finds the options
    differ = {name: v for name, v in found.items() if name not in DERIVED and any(d != c for _, d, c in v)}
    assert differ == {}


def test_a_campaigns_options_are_unset_by_default() -> None:
    found = settings(campaign)
    assert len(found) >= 20
    assert {name: v for name, v in found.items() if any(d is not None for _, d, _ in v)} == {}
