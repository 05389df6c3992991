"""Normalization of upstream answers: order, logprobs, stops, usage, best_of, truncate."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest

from core.answers import Choice, Chunk, Completion, Logprobs, Usage
from core.errors import UpstreamError
from providers.openai_compat.emulate import completion_room, mean_logprob, select_best
from providers.openai_compat.normalize import (
    Normalization,
    StreamNormalizer,
    choices,
    extras_for,
    finish,
    legacy_logprobs,
    usage,
)
from providers.openai_compat.stops import StopHoldBack, strip_stop, trim_logprobs

LABEL = "fw/accounts/x/models/y"


def lp(*pairs: tuple[str, float | None], start: int = 0) -> Logprobs:
    tokens = [t for t, _ in pairs]
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        at += len(t)
    # A null logprob keeps its `{token: None}` top entry here, which `Logprobs` does not
    # describe (vLLM sends a null entry instead): the code under test only carries it along.
    top: list[dict[str, Any] | None] = [{t: v} for t, v in pairs]
    return {
        "tokens": tokens,
        "token_logprobs": [v for _, v in pairs],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def complete(body: dict[str, Any], shape: Normalization) -> Completion:
    return finish(body, choices(body, shape), shape)


# ---------------------------------------------------------------- non-stream


def test_choices_ordered_by_index_and_extras_dropped() -> None:
    body = {
        "id": "uuid",
        "choices": [
            {
                "index": 1,
                "text": "b",
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [1],
            },
            {"index": 0, "text": "a", "finish_reason": "stop", "raw_output": {}, "logprobs": None},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "perf_metrics": {},
        "system_fingerprint": "fp_1",
    }
    out = complete(body, Normalization(LABEL, want_logprobs=False))
    assert out == {
        "choices": [
            {"text": "a", "index": 0, "logprobs": None, "finish_reason": "stop"},
            {"text": "b", "index": 1, "logprobs": None, "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "system_fingerprint": "fp_1",
    }


@pytest.mark.parametrize("reason", ["error", "abort"])
def test_failed_finish_reason_is_an_upstream_error(reason: str) -> None:
    body = {"choices": [{"index": 0, "text": "x", "finish_reason": reason}]}
    with pytest.raises(UpstreamError) as exc:
        complete(body, Normalization(LABEL, False))
    assert exc.value.status == 502
    assert LABEL in exc.value.message
    assert repr(reason) in exc.value.message


def test_missing_choices_is_a_bad_answer() -> None:
    with pytest.raises(UpstreamError) as exc:
        complete({"object": "text_completion"}, Normalization(LABEL, False))
    assert exc.value.code == "upstream_bad_response"
    assert LABEL in exc.value.message


def test_logprobs_removed_unless_requested() -> None:
    body = {
        "choices": [{"index": 0, "text": "a", "finish_reason": "stop", "logprobs": lp(("a", -1.0))}]
    }
    assert complete(body, Normalization(LABEL, False))["choices"][0]["logprobs"] is None
    assert complete(body, Normalization(LABEL, True))["choices"][0]["logprobs"] == lp(("a", -1.0))


def test_fireworks_content_logprobs_to_legacy() -> None:
    raw = {
        "content": [
            {
                "token": "Hel",
                "logprob": -0.5,
                "sampling_logprob": -0.4,
                "token_id": 9,
                "bytes": [72],
                "text_offset": 0,
                "top_logprobs": [
                    {"token": "Hel", "logprob": -0.5, "token_id": 9},
                    {"token": "Hi", "logprob": -1.5},
                ],
            },
            {"token": "lo", "logprob": -0.25, "text_offset": 3, "top_logprobs": []},
        ]
    }
    assert legacy_logprobs(raw) == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"Hel": -0.5, "Hi": -1.5}, None],
        "text_offset": [0, 3],
    }


def test_legacy_logprobs_keep_four_lists_only() -> None:
    raw = {**lp(("a", -1.0), ("b", None)), "token_ids": [1, 2]}
    assert legacy_logprobs(raw) == lp(("a", -1.0), ("b", None))
    assert legacy_logprobs({"tokens": ["ab", "c"]}) == {
        "tokens": ["ab", "c"],
        "token_logprobs": [None, None],
        "top_logprobs": [None, None],
        "text_offset": [0, 2],
    }
    assert legacy_logprobs(None) is None


def test_usage_normalized() -> None:
    assert usage({"prompt_tokens": 4, "completion_tokens": None, "total_tokens": 9}) == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
    }
    assert usage({"prompt_tokens": 4, "completion_tokens": None}) == {
        "prompt_tokens": 4,
        "completion_tokens": 0,
        "total_tokens": 4,
    }
    details = {"cached_tokens": 2}
    assert usage(
        {
            "prompt_tokens": 4,
            "completion_tokens": 1,
            "total_tokens": 5,
            "prompt_tokens_details": details,
        }
    ) == {
        "prompt_tokens": 4,
        "completion_tokens": 1,
        "total_tokens": 5,
        "prompt_tokens_details": details,
    }
    assert usage(None) is None


# ---------------------------------------------------------------- stop strings


def test_strip_trailing_stop_and_its_logprobs() -> None:
    c: Choice = {
        "text": "Hello END",
        "index": 0,
        "logprobs": lp(("Hello", -1.0), (" E", -2.0), ("ND", -3.0)),
        "finish_reason": "stop",
    }
    strip_stop(c, ("END",))
    assert c["text"] == "Hello "
    # " E" straddles the cut: it keeps its head " "; "ND" is gone
    assert c["logprobs"] == {
        "tokens": ["Hello", " "],
        "token_logprobs": [-1.0, -2.0],
        "top_logprobs": [{"Hello": -1.0}, {" E": -2.0}],
        "text_offset": [0, 5],
    }


def test_strip_only_on_stop_and_only_a_suffix() -> None:
    c: Choice = {"text": "a END", "index": 0, "logprobs": None, "finish_reason": "length"}
    strip_stop(c, ("END",))
    assert c["text"] == "a END"
    c = {"text": "END here", "index": 0, "logprobs": None, "finish_reason": "stop"}
    strip_stop(c, ("END",))
    assert c["text"] == "END here"
    c = {"text": "xab", "index": 0, "logprobs": None, "finish_reason": "stop"}
    strip_stop(c, ("b", "ab"))  # the longest match: generation stopped where "ab" began
    assert c["text"] == "x"


def test_strip_never_cuts_an_echoed_prompt() -> None:
    # echo, and nothing generated after a prompt that ends with the stop string
    c: Choice = {"text": "a END", "index": 0, "logprobs": None, "finish_reason": "stop"}
    strip_stop(c, ("END",), protected=len("a END"))
    assert c["text"] == "a END"
    c = {"text": "a END b END", "index": 0, "logprobs": None, "finish_reason": "stop"}
    strip_stop(c, ("END",), protected=len("a END"))
    assert c["text"] == "a END b "


def test_trim_logprobs_whole_tokens() -> None:
    out = trim_logprobs(lp(("a", -1.0), ("bc", -2.0), ("d", -3.0)), 3)
    assert out == {
        "tokens": ["a"],
        "token_logprobs": [-1.0],
        "top_logprobs": [{"a": -1.0}],
        "text_offset": [0],
    }


def test_non_stream_fireworks_stop_stripped() -> None:
    body = {"choices": [{"index": 0, "text": "1, 2, 3\n\n", "finish_reason": "stop"}]}
    out = complete(body, Normalization(LABEL, False, stops=("\n\n",)))
    assert out["choices"][0]["text"] == "1, 2, 3"


def delta(
    text: str, index: int = 0, finish: str | None = None, logprobs: Logprobs | None = None
) -> Choice:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def test_holdback_stop_split_over_three_deltas() -> None:
    hold = StopHoldBack(("<END>",))
    assert hold.feed(delta("Hi ")) == delta("Hi ")
    assert hold.feed(delta("<E")) is None
    assert hold.feed(delta("N")) is None
    assert hold.feed(delta("D>", finish="stop")) == delta("", finish="stop")


def test_holdback_keeps_whole_delta() -> None:
    # The delta "Hi <" ends with "<": the whole delta is held, not split.
    hold = StopHoldBack(("<END>",))
    out = hold.feed(delta("Hi <"))
    assert out is None
    assert hold.feed(delta("E")) is None
    assert hold.feed(delta("ND>", finish="stop")) == delta("Hi ", finish="stop")


def test_holdback_releases_false_prefix() -> None:
    hold = StopHoldBack(("<END>",))
    assert hold.feed(delta("a")) == delta("a")
    assert hold.feed(delta("<E")) is None
    assert hold.feed(delta("x")) == delta("<Ex")  # not a stop after all: released, merged
    assert hold.feed(delta(" b", finish="stop")) == delta(" b", finish="stop")


def test_holdback_with_logprobs_across_boundary() -> None:
    hold = StopHoldBack(("\n\n",))
    assert hold.feed(delta("one", logprobs=lp(("one", -1.0)))) == delta(
        "one", logprobs=lp(("one", -1.0))
    )
    assert hold.feed(delta("\n", logprobs=lp(("\n", -0.5), start=3))) is None
    out = hold.feed(delta("\n", finish="stop", logprobs=lp(("\n", -0.1), start=4)))
    assert out == delta(
        "",
        finish="stop",
        logprobs={"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []},
    )


def test_holdback_per_choice_and_flush() -> None:
    hold = StopHoldBack(("##",))
    assert hold.feed(delta("a#", index=0)) is None
    assert hold.feed(delta("b", index=1)) == delta("b", index=1)
    assert hold.flush() == [delta("a#", index=0)]
    assert hold.flush() == []


def test_holdback_finish_without_stop_keeps_text() -> None:
    hold = StopHoldBack(("##",))
    assert hold.feed(delta("a#")) is None
    assert hold.feed(delta("#", finish="length")) == delta("a##", finish="length")


def test_holdback_never_cuts_an_echoed_prompt() -> None:
    protected = {0: len("p ##"), 1: len("q")}
    hold = StopHoldBack(("##",), protected.__getitem__)
    assert hold.feed(delta("p ##", index=0, finish="stop")) == delta("p ##", index=0, finish="stop")
    assert hold.feed(delta("q", index=1)) == delta("q", index=1)
    assert hold.feed(delta(" #", index=1)) is None
    assert hold.feed(delta("#", index=1, finish="stop")) == delta(" ", index=1, finish="stop")


# ---------------------------------------------------------------- streams


def usage_chunk(usage: Usage) -> Chunk:
    """A stream's last chunk: the request's usage, on its own."""
    return {"choices": [], "usage": usage}


def test_stream_fireworks_usage_on_last_chunk_split_off() -> None:
    norm = StreamNormalizer(Normalization(LABEL, False))
    usage_raw: Usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    out = norm.feed({"choices": [{"index": 0, "text": "Hi", "finish_reason": None}], "usage": None})
    assert out == [{"choices": [delta("Hi")]}]
    out = norm.feed(
        {
            "choices": [{"index": 0, "text": "!", "finish_reason": "stop", "raw_output": {}}],
            "usage": usage_raw,
        }
    )
    assert out == [{"choices": [delta("!", finish="stop")]}]
    assert norm.end() == [usage_chunk(usage_raw)]


def test_stream_openai_usage_chunk_passed_on_last() -> None:
    norm = StreamNormalizer(Normalization(LABEL, False))
    assert norm.feed({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}) == [
        {"choices": [delta("x", finish="length")]}
    ]
    assert (
        norm.feed(
            {
                "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )
        == []
    )
    assert norm.end() == [
        usage_chunk({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
    ]


USAGE_1: Usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
USAGE_2: Usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_stream_continuous_usage_stays_on_its_chunk() -> None:
    """vLLM's continuous_usage_stats: each content chunk keeps its choice's usage so far; the
    request's usage still comes last, on its own."""
    norm = StreamNormalizer(Normalization(LABEL, False, continuous_usage=True))
    first = {"choices": [{"index": 0, "text": "a", "finish_reason": None}], "usage": USAGE_1}
    assert norm.feed(first) == [{"choices": [delta("a")], "usage": USAGE_1}]
    last = {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}], "usage": USAGE_2}
    assert norm.feed(last) == [{"choices": [delta("b", finish="length")], "usage": USAGE_2}]
    assert norm.feed({"choices": [], "usage": USAGE_2}) == []
    assert norm.end() == [usage_chunk(USAGE_2)]
    # Without it, usage on a content chunk is the request's (Fireworks' last chunk).
    plain = StreamNormalizer(Normalization(LABEL, False))
    assert plain.feed(last) == [{"choices": [delta("b", finish="length")]}]
    assert plain.end() == [usage_chunk(USAGE_2)]


