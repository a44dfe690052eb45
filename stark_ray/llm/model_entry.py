"""The model's own entry on its provider (``GET /models/<model>``), through either official SDK: what the provider
check before a run's work asks (:func:`stark_ray.llm.factory.check_provider`). No tokens are spent. As in
:mod:`stark_ray.llm.errors`, one function serves both SDKs: the caller passes the SDK module and its client."""

from __future__ import annotations

from typing import Any

from stark_ray.llm.errors import from_sdk_error
from stark_ray.records import LLMUsage

CHECK_TIMEOUT_S = 10.0  # one try of the check


def retrieve_model(client: Any, sdk: Any, model: str, label: str, usage: LLMUsage) -> None:
    """Ask for ``model``'s entry; LLMError (:func:`~stark_ray.llm.errors.from_sdk_error`) where that fails (anything
    but the SDK's own errors is kind ``error``, which stops no run). An SDK older than its models endpoint asks
    nothing."""
    models = getattr(client.with_options(timeout=CHECK_TIMEOUT_S), "models", None)
    if models is None:
        return
    try:
        models.retrieve(model)
    except Exception as exc:  # a check must never be what breaks a run
        raise from_sdk_error(exc, sdk, label, usage) from exc
