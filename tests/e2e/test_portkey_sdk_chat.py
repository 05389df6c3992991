"""Chat through the Portkey SDK (`portkey_ai.Portkey`), pointed at the gateway as at Portkey's
own: its `x-portkey-api-key`, `x-portkey-virtual-key` and `x-portkey-config` headers route the
request; answers and errors are OpenAI's, as the SDK expects them."""

from __future__ import annotations

from typing import Any

import pytest
from portkey_ai import Portkey
from portkey_ai.api_resources.types.chat_complete_type import ChatCompletions, StreamChoice

from tests.e2e.conftest import Env
from tests.e2e.support import FIREWORKS_MODEL, FULL_KEY, LIMITED_KEY, OA, OPENAI_MODEL
from tests.upstreams.chat_fake import chat_prompt
from tests.upstreams.fakegen import expected_text

MESSAGES: list[Any] = [{"role": "user", "content": "Write about the sea"}]
PROMPT = chat_prompt(MESSAGES)


def portkey(env: Env, **kw: Any) -> Portkey:
    kw.setdefault("api_key", FULL_KEY)
    return Portkey(base_url=env.url + "/v1", max_retries=0, **kw)


def test_a_chat_through_a_virtual_key(env: Env) -> None:
    client = portkey(env, virtual_key="fw")
    out = client.chat.completions.create(
        model=FIREWORKS_MODEL, messages=MESSAGES, max_tokens=5, seed=3
    )
    assert isinstance(out, ChatCompletions)  # not a stream
    assert out.id is not None and out.id.startswith("chatcmpl-") and out.model == FIREWORKS_MODEL
    assert out.choices is not None and out.choices[0].message is not None
    assert out.choices[0].message.content == expected_text(PROMPT, 0, 5, 3)
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 5
    sent = env.fireworks.last_request()
    assert sent["path"] == "/inference/v1/chat/completions"
    assert env.openai.requests() == []


def test_a_stream_through_an_alias(env: Env) -> None:
    client = portkey(env)
    stream = client.chat.completions.create(
        model=OA, messages=MESSAGES, max_tokens=6, seed=1, stream=True
    )
    assert not isinstance(stream, ChatCompletions)  # a stream
    chunks = list(stream)
    first, last = chunks[0].choices, chunks[-1].choices
    assert first is not None and first[0].delta is not None
    assert first[0].delta.role == "assistant"
    text = "".join(delta_content(c.choices[0]) for c in chunks if c.choices)
    assert text == expected_text(PROMPT, 0, 6, 1)
    assert last is not None and last[0].finish_reason == "length"


def delta_content(choice: StreamChoice) -> str:
    assert choice.delta is not None
    return choice.delta.content or ""


def test_a_config_falls_back(env: Env) -> None:
    env.openai.script({"status": 503})
    config = {
        "strategy": {"mode": "fallback"},
        "targets": [
            {"virtual_key": "oai", "override_params": {"model": OPENAI_MODEL}},
            {"virtual_key": "fw", "override_params": {"model": FIREWORKS_MODEL}},
        ],
    }
    client = portkey(env, config=config)
    out = client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=4)
    assert isinstance(out, ChatCompletions)  # not a stream
    assert out.choices is not None and out.choices[0].message is not None
    assert out.choices[0].message.content == expected_text(PROMPT, 0, 4, None)
    assert len(env.openai.requests()) == 1 and len(env.fireworks.requests()) == 1


def test_errors_are_the_sdk_s_exceptions(env: Env) -> None:
    """The SDK raises the status errors of the openai client it bundles."""
    client = portkey(env)
    with pytest.raises(Exception) as bad:
        client.chat.completions.create(model=OA, messages=[{"role": "robot", "content": "x"}])
    assert type(bad.value).__name__ == "BadRequestError"
    assert bad.value.body["param"] == "messages[0].role"  # type: ignore[attr-defined]
    limited = portkey(env, api_key=LIMITED_KEY, virtual_key="oai")
    with pytest.raises(Exception) as denied:
        limited.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
    assert type(denied.value).__name__ == "PermissionDeniedError"
    assert env.openai.requests() == []
