"""providers.vllm_engine.output: vLLM engine outputs → OpenAI's legacy completions shape.

Parity first: the same hand-made engine outputs (real `RequestOutput` / `CompletionOutput` /
`Logprob` objects) go through vLLM's own server (`OpenAIServingCompletion`, no engine behind it)
and through output.py, and the choices and usage must match. Hand-computed expectations pin what
parity cannot show by itself (that both are right about the quirks we rely on)."""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest

from core.answers import Chunk, Usage
from providers.openai_compat.normalize import extras_for
from providers.vllm_engine.output import (
    EngineStopped,
    Rendering,
    RequestStream,
    choice,
    completion,
    finish_reason,
    legacy_logprobs,
    prompt_of,
)

with warnings.catch_warnings():
    # vLLM imports torch, which warns about its own deprecations on import; the suite turns
    # warnings into errors, and these are not ours to fix.
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("vllm.outputs")
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

Json = dict[str, Any]
Position = dict[int, Logprob]
Event = tuple[int, RequestOutput]  # (prompt index, DELTA result), as the engine yields them

INF = float("-inf")
CHOICE_KEYS = ("text", "index", "logprobs", "finish_reason")

# 20 and 21 decode alike, to show how top_logprobs collapses tokens with the same string.
VOCAB = {
    1: "<s>",
    5: "The",
    6: " cat",
    7: " sat",
    8: ".",
    9: " dog",
    10: " on",
    11: " mat",
    12: "\n",
    20: " the",
    21: " the",
}
PROMPT_TEXT = "The cat"  # the text as sent: the BOS token the engine adds is not part of it
PROMPT_IDS = (1, 5, 6)
DOG_TEXT = "The dog"
DOG_IDS = (1, 5, 9)
MAT = (7, 10, 20, 11)  # " sat on the mat"


class Tokenizer:
    """The only tokenizer method rendering uses. vLLM's server decodes a bare id (not a list)
    for a token without logprobs (the first prompt token)."""

    def decode(self, ids: list[int] | int, /) -> str:
        if isinstance(ids, int):
            return VOCAB[ids]
        return "".join(VOCAB[i] for i in ids)


# Typed Any for vLLM's signatures, which want its whole TokenizerLike protocol.
TOK: Any = Tokenizer()


# -- building engine outputs ------------------------------------------------------------------


def pos(*entries: tuple[int, float], decoded: bool = True) -> Position:
    """One position's distribution in the engine's order: the sampled (or prompt) token first,
    then the top-k. `decoded=False`: the engine left decoding to the server's tokenizer."""
    return {
        token_id: Logprob(logprob=lp, rank=rank, decoded_token=VOCAB[token_id] if decoded else None)
        for rank, (token_id, lp) in enumerate(entries, 1)
    }


def mat_logprobs(decoded: bool = True) -> list[Position]:
    """Sample logprobs for MAT, with the awkward cases: -inf values (sampled and top), a sampled
    token whose top-1 decodes alike, and alike tokens that only show past top-2."""
    return [
        pos((7, -0.5), (9, -1.0), (8, -2.0), (12, -3.0), decoded=decoded),
        pos((10, -0.125), (12, -2.5), (8, INF), (9, -7.0), decoded=decoded),
        pos((20, -0.25), (21, -0.75), (11, -2.0), decoded=decoded),
        pos((11, INF), (9, -0.5), (20, -1.0), (21, -1.25), decoded=decoded),
    ]


def some_logprobs(ids: Sequence[int]) -> list[Position]:
    """Plain sample logprobs for any tokens: the token, then three alternatives."""
    out = []
    for i, token_id in enumerate(ids):
        alts = [t for t in (8, 12, 9, 6) if t != token_id][:3]
        out.append(pos((token_id, -0.5 - i / 8), *((t, -2.0 - j) for j, t in enumerate(alts))))
    return out


def prompt_logprobs(ids: Sequence[int] = PROMPT_IDS) -> list[Position | None]:
    """Prompt logprobs as the engine gives them: nothing for the first token, then the prompt
    token and the top-k (one -inf among them, which vLLM's server clamps in place)."""
    positions: list[Position | None] = [None]
    for i, token_id in enumerate(ids[1:]):
        alts = [t for t in (9, 20, 21, 12) if t != token_id][:3]
        top = [(t, -1.0 - j) for j, t in enumerate(alts)]
        if i == 0:
            top[1] = (top[1][0], INF)
        positions.append(pos((token_id, -3.0 + i), *top))
    return positions


