"""Turn the SDKs' exceptions into :class:`~stark_ray.llm.base.LLMError` with a short ``kind`` tag.

Both official SDKs (``openai`` and ``anthropic``) share one exception layout: ``APITimeoutError`` is an
``APIConnectionError``; every HTTP failure is an ``APIStatusError`` carrying ``status_code`` and the decoded
``body``. So one mapper serves both; the caller passes the SDK module. The SDKs do not retry (their clients are
made with ``max_retries=0``): ``transient`` tells :mod:`stark_ray.llm.retry` that another try could help, and
``retry_after`` how long the server asked it to wait. A body that is not the JSON it should be (an HTML error
page from a proxy, a cut stream) is ``bad_response``, transient.
"""

from __future__ import annotations

import json
from typing import Any

from stark_ray.llm.base import LLMError
from stark_ray.llm.retry import retry_after
from stark_ray.records import LLMUsage, one_line

# HTTP status -> (kind, transient)
_STATUS_KINDS: dict[int, tuple[str, bool]] = {
    400: ("bad_request", False),
    401: ("auth", False),
    402: ("billing", False),
    403: ("permission", False),
    404: ("not_found", False),
    408: ("timeout", True),
    409: ("conflict", True),
    413: ("bad_request", False),
    422: ("bad_request", False),
    429: ("rate_limit", True),
    529: ("overloaded", True),
}


def status_kind(status: int) -> tuple[str, bool]:
    """The ``(kind, transient)`` pair for an HTTP error status."""
    if status in _STATUS_KINDS:
        return _STATUS_KINDS[status]
    if status >= 500:
        return "server", True
    return f"http_{status}", False


def _body_message(body: object) -> str | None:
    """The human message inside an error body, for both wire formats."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    msg = body.get("message")
    return msg if isinstance(msg, str) else None


def from_sdk_error(exc: Exception, sdk: Any, label: str, usage: LLMUsage) -> LLMError:
    """Map an exception raised by ``sdk`` (the ``openai`` or ``anthropic`` module) to an LLMError.

    ``label`` names the call in the message (e.g. ``"openai gpt-4o"``); ``usage`` is filled in as a failed
    call and attached to the error so that failed calls are still accounted for.
    """
    status: int | None = None
    if isinstance(exc, sdk.APITimeoutError):
        kind, transient = "timeout", True
    elif isinstance(exc, sdk.APIConnectionError):
        kind, transient = "connection", True
    elif isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        kind, transient = status_kind(status)
    elif isinstance(exc, sdk.APIResponseValidationError):
        kind, transient = "bad_response", False
    elif isinstance(exc, json.JSONDecodeError):  # the SDK's parse of a body that is not JSON
        kind, transient = "bad_response", True
    else:
        kind, transient = "error", False
    detail = _body_message(getattr(exc, "body", None)) or str(exc) or type(exc).__name__
    where = f"HTTP {status} " if status is not None else ""
    message = f"{label}: {where}{kind}: {one_line(detail)}"
    usage.ok = False
    usage.error = one_line(f"{kind}: {where}{detail}", 200)
    response = getattr(exc, "response", None)
    return LLMError(message, kind=kind, transient=transient, usage=usage,
                    retry_after=retry_after(getattr(response, "headers", None)))


def empty_reply(label: str, why: str, usage: LLMUsage) -> LLMError:
    """The server answered but gave no text (no choices, null content, only thinking blocks)."""
    usage.ok = False
    usage.error = f"empty: {why}"
    return LLMError(f"{label}: empty reply: {why}", kind="empty", transient=False, usage=usage)
