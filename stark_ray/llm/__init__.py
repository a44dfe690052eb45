"""LLM providers behind one small protocol (see base.py).

``make_client(cfg)`` builds the configured client (openai, anthropic or replay, optionally recording);
``check_credentials(cfg)`` fails fast on a missing key. Provider modules import their SDK lazily through the
factory, so importing this package stays light.
"""

from stark_ray.llm.base import Completion, ConfigError, LLMClient, LLMError, LLMRequest, Message
from stark_ray.llm.factory import check_credentials, make_client
from stark_ray.llm.usage import UsageTotals

__all__ = [
    "Completion",
    "ConfigError",
    "LLMClient",
    "LLMError",
    "LLMRequest",
    "Message",
    "UsageTotals",
    "check_credentials",
    "make_client",
]