def seq(
    ids: Sequence[int],
    logprobs: list[Position] | None = None,
    *,
    index: int = 0,
    finish: str | None = "length",
    text: str | None = None,
    stop_reason: int | str | None = None,
) -> CompletionOutput:
    """A sequence; `text` differs from the tokens' when a stop string is held back."""
    return CompletionOutput(
        index=index,
        text=TOK.decode(list(ids)) if text is None else text,
        token_ids=list(ids),
        cumulative_logprob=None,
        logprobs=some_logprobs(ids) if logprobs is None else logprobs,
        finish_reason=finish,
        stop_reason=stop_reason,
    )


def result(
    outputs: list[CompletionOutput],
    ids: Sequence[int] = PROMPT_IDS,
    text: str | None = PROMPT_TEXT,
    *,
    with_prompt_logprobs: bool = True,
    finished: bool = True,
) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt=text,
        prompt_token_ids=list(ids),
        prompt_logprobs=prompt_logprobs(ids) if with_prompt_logprobs else None,
        outputs=outputs,
        finished=finished,
    )


def as_asked(results: list[RequestOutput], body: Json) -> list[RequestOutput]:
    """What the engine returns for `body`: no logprobs unless asked, prompt logprobs only when
    asked or for echo with logprobs (the sampling rules ask for them only then)."""
    for res in results:
        echo_logprobs = body.get("logprobs") is not None and body.get("echo")
        if body.get("prompt_logprobs") is None and not echo_logprobs:
            res.prompt_logprobs = None
        if body.get("logprobs") is None:
            for out in res.outputs:
                out.logprobs = None
    return results


# -- vLLM's server, without an engine ---------------------------------------------------------


def vllm_server() -> OpenAIServingCompletion:
    """vLLM's completion server without its engine: rendering reads only these settings and its
    own methods, so the instance skips `__init__` (which wants an engine client)."""
    server = object.__new__(OpenAIServingCompletion)
    server.return_tokens_as_token_ids = False
    server.system_fingerprint = None
    server.enable_prompt_tokens_details = False
    server.enable_force_include_usage = False
    server.enable_per_request_metrics = False
    return server


def vllm_request(body: Json, stream: bool = False) -> CompletionRequest:
    body = dict(body)
    options = body.pop("stream_options", {"include_usage": True})
    extra: Json = {"stream": True, "stream_options": options} if stream else {}
    return CompletionRequest(model="m", prompt="p", **body, **extra)


