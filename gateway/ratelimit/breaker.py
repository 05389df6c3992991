"""A circuit breaker for the limiter's backend: after `failures` consecutive failures it stops
calling the backend for `cooldown_s`, then lets one call through as a probe; the probe's success
closes it again. Redis coming back is noticed by the next probe, with no restart."""

from __future__ import annotations

import time
from collections.abc import Callable

CLOSED, OPEN, PROBING = "closed", "open", "probing"


class Breaker:
    def __init__(
        self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._failures = failures
        self._cooldown = cooldown_s
        self._clock = clock
        self.state = CLOSED
        self._count = 0
        self._opened = 0.0

    def allow(self) -> bool:
        """May this call go to the backend? While a probe is out, the others may not; a probe
        that never reported back (its caller left) is replaced after another cool-down."""
        if self.state == CLOSED:
            return True
        now = self._clock()
        if now >= self._opened + self._cooldown:
            self.state = PROBING
            self._opened = now  # the probe's own deadline
            return True
        return False

    def success(self) -> None:
        self.state = CLOSED
        self._count = 0

    def failure(self) -> None:
        self._count += 1
        if self.state == PROBING or self._count >= self._failures:
            self.state = OPEN
            self._opened = self._clock()

    def retry_in(self) -> float:
        """Seconds until the backend is tried again (0 when it is in use)."""
        if self.state == CLOSED:
            return 0.0
        return max(0.0, self._opened + self._cooldown - self._clock())
