"""A stream and the whole answer it means, both ways (core.replay): hand-written streams, answers
generated and streams generated from them however they are split, and the openai SDK's own
stream accumulators as an independent reading of the streams made."""

from __future__ import annotations

import copy
import itertools
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.chat._types import ParsedChatCompletionSnapshot
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent as SdkEvent

from core.answers import (
    ChatChunk,
    ChatCompletion,
    ChatMessage,
    Chunk,
    Completion,
    Logprobs,
    ResponseAnswer,
    ResponseEvent,
    TokenLogprob,
    Usage,
)
from core.chat_bridge import echo
from core.completions import RequestLimits
from core.replay import (
    chat_chunks,
    chat_of,
    completion_chunks,
    completion_of,
    response_events,
    response_of,
)
from core.responses import validate_responses

Json = dict[str, Any]
USAGE: Usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lp(*tokens: str) -> Logprobs:
    """Legacy logprobs of `tokens`."""
    return {
        "tokens": list(tokens),
        "token_logprobs": [-1.0] * len(tokens),
        "top_logprobs": [{t: -1.0} for t in tokens],
        "text_offset": list(range(len(tokens))),
    }


def token(text: str) -> TokenLogprob:
    return {"token": text, "logprob": -0.5, "bytes": list(text.encode()), "top_logprobs": []}


# ---------------------------------------------------------------- completions


