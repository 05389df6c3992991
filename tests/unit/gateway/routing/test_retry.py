"""The retry policy: which failures are retried, the wait (the upstream's, else backoff with
jitter), the cap on all waits, and its config."""

from __future__ import annotations

import email.utils
import time

import pytest

from core.errors import (
    ConfigError,
    GatewayError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.config import parse
from gateway.routing.retry import RetryPolicy, retry_after
from gateway.routing.trees import leaves


def upstream(status: int, **headers: str) -> UpstreamError:
    err = UpstreamError("boom", headers=headers)
    err.upstream_status = status
    return err


POLICY = RetryPolicy(attempts=3, backoff_s=0.5, max_backoff_s=8.0, max_wait_s=60.0)


def test_backoff_doubles_with_jitter_and_stops_after_the_attempts() -> None:
    err = upstream(503)
    assert [POLICY.delay(n, err, 0.0, jitter=0.0) for n in range(4)] == [0.5, 1.0, 2.0, None]
    assert POLICY.delay(0, err, 0.0, jitter=0.999) == pytest.approx(0.5 * 0.75, rel=1e-3)
    long = RetryPolicy(attempts=5, max_backoff_s=1.5)
    assert long.delay(4, err, 0.0, jitter=0.0) == 1.5


@pytest.mark.parametrize(
    ("err", "retried"),
    [
        (upstream(429), True),
        (upstream(500), True),
        (upstream(400), False),
        (upstream(404), False),
        (upstream(429, **{"x-should-retry": "false"}), False),
        (UpstreamTimeout("slow"), True),
        (UpstreamUnreachable("gone"), True),
        (GatewayError("internal"), False),
    ],
)
def test_what_is_retried(err: GatewayError, retried: bool) -> None:
    assert (POLICY.delay(0, err, 0.0, jitter=0.0) is not None) == retried


def test_the_upstreams_wait_wins_within_the_cap() -> None:
    assert POLICY.delay(0, upstream(429, **{"retry-after": "7"}), 0.0, 0.0) == 7.0
    both = upstream(429, **{"retry-after": "7", "retry-after-ms": "1500"})
    assert POLICY.delay(0, both, 0.0, 0.0) == 1.5
    assert POLICY.delay(0, upstream(429, **{"retry-after": "7"}), 54.0, 0.0) is None
    assert POLICY.delay(1, upstream(503), 59.0, 0.0) == 1.0  # exactly reaches the cap
    assert POLICY.delay(1, upstream(503), 59.5, 0.0) is None  # 1 s of backoff: past 60 s


def test_retry_after_reads_ms_seconds_and_dates() -> None:
    assert retry_after({}) is None
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after({"retry-after": "2.5"}) == 2.5
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after": "-3"}) is None
    assert retry_after({"retry-after-ms": "nan", "retry-after": "1"}) == 1.0
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after({"retry-after": date}) == pytest.approx(30, abs=2)


BASE = """
providers: {up: {type: openai-compatible, base_url: "http://127.0.0.1:9/v1"}}
models:
  m:
    targets: [{provider: up}]
"""


def test_config_reads_the_policy() -> None:
    cfg = parse(BASE + "    retry: {attempts: 2, on_status: [429, 503], backoff_s: 0.1}\n")
    (leaf,) = leaves(cfg.models["m"].tree)
    policy = leaf.retry
    assert (policy.attempts, policy.on_status, policy.backoff_s) == (2, frozenset({429, 503}), 0.1)
    assert leaves(parse(BASE).models["m"].tree)[0].retry.attempts == 0  # none unless asked


@pytest.mark.parametrize(
    ("retry", "path"),
    [
        ("{attempts: 6}", "models.m.retry.attempts"),
        ("{attempts: -1}", "models.m.retry.attempts"),
        ("{on_status: [200]}", "models.m.retry.on_status[0]"),
        ("{on_status: 503}", "models.m.retry.on_status"),
        ("{max_wait_s: 0}", "models.m.retry.max_wait_s"),
        ("{tries: 2}", "models.m.retry"),
    ],
)
def test_config_errors_name_the_field(retry: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(BASE + f"    retry: {retry}\n")
    assert path in str(info.value)