def test_extras_kept_when_asked_and_not_null() -> None:
    shape = Normalization(LABEL, False, extras=extras_for({"return_token_ids": True}))
    raw = {
        "index": 0,
        "text": "a",
        "finish_reason": "stop",
        "stop_reason": 7,
        "prompt_token_ids": [1, 2],
        "token_ids": [5, 7],
        "prompt_logprobs": None,
        "raw_output": {},
    }
    assert complete({"choices": [raw]}, shape)["choices"] == [
        {
            "text": "a",
            "index": 0,
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": 7,
            "prompt_token_ids": [1, 2],
            "token_ids": [5, 7],
        }
    ]
    assert extras_for({}) == ("stop_reason",)
    assert extras_for({"prompt_logprobs": 0}) == ("stop_reason", "prompt_logprobs")
    assert extras_for({"echo": True, "logprobs": 0}) == ("stop_reason", "prompt_logprobs")
    assert extras_for({"echo": True}) == ("stop_reason",)


def test_stream_tokens_whose_text_is_held_back_still_go_out() -> None:
    """vLLM sends a token whose text waits (a possible stop string) with empty text: its id
    must reach the caller, or the ids would not add up."""
    norm = StreamNormalizer(
        Normalization(LABEL, False, extras=extras_for({"return_token_ids": True}))
    )
    first = {"index": 0, "text": "", "prompt_token_ids": [1], "token_ids": [9]}
    assert norm.feed({"choices": [first]}) == [
        {"choices": [{**delta(""), "prompt_token_ids": [1], "token_ids": [9]}]}
    ]
    assert norm.feed({"choices": [{"index": 0, "text": "", "token_ids": []}]}) == []