def test_a_completions_stream_interleaved_with_logprobs_and_vllms_extras() -> None:
    chunks: list[Json] = [
        {
            "choices": [
                {
                    "text": "Hel",
                    "index": 0,
                    "logprobs": lp("Hel"),
                    "finish_reason": None,
                    "prompt_token_ids": [1, 2],
                    "prompt_logprobs": [
                        None,
                        {"2": {"logprob": -1.0, "rank": 1, "decoded_token": "x"}},
                    ],
                    "token_ids": [7],
                }
            ],
            "system_fingerprint": "fp_1",
        },
        {
            "choices": [
                {
                    "text": "Bo",
                    "index": 1,
                    "logprobs": lp("Bo"),
                    "finish_reason": None,
                    "stop_reason": None,
                    "token_ids": [9],
                }
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        },
        {
            "choices": [
                {
                    "text": "lo",
                    "index": 0,
                    "logprobs": lp("lo"),
                    "finish_reason": "stop",
                    "stop_reason": "\n",
                    "token_ids": [8],
                },
                {
                    "text": "nd",
                    "index": 1,
                    "logprobs": lp("nd"),
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": None,
                },
            ]
        },
        {"choices": [], "usage": USAGE, "system_fingerprint": "fp_2"},
    ]
    assert completion_of(cast(list[Chunk], chunks)) == {
        "choices": [
            {
                "text": "Hello",
                "index": 0,
                "logprobs": {
                    "tokens": ["Hel", "lo"],
                    "token_logprobs": [-1.0, -1.0],
                    "top_logprobs": [{"Hel": -1.0}, {"lo": -1.0}],
                    "text_offset": [0, 0],
                },
                "finish_reason": "stop",
                "stop_reason": "\n",
                "prompt_token_ids": [1, 2],
                "prompt_logprobs": [
                    None,
                    {"2": {"logprob": -1.0, "rank": 1, "decoded_token": "x"}},
                ],
                "token_ids": [7, 8],
            },
            {
                "text": "Bond",
                "index": 1,
                "logprobs": lp("Bo", "nd") | {"text_offset": [0, 0]},
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [9],
            },
        ],
        "usage": USAGE,  # the usage chunk's, not the continuous usage of a content chunk
        "system_fingerprint": "fp_2",
    }


def test_a_completions_stream_without_usage_or_logprobs() -> None:
    chunks: list[Chunk] = [
        {"choices": [{"text": "a", "index": 0, "logprobs": None, "finish_reason": None}]},
        {"choices": [{"text": "b", "index": 0, "logprobs": None, "finish_reason": "stop"}]},
    ]
    assert completion_of(chunks) == {
        "choices": [{"text": "ab", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": None,
    }


def test_a_completions_stream_not_ended_is_no_answer() -> None:
    ended: Chunk = {
        "choices": [{"text": "a", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    }
    going: Chunk = {"choices": [{"text": "b", "index": 1, "logprobs": None, "finish_reason": None}]}
    assert completion_of([ended, going, {"choices": [], "usage": USAGE}]) is None
    assert completion_of([{"choices": [], "usage": USAGE}]) is None
    assert completion_of([]) is None


def test_a_completions_answer_as_its_stream() -> None:
    answer: Completion = {
        "choices": [
            {
                "text": "x",
                "index": 0,
                "logprobs": lp("x"),
                "finish_reason": "stop",
                "stop_reason": 13,
            },
            {"text": "y", "index": 1, "logprobs": None, "finish_reason": "length"},
        ],
        "usage": USAGE,
        "system_fingerprint": "fp",
    }
    chunks = completion_chunks(answer)
    assert chunks == [
        {"choices": [answer["choices"][0]], "system_fingerprint": "fp"},
        {"choices": [answer["choices"][1]]},
        {"choices": [], "usage": USAGE},
    ]
    assert completion_of(chunks) == answer
    assert completion_chunks({**answer, "usage": None})[-1] == {"choices": [answer["choices"][1]]}


# ---------------------------------------------------------------- chat


def opened(index: int, call_id: str, name: str, arguments: str) -> Json:
    """A tool call's first delta: its id, type and name, and the first of its arguments."""
    return {"index": index, "id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def chat_choice(index: int, delta: Json, finish: str | None = None, **more: Any) -> Json:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish, **more}


def test_tool_calls_split_over_deltas() -> None:
    chunks = [
        {
            "choices": [chat_choice(0, {"role": "assistant", "content": None})],
            "prompt_token_ids": [1, 2, 3],
        },
        {
            "choices": [
                chat_choice(
                    0,
                    {"tool_calls": [opened(0, "call_a", "weather", "")]},
                )
            ],
            "prompt_token_ids": [1, 2, 3],
        },
        {
            "choices": [
                chat_choice(
                    0,
                    {
                        "tool_calls": [
                            {"index": 0, "function": {"arguments": '{"ci'}},
                            opened(1, "call_b", "time", "{"),
                        ]
                    },
                )
            ]
        },
        {
            "choices": [
                chat_choice(
                    0,
                    {
                        "tool_calls": [
                            {"index": 1, "function": {"arguments": "}"}},
                            {"index": 0, "function": {"arguments": 'ty": "Paris"}'}},
                        ]
                    },
                )
            ]
        },
        {"choices": [chat_choice(0, {}, "tool_calls")]},
    ]
    assert chat_of(cast(list[ChatChunk], chunks)) == {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,  # OpenAI's tool-call-only message
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        },
                        {
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "time", "arguments": "{}"},
                        },
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": None,
        "prompt_token_ids": [1, 2, 3],
    }


def test_chat_logprobs_reasoning_and_vllms_extras() -> None:
    chunks = [
        {
            "choices": [
                chat_choice(
                    0,
                    {"role": "assistant", "content": "", "reasoning_content": "Hm"},
                    logprobs={"content": [], "refusal": None},
                )
            ],
            "system_fingerprint": "fp_1",
        },
        {"choices": [chat_choice(0, {"reasoning_content": "m."}, token_ids=[4])]},
        {
            "choices": [
                chat_choice(
                    0,
                    {"content": "Hi"},
                    token_ids=[5],
                    logprobs={"content": [token("Hi")], "refusal": None},
                )
            ]
        },
        {"choices": [chat_choice(0, {"content": "!"}, logprobs={"content": [token("!")]})]},
        {
            "choices": [chat_choice(0, {}, "stop", stop_reason=None, token_ids=[6])],
            "system_fingerprint": None,
        },
        {"choices": [], "usage": USAGE},
    ]
    assert chat_of(cast(list[ChatChunk], chunks)) == {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi!",
                    "refusal": None,
                    "reasoning_content": "Hmm.",
                },
                "logprobs": {"content": [token("Hi"), token("!")], "refusal": None},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": [4, 5, 6],
            }
        ],
        "usage": USAGE,
        "system_fingerprint": "fp_1",  # a null after it says nothing
    }


def test_chat_choices_interleaved_and_a_refusal() -> None:
    chunks = [
        {"choices": [chat_choice(1, {"role": "assistant", "content": None, "refusal": "I can"})]},
        {"choices": [chat_choice(0, {"content": "Su"}), chat_choice(1, {"refusal": "not."})]},
        {"choices": [chat_choice(1, {}, "stop"), chat_choice(0, {"content": "re"}, "length")]},
    ]
    answer = chat_of(cast(list[ChatChunk], chunks))
    assert answer is not None
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Sure",
        "refusal": None,
    }
    assert answer["choices"][1]["message"] == {
        "role": "assistant",
        "content": None,
        "refusal": "I cannot.",
    }
    assert [c["finish_reason"] for c in answer["choices"]] == ["length", "stop"]
    assert answer["usage"] is None and "system_fingerprint" not in answer


def test_a_chat_stream_not_ended_is_no_answer() -> None:
    chunks = [
        {"choices": [chat_choice(0, {"role": "assistant", "content": "x"})]},
        {"choices": [], "usage": USAGE},
    ]
    assert chat_of(cast(list[ChatChunk], chunks)) is None
    assert chat_of([]) is None


def test_a_chat_answer_as_openais_stream() -> None:
    answer: ChatCompletion = {
        "choices": [
            {
                "index": 0,
                "message": cast(
                    ChatMessage,
                    {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "reasoning": "Think.",  # vLLM's
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                ),
                "logprobs": {"content": [token("x")]},
                "finish_reason": "tool_calls",
                "stop_reason": None,
                "token_ids": [1, 2],
            }
        ],
        "usage": USAGE,
        "system_fingerprint": "fp",
        "prompt_token_ids": [9],
    }
    chunks = chat_chunks(answer)
    assert chunks == [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "content": None,
                        "reasoning": "Think.",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    "logprobs": {"content": [token("x")]},
                    "finish_reason": None,
                }
            ],
            "system_fingerprint": "fp",
            "prompt_token_ids": [9],
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": "tool_calls",
                    "stop_reason": None,
                    "token_ids": [1, 2],
                }
            ]
        },
        {"choices": [], "usage": USAGE},
    ]
    assert chat_of(chunks) == answer


