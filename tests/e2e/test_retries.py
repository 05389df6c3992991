"""Retries of a target (`models.<alias>.retry`), seen through the openai SDK with its own
retries off: the gateway retries retryable failures, waits as the upstream asks within the
cap, gives up with the last answer, and falls back to the next target after its retries."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import RETRY, RETRY_THEN_FW

PROMPT = "Say this is a test"


@pytest.mark.parametrize("stream", [False, True])
def test_retries_until_the_upstream_recovers(env: Env, stream: bool) -> None:
    env.openai.script({"status": 503, "times": 2})
    if stream:
        chunks = list(env.sdk.completions.create(model=RETRY, prompt=PROMPT, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        text = env.sdk.completions.create(model=RETRY, prompt=PROMPT).choices[0].text
    assert text
    assert [r["outcome"] for r in env.openai.requests()] == ["error", "error", stream_ok(stream)]


def stream_ok(stream: bool) -> str:
    return "completed_stream" if stream else "ok"


def test_a_dropped_connection_is_retried(env: Env) -> None:
    env.openai.script({"close": True, "times": 1})
    assert env.sdk.completions.create(model=RETRY, prompt=PROMPT).choices[0].text
    assert len(env.openai.requests()) == 2


def test_retries_end_with_the_last_error(env: Env) -> None:
    env.openai.script({"status": 500, "times": -1})
    with pytest.raises(openai.InternalServerError) as info:
        env.sdk.completions.create(model=RETRY, prompt=PROMPT)
    assert info.value.status_code == 502
    assert len(env.openai.requests()) == 3  # the try and two retries


def test_a_client_error_is_not_retried(env: Env) -> None:
    env.openai.script({"status": 400, "times": -1})
    with pytest.raises(openai.BadRequestError):
        env.sdk.completions.create(model=RETRY, prompt=PROMPT)
    assert len(env.openai.requests()) == 1


def test_an_upstream_that_says_no_retry_is_not_retried(env: Env) -> None:
    """OpenAI's insufficient_quota 429 carries x-should-retry: false."""
    with pytest.raises(openai.RateLimitError):
        env.sdk.completions.create(model=RETRY, prompt="__status_429_quota__")
    assert len(env.openai.requests()) == 1


def test_a_wait_beyond_the_cap_is_not_made(env: Env) -> None:
    """The upstream's 429 asks for 7 s; the alias allows 1 s of waiting in all: the 429 comes
    back at once, with the upstream's retry-after for the caller."""
    env.openai.script({"status": 429, "times": -1})
    with pytest.raises(openai.RateLimitError) as info:
        env.sdk.completions.create(model=RETRY, prompt=PROMPT)
    assert info.value.response.headers["retry-after"] == "7"
    assert len(env.openai.requests()) == 1


def test_fallback_comes_after_the_retries(env: Env) -> None:
    env.openai.script({"status": 503, "times": -1})
    assert env.sdk.completions.create(model=RETRY_THEN_FW, prompt=PROMPT).choices[0].text
    assert len(env.openai.requests()) == 3
    assert len(env.fireworks.requests()) == 1