def test_stream_skips_empty_deltas_and_no_usage_when_unknown() -> None:
    norm = StreamNormalizer(Normalization(LABEL, False))
    assert norm.feed({"choices": [{"index": 0, "text": "", "finish_reason": None}]}) == []
    assert norm.feed({"choices": [{"index": 0, "text": "", "logprobs": lp(("", -1.0))}]}) == []
    assert norm.end() == []


def test_stream_holdback_then_flush_at_end() -> None:
    norm = StreamNormalizer(Normalization(LABEL, True, stops=("STOP",)))
    assert norm.feed({"choices": [{"index": 0, "text": "go S"}]}) == []
    assert norm.feed({"choices": [{"index": 0, "text": "TOP", "finish_reason": "stop"}]}) == [
        {"choices": [delta("go ", finish="stop")]}
    ]
    assert norm.feed({"choices": [{"index": 1, "text": "ST"}]}) == []
    assert norm.end() == [{"choices": [delta("ST", index=1)]}]


def test_stream_fingerprint_on_first_chunk_out_and_on_change() -> None:
    norm = StreamNormalizer(Normalization(LABEL, False))
    fp = "fp_a"
    assert norm.feed({"choices": [], "system_fingerprint": fp}) == []  # nothing to carry it yet
    assert norm.feed({"choices": [{"index": 0, "text": "a"}], "system_fingerprint": fp}) == [
        {"choices": [delta("a")], "system_fingerprint": fp}
    ]
    assert norm.feed({"choices": [{"index": 0, "text": "b"}], "system_fingerprint": fp}) == [
        {"choices": [delta("b")]}
    ]
    norm.feed({"choices": [], "system_fingerprint": "fp_b", "usage": {"prompt_tokens": 1}})
    last: Chunk = {
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1},
        "system_fingerprint": "fp_b",
    }
    assert norm.end() == [last]