def test_a_role_not_streamed_is_the_assistants() -> None:
    chunks = [{"choices": [chat_choice(0, {"content": "x"}, "stop")]}]
    answer = chat_of(cast(list[ChatChunk], chunks))
    assert answer is not None and answer["choices"][0]["message"]["role"] == "assistant"


# ---------------------------------------------------------------- the Responses API


def request_echo() -> Json:
    return echo(validate_responses({"model": "m", "input": "hi"}, RequestLimits()))


def message_item(mid: str, *parts: Json, status: str = "completed") -> Json:
    return {
        "id": mid,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": list(parts),
    }


def text_part(text: str, logprobs: Sequence[Mapping[str, Any]] = ()) -> Json:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}


WHOLE: ResponseAnswer = {
    "status": "completed",
    "output": [
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Think."}],
        },
        message_item(
            "msg_1", text_part("Hi", [token("Hi")]), {"type": "refusal", "refusal": "No."}
        ),
        {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {
            "id": "ws_1",
            "type": "web_search_call",
            "status": "completed",
            "action": {"type": "search", "query": "q"},
        },
    ],
    "usage": USAGE,
    "incomplete_details": None,
    "error": None,
    "echo": request_echo(),
}


def test_a_response_as_openais_event_sequence() -> None:
    events = response_events(WHOLE)
    at = [(e["type"], e.get("output_index"), e.get("content_index")) for e in events]
    assert at == [
        ("response.created", None, None),
        ("response.in_progress", None, None),
        ("response.output_item.added", 0, None),
        ("response.content_part.added", 0, 0),
        ("response.reasoning_text.delta", 0, 0),
        ("response.reasoning_text.done", 0, 0),
        ("response.content_part.done", 0, 0),
        ("response.output_item.done", 0, None),
        ("response.output_item.added", 1, None),
        ("response.content_part.added", 1, 0),
        ("response.output_text.delta", 1, 0),
        ("response.output_text.done", 1, 0),
        ("response.content_part.done", 1, 0),
        ("response.content_part.added", 1, 1),
        ("response.refusal.delta", 1, 1),
        ("response.refusal.done", 1, 1),
        ("response.content_part.done", 1, 1),
        ("response.output_item.done", 1, None),
        ("response.output_item.added", 2, None),
        ("response.function_call_arguments.delta", 2, None),
        ("response.function_call_arguments.done", 2, None),
        ("response.output_item.done", 2, None),
        ("response.output_item.added", 3, None),
        ("response.output_item.done", 3, None),
        ("response.completed", None, None),
    ]
    began = events[0]["response"]
    assert began == {**WHOLE, "status": "in_progress", "output": [], "usage": None}
    assert events[1]["response"] == began
    assert events[8]["item"] == {**WHOLE["output"][1], "status": "in_progress", "content": []}
    assert events[9]["part"] == text_part("")
    assert events[10] == {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "Hi",
        "logprobs": [token("Hi")],
    }
    assert events[11]["text"] == "Hi" and events[11]["logprobs"] == [token("Hi")]
    assert events[13]["part"] == {"type": "refusal", "refusal": ""}
    assert cast(Json, events[15])["refusal"] == "No."
    assert events[18]["item"]["arguments"] == "" and events[18]["item"]["status"] == "in_progress"
    assert events[20] == {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_1",
        "output_index": 2,
        "arguments": '{"city": "Paris"}',
        "name": "weather",
    }
    assert all(
        e["item_id"] == WHOLE["output"][e["output_index"]]["id"] for e in events if "item_id" in e
    )
    assert events[-1]["response"] == WHOLE
    assert response_of(events) == WHOLE


def test_an_incomplete_response_ends_incomplete() -> None:
    cut: ResponseAnswer = {
        **WHOLE,
        "status": "incomplete",
        "output": [message_item("msg_1", text_part("Hel"), status="incomplete")],
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    events = response_events(cut)
    assert events[-1] == {"type": "response.incomplete", "response": cut}
    assert events[0]["response"]["incomplete_details"] is None
    assert response_of(events) == cut


def test_a_failed_or_unended_response_stream_is_no_answer() -> None:
    events = response_events(WHOLE)
    failed: ResponseEvent = {
        "type": "response.failed",
        "response": {
            **WHOLE,
            "status": "failed",
            "error": {"code": "server_error", "message": "x"},
        },
    }
    error: ResponseEvent = {"type": "error", "code": "server_error", "message": "x", "param": None}
    assert response_of([*events[:-1], failed]) is None
    assert response_of([*events[:-1], error]) is None
    assert response_of(events[:-1]) is None
    assert response_of([]) is None
    assert response_of([*events, error]) is None  # the stream's end says how it ended


# ---------------------------------------------------------------- inputs left alone


def scribble(value: Any) -> None:
    """Every dict and list in `value` changed in place, as a writer may change what it writes."""
    if isinstance(value, dict):
        for v in list(value.values()):
            scribble(v)
        value["scribbled"] = True
    elif isinstance(value, list):
        for v in list(value):
            scribble(v)
        value.append("scribbled")


def unshared(fn: Callable[[Any], Any], given_: Any) -> None:
    before = copy.deepcopy(given_)
    out = fn(given_)
    assert given_ == before  # not changed by the call
    scribble(out)
    assert given_ == before  # nor by a change of what it returned


def test_no_function_changes_its_input_or_shares_with_its_output() -> None:
    stream = [
        {
            "choices": [
                {
                    "text": "a",
                    "index": 0,
                    "logprobs": lp("a"),
                    "finish_reason": "stop",
                    "prompt_token_ids": [1],
                    "token_ids": [2],
                    "prompt_logprobs": [
                        None,
                        {"1": {"logprob": -1.0, "rank": 1, "decoded_token": "a"}},
                    ],
                }
            ]
        },
        {"choices": [], "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 1}}},
    ]
    unshared(completion_of, stream)
    completion = completion_of(cast(list[Chunk], stream))
    unshared(completion_chunks, completion)
    chat = chat_of(chat_chunks(CHAT))
    unshared(chat_chunks, CHAT)
    unshared(chat_of, chat_chunks(CHAT))
    assert chat == CHAT
    unshared(response_events, WHOLE)
    unshared(response_of, response_events(WHOLE))


CHAT: ChatCompletion = {
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "a",
                "refusal": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "logprobs": {"content": [token("a")], "refusal": []},
            "finish_reason": "stop",
            "token_ids": [3],
        }
    ],
    "usage": {**USAGE, "completion_tokens_details": {"reasoning_tokens": 0}},
    "prompt_token_ids": [1, 2],
}


