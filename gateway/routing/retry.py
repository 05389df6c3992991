"""Retries of one target: which failures are worth another try, and how long to wait first.

The wait is the upstream's own `retry-after-ms` / `retry-after` when it gave one (seconds or an
HTTP date), else exponential backoff with jitter: backoff_s * 2^retries, at most max_backoff_s,
times a factor in (0.75, 1] (the openai SDK's curve). Every wait of a request counts against
max_wait_s: a retry that would wait past it is not made, and the caller gets the last answer.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})  # Portkey's and the openai SDK's
MAX_ATTEMPTS = 5  # Portkey's ceiling on retries


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 0  # retries of a target after its first try
    on_status: frozenset[int] = RETRY_STATUSES  # upstream statuses worth a retry
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_wait_s: float = 60.0  # all of a request's waits together
    use_retry_after: bool = True  # wait as the upstream's retry-after says, when it does
    jitter: bool = True  # Portkey's backoff has none: 1 s, 2 s, 4 s, ...

    def delay(self, retries: int, err: GatewayError, waited: float, jitter: float) -> float | None:
        """Seconds to wait before retry number `retries + 1` after `err`, or None: no retry.
        `jitter` is a random number in [0, 1)."""
        if retries >= self.attempts or not self.retryable(err):
            return None
        hinted = retry_after(err.headers) if self.use_retry_after else None
        if hinted is None:
            hinted = min(self.backoff_s * 2**retries, self.max_backoff_s)
            if self.jitter:
                hinted *= 1 - 0.25 * jitter
        return hinted if waited + hinted <= self.max_wait_s else None

    def retryable(self, err: GatewayError) -> bool:
        if err.lasting:  # e.g. the upstream's certificate refused: it would be again
            return False
        if err.headers.get("x-should-retry") == "false":  # the upstream says it won't help
            return False
        if isinstance(err, (UpstreamTimeout, UpstreamUnreachable)) and err.upstream_status is None:
            return True  # no answer at all: a connection error or a timeout
        return err.upstream_status in self.on_status


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The upstream's requested wait in seconds: retry-after-ms, else retry-after as seconds
    or as an HTTP date; None if absent, unreadable or negative."""
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000
    raw = headers.get("retry-after")
    seconds = _number(raw)
    if seconds is not None or raw is None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