def test_stream_error_finish_raises() -> None:
    norm = StreamNormalizer(Normalization(LABEL, False))
    with pytest.raises(UpstreamError) as exc:
        norm.feed({"choices": [{"index": 2, "text": "", "finish_reason": "error"}]})
    assert "choice 2" in exc.value.message and LABEL in exc.value.message


# ---------------------------------------------------------------- best_of


def cand(index: int, text: str, *values: float | None) -> Choice:
    pairs = tuple((f"t{i}", v) for i, v in enumerate(values))
    return {"text": text, "index": index, "logprobs": lp(*pairs), "finish_reason": "stop"}


def test_best_of_ranks_by_mean_logprob_per_prompt() -> None:
    cands = [
        cand(0, "a", -1.0, -1.0),  # mean -1
        cand(1, "b", -0.1, None, -0.3),  # mean -0.2 (null skipped)
        cand(2, "c", -5.0),  # -5
        cand(3, "d", -2.0),  # prompt 1
        cand(4, "e", -0.5),
        cand(5, "f", -0.7),
    ]
    best = select_best(cands, best_of=3, n=2, prompts=["p", "q"], echo=False)
    assert [(c["index"], c["text"]) for c in best] == [(0, "b"), (1, "a"), (2, "e"), (3, "f")]


