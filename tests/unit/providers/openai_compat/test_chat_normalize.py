"""Chat through OpenAI-compatible upstreams: each dialect's table for the chat fields, the body
prepare_chat() builds, and the upstream's answers normalized (JSON and streams)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.answers import ChatChunk, Usage
from core.chat import CHAT, VLLM_FIELDS, validate_chat
from core.completions import RequestLimits
from core.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter, UpstreamError
from core.fields import EXTENSION
from core.provider import Target
from providers.openai_compat import OpenAICompatProvider
from providers.openai_compat.adapter import UpstreamChat, _truncated_chat
from providers.openai_compat.chat_normalize import (
    ChatNormalization,
    ChatStreamNormalizer,
    chat_answer,
)
from providers.rules.chat import RULES
from providers.rules.params import UNKNOWN, Action

TAGS = ("openai", "fireworks", "vllm-server", "openai-compatible", "azure-openai")
HELLO = [{"role": "user", "content": "hello"}]


def request(**fields: Any) -> Any:
    return validate_chat({"model": "alias", "messages": HELLO, **fields}, RequestLimits())


def provider(tag: str) -> OpenAICompatProvider:
    return OpenAICompatProvider.from_config(
        "up", tag, {"type": tag, "base_url": "http://127.0.0.1:9/v1"}, "providers.up"
    )


def target(policy: str = "reject") -> Target:
    return Target("alias", "up", "acct/model-x", 30.0, policy)  # type: ignore[arg-type]


def prepared(tag: str, policy: str = "reject", **fields: Any) -> UpstreamChat:
    plan: UpstreamChat = provider(tag).prepare_chat(request(**fields), target(policy)).state
    assert orjson.loads(plan.payload) == plan.body  # serialized once, the same thing
    return plan


def body_of(tag: str, policy: str = "reject", **fields: Any) -> dict[str, Any]:
    return dict(prepared(tag, policy, **fields).body)


# ---------------------------------------------------------------- the tables


@pytest.mark.parametrize("tag", TAGS)
def test_every_chat_field_has_a_rule_in_every_dialect(tag: str) -> None:
    rules = RULES[tag]
    assert UNKNOWN in rules
    missing = [name for name in CHAT.names() if name not in rules]
    assert missing == []


@pytest.mark.parametrize(
    ("tag", "field", "value"),
    [
        ("openai", "top_k", 40),
        ("openai", "min_p", 0.1),
        ("openai", "chat_template", "{{ x }}"),
        ("fireworks", "audio", {"voice": "alloy", "format": "wav"}),
        ("fireworks", "web_search_options", {}),
        ("fireworks", "store", True),
        ("fireworks", "min_tokens", 2),
        ("vllm-server", "mirostat_target", 5.0),
        ("vllm-server", "modalities", ["text"]),
        ("openai-compatible", "mirostat_target", 5.0),
        ("azure-openai", "web_search_options", {}),
        ("azure-openai", "top_k", 40),
    ],
)
def test_what_a_target_cannot_serve_is_a_400_naming_it(tag: str, field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParameter) as exc:
        body_of(tag, **{field: value})
    assert exc.value.param == field
    assert f"Parameter '{field}' is not supported by target 'up/acct/model-x'" in exc.value.message


def test_the_drop_policy_drops_and_reports() -> None:
    provider_ = provider("fireworks")
    prepared_ = provider_.prepare_chat(request(audio={"voice": "x"}, top_k=5), target("drop"))
    assert prepared_.dropped == ("audio",)
    assert "audio" not in prepared_.state.body and prepared_.state.body["top_k"] == 5


@pytest.mark.parametrize("tag", TAGS)
def test_openai_fields_pass_unchanged(tag: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    fields: dict[str, Any] = {
        "temperature": 0.5,
        "max_completion_tokens": 9,
        "n": 2,
        "stop": ["x"],
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "tools": tools,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "user": "u",
    }
    body = body_of(tag, **fields)
    assert {k: body[k] for k in fields} == fields
    assert body["model"] == "acct/model-x" and body["messages"] == HELLO


def test_the_provider_extensions_by_dialect() -> None:
    extensions: dict[str, Any] = {
        "top_k": 40,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "ignore_eos": True,
    }
    for tag in ("fireworks", "vllm-server", "openai-compatible"):
        assert {k: body_of(tag, **extensions)[k] for k in extensions} == extensions
    assert body_of("fireworks", mirostat_target=5.0, mirostat_lr=0.1)["mirostat_lr"] == 0.1
    assert set(CHAT.names(EXTENSION)) >= set(extensions)


def test_vllm_extras_pass_to_vllm_servers_and_nowhere_strict() -> None:
    extras: dict[str, Any] = {
        "min_tokens": 2,
        "chat_template_kwargs": {"x": 1},
        "add_generation_prompt": False,
    }
    for tag in ("vllm-server", "openai-compatible"):
        assert {k: body_of(tag, **extras)[k] for k in extras} == extras
    for tag in ("openai", "fireworks"):
        assert all(RULES[tag][name].action is Action.REJECT for name in VLLM_FIELDS)


def test_unknown_fields() -> None:
    assert body_of("vllm-server", my_extra=1)["my_extra"] == 1
    assert body_of("openai-compatible", my_extra=1)["my_extra"] == 1
    for tag in ("openai", "fireworks"):
        with pytest.raises(UnsupportedParameter) as exc:
            body_of(tag, my_extra=1)
        assert exc.value.param == "my_extra"


def test_streams_ask_for_usage_except_fireworks() -> None:
    for tag in ("openai", "vllm-server", "openai-compatible"):
        assert body_of(tag, stream=True)["stream_options"] == {"include_usage": True}
        asked = body_of(tag, stream=True, stream_options={"include_usage": False})
        assert asked["stream_options"] == {"include_usage": True}
    fireworks = body_of("fireworks", stream=True, stream_options={"include_usage": True})
    assert "stream_options" not in fireworks and fireworks["stream"] is True


def test_context_behaviour_by_dialect() -> None:
    assert body_of("fireworks")["context_length_exceeded_behavior"] == "error"
    truncate = {"context_length_exceeded_behavior": "truncate"}
    assert body_of("fireworks", **truncate)["context_length_exceeded_behavior"] == "truncate"
    for tag in ("openai", "vllm-server", "openai-compatible"):
        plan = prepared(tag, max_tokens=10, **truncate)
        assert "context_length_exceeded_behavior" not in plan.body and plan.truncate
        assert not prepared(tag, **truncate).truncate  # nothing to lower without a bound
    error = {"context_length_exceeded_behavior": "error"}
    assert prepared("vllm-server", max_tokens=10, **error).check_context  # it clamps: counted
    assert not prepared("vllm-server", **error).check_context  # no bound: nothing to count
    assert not prepared("vllm-server", max_tokens=10).check_context  # unasked: vLLM's clamp
    assert not prepared("openai", max_tokens=10).check_context


def test_a_truncate_retry_lowers_the_callers_bound() -> None:
    plan = prepared(
        "openai", max_completion_tokens=500, context_length_exceeded_behavior="truncate"
    )
    err = ContextLengthExceeded(
        "This model's maximum context length is 2048 tokens. However, you requested 2100 "
        "tokens (1600 in the messages, 500 in the completion).",
        param="messages",
    )
    lowered = _truncated_chat(plan, err)
    assert lowered is not None
    assert orjson.loads(lowered)["max_completion_tokens"] == 448
    assert "max_tokens" not in orjson.loads(lowered)


def test_grammar_response_format() -> None:
    grammar = {"type": "grammar", "grammar": 'root ::= "yes" | "no"'}
    assert body_of("fireworks", response_format=grammar)["response_format"] == grammar
    vllm = body_of("vllm-server", response_format=grammar)
    assert vllm["structured_outputs"] == {"grammar": grammar["grammar"]}
    assert "response_format" not in vllm
    with pytest.raises(InvalidRequest) as exc:
        body_of("openai", response_format=grammar)
    assert exc.value.param == "response_format.type"
    with pytest.raises(InvalidRequest) as exc:
        request(response_format={"type": "grammar"})
    assert exc.value.param == "response_format.grammar"


def test_vllm_json_object_with_a_schema_is_json_schema() -> None:
    schema = {"type": "object"}
    body = body_of("vllm-server", response_format={"type": "json_object", "schema": schema})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }


# ---------------------------------------------------------------- answers

SHAPE = ChatNormalization("up/model", want_logprobs=False)
USAGE: Usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_a_json_answer() -> None:
    body = {
        "id": "whatever",
        "system_fingerprint": "fp_1",
        "choices": [
            {
                "index": 1,
                "message": {"role": "assistant", "content": "b", "annotations": []},
                "finish_reason": "length",
                "logprobs": {"content": []},
            },
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "eos"},
        ],
        "usage": {**USAGE, "perf_metrics": {}},
    }
    out = chat_answer(body, SHAPE)
    assert out == {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "a", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "b", "refusal": None},
                "logprobs": None,
                "finish_reason": "length",
            },
        ],
        "usage": USAGE,
        "system_fingerprint": "fp_1",
    }


def test_tool_calls_and_their_arguments() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
    body: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": calls},
                "finish_reason": "tool_calls",
            }
        ]
    }
    choice = chat_answer(body, SHAPE)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    ]
    body["choices"][0]["message"]["tool_calls"] = [{"id": "x", "function": {}}]
    with pytest.raises(UpstreamError):
        chat_answer(body, SHAPE)


def test_logprobs_in_openai_s_chat_form() -> None:
    token = {"token": "hi", "logprob": -0.5, "top_logprobs": [{"token": "yo", "logprob": -1.0}]}
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"content": "hi"},
                "logprobs": {"content": [{**token, "token_id": 7, "sampling_logprob": -0.4}]},
                "finish_reason": "stop",
            }
        ]
    }
    shape = ChatNormalization("up/model", want_logprobs=True)
    assert chat_answer(body, shape)["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "hi",
                "logprob": -0.5,
                "bytes": [104, 105],
                "top_logprobs": [{"token": "yo", "logprob": -1.0, "bytes": [121, 111]}],
            }
        ],
        "refusal": None,
    }


def test_vllm_extras_kept_when_asked() -> None:
    shape = ChatNormalization(
        "up/model",
        False,
        choice_extras=("stop_reason", "token_ids"),
        answer_extras=("prompt_token_ids",),
    )
    body = {
        "prompt_token_ids": [1, 2],
        "prompt_logprobs": None,
        "choices": [
            {
                "index": 0,
                "message": {"content": "x"},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": [3],
            },
        ],
    }
    out = chat_answer(body, shape)
    assert out["prompt_token_ids"] == [1, 2] and "prompt_logprobs" not in out
    assert out["choices"][0]["token_ids"] == [3] and "stop_reason" not in out["choices"][0]


def test_a_failed_generation_is_an_upstream_error() -> None:
    body = {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "error"}]}
    with pytest.raises(UpstreamError):
        chat_answer(body, SHAPE)


# ---------------------------------------------------------------- streams


def event(*choices: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion.chunk", "choices": list(choices), **top}


def delta(index: int, finish: str | None = None, **d: Any) -> dict[str, Any]:
    return {"index": index, "delta": d, "logprobs": None, "finish_reason": finish}


def test_openai_s_stream() -> None:
    norm = ChatStreamNormalizer(SHAPE)
    out = [
        *norm.feed(
            event(delta(0, role="assistant", content="", refusal=None), system_fingerprint="fp")
        ),
        *norm.feed(event(delta(0, content="Hel"), system_fingerprint="fp")),
        *norm.feed(event(delta(0, content=""))),  # nothing in it
        *norm.feed(event(delta(0, "stop"))),
        *norm.feed(event(usage=USAGE)),
        *norm.end(),
    ]
    assert out == [
        {
            "choices": [delta(0, role="assistant", content="", refusal=None)],
            "system_fingerprint": "fp",
        },
        {"choices": [delta(0, content="Hel")]},
        {"choices": [delta(0, "stop")]},
        {"choices": [], "usage": USAGE},
    ]


def test_fireworks_usage_on_the_last_content_chunk() -> None:
    norm = ChatStreamNormalizer(SHAPE)
    out = [
        *norm.feed(event(delta(0, role="assistant"), usage=None)),
        *norm.feed(event(delta(0, "length", content="x"), usage=USAGE)),
        *norm.end(),
    ]
    assert out == [
        {"choices": [delta(0, role="assistant")]},
        {"choices": [delta(0, "length", content="x")]},
        {"choices": [], "usage": USAGE},
    ]


def test_tool_call_deltas() -> None:
    norm = ChatStreamNormalizer(SHAPE)
    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    piece = {"index": 0, "function": {"arguments": '{"a"'}}
    out = [
        *norm.feed(event(delta(0, role="assistant", content=None, tool_calls=[first]))),
        *norm.feed(event(delta(0, tool_calls=[piece]))),
        *norm.feed(event(delta(0, "tool_calls"))),
    ]
    assert out[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [first],
    }
    assert out[1]["choices"][0]["delta"] == {"tool_calls": [piece]}
    assert out[2]["choices"][0]["finish_reason"] == "tool_calls"


def test_stream_logprobs_only_when_asked() -> None:
    lp = {"content": [{"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}]}
    raw = {**delta(0, content="a"), "logprobs": lp}
    assert ChatStreamNormalizer(SHAPE).feed(event(raw))[0]["choices"][0]["logprobs"] is None
    shape = ChatNormalization("up/model", want_logprobs=True)
    got = ChatStreamNormalizer(shape).feed(event(raw))[0]["choices"][0]["logprobs"]
    assert got == {**lp, "refusal": None}


# ---------------------------------------------------------------- stop strings (Fireworks)


def entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def test_a_stop_string_is_cut_from_the_content_and_its_logprobs() -> None:
    shape = ChatNormalization("fw/m", want_logprobs=True, stops=(" gam", "END"))
    logprobs = {"content": [entry(" alpha", -1.0), entry(" ga", -2.0), entry("mma", -3.0)]}
    body: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "message": {"content": " alpha gamma"},
                "logprobs": logprobs,
                "finish_reason": "stop",
            }
        ]
    }
    # " alpha gamma" does not end with a stop string: kept whole
    assert chat_answer(body, shape)["choices"][0]["message"]["content"] == " alpha gamma"
    body["choices"][0]["message"]["content"] = " alpha gam"
    logprobs["content"] = [entry(" alpha", -1.0), entry(" g", -2.0), entry("am", -3.0)]
    choice = chat_answer(body, shape)["choices"][0]
    assert choice["message"]["content"] == " alpha"
    assert choice["logprobs"] == {"content": [entry(" alpha", -1.0)], "refusal": None}


def test_the_cut_never_applies_to_a_choice_cut_by_length() -> None:
    shape = ChatNormalization("fw/m", want_logprobs=False, stops=("END",))
    body = {"choices": [{"index": 0, "message": {"content": "xEND"}, "finish_reason": "length"}]}
    assert chat_answer(body, shape)["choices"][0]["message"]["content"] == "xEND"


def test_a_stream_holds_back_what_may_begin_a_stop_string() -> None:
    norm = ChatStreamNormalizer(ChatNormalization("fw/m", want_logprobs=False, stops=(" gamma",)))
    out = [
        *norm.feed(event(delta(0, role="assistant"))),
        *norm.feed(event(delta(0, content=" alpha"))),
        *norm.feed(event(delta(0, content=" ga"))),  # may begin " gamma": held
        *norm.feed(event(delta(0, content="mma"))),
        *norm.feed(event(delta(0, "stop"), usage=USAGE)),
        *norm.end(),
    ]
    texts = [c["choices"][0]["delta"].get("content") for c in out if c["choices"]]
    assert texts == [None, " alpha", None]
    assert out[-2]["choices"][0]["finish_reason"] == "stop"
    last: ChatChunk = {"choices": [], "usage": USAGE}
    assert out[-1] == last


def test_held_text_that_was_no_stop_goes_out() -> None:
    shape = ChatNormalization("fw/m", want_logprobs=True, stops=(" gamma",))
    norm = ChatStreamNormalizer(shape)
    first = {**delta(0, content=" ga"), "logprobs": {"content": [entry(" ga", -1.0)]}}
    then = {**delta(0, content="rden"), "logprobs": {"content": [entry("rden", -2.0)]}}
    assert norm.feed(event(first)) == []
    out = norm.feed(event(then))
    assert out[0]["choices"][0]["delta"] == {"content": " garden"}
    assert out[0]["choices"][0]["logprobs"] == {
        "content": [entry(" ga", -1.0), entry("rden", -2.0)],
        "refusal": None,
    }
    assert norm.feed(event({**delta(0, content=" ga"), "logprobs": {"content": []}})) == []
    assert norm.end()[0]["choices"][0]["delta"] == {"content": " ga"}  # the stream just ended


def test_a_fireworks_chat_cuts_stops_and_sends_one_bound() -> None:
    plan = prepared("fireworks", stop=["END"], max_tokens=9, max_completion_tokens=3)
    assert plan.shape.stops == ("END",)
    assert plan.body["max_completion_tokens"] == 3 and "max_tokens" not in plan.body
    assert prepared("openai", stop="END").shape.stops == ()


# ---------------------------------------------------------------- Azure's content filter

VERDICTS = {"hate": {"filtered": False, "severity": "safe"}}
FLAGGED = {"hate": {"filtered": True, "severity": "high"}}
PROMPT_FILTER = [{"prompt_index": 0, "content_filter_results": VERDICTS}]
AZURE = ChatNormalization(
    "az/gpt-4o",
    want_logprobs=False,
    choice_extras=("stop_reason", "content_filter_results"),
    upstream_extras=("prompt_filter_results",),
)


def test_azure_filter_results_pass_through_a_json_answer() -> None:
    message = {"role": "assistant", "content": "Hi"}
    choice = {"index": 0, "message": message, "finish_reason": "content_filter"}
    body = {
        "choices": [{**choice, "content_filter_results": FLAGGED}],
        "prompt_filter_results": PROMPT_FILTER,
    }
    out: dict[str, Any] = dict(chat_answer(body, AZURE))
    assert out["prompt_filter_results"] == PROMPT_FILTER
    assert out["choices"][0]["content_filter_results"] == FLAGGED
    assert out["choices"][0]["finish_reason"] == "content_filter"
    plain: dict[str, Any] = dict(chat_answer(body, SHAPE))
    assert "prompt_filter_results" not in plain
    assert "content_filter_results" not in plain["choices"][0]


def test_azure_stream_the_prompt_s_verdicts_ride_on_the_first_chunk() -> None:
    norm = ChatStreamNormalizer(AZURE)
    first = {"id": "", "object": "", "choices": [], "prompt_filter_results": PROMPT_FILTER}
    role = {**delta(0, role="assistant", content=""), "content_filter_results": {}}
    text = {**delta(0, content="Hi"), "content_filter_results": VERDICTS}
    late = {**delta(0), "content_filter_results": FLAGGED}  # an asynchronous filter's
    end = {**delta(0, "content_filter"), "content_filter_results": {}}
    out = [*norm.feed(first), *norm.feed(event(role)), *norm.feed(event(text))]
    out += [*norm.feed(event(late)), *norm.feed(event(end)), *norm.end()]
    assert out == [
        {"choices": [role], "prompt_filter_results": PROMPT_FILTER},
        {"choices": [text]},
        {"choices": [late]},
        {"choices": [end]},
    ]


def test_azure_asks_for_usage_and_keeps_openai_s_fields() -> None:
    plan = prepared("azure-openai", stream=True)
    assert plan.body["stream_options"] == {"include_usage": True}
    assert "content_filter_results" in plan.shape.choice_extras
    assert plan.shape.upstream_extras == ("prompt_filter_results",)
    assert plan.url == "http://127.0.0.1:9/v1/openai/v1/chat/completions"
