"""Upstream failures as the SDK sees them: status mapping (429 kept with its retry headers,
5xx/unreachable → 502, timeout → 504, each naming the target), fallback, and errors after the
first byte (an SSE error event, then [DONE]; the SDK raises APIError)."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import (
    DEAD,
    DIALECT_ALIASES,
    FALLBACK,
    FAST,
    FW,
    OA,
    OA_THEN_FW,
    TARGET_LABEL,
    error_body,
    expect,
    poll_stats,
    raw_stream,
)

PROMPT = "Say this is a test"


def test_upstream_429_is_a_rate_limit_error_with_retry_after(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        sdk.completions.create(model=OA, prompt="__status_429__")
    err = info.value
    assert err.status_code == 429
    assert err.code == "rate_limit_exceeded"
    assert (err.response.headers["retry-after"], err.response.headers["retry-after-ms"]) == (
        "7",
        "7000",
    )


class RecordingClock:
    """`time` as the SDK's retry loop sees it: the waits are recorded instead of slept."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> RecordingClock:
    recording = RecordingClock()
    monkeypatch.setattr(openai._base_client, "time", recording)
    return recording


def test_sdk_honours_retry_after(env: Env, clock: RecordingClock) -> None:
    """With one retry allowed, the SDK waits what the gateway's retry-after says (7 s, from
    the upstream), not its own backoff (≈0.5 s), and the upstream sees both attempts."""
    with env.client(max_retries=1) as client, pytest.raises(openai.RateLimitError):
        client.completions.create(model=OA, prompt="__status_429__")
    assert clock.sleeps == [7.0]
    assert len(env.openai.requests()) == 2


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_upstream_503_is_a_502_naming_the_target(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.completions.create(model=alias, prompt="__status_503__")
    assert info.value.status_code == 502
    assert TARGET_LABEL[alias] in info.value.message


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_upstream_text_500_is_a_502(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.completions.create(model=alias, prompt="__notjson_500__")
    assert info.value.status_code == 502
    assert "upstream exploded" in info.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_timeout_is_504(env: Env, sdk: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.completions.create(model=FAST, prompt="__sleep_2000__", stream=stream)
    assert info.value.status_code == 504
    assert error_body(info.value)["type"] == "timeout_error"
    assert TARGET_LABEL[OA] in info.value.message
    # the gateway gave up on the upstream request too: it was not left running
    stats = poll_stats(env.openai, lambda s: s["cancelled"] >= 1)
    assert (stats["requests"], stats["cancelled"]) == (1, 1)


def test_timeout_bounds_each_wait_not_a_whole_stream(sdk: openai.OpenAI) -> None:
    """`timeout_s` (0.5 s) is per wait for the next bytes: a stream sending a chunk every
    100 ms outlives it."""
    with sdk.completions.create(model=FAST, prompt="__slow_stream__", stream=True) as chunks:
        texts = [c.choices[0].text for c, _ in zip(chunks, range(10), strict=False)]
    assert "".join(texts) == expect("__slow_stream__", 0, 10).text


@pytest.mark.parametrize("stream", [False, True])
def test_unreachable_upstream_is_502(sdk: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.completions.create(model=DEAD, prompt=PROMPT, stream=stream)
    assert info.value.status_code == 502
    assert info.value.code == "upstream_unreachable"
    assert "deadp/nowhere" in info.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_fallback_skips_the_dead_target(env: Env, sdk: openai.OpenAI, stream: bool) -> None:
    if stream:
        with sdk.completions.create(
            model=FALLBACK, prompt=PROMPT, max_tokens=3, stream=True
        ) as chunks:
            text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        resp = sdk.completions.create(model=FALLBACK, prompt=PROMPT, max_tokens=3)
        assert resp.model == FALLBACK
        text = resp.choices[0].text
    assert text == expect(PROMPT, 0, 3).text
    assert len(env.openai.requests()) == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [429, 500, 503])
def test_fallback_on_an_upstream_failure(
    env: Env, sdk: openai.OpenAI, status: int, stream: bool
) -> None:
    env.openai.script({"status": status})
    resp = sdk.completions.with_raw_response.create(
        model=OA_THEN_FW, prompt=PROMPT, max_tokens=3, stream=stream
    )
    assert resp.status_code == 200
    parsed = resp.parse()
    assert isinstance(parsed, openai.Stream) == stream
    if isinstance(parsed, openai.Stream):
        text = "".join(c.choices[0].text for c in parsed if c.choices)
    else:
        text = parsed.choices[0].text
    assert text == expect(PROMPT, 0, 3).text
    assert [r["outcome"] for r in env.openai.requests()] == ["error"]
    assert len(env.fireworks.requests()) == 1


def test_no_fallback_on_a_caller_error(env: Env, sdk: openai.OpenAI) -> None:
    env.openai.script({"status": 400})
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model=OA_THEN_FW, prompt=PROMPT)
    assert env.fireworks.requests() == []


def test_when_every_target_fails_the_last_error_is_returned(env: Env, sdk: openai.OpenAI) -> None:
    env.openai.script({"status": 503})
    env.fireworks.script({"status": 500})
    with pytest.raises(openai.InternalServerError) as info:
        sdk.completions.create(model=OA_THEN_FW, prompt=PROMPT)
    assert info.value.status_code == 502
    assert TARGET_LABEL[FW] in info.value.message


def test_no_fallback_after_the_first_byte(env: Env) -> None:
    body = {"model": OA_THEN_FW, "prompt": "__midstream_error__", "stream": True}
    *events, error, done = raw_stream(env.http, body).data()
    assert (done, set(error)) == ("[DONE]", {"error"})
    assert TARGET_LABEL[OA] in error["error"]["message"]
    assert events
    assert env.fireworks.requests() == []


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_midstream_error_raises_api_error(sdk: openai.OpenAI, alias: str) -> None:
    got: list[str] = []
    with (
        pytest.raises(openai.APIError) as info,
        sdk.completions.create(model=alias, prompt="__midstream_error__", stream=True) as chunks,
    ):
        for chunk in chunks:
            got += [c.text for c in chunk.choices]
    assert not isinstance(info.value, openai.APIStatusError)
    assert TARGET_LABEL[alias] in info.value.message
    assert got  # content arrived before the error


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_midstream_error_raw_sse(env: Env, alias: str) -> None:
    raw = raw_stream(env.http, {"model": alias, "prompt": "__midstream_error__", "stream": True})
    assert raw.status == 200
    *events, error, done = raw.data()
    assert done == "[DONE]"
    assert set(error) == {"error"}
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert TARGET_LABEL[alias] in error["error"]["message"]
    assert events and all(e["choices"] for e in events)
    # OpenAI sends an error event; Fireworks just cuts the connection
    expected_code = "upstream_response_incomplete" if alias == FW else "upstream_server_error"
    assert error["error"]["code"] == expected_code


# (upstream status, status the caller gets, SDK exception, error code)
UPSTREAM_STATUSES: list[tuple[int, int, type[openai.APIStatusError], str | None]] = [
    (400, 400, openai.BadRequestError, None),
    (401, 502, openai.InternalServerError, "upstream_authentication_failed"),
    (403, 502, openai.InternalServerError, "upstream_permission_denied"),
    (404, 502, openai.InternalServerError, "upstream_not_found"),
    (408, 504, openai.InternalServerError, "upstream_timeout"),
    (409, 409, openai.ConflictError, None),
    (422, 400, openai.BadRequestError, None),
    (500, 502, openai.InternalServerError, "upstream_server_error"),
    (503, 502, openai.InternalServerError, "upstream_server_error"),
]


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
@pytest.mark.parametrize(
    ("upstream", "status", "exc", "code"),
    UPSTREAM_STATUSES,
    ids=[str(s[0]) for s in UPSTREAM_STATUSES],
)
def test_upstream_status_table(
    sdk: openai.OpenAI,
    alias: str,
    upstream: int,
    status: int,
    exc: type[openai.APIStatusError],
    code: str | None,
) -> None:
    with pytest.raises(exc) as info:
        sdk.completions.create(model=alias, prompt=f"__status_{upstream}__")
    assert info.value.status_code == status
    if code is not None:
        assert info.value.code == code
    assert TARGET_LABEL[alias] in info.value.message
    assert f"returned {upstream}" in info.value.message


def test_quota_429_is_not_retried_by_the_sdk(env: Env, clock: RecordingClock) -> None:
    with env.client(max_retries=2) as client, pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=OA, prompt="__status_429_quota__")
    assert (info.value.code, info.value.type) == ("insufficient_quota", "insufficient_quota")
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(env.openai.requests()) == 1
    assert clock.sleeps == []


def test_fireworks_429_keeps_retry_after(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        sdk.completions.create(model=FW, prompt="__status_429__")
    assert info.value.response.headers["retry-after"] == "7"
    assert TARGET_LABEL[FW] in info.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_closing_the_connection_is_502(sdk: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.completions.create(model=FW, prompt="__close__", stream=stream)
    assert info.value.status_code == 502
    assert TARGET_LABEL[FW] in info.value.message
