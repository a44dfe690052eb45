"""Retries of a provider call, each try on the record.

The SDKs can retry by themselves, but then a call that took four tries leaves one row and a long latency. So the
providers make their SDK clients with ``max_retries=0`` and retry here: a transient failure (rate limit, overload,
server error, timeout, a dropped connection, a body that is not the JSON it should be) is tried again up to
``AgentConfig.max_retries`` times, after the wait the server asks for (``retry-after-ms`` / ``retry-after``), else
an exponential backoff with jitter. Every failed try is kept (``Completion.failed_tries`` on success,
``LLMError.failed_tries`` on failure) and becomes its own ``llm_calls`` row.

A provider whose endpoint cannot be connected to at all, call after call (a wrong ``--base-url``, a local server
that is not up), is taken for dead (:class:`Reachability`): the run ends in one line instead of spending its
budget on failed calls.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any

from stark_ray.llm.base import Completion, LLMError

BACKOFF_S = 0.5  # the first wait without a server's word; doubles with each try
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 60.0  # a server's word is followed up to this
UNREACHABLE_AFTER = 3  # calls in a row that could not connect, each after its retries: the endpoint is down


def retry_after(headers: Any) -> float | None:
    """The wait (s) a response's headers ask for, or None."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, AttributeError):
        return None


def backoff(tries: int, rng: random.Random) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_S * 2 ** tries) * rng.uniform(0.75, 1.0)


def with_retries(attempt: Callable[[], Completion], max_retries: int,
                 sleep: Callable[[float], None] = time.sleep) -> Completion:
    """``attempt()`` until it succeeds, fails for good, or ``max_retries`` retries are spent."""
    failed: list[LLMError] = []
    rng = random.Random()
    while True:
        try:
            completion = attempt()
        except LLMError as e:
            if not e.transient or len(failed) >= max_retries:
                e.failed_tries = [f.usage for f in failed if f.usage is not None]
                raise
            failed.append(e)
            wait = e.retry_after if e.retry_after is not None else backoff(len(failed) - 1, rng)
            sleep(min(wait, RETRY_AFTER_MAX_S))
            continue
        completion.failed_tries = [f.usage for f in failed if f.usage is not None]
        return completion


class Reachability:
    """Counts a client's calls in a row that failed for good without a connection (kind ``connection``: refused,
    no such host; not a timeout, which a slow server gives too). The ``after``-th of them is raised as fatal
    (kind ``unreachable``): every further call would fail alike. Any other outcome starts the count again."""

    def __init__(self, endpoint: str, after: int = UNREACHABLE_AFTER) -> None:
        self.endpoint = endpoint
        self.after = after
        self.failures = 0

    def call(self, attempt: Callable[[], Completion]) -> Completion:
        try:
            completion = attempt()
        except LLMError as e:
            self.failures = self.failures + 1 if e.kind == "connection" else 0
            if self.failures < self.after:
                raise
            dead = LLMError(f"{self.endpoint} could not be reached in {self.failures} calls in a row, each tried "
                            f"{len(e.failed_tries) + 1} time(s) (last: {e}); is the server up and the address "
                            "right (--base-url)?", "unreachable", usage=e.usage)
            dead.failed_tries = e.failed_tries
            raise dead from None
        self.failures = 0
        return completion