# ---------------------------------------------------------------- generated answers

TEXT = st.text(max_size=8)
WORD = st.text(min_size=1, max_size=6)
LOGPROB = st.floats(-20, 0, allow_nan=False)
IDS = st.lists(st.integers(0, 50_000), max_size=4)
LEGACY = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    prompt, completion = draw(st.integers(0, 999)), draw(st.integers(0, 999))
    usage: Usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if draw(st.booleans()):
        usage["prompt_tokens_details"] = {"cached_tokens": draw(st.integers(0, prompt))}
    if draw(st.booleans()):
        usage["completion_tokens_details"] = {"reasoning_tokens": draw(st.integers(0, completion))}
    return usage


@st.composite
def legacy_logprobs(draw: st.DrawFn) -> Json:
    n = draw(st.integers(0, 4))

    def column(values: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(values, min_size=n, max_size=n))

    return {
        "tokens": column(TEXT),
        "token_logprobs": column(st.none() | LOGPROB),
        "top_logprobs": column(st.none() | st.dictionaries(WORD, LOGPROB, max_size=2)),
        "text_offset": column(st.integers(0, 99)),
    }


PROMPT_LOGPROB = st.fixed_dictionaries(
    {"logprob": LOGPROB, "rank": st.none() | st.integers(1, 5), "decoded_token": st.none() | WORD}
)
COMPLETION_EXTRAS: Mapping[str, st.SearchStrategy[Any]] = {
    "stop_reason": st.none() | st.integers(0, 99) | WORD,
    "prompt_logprobs": st.none()
    | st.lists(
        st.none() | st.dictionaries(st.integers(0, 99).map(str), PROMPT_LOGPROB, max_size=2),
        max_size=3,
    ),
    "prompt_token_ids": st.none() | IDS,
    "token_ids": st.none() | IDS,
}
CHAT_EXTRAS: Mapping[str, st.SearchStrategy[Any]] = {
    "stop_reason": COMPLETION_EXTRAS["stop_reason"],
    "token_ids": st.none() | IDS,
}


def extras(draw: st.DrawFn, table: Mapping[str, st.SearchStrategy[Any]]) -> Json:
    keys = draw(st.lists(st.sampled_from(sorted(table)), unique=True))
    return {k: draw(table[k]) for k in keys}


@st.composite
def completions(draw: st.DrawFn) -> Completion:
    choices = [
        {
            "text": draw(TEXT),
            "index": i,
            "logprobs": draw(st.none() | legacy_logprobs()),
            "finish_reason": draw(st.sampled_from(["stop", "length", "content_filter"])),
            **extras(draw, COMPLETION_EXTRAS),
        }
        for i in range(draw(st.integers(1, 3)))
    ]
    answer: Json = {"choices": choices, "usage": draw(st.none() | usages())}
    if draw(st.booleans()):
        answer["system_fingerprint"] = draw(st.none() | WORD)
    return cast(Completion, answer)


TOP = st.lists(
    st.fixed_dictionaries(
        {"token": WORD, "logprob": LOGPROB, "bytes": st.none() | st.lists(st.integers(0, 255))}
    ),
    max_size=2,
)
TOKEN = st.fixed_dictionaries(
    {
        "token": WORD,
        "logprob": LOGPROB,
        "bytes": st.none() | st.lists(st.integers(0, 255), max_size=3),
        "top_logprobs": TOP,
    }
)
TOKENS = st.lists(TOKEN, max_size=3)


@st.composite
def chat_logprobs(draw: st.DrawFn) -> Json:
    made: Json = {"content": draw(st.none() | TOKENS)}
    if draw(st.booleans()):
        made["refusal"] = draw(st.none() | TOKENS)
    return made


