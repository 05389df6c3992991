"""Circuit breakers: one per target (provider and configured model), kept across reloads; the
rate limiter's Redis backend has one too.

closed → open after `failures` failures in a row (timeouts, lost connections, 5xx answers);
open: the target is skipped for `cooldown_s`; then half-open: one request probes it while the
others still skip it. The probe's success closes the circuit, its failure opens it again.
A 429 or a 4xx is an answer, not a failure: the upstream is alive.

Targets whose model is not in the config (a virtual key's or a Portkey target's model taken from
the request) share one breaker per provider, `*`: the board stays bounded by the config, and so
do the metric's labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.errors import GatewayError, RequestTimeout, UpstreamTimeout, UpstreamUnreachable

# Gauge values: the higher the worse, so that the max over workers is the worst state.
CLOSED, HALF_OPEN, OPEN = 0, 1, 2
STATE_NAMES = {CLOSED: "closed", HALF_OPEN: "half_open", OPEN: "open"}
ANY_MODEL = "*"


@dataclass(frozen=True, slots=True)
class CircuitPolicy:
    failures: int = 5  # failures in a row that open a circuit; 0: breakers off
    cooldown_s: float = 30.0


def is_failure(err: GatewayError) -> bool:
    if isinstance(err, (UpstreamTimeout, UpstreamUnreachable, RequestTimeout)):
        return True
    return (err.upstream_status or 0) >= 500


Report = Callable[[str, str, int, bool], None]  # provider, model, state, whether it changed


class Breaker:
    """One breaker. A probe that never reports back (its caller left without a word) is
    replaced after another cool-down: a breaker never stays half-open for good."""

    __slots__ = ("_report", "failures", "key", "opened_at", "policy", "probing", "state")

    def __init__(
        self, policy: CircuitPolicy, key: tuple[str, str] = ("", ""), report: Report | None = None
    ) -> None:
        self.key = key
        self.policy = policy
        self._report = report
        self.state = CLOSED
        self.failures = 0
        self.opened_at = 0.0  # when it opened, or when its probe went out
        self.probing = False

    def admit(self, now: float) -> bool:
        """May a call go through now? In half-open, only the one probe may."""
        if self.state == CLOSED:
            return True
        if not (self.state == HALF_OPEN and not self.probing) and self.blocked(now):
            return False
        if self.state == OPEN:
            self._move(HALF_OPEN)
        self.opened_at, self.probing = now, True
        return True

    def blocked(self, now: float) -> bool:
        """admit() would say no (without moving to half-open)."""
        if self.state == CLOSED or (self.state == HALF_OPEN and not self.probing):
            return False
        return now - self.opened_at < self.policy.cooldown_s

    def retry_in(self, now: float) -> float:
        """Seconds until a call may go through again (0: now)."""
        if not self.blocked(now):
            return 0.0
        return max(0.0, self.policy.cooldown_s - (now - self.opened_at))

    def succeeded(self) -> None:
        self.failures = 0
        self.probing = False
        if self.state != CLOSED:
            self._move(CLOSED)

    def failed(self, now: float) -> None:
        self.failures += 1
        self.probing = False
        if self.state == HALF_OPEN or (
            self.state == CLOSED and 0 < self.policy.failures <= self.failures
        ):
            self.opened_at = now
            self._move(OPEN)

    def released(self) -> None:
        """The call ended without telling (the caller left): let another one probe."""
        self.probing = False

    def _move(self, state: int) -> None:
        self.state = state
        if self._report is not None:
            self._report(*self.key, state, True)


class Board:
    """The breakers of every target, by (provider, model)."""

    def __init__(self, policy: CircuitPolicy, report: Report) -> None:
        self._policy = policy
        self._report = report
        self._known: frozenset[tuple[str, str]] = frozenset()
        self._breakers: dict[tuple[str, str], Breaker] = {}

    def configure(self, policy: CircuitPolicy, targets: Iterable[tuple[str, str]]) -> None:
        """A (re)loaded config: its policy holds for every breaker; breakers of targets that
        are still configured keep their state."""
        self._policy = policy
        self._known = frozenset(targets)
        for key in [k for k in self._breakers if k[1] != ANY_MODEL and k not in self._known]:
            del self._breakers[key]
        for breaker in self._breakers.values():
            breaker.policy = policy
        for key in self._known:
            self.get(*key)  # the gauge shows every configured target from the start

    def get(self, provider: str, model: str) -> Breaker:
        key = (provider, model)
        breaker = self._breakers.get(key)
        if breaker is None:
            if key not in self._known:
                key = (provider, ANY_MODEL)
                breaker = self._breakers.get(key)
            if breaker is None:
                breaker = self._breakers[key] = Breaker(self._policy, key, self._report)
                self._report(*key, CLOSED, False)
        return breaker
