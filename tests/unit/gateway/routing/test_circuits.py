"""Circuit breakers: closed → open after failures in a row, skipped for the cool-down, one probe in
half-open, its outcome deciding (the rate limiter's backend breaker is the same one); the board
keeps state across reloads and stays bounded."""

from __future__ import annotations

import pytest

from core.errors import (
    GatewayError,
    InvalidRequest,
    RequestTimeout,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.routing.circuits import (
    ANY_MODEL,
    CLOSED,
    HALF_OPEN,
    OPEN,
    Board,
    Breaker,
    CircuitPolicy,
    is_failure,
)

POLICY = CircuitPolicy(failures=3, cooldown_s=10.0)


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int, bool]] = []

    def __call__(self, provider: str, model: str, state: int, moved: bool) -> None:
        self.seen.append((provider, model, state, moved))


def breaker(policy: CircuitPolicy = POLICY, reports: Reports | None = None) -> Breaker:
    board = Board(policy, reports or Reports())
    board.configure(policy, [("p", "m")])
    return board.get("p", "m")


def upstream(status: int) -> UpstreamError:
    err = UpstreamError("boom")
    err.upstream_status = status
    return err


def test_failures_in_a_row_open_it_and_the_cooldown_lets_one_probe_through() -> None:
    reports = Reports()
    b = breaker(reports=reports)
    for now in (1.0, 2.0):
        b.failed(now)
    b.succeeded()  # an answer in between: the count starts again
    for now in (3.0, 4.0):
        b.failed(now)
        assert b.state == CLOSED and b.admit(now)
    b.failed(5.0)
    assert b.state == OPEN and not b.admit(14.9) and b.blocked(14.9)
    assert b.retry_in(14.0) == pytest.approx(1.0)
    assert b.admit(15.0) and b.state == HALF_OPEN  # the probe
    assert not b.admit(15.1) and b.blocked(15.1)  # only one at a time
    b.failed(16.0)  # the probe failed: open again, for a whole cool-down
    assert b.state == OPEN and not b.admit(25.9)
    assert b.admit(26.0)
    b.succeeded()
    assert b.state == CLOSED and b.admit(26.1) and not b.blocked(26.1)
    moves = [state for (_, _, state, moved) in reports.seen if moved]
    assert moves == [OPEN, HALF_OPEN, OPEN, HALF_OPEN, CLOSED]
    assert reports.seen[0] == ("p", "m", CLOSED, False)  # the gauge starts at closed


def test_a_probe_that_ends_without_an_answer_lets_the_next_one_probe() -> None:
    b = breaker()
    for now in (1.0, 2.0, 3.0):
        b.failed(now)
    assert b.admit(13.0) and not b.admit(13.0)
    b.released()  # the caller left during the probe
    assert b.state == HALF_OPEN and b.admit(13.5)


def test_a_probe_that_never_reports_is_replaced_after_a_cool_down() -> None:
    b = breaker(CircuitPolicy(failures=1, cooldown_s=5.0))
    b.failed(1000.0)
    assert b.admit(1005.0)  # the probe's caller goes away: neither success nor failure
    assert not b.admit(1009.9) and b.retry_in(1009.9) == pytest.approx(0.1)
    assert b.admit(1010.0)  # another probe, not a breaker stuck half-open for good


def test_zero_failures_turns_breakers_off() -> None:
    b = breaker(CircuitPolicy(failures=0))
    for now in range(100):
        b.failed(float(now))
    assert b.state == CLOSED and b.admit(100.0)


@pytest.mark.parametrize(
    ("err", "failure"),
    [
        (UpstreamTimeout("slow"), True),
        (UpstreamUnreachable("gone"), True),
        (RequestTimeout("408"), True),
        (upstream(500), True),
        (upstream(503), True),
        (upstream(429), False),  # throttled is alive
        (upstream(400), False),
        (InvalidRequest("bad"), False),
        (GatewayError("ours"), False),
    ],
)
def test_what_counts_as_a_failure(err: GatewayError, failure: bool) -> None:
    assert is_failure(err) is failure


def test_models_outside_the_config_share_one_breaker_per_provider() -> None:
    reports = Reports()
    board = Board(POLICY, reports)
    board.configure(POLICY, [("p", "m")])
    assert board.get("p", "m").key == ("p", "m")
    assert board.get("p", "caller/chosen-1") is board.get("p", "caller/chosen-2")
    assert board.get("p", "caller/chosen-1").key == ("p", ANY_MODEL)
    labels = {(p, m) for (p, m, _, _) in reports.seen}
    assert labels == {("p", "m"), ("p", ANY_MODEL)}  # bounded by the config


def test_a_reload_keeps_the_state_of_targets_still_configured() -> None:
    board = Board(POLICY, Reports())
    board.configure(POLICY, [("p", "m"), ("q", "n")])
    kept, dropped = board.get("p", "m"), board.get("q", "n")
    for now in (1.0, 2.0, 3.0):
        kept.failed(now)
    board.configure(CircuitPolicy(failures=3, cooldown_s=1.0), [("p", "m")])
    assert board.get("p", "m") is kept and kept.state == OPEN
    assert kept.admit(4.0)  # the new cool-down holds for the carried breaker
    assert board.get("q", "n") is not dropped  # now a model outside the config: `*`