@st.composite
def chat_messages(draw: st.DrawFn) -> Json:
    message: Json = {
        "role": "assistant",
        "content": draw(st.none() | TEXT),
        "refusal": draw(st.none() | TEXT),
    }
    for key in draw(st.lists(st.sampled_from(["reasoning_content", "reasoning"]), unique=True)):
        message[key] = draw(TEXT)
    calls = [
        {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": draw(WORD), "arguments": draw(st.text(max_size=12))},
        }
        for n in range(draw(st.integers(0, 3)))
    ]
    if calls:
        message["tool_calls"] = calls
    return message


@st.composite
def chats(draw: st.DrawFn) -> ChatCompletion:
    choices = [
        {
            "index": i,
            "message": draw(chat_messages()),
            "logprobs": draw(st.none() | chat_logprobs()),
            "finish_reason": draw(
                st.sampled_from(["stop", "length", "tool_calls", "content_filter"])
            ),
            **extras(draw, CHAT_EXTRAS),
        }
        for i in range(draw(st.integers(1, 3)))
    ]
    answer: Json = {"choices": choices, "usage": draw(st.none() | usages())}
    for key, values in (
        ("system_fingerprint", st.none() | WORD),
        ("prompt_token_ids", st.none() | IDS),
    ):
        if draw(st.booleans()):
            answer[key] = draw(values)
    return cast(ChatCompletion, answer)


# ---------------------------------------------------------------- streams split anywhere


def pieces(draw: st.DrawFn, whole: Sequence[Any], k: int) -> list[Any]:
    """`whole` (a string or a list) cut into `k` pieces anywhere, empty ones too."""
    cuts = sorted(draw(st.lists(st.integers(0, len(whole)), min_size=k - 1, max_size=k - 1)))
    bounds = [0, *cuts, len(whole)]
    return [whole[a:b] for a, b in itertools.pairwise(bounds)]


def spread_extras(draw: st.DrawFn, choice: Mapping[str, Any], deltas: list[Json]) -> None:
    """vLLM's extras over a choice's deltas: said once on the first, on the last (a null on
    the others says nothing), or in pieces."""
    k = len(deltas)
    for key in ("prompt_token_ids", "prompt_logprobs"):
        if key in choice:
            deltas[0][key] = choice[key]
    if "stop_reason" in choice:
        for d in deltas[:-1]:
            if draw(st.booleans()):
                d["stop_reason"] = None
        deltas[-1]["stop_reason"] = choice["stop_reason"]
    if "token_ids" in choice:
        ids = choice["token_ids"]
        if ids is None:
            deltas[-1]["token_ids"] = None
        else:
            for d, piece in zip(deltas, pieces(draw, ids, k), strict=True):
                d["token_ids"] = piece


def split_logprobs(draw: st.DrawFn, logprobs: Json | None, k: int) -> list[Json | None]:
    """A choice's logprobs over `k` deltas, each list cut anywhere; a delta whose pieces are
    all empty may carry none."""
    if logprobs is None:
        return [None] * k
    columns = {
        key: pieces(draw, value, k) if value is not None else [None] * k
        for key, value in logprobs.items()
    }
    out: list[Json | None] = [{key: columns[key][j] for key in columns} for j in range(k)]
    for j in range(1, k):
        if not any(columns[key][j] for key in columns) and draw(st.booleans()):
            out[j] = None
    return out


@st.composite
def completion_deltas(draw: st.DrawFn, choice: Json) -> list[Json]:
    k = draw(st.integers(1, 4))
    texts = pieces(draw, choice["text"], k)
    logprobs = choice["logprobs"]
    if logprobs is None:
        lps: list[Json | None] = [None] * k
    else:
        columns = [pieces(draw, logprobs[key], k) for key in LEGACY]
        lps = [dict(zip(LEGACY, row, strict=True)) for row in zip(*columns, strict=True)]
    deltas = [
        {"text": t, "index": choice["index"], "logprobs": lp_, "finish_reason": None}
        for t, lp_ in zip(texts, lps, strict=True)
    ]
    deltas[-1]["finish_reason"] = choice["finish_reason"]
    spread_extras(draw, choice, deltas)
    return deltas


@st.composite
def chat_deltas(draw: st.DrawFn, choice: Json, in_order: bool) -> list[Json]:
    """A chat choice's deltas: its strings and tool call arguments cut anywhere, each tool call
    beginning at any delta (in index order for the SDK, which needs that)."""
    k = draw(st.integers(1, 4))
    message = choice["message"]
    deltas: list[Json] = [{} for _ in range(k)]
    if draw(st.booleans()):
        deltas[0]["role"] = message["role"]
    for key in [k_ for k_ in message if k_ not in ("role", "tool_calls")]:
        value = message[key]
        for d, piece in zip(
            deltas, pieces(draw, value, k) if value is not None else [None] * k, strict=True
        ):
            if piece is not None or draw(st.booleans()):  # a null said or not
                d[key] = piece
    starts = sorted(draw(st.lists(st.integers(0, k - 1), min_size=3, max_size=3)))
    for n, call in enumerate(message.get("tool_calls", [])):
        start = starts[n] if in_order else draw(st.integers(0, k - 1))
        for j, piece in enumerate(pieces(draw, call["function"]["arguments"], k - start)):
            fragment: Json = {"index": n, "function": {"arguments": piece}}
            if j == 0:
                fragment |= {"id": call["id"], "type": call["type"]}
                fragment["function"]["name"] = call["function"]["name"]
            deltas[start + j].setdefault("tool_calls", []).append(fragment)
    if not in_order:
        for d in deltas:
            if "tool_calls" in d:
                d["tool_calls"] = draw(st.permutations(d["tool_calls"]))
    lps = split_logprobs(draw, choice["logprobs"], k)
    made = [
        {"index": choice["index"], "delta": d, "logprobs": lp_, "finish_reason": None}
        for d, lp_ in zip(deltas, lps, strict=True)
    ]
    made[-1]["finish_reason"] = choice["finish_reason"]
    spread_extras(draw, choice, made)
    return made