def vllm_completion(results: list[RequestOutput], body: Json) -> Json:
    response = vllm_server().request_output_to_completion_response(
        results, vllm_request(body), "cmpl-1", 0, "m", TOK, RequestResponseMetadata(request_id="1")
    )
    dumped = json.loads(response.model_dump_json())  # what vLLM's server sends
    usage = {k: dumped["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"choices": [_pick(c, body) for c in dumped["choices"]], "usage": usage}


async def vllm_stream(events: list[Event], body: Json, num_prompts: int) -> tuple[list[Json], Json]:
    """vLLM's stream for `events`: each chunk's one choice, and the final usage chunk's usage."""

    async def engine() -> AsyncIterator[Event]:
        for event in events:
            yield event

    lines = vllm_server().completion_stream_generator(
        vllm_request(body, stream=True),
        [],  # engine inputs: read only for results without a prompt text
        engine(),
        "cmpl-1",
        0,
        "m",
        num_prompts,
        TOK,
        RequestResponseMetadata(request_id="1"),
    )
    deltas: list[Json] = []
    usage: Json = {}
    async for line in lines:
        data = line.removeprefix("data: ").strip()
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        assert "error" not in chunk, chunk  # the generator turns exceptions into error events
        if chunk["choices"]:
            [delta] = chunk["choices"]
            deltas.append(_pick(delta, body))
            if "usage" in chunk:  # continuous usage: the choice's so far
                deltas[-1]["usage"] = chunk["usage"]
        else:
            usage = chunk["usage"]
    return deltas, usage


def _pick(vllm_choice: Json, body: Json) -> Json:
    """A choice of vLLM's as the gateway renders it: OpenAI's keys, and the extras the request
    asked for that are not null (vLLM's stream also sends the prompt's ids with echo alone)."""
    asked = extras_for(body)
    return {
        k: v for k, v in vllm_choice.items() if k in CHOICE_KEYS or (v is not None and k in asked)
    }


def ordered(choices: Sequence[Mapping[str, Any]]) -> list[Json]:
    """Choices with each top_logprobs dict as its item list: dict equality ignores key order,
    and the order (the engine's) is part of what must match."""
    out = []
    for c in choices:
        lp = c["logprobs"]
        if lp is not None:
            top = [list(d.items()) if d is not None else None for d in lp["top_logprobs"]]
            lp = {**lp, "top_logprobs": top}
        out.append({**c, "logprobs": lp})
    return out


def ours_stream(
    events: list[Event], body: Json, num_prompts: int
) -> tuple[list[Mapping[str, Any]], Usage]:
    continuous = bool(body.get("stream_options", {}).get("continuous_usage_stats"))
    shape = Rendering.of(body, continuous_usage=continuous)
    stream = RequestStream(shape, body.get("n") or 1, num_prompts, TOK)
    deltas: list[Mapping[str, Any]] = []
    for prompt_idx, res in events:
        for chunk in stream.chunks(prompt_idx, res):
            [delta] = chunk["choices"]
            deltas.append(delta if "usage" not in chunk else {**delta, "usage": chunk["usage"]})
    last: Chunk = {"choices": [], "usage": stream.usage()}
    assert stream.usage_chunk() == last
    return deltas, stream.usage()


# -- non-streamed cases -----------------------------------------------------------------------

Case = tuple[Json, Callable[[], list[RequestOutput]]]


def _two_prompts() -> list[RequestOutput]:
    return [
        result([seq(MAT, index=0, finish="stop"), seq((9, 12), index=1)]),
        result([seq((10, 11), index=0), seq((8,), index=1, finish="stop")], DOG_IDS, DOG_TEXT),
    ]


CASES: dict[str, Case] = {
    "plain": ({}, lambda: [result([seq(MAT)])]),
    "stop-string-held-back": (
        {"logprobs": 1},
        lambda: [result([seq((*MAT, 8), finish="stop", text=" sat on the mat")])],
    ),
    "logprobs-0": ({"logprobs": 0}, lambda: [result([seq(MAT, mat_logprobs())])]),
    "logprobs-2": ({"logprobs": 2}, lambda: [result([seq(MAT, mat_logprobs())])]),
    "logprobs-3-alike-tokens": ({"logprobs": 3}, lambda: [result([seq(MAT, mat_logprobs())])]),
    "logprobs-tokenizer-decodes": (
        {"logprobs": 2},
        lambda: [result([seq(MAT, mat_logprobs(decoded=False))])],
    ),
    "echo": ({"echo": True}, lambda: [result([seq(MAT)])]),
    "echo-logprobs": ({"echo": True, "logprobs": 2}, lambda: [result([seq(MAT, mat_logprobs())])]),
    "echo-max-tokens-0": ({"echo": True, "max_tokens": 0}, lambda: [result([seq((7,))])]),
    "echo-max-tokens-0-logprobs": (
        {"echo": True, "max_tokens": 0, "logprobs": 1},
        lambda: [result([seq((7,))])],
    ),
    "n-2": (
        {"n": 2, "logprobs": 1},
        lambda: [result([seq(MAT, index=0, finish="stop"), seq((9, 10, 12), index=1)])],
    ),
    "two-prompts-n-2": ({"n": 2, "logprobs": 1}, _two_prompts),
    "two-prompts-n-2-echo": ({"n": 2, "echo": True, "logprobs": 2}, _two_prompts),
    "tokens-as-ids": (
        {"echo": True, "logprobs": 2, "return_tokens_as_token_ids": True},
        lambda: [result([seq(MAT, mat_logprobs())])],
    ),
    "stop-reason": ({}, lambda: [result([seq(MAT, finish="stop", stop_reason=".")])]),
    "stop-reason-token-id": ({}, lambda: [result([seq(MAT, finish="stop", stop_reason=2)])]),
    "prompt-logprobs": ({"prompt_logprobs": 2}, lambda: [result([seq(MAT)])]),
    "prompt-logprobs-0-n-2": ({"prompt_logprobs": 0, "n": 2}, _two_prompts),
    "prompt-logprobs-echo": (
        {"prompt_logprobs": 1, "echo": True, "logprobs": 2},
        lambda: [result([seq(MAT, mat_logprobs())])],
    ),
    "echo-logprobs-shows-prompt-logprobs": (
        {"echo": True, "logprobs": 1},
        lambda: [result([seq(MAT, mat_logprobs())])],
    ),
    "return-token-ids": ({"return_token_ids": True}, _two_prompts),
    # The engine scores the sampled token and the listed ids; all of them are shown.
    "logprob-token-ids": (
        {"logprobs": 1, "logprob_token_ids": [9, 8, 12]},
        lambda: [result([seq(MAT, mat_logprobs())])],
    ),
    "logprob-token-ids-echo": (
        {"logprobs": 0, "logprob_token_ids": [9], "echo": True},
        lambda: [result([seq(MAT, mat_logprobs())])],
    ),
    # vLLM's server echoes no prompt text with return_token_ids (the ids stand for it).
    "return-token-ids-echo": (
        {"return_token_ids": True, "echo": True, "logprobs": 1},
        lambda: [result([seq(MAT, mat_logprobs())])],
    ),
    "return-token-ids-echo-max-tokens-0": (
        {"return_token_ids": True, "echo": True, "max_tokens": 0},
        lambda: [result([seq((7,))])],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_completion_matches_vllm_server(name: str) -> None:
    body, make = CASES[name]
    # Fresh objects for each side: vLLM's server clamps prompt logprobs in place.
    theirs = vllm_completion(as_asked(make(), body), body)
    ours = completion(as_asked(make(), body), Rendering.of(body), TOK)
    assert ordered(ours["choices"]) == ordered(theirs["choices"])
    assert ours["usage"] == theirs["usage"]


def test_plain_choice() -> None:
    ours = completion([result([seq(MAT, finish="stop")])], Rendering(), TOK)
    assert ours == {
        "choices": [
            {"text": " sat on the mat", "index": 0, "logprobs": None, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def test_logprobs_clamp_cut_and_collapse() -> None:
    [c] = completion([result([seq(MAT, mat_logprobs())])], Rendering(logprobs=3), TOK)["choices"]
    lp = c["logprobs"]
    assert lp is not None
    assert lp["tokens"] == [" sat", " on", " the", " mat"]
    assert lp["token_logprobs"] == [-0.5, -0.125, -0.25, -9999.0]  # -inf → -9999.0
    assert lp["text_offset"] == [0, 4, 7, 11]
    assert lp["top_logprobs"][1] == {" on": -0.125, "\n": -2.5, ".": -9999.0, " dog": -7.0}
    # 20 and 21 both decode to " the": one key, at the first one's place, the last one's value.
    assert lp["top_logprobs"][2] is not None and lp["top_logprobs"][3] is not None
    assert list(lp["top_logprobs"][2].items()) == [(" the", -0.75), (" mat", -2.0)]
    assert list(lp["top_logprobs"][3].items()) == [
        (" mat", -9999.0),
        (" dog", -0.5),
        (" the", -1.25),
    ]
    # logprobs=k shows the sampled token and the top k: k + 1 entries.
    [c] = completion([result([seq(MAT, mat_logprobs())])], Rendering(logprobs=1), TOK)["choices"]
    assert c["logprobs"] is not None
    tops = c["logprobs"]["top_logprobs"]
    assert [None if top is None else len(top) for top in tops] == [2, 2, 1, 2]


def test_echo_shows_prompt_tokens_with_a_null_first_logprob() -> None:
    res = result([seq(MAT, mat_logprobs())])
    [c] = completion([res], Rendering(echo=True, logprobs=1), TOK)["choices"]
    assert c["text"] == "The cat sat on the mat"
    lp = c["logprobs"]
    assert lp is not None
    assert lp["tokens"][:4] == ["<s>", "The", " cat", " sat"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][2] == -2.0
    # Offsets count the token strings, BOS included, not the choice's text.
    assert lp["text_offset"][:4] == [0, 3, 6, 10]


def test_echo_with_max_tokens_0_shows_the_prompt_but_counts_the_throwaway_token() -> None:
    ours = completion([result([seq((7,))])], Rendering(echo=True, max_tokens=0, logprobs=0), TOK)
    [c] = ours["choices"]
    assert c["text"] == PROMPT_TEXT
    assert c["logprobs"] is not None
    assert c["logprobs"]["tokens"] == ["<s>", "The", " cat"]
    assert ours["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_choices_are_numbered_prompt_major() -> None:
    ours = completion(_two_prompts(), Rendering(echo=True), TOK)
    assert [(c["index"], c["text"]) for c in ours["choices"]] == [
        (0, "The cat sat on the mat"),
        (1, "The cat dog\n"),
        (2, "The dog on mat"),
        (3, "The dog."),
    ]
    # Each prompt counted once, whatever n.
    assert ours["usage"] == {"prompt_tokens": 6, "completion_tokens": 9, "total_tokens": 15}


def test_tokens_as_ids_replace_every_token_string() -> None:
    res = result([seq(MAT, mat_logprobs())])
    shape = Rendering(echo=True, logprobs=1, tokens_as_ids=True)
    lp = completion([res], shape, TOK)["choices"][0]["logprobs"]
    assert lp is not None
    assert lp["tokens"] == [f"token_id:{t}" for t in (*PROMPT_IDS, *MAT)]
    assert lp["top_logprobs"][3] is not None
    assert list(lp["top_logprobs"][3]) == ["token_id:7", "token_id:9"]
    assert lp["text_offset"][:2] == [0, len("token_id:1")]


def test_echo_takes_the_prompt_text_given_when_the_engine_kept_none() -> None:
    res = result([seq(MAT)], text=None)
    assert completion([res], Rendering(echo=True), TOK, ["The cat"])["choices"][0]["text"] == (
        "The cat sat on the mat"
    )
    assert prompt_of(result([seq(MAT)])).text == PROMPT_TEXT  # the engine's text wins


def test_missing_logprobs_or_prompt_are_errors() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        choice(_no_logprobs(), 0, Rendering(logprobs=1), TOK)
    with pytest.raises(ValueError, match="echo"):
        choice(seq(MAT), 0, Rendering(echo=True), TOK)
    res = result([seq(MAT)], with_prompt_logprobs=False)
    with pytest.raises(ValueError, match="prompt and sample"):
        completion([res], Rendering(echo=True, logprobs=1), TOK)


def _no_logprobs() -> CompletionOutput:
    out = seq(MAT)
    out.logprobs = None
    return out


@pytest.mark.parametrize("tokens_as_ids", [False, True])
@pytest.mark.parametrize("initial_text_offset", [0, 7])
@pytest.mark.parametrize("num_top", [-1, 0, 1, 3])
def test_legacy_logprobs_matches_vllm_server(
    num_top: int, initial_text_offset: int, tokens_as_ids: bool
) -> None:
    token_ids = [*PROMPT_IDS, *MAT, *MAT]
    positions = [*prompt_logprobs(), *mat_logprobs(), *mat_logprobs(decoded=False)]
    theirs = vllm_server()._create_completion_logprobs(
        token_ids=token_ids,
        top_logprobs=positions,
        num_output_top_logprobs=num_top,
        tokenizer=TOK,
        initial_text_offset=initial_text_offset,
        return_as_token_id=tokens_as_ids,
    )
    ours = legacy_logprobs(
        token_ids,
        positions,
        num_top,
        TOK,
        initial_text_offset=initial_text_offset,
        tokens_as_ids=tokens_as_ids,
    )
    [theirs_c, ours_c] = ordered([{"logprobs": theirs.model_dump()}, {"logprobs": ours}])
    assert ours_c == theirs_c


def test_legacy_logprobs_prefers_the_engines_decoding_and_needs_a_tokenizer_otherwise() -> None:
    position = {7: Logprob(logprob=-1.0, rank=1, decoded_token="▁sat")}
    assert legacy_logprobs([7], [position], 0, None)["tokens"] == ["▁sat"]
    assert legacy_logprobs([7], [pos((7, -1.0), decoded=False)], 0, TOK)["tokens"] == [" sat"]
    with pytest.raises(ValueError, match="tokenizer"):
        legacy_logprobs([7], [pos((7, -1.0), decoded=False)], 0, None)
    with pytest.raises(ValueError, match="tokenizer"):
        legacy_logprobs([1], [None], 0, None)
    assert legacy_logprobs([1], [None], 0, None, tokens_as_ids=True)["tokens"] == ["token_id:1"]


def test_shape_of_a_body() -> None:
    assert Rendering.of({}) == Rendering(
        echo=False, logprobs=None, max_tokens=16, tokens_as_ids=False
    )
    assert Rendering.of({"max_tokens": None}).max_tokens == 16  # null means the default, not 0
    shape = Rendering.of(
        {"echo": True, "logprobs": 0, "max_tokens": 0, "return_tokens_as_token_ids": True}
    )
    assert shape == Rendering(
        echo=True, logprobs=0, max_tokens=0, tokens_as_ids=True, prompt_logprobs=True
    )
    assert shape.prompt_only and not Rendering(echo=True, max_tokens=1).prompt_only
    assert Rendering.of({"prompt_logprobs": 0}).prompt_logprobs
    assert not Rendering.of({"echo": True}).prompt_logprobs  # echo alone asks for none
    assert Rendering.of({"return_token_ids": True}).token_ids
    assert Rendering.of({}, continuous_usage=True).continuous_usage


# -- finish reasons ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("stop", "stop"), ("length", "length"), ("repetition", "stop"), (None, None)],
)
def test_finish_reason_mapping(reason: str | None, expected: str | None) -> None:
    assert finish_reason(reason) == expected


@pytest.mark.parametrize("reason", ["abort", "error", "something-new"])
def test_unfinished_sequences_raise(reason: str) -> None:
    with pytest.raises(EngineStopped) as exc:
        finish_reason(reason)
    assert exc.value.reason == reason
    with pytest.raises(EngineStopped):
        completion(
            [result([seq(MAT, index=0), seq(MAT, index=1, finish=reason)])], Rendering(), TOK
        )
    stream = RequestStream(Rendering(), 1, 1, TOK)
    stream.chunks(0, result([seq((7,), finish=None)], finished=False))
    with pytest.raises(EngineStopped):
        stream.chunks(0, result([seq((10,), finish=reason)]))


# -- streaming --------------------------------------------------------------------------------


def _later(outputs: list[CompletionOutput], ids: Sequence[int] = PROMPT_IDS) -> RequestOutput:
    """A DELTA result after the first: the engine keeps the prompt ids and text but has handed
    out the prompt logprobs already."""
    text = PROMPT_TEXT if tuple(ids) == PROMPT_IDS else DOG_TEXT
    return result(outputs, ids, text, with_prompt_logprobs=False, finished=False)


def _first(outputs: list[CompletionOutput], ids: Sequence[int] = PROMPT_IDS) -> RequestOutput:
    """A sequence's first DELTA result, with the prompt logprobs. With n > 1 each sequence is a
    child request of its own in the engine (`ParentRequest`), so each one's first result has
    them."""
    text = PROMPT_TEXT if tuple(ids) == PROMPT_IDS else DOG_TEXT
    return result(outputs, ids, text, finished=False)


def _plain_deltas() -> list[Event]:
    lps = mat_logprobs()
    return [
        (0, _first([seq((), [], finish=None)])),  # chunked prefill: nothing to send
        (0, _later([seq((7,), lps[:1], finish=None)])),
        (0, _later([seq((10, 20), lps[1:3], finish=None)])),
        # The stop string "." is a token but not text.
        (0, _later([seq((11, 8), [lps[3], *some_logprobs((8,))], finish="stop", text=" mat")])),
    ]


def _echo_deltas() -> list[Event]:
    lps = mat_logprobs()
    return [
        (0, _first([seq((7,), lps[:1], finish=None)])),
        (0, _later([seq((10, 20), lps[1:3], finish=None)])),
        (0, _later([seq((11,), lps[3:])])),
    ]


def _n2_deltas() -> list[Event]:
    return [
        (0, _first([seq((7,), index=0, finish=None)])),
        (0, _first([seq((9,), index=1, finish=None)])),
        (0, _later([seq((10,), index=1, finish=None)])),
        (0, _later([seq((10, 20), index=0, finish=None)])),
        (0, _later([seq((11,), index=0)])),
        (0, _later([seq((12,), index=1, finish="stop", text="")])),  # held-back stop string
    ]


def _two_prompt_deltas() -> list[Event]:
    return [
        (1, _first([seq((), [], index=1, finish=None)], DOG_IDS)),  # chunked prefill
        (0, _first([seq((7,), index=0, finish=None)])),
        (1, _later([seq((10,), index=1, finish=None)], DOG_IDS)),
        (0, _first([seq((9,), index=1, finish=None)])),
        (1, _first([seq((8,), index=0, finish="stop")], DOG_IDS)),
        (0, _later([seq((10, 11), index=0)])),
        (1, _later([seq((11,), index=1)], DOG_IDS)),
        (0, _later([seq((12,), index=1, finish="stop")])),
    ]


def _stop_reason_deltas() -> list[Event]:
    return [
        (0, _first([seq((7,), finish=None)])),
        (0, _later([seq((10, 8), finish="stop", text=" on", stop_reason=".")])),
    ]


CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
StreamCase = tuple[Json, int, Callable[[], list[Event]]]

STREAMS: dict[str, StreamCase] = {
    "plain": ({}, 1, _plain_deltas),
    "logprobs": ({"logprobs": 1}, 1, _plain_deltas),
    "echo": ({"echo": True}, 1, _echo_deltas),
    "echo-logprobs": ({"echo": True, "logprobs": 2}, 1, _echo_deltas),
    "echo-max-tokens-0": (
        {"echo": True, "max_tokens": 0, "logprobs": 1},
        1,
        lambda: [(0, _first([seq((7,))]))],
    ),
    "n-2": ({"n": 2, "logprobs": 1}, 1, _n2_deltas),
    "two-prompts-n-2": ({"n": 2, "logprobs": 0}, 2, _two_prompt_deltas),
    "two-prompts-n-2-echo": ({"n": 2, "echo": True, "logprobs": 1}, 2, _two_prompt_deltas),
    "tokens-as-ids": (
        {"echo": True, "logprobs": 1, "return_tokens_as_token_ids": True},
        1,
        _echo_deltas,
    ),
    "return-token-ids": ({"return_token_ids": True, "n": 2}, 1, _n2_deltas),
    "return-token-ids-echo": ({"return_token_ids": True, "echo": True}, 1, _echo_deltas),
    "stop-reason": ({}, 1, _stop_reason_deltas),
    "continuous-usage": ({"stream_options": CONTINUOUS, "n": 2}, 1, _n2_deltas),
    "continuous-usage-two-prompts": (
        {"stream_options": CONTINUOUS, "n": 2, "echo": True},
        2,
        _two_prompt_deltas,
    ),
}


def _stream_events(name: str) -> list[Event]:
    body, _, make = STREAMS[name]
    events = make()
    as_asked([res for _, res in events], body)
    return events


@pytest.mark.parametrize("name", STREAMS)
async def test_stream_matches_vllm_server(name: str) -> None:
    body, num_prompts, _ = STREAMS[name]
    theirs = await vllm_stream(_stream_events(name), body, num_prompts)
    ours = ours_stream(_stream_events(name), body, num_prompts)
    assert ordered(ours[0]) == ordered(theirs[0])
    assert ours[1] == theirs[1]


def merged(events: list[Event], num_prompts: int) -> list[RequestOutput]:
    """The FINAL results the engine would have returned for the same DELTA outputs."""
    finals: list[RequestOutput] = []
    for prompt_idx in range(num_prompts):
        mine = [res for idx, res in events if idx == prompt_idx]
        first = mine[0]
        seqs: dict[int, CompletionOutput] = {}
        for res in mine:
            for out in res.outputs:
                acc = seqs.setdefault(out.index, seq((), [], index=out.index, finish=None))
                acc.text += out.text
                acc.token_ids = [*acc.token_ids, *out.token_ids]
                acc.logprobs = (
                    None if out.logprobs is None else [*(acc.logprobs or []), *out.logprobs]
                )
                acc.finish_reason = out.finish_reason
        outputs = [seqs[i] for i in sorted(seqs)]
        ids, text = first.prompt_token_ids or [], first.prompt
        finals.append(result(outputs, ids, text))
        finals[-1].prompt_logprobs = first.prompt_logprobs
    return finals


@pytest.mark.parametrize("name", STREAMS)
def test_stream_adds_up_to_the_non_streamed_answer(name: str) -> None:
    """Per choice, the deltas concatenate to the non-streamed choice: text, logprobs (offsets
    continue across deltas), finish_reason on the last delta only; usage is the same."""
    body, num_prompts, _ = STREAMS[name]
    deltas, stream_usage = ours_stream(_stream_events(name), body, num_prompts)
    whole = completion(merged(_stream_events(name), num_prompts), Rendering.of(body), TOK)
    assert stream_usage == whole["usage"]
    for c in whole["choices"]:
        mine = [d for d in deltas if d["index"] == c["index"]]
        assert "".join(d["text"] for d in mine) == c["text"]
        assert [d["finish_reason"] for d in mine] == [None] * (len(mine) - 1) + [c["finish_reason"]]
        if c["logprobs"] is None:
            assert all(d["logprobs"] is None for d in mine)
            continue
        for key, value in c["logprobs"].items():
            assert [x for d in mine for x in d["logprobs"][key]] == value, key


def test_stream_deltas_by_hand() -> None:
    deltas, usage = ours_stream(_stream_events("echo-logprobs"), {"echo": True, "logprobs": 2}, 1)
    assert [d["text"] for d in deltas] == ["The cat sat", " on the", " mat"]
    assert [d["logprobs"]["tokens"] for d in deltas] == [
        ["<s>", "The", " cat", " sat"],
        [" on", " the"],
        [" mat"],
    ]
    assert [d["logprobs"]["text_offset"] for d in deltas] == [[0, 3, 6, 10], [14, 17], [21]]
    assert [d["finish_reason"] for d in deltas] == [None, None, "length"]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_stream_skips_empty_prefill_output_and_numbers_choices() -> None:
    deltas, usage = ours_stream(_stream_events("two-prompts-n-2"), {"n": 2, "logprobs": 0}, 2)
    assert [(d["index"], d["text"]) for d in deltas] == [
        (0, " sat"),
        (3, " on"),
        (1, " dog"),
        (2, "."),
        (0, " on mat"),
        (3, " mat"),
        (1, "\n"),
    ]
    assert usage == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}


def test_stream_echoes_the_prompt_once_per_choice() -> None:
    body = {"n": 2, "echo": True}
    deltas, _ = ours_stream(_stream_events("two-prompts-n-2-echo"), body, 2)
    firsts: dict[int, str] = {}
    for d in deltas:
        firsts.setdefault(d["index"], d["text"])
    assert firsts == {0: "The cat sat", 1: "The cat dog", 2: "The dog.", 3: "The dog"}
    assert sum(d["text"].count("The") for d in deltas) == 4


def test_stream_echo_with_max_tokens_0_sends_only_the_prompt() -> None:
    body = {"echo": True, "max_tokens": 0}
    deltas, usage = ours_stream([(0, _first([seq((7,))]))], body, 1)
    assert deltas == [
        {"text": PROMPT_TEXT, "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_stream_copies_repeat_each_delta_under_their_own_indices() -> None:
    """Greedy n > 1 (the gateway's fan-out, not vLLM's server): the engine makes one sequence
    per prompt and each delta fills `copies` choices, each counted in usage."""
    stream = RequestStream(Rendering(echo=True, logprobs=0), 2, 2, TOK, copies=2)
    events = [
        (1, _first([seq((8,), finish=None)], DOG_IDS)),
        (0, _first([seq((7,), finish=None)])),
        (0, _later([seq((10,), finish="stop")])),
        (1, _later([seq((11,))], DOG_IDS)),
    ]
    deltas = [c["choices"][0] for prompt_idx, res in events for c in stream.chunks(prompt_idx, res)]
    assert [(d["index"], d["text"]) for d in deltas] == [
        (2, "The dog."),
        (3, "The dog."),
        (0, "The cat sat"),
        (1, "The cat sat"),
        (0, " on"),
        (1, " on"),
        (2, " mat"),
        (3, " mat"),
    ]
    assert deltas[0]["logprobs"] == deltas[1]["logprobs"]
    assert deltas[4]["logprobs"] is not None and deltas[5]["logprobs"] is not None
    assert deltas[4]["logprobs"]["text_offset"] == deltas[5]["logprobs"]["text_offset"] == [14]
    assert stream.usage() == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}