def test_best_of_through_finish_hides_logprobs_and_keeps_usage() -> None:
    body = {
        "choices": [cand(1, "good", -0.1), cand(0, "bad", -3.0)],
        "usage": {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10},
    }
    shape = Normalization(LABEL, want_logprobs=False)
    picked = select_best(choices(body, shape), best_of=2, n=1, prompts=["p"], echo=False)
    out = finish(body, picked, shape)
    assert out["choices"] == [
        {"text": "good", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    assert out["usage"] is not None
    assert out["usage"]["completion_tokens"] == 8  # every candidate was generated


def test_mean_logprob_skips_echoed_prompt() -> None:
    # mean_logprob reads a choice's logprobs only: the choices here have nothing else.
    c = cast(Choice, {"logprobs": lp(("Say", None), (" hi", -9.0), ("!", -1.0))})
    assert mean_logprob(c) == -5.0
    assert mean_logprob(c, "Say hi") == -1.0
    assert mean_logprob(c, [7, 8]) == -1.0
    assert mean_logprob(cast(Choice, {"logprobs": None})) == -math.inf


# ---------------------------------------------------------------- truncate


@pytest.mark.parametrize(
    ("message", "room"),
    [
        (
            "This model's maximum context length is 4097 tokens, however you requested 4116 "
            "tokens (3860 in your prompt; 256 for the completion). Please reduce your prompt; "
            "or completion length.",
            237,
        ),
        (
            "This model's maximum context length is 131072 tokens. However, you requested 105924 "
            "output tokens and your prompt contains at least 25149 input tokens, for a total of "
            "at least 131073 tokens.",
            105923,
        ),
        (
            "Upstream v/m returned 400: This model's maximum context length is 2048 tokens. "
            "However, you requested 2100 tokens (2000 in the messages, 100 in the completion).",
            48,
        ),
        ("maximum context length is 100 tokens. However, your request has 150 input tokens.", -50),
        ("context length exceeded", None),
        ("maximum context length is 4097 tokens", None),
    ],
)
def test_completion_room(message: str, room: int | None) -> None:
    assert completion_room(message) == room


# ---------------------------------------------------------------- Azure's content filter

VERDICTS = {"hate": {"filtered": False, "severity": "safe"}}
FLAGGED = {"hate": {"filtered": True, "severity": "high"}}
PROMPT_FILTER = [{"prompt_index": 0, "content_filter_results": VERDICTS}]
AZURE = Normalization(
    LABEL,
    False,
    extras=extras_for({}, ("stop_reason", "content_filter_results")),
    upstream_extras=("prompt_filter_results",),
)


def test_azure_filter_results_pass_through_a_json_answer() -> None:
    raw = {"index": 0, "text": "a", "finish_reason": "content_filter"}
    body = {
        "choices": [{**raw, "content_filter_results": FLAGGED}],
        "prompt_filter_results": PROMPT_FILTER,
    }
    out: dict[str, Any] = dict(complete(body, AZURE))
    choice = {**delta("a", finish="content_filter"), "content_filter_results": FLAGGED}
    assert out["choices"] == [choice]
    assert out["prompt_filter_results"] == PROMPT_FILTER
    # elsewhere they are no answer's
    plain = complete(body, Normalization(LABEL, False))
    assert "prompt_filter_results" not in plain
    assert "content_filter_results" not in plain["choices"][0]


def test_azure_asked_extras_come_after_its_own() -> None:
    mine = ("stop_reason", "content_filter_results")
    assert extras_for({"prompt_logprobs": 1}, mine) == (*mine, "prompt_logprobs")


def test_azure_stream_the_prompt_s_verdicts_ride_on_the_first_chunk() -> None:
    norm = StreamNormalizer(AZURE)
    first = {"id": "", "choices": [], "prompt_filter_results": PROMPT_FILTER}
    assert norm.feed(first) == []
    text = {"index": 0, "text": "Hi", "finish_reason": None, "content_filter_results": VERDICTS}
    out = norm.feed({"choices": [text], "system_fingerprint": "fp"})
    assert out == [
        {
            "choices": [{**delta("Hi"), "content_filter_results": VERDICTS}],
            "prompt_filter_results": PROMPT_FILTER,
            "system_fingerprint": "fp",
        }
    ]
    # an asynchronous filter's verdicts come alone: they still go out; an empty delta does not
    late = {"index": 0, "text": "", "finish_reason": None, "content_filter_results": FLAGGED}
    assert norm.feed({"choices": [late]}) == [
        {"choices": [{**delta(""), "content_filter_results": FLAGGED}]}
    ]
    empty = {"index": 0, "text": "", "finish_reason": None, "content_filter_results": {}}
    assert norm.feed({"choices": [empty]}) == []
    end = {"index": 0, "text": "", "finish_reason": "content_filter", "content_filter_results": {}}
    assert norm.feed({"choices": [end]}) == [
        {"choices": [{**delta("", finish="content_filter"), "content_filter_results": {}}]}
    ]