def chunked(draw: st.DrawFn, per_choice: list[list[Json]]) -> list[Json]:
    """The choices' deltas interleaved (each choice's in its order), a chunk holding at most one
    delta of a choice."""
    queues = [list(q) for q in per_choice]
    chunks: list[Json] = []
    for _ in range(sum(map(len, queues))):
        i = draw(st.sampled_from([i for i, q in enumerate(queues) if q]))
        delta = queues[i].pop(0)
        current = chunks[-1]["choices"] if chunks else None
        if current is None or any(c["index"] == i for c in current) or draw(st.booleans()):
            chunks.append({"choices": []})
        chunks[-1]["choices"].append(delta)
    return chunks


def framed(
    draw: st.DrawFn, chunks: list[Json], answer: Mapping[str, Any], continuous: bool
) -> list[Json]:
    """The chunk-level fields on the first chunk (said again on later ones, or not), vLLM's
    continuous usage on content chunks, then the usage chunk."""
    for key in ("system_fingerprint", "prompt_token_ids"):
        if key in answer:
            chunks[0][key] = answer[key]
            for chunk in chunks[1:]:
                if answer[key] is not None and draw(st.booleans()):
                    chunk[key] = answer[key]
    if continuous:
        for chunk in chunks:
            if draw(st.booleans()):
                chunk["usage"] = draw(usages())
    if answer["usage"] is not None:
        chunks.append({"choices": [], "usage": answer["usage"]})
    return chunks


@st.composite
def completion_streams(draw: st.DrawFn) -> tuple[Completion, list[Chunk]]:
    answer = draw(completions())
    per_choice = [draw(completion_deltas(cast(Json, c))) for c in answer["choices"]]
    chunks = framed(draw, chunked(draw, per_choice), answer, continuous=True)
    return answer, cast(list[Chunk], chunks)


@st.composite
def chat_streams(draw: st.DrawFn, sdk: bool = False) -> tuple[ChatCompletion, list[ChatChunk]]:
    answer = draw(chats())
    per_choice = [draw(chat_deltas(cast(Json, c), sdk)) for c in answer["choices"]]
    chunks = framed(draw, chunked(draw, per_choice), answer, continuous=not sdk)
    return answer, cast(list[ChatChunk], chunks)


# Each endpoint's generated answers and streams, with its two ways: a stream's answer, and an
# answer's stream.
Ways = tuple[Callable[[Any], Any], Callable[[Any], Any]]
COMPLETION_WAYS: Ways = (completion_of, completion_chunks)
CHAT_WAYS: Ways = (chat_of, chat_chunks)


@given(st.one_of(completions().map(lambda a: (a, COMPLETION_WAYS)),
                 chats().map(lambda a: (a, CHAT_WAYS))))  # fmt: skip
def test_an_answer_round_trips(made: tuple[Any, Ways]) -> None:
    answer, (whole, stream) = made
    assert whole(stream(answer)) == answer


@given(st.one_of(completion_streams().map(lambda m: (m, COMPLETION_WAYS)),
                 chat_streams().map(lambda m: (m, CHAT_WAYS))))  # fmt: skip
def test_a_stream_however_split_means_its_answer(made: tuple[tuple[Any, Any], Ways]) -> None:
    (answer, chunks), (whole, _) = made
    assert whole(chunks) == answer


@given(chat_streams(), st.data())
def test_a_stream_cut_before_a_choice_ended_is_no_answer(
    made: tuple[ChatCompletion, list[ChatChunk]], data: st.DataObject
) -> None:
    """Cut once every choice began, before the last one ended."""
    answer, chunks = made
    where = {
        c["index"]: n for n, chunk in reversed(list(enumerate(chunks))) for c in chunk["choices"]
    }
    ends = [
        n for n, chunk in enumerate(chunks) if any(c["finish_reason"] for c in chunk["choices"])
    ]
    assume(max(where.values()) < ends[-1])
    cut = data.draw(st.integers(max(where.values()) + 1, ends[-1]))
    assert chat_of(chunks[:cut]) is None
    assert len(where) == len(answer["choices"])


# ---------------------------------------------------------------- generated responses


@st.composite
def output_texts(draw: st.DrawFn) -> Json:
    logprobs = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "token": WORD,
                    "logprob": LOGPROB,
                    "bytes": st.lists(st.integers(0, 255), max_size=3),
                    "top_logprobs": st.lists(
                        st.fixed_dictionaries(
                            {
                                "token": WORD,
                                "logprob": LOGPROB,
                                "bytes": st.lists(st.integers(0, 255), max_size=3),
                            }
                        ),
                        max_size=2,
                    ),
                }
            ),
            max_size=2,
        )
    )
    return text_part(draw(TEXT), logprobs)


PARTS = st.one_of(output_texts(), st.builds(lambda t: {"type": "refusal", "refusal": t}, TEXT))
ITEM_KINDS: Mapping[str, Callable[[st.DrawFn, int], Json]] = {
    "message": lambda draw, i: message_item(
        f"msg_{i}",
        *draw(st.lists(PARTS, max_size=3)),
        status=draw(st.sampled_from(["completed", "incomplete"])),
    ),
    "function_call": lambda draw, i: {
        "id": f"fc_{i}",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_{i}",
        "name": draw(WORD),
        "arguments": draw(st.text(max_size=12)),
    },
    "reasoning": lambda draw, i: {
        "id": f"rs_{i}",
        "type": "reasoning",
        "summary": [],
        **(
            {
                "content": [
                    {"type": "reasoning_text", "text": t} for t in draw(st.lists(TEXT, max_size=2))
                ]
            }
            if draw(st.booleans())
            else {}
        ),
    },
    "web_search_call": lambda draw, i: {
        "id": f"ws_{i}",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": draw(TEXT)},
    },
}


@st.composite
def responses(draw: st.DrawFn) -> ResponseAnswer:
    kinds = draw(st.lists(st.sampled_from(sorted(ITEM_KINDS)), max_size=4))
    cut = draw(st.booleans())
    answer: Json = {
        "status": "incomplete" if cut else "completed",
        "output": [ITEM_KINDS[kind](draw, i) for i, kind in enumerate(kinds)],
        "usage": draw(st.none() | usages()),
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "echo": request_echo(),
    }
    if draw(st.booleans()):
        answer["upstream"] = {"provider": "p", "id": "resp_up", "whole": draw(st.booleans())}
    return cast(ResponseAnswer, answer)


@given(responses())
def test_a_response_round_trips_and_its_events_say_its_items(answer: ResponseAnswer) -> None:
    events = response_events(answer)
    assert response_of(events) == answer
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    said: dict[tuple[int, int | None], str] = {}
    for event in events[2:-1]:
        item = answer["output"][event["output_index"]]
        if "item_id" in event:
            assert event["item_id"] == item["id"]
        if event["type"].endswith(".delta"):
            where = (event["output_index"], event.get("content_index"))
            said[where] = said.get(where, "") + event["delta"]
        if event["type"] == "response.output_item.done":
            assert event["item"] == item
    for index, item in enumerate(answer["output"]):
        for n, part in enumerate(item.get("content") or []):
            whole = part.get("text", part.get("refusal"))
            assert said.get((index, n), "") == whole
        if item["type"] == "function_call":
            assert said.get((index, None), "") == item["arguments"]


@given(responses(), responses(), completions(), chats())
def test_generated_inputs_are_left_alone(
    response: ResponseAnswer, other: ResponseAnswer, completion: Completion, chat: ChatCompletion
) -> None:
    unshared(response_events, response)
    unshared(response_of, response_events(other))
    unshared(completion_chunks, completion)
    unshared(completion_of, completion_chunks(completion))
    unshared(chat_chunks, chat)
    unshared(chat_of, chat_chunks(chat))


# ---------------------------------------------------------------- the openai SDK's reading


def sdk_chat(chunks: Sequence[ChatChunk]) -> ParsedChatCompletionSnapshot:
    """The chunks as OpenAI's wire chunks (a fingerprint holds for every later chunk, as the
    gateway writes it), accumulated by the SDK's own stream state (its snapshot: its final
    completion refuses a length or content filter finish)."""
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    fingerprint = None
    for chunk in chunks:
        fingerprint = chunk.get("system_fingerprint") or fingerprint
        wire = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            **chunk,
            "system_fingerprint": fingerprint,
        }
        list(state.handle_chunk(ChatCompletionChunk.model_validate(wire)))
    return state.current_completion_snapshot


def begun(chunks: list[ChatChunk]) -> list[ChatChunk]:
    """The stream with every choice begun in its first chunk, in index order, by a delta that
    says only the role: the SDK needs its choices to begin in index order, and counts twice
    the logprobs of a choice's first delta when that is not in the stream's first chunk."""
    indexes = sorted({c["index"] for chunk in chunks for c in chunk["choices"]})
    opening = [
        {"index": i, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
        for i in indexes
    ]
    return [cast(ChatChunk, {"choices": opening}), *chunks]


def agree_on_chat(chunks: list[ChatChunk]) -> None:
    """chat_of and the SDK read the same stream alike."""
    chunks = begun(chunks)
    ours = chat_of(chunks)
    assert ours is not None
    final = sdk_chat(chunks)
    assert [c.index for c in final.choices] == [c["index"] for c in ours["choices"]]
    for theirs, mine in zip(final.choices, ours["choices"], strict=True):
        message = theirs.message
        dumped = message.to_dict()
        assert message.content == mine["message"]["content"]
        assert message.refusal == mine["message"]["refusal"]
        for key in ("reasoning_content", "reasoning"):
            assert dumped.get(key) == cast(Json, mine["message"]).get(key)
        calls = [
            {
                "id": t.id,
                "type": t.type,
                "function": {"name": t.function.name, "arguments": t.function.arguments},
            }
            for t in message.tool_calls or []
            if t.type == "function"
        ]
        assert calls == mine["message"].get("tool_calls", [])
        assert theirs.finish_reason == mine["finish_reason"]
        logprobs = mine["logprobs"]
        assert (theirs.logprobs is None) == (logprobs is None)
        if theirs.logprobs is not None and logprobs is not None:
            tokens = [t.to_dict() for t in theirs.logprobs.content or []]
            assert tokens == (logprobs["content"] or [])
            refused = [t.to_dict() for t in theirs.logprobs.refusal or []]
            assert refused == (logprobs.get("refusal") or [])
    assert (final.usage.to_dict() if final.usage else None) == ours["usage"]
    assert final.system_fingerprint == ours.get("system_fingerprint")


@SLOW
@given(chats())
def test_the_sdk_reads_a_chat_answers_stream_as_chat_of_does(answer: ChatCompletion) -> None:
    agree_on_chat(chat_chunks(answer))


@SLOW
@given(chat_streams(sdk=True))
def test_the_sdk_reads_a_split_chat_stream_as_chat_of_does(
    made: tuple[ChatCompletion, list[ChatChunk]],
) -> None:
    agree_on_chat(made[1])


def test_the_sdk_reads_the_hand_written_tool_call_stream_as_chat_of_does() -> None:
    chunks = [
        {"choices": [chat_choice(0, {"role": "assistant", "content": None})]},
        {
            "choices": [
                chat_choice(
                    0,
                    {"tool_calls": [opened(0, "call_a", "weather", '{"ci')]},
                )
            ]
        },
        {
            "choices": [
                chat_choice(
                    0,
                    {
                        "tool_calls": [
                            {"index": 0, "function": {"arguments": 'ty": 1}'}},
                            opened(1, "call_b", "time", "{}"),
                        ]
                    },
                )
            ]
        },
        {"choices": [chat_choice(0, {}, "tool_calls")], "system_fingerprint": "fp"},
        {"choices": [], "usage": USAGE},
    ]
    agree_on_chat(cast(list[ChatChunk], chunks))


def _event_classes() -> dict[str, type[Any]]:
    """The SDK's event class of each event type (its union's members, by their `type`)."""
    members = typing.get_args(typing.get_args(SdkEvent)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in members}


EVENT_CLASSES = _event_classes()


def response_document(answer: ResponseAnswer) -> Json:
    """A response as the gateway writes it (its stamps, its usage in the Responses API's
    words)."""
    usage = answer["usage"]
    wire_usage = (
        None
        if usage is None
        else {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }
    )
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": answer["status"],
        "error": answer["error"],
        "incomplete_details": answer["incomplete_details"],
        **answer["echo"],
        "output": answer["output"],
        "usage": wire_usage,
    }


def sdk_events(events: Sequence[ResponseEvent], last_output: bool) -> Iterator[Any]:
    """The events numbered and rendered as OpenAI's, each validated by its SDK class, then
    through the SDK's stream state: what it fires. Without `last_output`, the last event's
    response has no output: the SDK makes it from the items' done events."""
    state: ResponseStreamState[None] = ResponseStreamState(input_tools=omit, text_format=omit)
    for n, event in enumerate(events):
        wire: Json = {**event, "sequence_number": n}
        if "response" in event:
            wire["response"] = response_document(event["response"])
        parsed = EVENT_CLASSES[event["type"]].model_validate(wire)
        if n == len(events) - 1 and not last_output:
            del wire["response"]["output"]
            parsed = construct_type(type_=SdkEvent, value=wire)
        yield from state.handle_event(parsed)


def plain(item: Any) -> Json:
    """An SDK output item as the answer holds it (without what the SDK parses itself)."""
    made: Json = item.to_dict()
    made.pop("parsed_arguments", None)
    for part in made.get("content") or []:
        part.pop("parsed", None)
    return made


def agree_on_response(answer: ResponseAnswer, last_output: bool) -> None:
    fired = list(sdk_events(response_events(answer), last_output))
    final = fired[-1].response
    assert fired[-1].type == f"response.{answer['status']}"
    assert final.status == answer["status"]
    assert [plain(item) for item in final.output] == answer["output"]
    usage = answer["usage"]
    assert (final.usage.output_tokens if final.usage else None) == (
        usage["completion_tokens"] if usage else None
    )
    # What the SDK accumulated from the deltas over the parts and items as they began.
    for event in fired:
        item = answer["output"][event.output_index] if hasattr(event, "output_index") else None
        if event.type == "response.output_text.delta":
            assert (
                item is not None and event.snapshot == item["content"][event.content_index]["text"]
            )
        if event.type == "response.function_call_arguments.delta":
            assert item is not None and event.snapshot == item["arguments"]


def test_the_sdk_reads_a_response_stream_as_the_response_it_was_made_of() -> None:
    for last_output in (True, False):
        agree_on_response(WHOLE, last_output)


@SLOW
@given(responses(), st.booleans())
def test_the_sdk_reads_generated_response_streams_as_their_responses(
    answer: ResponseAnswer, last_output: bool
) -> None:
    agree_on_response(answer, last_output)
