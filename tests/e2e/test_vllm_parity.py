"""The parity suite: one scenario suite through both of the gateway's vLLM paths, compared
with vLLM's own OpenAI server called directly with the same SDK.

    server   the gateway → vLLM's OpenAI server (`type: vllm-server`)
    engine   the gateway's in-process engine (`type: vllm`) on the same tiny model

The stack (tests/e2e/vllm_stack.py) is started once per session. Wherever the output is
deterministic (temperature 0 or a fixed seed) both paths must give vLLM's text and token counts;
what the gateway adds (aliases, ids, best_of, top_p=0, context-length handling, parameter
checks) is tested on top.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, cast

import httpx
import openai
import orjson
import pytest
from openai.types import Completion, CompletionUsage
from openai.types.chat import ChatCompletionStreamOptionsParam

from tests.e2e.support import outputs, streamed_texts
from tests.e2e.vllm_stack import ASK_ERROR, MODEL, PATHS, WINDOW, Stack
from tests.vllm_proc import require_vllm

require_vllm()

PROMPT = "Once upon a time"  # greedy: "\ufffder" then "er" repeated, then "~er~…"
OTHER = "The weather today is"  # a different greedy continuation
MAX_TOKENS = 12
# vLLM refuses n > 1 with temperature 0 ("n must be 1 when using greedy sampling"); top_k=1 samples
# the greedy continuation while staying "random" sampling.
GREEDY_SAMPLING: dict[str, Any] = {"temperature": 1.0, "extra_body": {"top_k": 1}}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=PATHS)
def path(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture(scope="module")
def gw(vllm_stack: Stack, path: str) -> Iterator[openai.OpenAI]:
    with vllm_stack.client(path) as client:
        yield client


# ---------------------------------------------------------------- helpers


def create(client: openai.OpenAI, **kw: Any) -> Completion:
    kw.setdefault("model", MODEL)
    kw.setdefault("max_tokens", MAX_TOKENS)
    resp: Completion = client.completions.create(**kw)
    return resp


def both(gw: openai.OpenAI, direct: openai.OpenAI, **kw: Any) -> tuple[Completion, Completion]:
    """The same request through the gateway and straight to vLLM."""
    return create(gw, **kw), create(direct, **kw)


def counts(usage: CompletionUsage | None) -> tuple[int, int, int]:
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def assert_same(g: Completion, d: Completion) -> None:
    assert outputs(g) == outputs(d)
    assert counts(g.usage) == counts(d.usage)


def greedy(direct: openai.OpenAI, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    return create(direct, prompt=prompt, max_tokens=max_tokens, temperature=0).choices[0].text


def finish_reasons(chunks: list[Completion]) -> dict[int, list[str]]:
    """Per choice index, the non-null finish reasons it received (exactly one is expected)."""
    found: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                found[choice.index].append(choice.finish_reason)
    return dict(found)


def stream_all(client: openai.OpenAI, **kw: Any) -> list[Completion]:
    kw.setdefault("model", MODEL)
    kw.setdefault("max_tokens", MAX_TOKENS)
    with client.completions.create(stream=True, **kw) as stream:
        return list(stream)


def sse_data(url: str, body: dict[str, Any], headers: dict[str, str]) -> list[str]:
    """The `data:` payloads of a raw SSE response, in order."""
    lines: list[str] = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60.0) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data:"):
                lines.append(line[len("data:") :].strip())
    return lines


# ---------------------------------------------------------------- plain completions


def test_greedy_matches_vllm(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    g, d = both(gw, direct, prompt=PROMPT, temperature=0)
    assert_same(g, d)
    assert len(g.choices) == 1
    assert g.model == MODEL
    assert g.object == "text_completion"
    assert g.id.startswith("cmpl-")
    assert g.choices[0].finish_reason == "length"
    assert counts(g.usage)[1] == MAX_TOKENS


def test_seeded_sampling_matches_vllm(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    g, d = both(gw, direct, prompt=PROMPT, temperature=1.0, seed=11)
    assert_same(g, d)
    again = create(gw, prompt=PROMPT, temperature=1.0, seed=11)
    assert outputs(again) == outputs(g)


def test_two_prompts_n2_are_prompt_major(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    first, second = greedy(direct, PROMPT), greedy(direct, OTHER)
    assert first != second  # otherwise the order below proves nothing
    g, d = both(gw, direct, prompt=[PROMPT, OTHER], n=2, **GREEDY_SAMPLING)
    assert [c.index for c in g.choices] == [0, 1, 2, 3]
    assert [c.text for c in g.choices] == [first, first, second, second]
    assert_same(g, d)
    assert counts(g.usage)[1] == 4 * MAX_TOKENS  # completion tokens of every choice


def test_two_prompts_n2_seeded_match_vllm(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    g, d = both(gw, direct, prompt=[PROMPT, OTHER], n=2, temperature=1.0, seed=7)
    assert [c.index for c in g.choices] == [0, 1, 2, 3]
    assert_same(g, d)


# ---------------------------------------------------------------- streaming


async def test_stream_deltas_concatenate_to_the_completion(
    direct: openai.OpenAI, vllm_stack: Stack, path: str
) -> None:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, **GREEDY_SAMPLING}
    full = create(direct, prompt=[PROMPT, OTHER], n=2, **kw)
    async with vllm_stack.async_client(path) as client:
        stream = await client.completions.create(prompt=[PROMPT, OTHER], n=2, stream=True, **kw)
        chunks = [chunk async for chunk in stream]
    assert streamed_texts(chunks) == {c.index: c.text for c in full.choices}
    assert finish_reasons(chunks) == {c.index: [c.finish_reason] for c in full.choices}
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert chunks[0].id.startswith("cmpl-")
    assert {chunk.model for chunk in chunks} == {MODEL}
    assert all(chunk.usage is None for chunk in chunks)  # no usage unless asked for


def test_stream_matches_vllm_stream(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"prompt": PROMPT, "temperature": 1.0, "seed": 5}
    g, d = stream_all(gw, **kw), stream_all(direct, **kw)
    assert streamed_texts(g) == streamed_texts(d)
    assert finish_reasons(g) == finish_reasons(d)
    assert streamed_texts(g) == {0: create(direct, **kw).choices[0].text}


def test_raw_stream_ends_with_done(vllm_stack: Stack, path: str) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    url = vllm_stack.gateway.url + "/v1/completions"
    data = sse_data(url, body, vllm_stack.headers(path))
    assert data[-1] == "[DONE]"
    assert data.count("[DONE]") == 1
    events = [orjson.loads(item) for item in data[:-1]]
    assert events and all(event["object"] == "text_completion" for event in events)
    assert all("error" not in event for event in events)


async def test_stream_include_usage(direct: openai.OpenAI, vllm_stack: Stack, path: str) -> None:
    kw: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    full = create(direct, temperature=0, **kw)
    async with vllm_stack.async_client(path) as client:
        stream = await client.completions.create(
            stream=True, stream_options={"include_usage": True}, temperature=0, **kw
        )
        chunks = [chunk async for chunk in stream]
    *content, last = chunks
    assert last.choices == []
    assert counts(last.usage) == counts(full.usage)
    assert content and all(chunk.usage is None for chunk in content)
    assert streamed_texts(content) == {0: full.choices[0].text}


def test_stream_with_stop_string(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    text = greedy(direct, PROMPT, max_tokens=16)
    assert "~" in text  # the tiny model's greedy output for PROMPT
    chunks = stream_all(gw, prompt=PROMPT, max_tokens=16, temperature=0, stop=["~"])
    assert streamed_texts(chunks) == {0: text[: text.index("~")]}
    assert finish_reasons(chunks) == {0: ["stop"]}


# ---------------------------------------------------------------- logprobs, echo, stop


def test_logprobs_legacy_shape(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    g, d = both(gw, direct, prompt=PROMPT, temperature=0, logprobs=2)
    assert_same(g, d)
    lp, ref = g.choices[0].logprobs, d.choices[0].logprobs
    assert lp is not None and ref is not None
    assert lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    lengths = {len(lp.tokens), len(lp.token_logprobs), len(lp.top_logprobs), len(lp.text_offset)}
    assert lengths == {counts(g.usage)[1]}
    assert all(top is not None and 1 <= len(top) <= 3 for top in lp.top_logprobs)
    assert lp.tokens == ref.tokens
    assert lp.text_offset == ref.text_offset
    assert lp.token_logprobs == pytest.approx(ref.token_logprobs, rel=1e-5)
    assert lp.top_logprobs == ref.top_logprobs or all(
        a.keys() == b.keys() and list(a.values()) == pytest.approx(list(b.values()), rel=1e-5)
        for a, b in zip(lp.top_logprobs, ref.top_logprobs or [], strict=True)
    )


def test_echo_with_logprobs_scores_the_prompt(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    g, d = both(gw, direct, prompt=PROMPT, temperature=0, echo=True, logprobs=1, max_tokens=1)
    assert_same(g, d)
    choice = g.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    prompt_tokens, completion_tokens, _ = counts(g.usage)
    assert completion_tokens == 1
    assert len(lp.tokens) == len(lp.token_logprobs) == prompt_tokens + 1
    assert len(lp.top_logprobs) == len(lp.text_offset) == prompt_tokens + 1
    assert lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    assert all(value is not None for value in lp.token_logprobs[1:])
    ref = d.choices[0].logprobs
    assert ref is not None
    assert lp.tokens == ref.tokens
    assert lp.token_logprobs[1:] == pytest.approx((ref.token_logprobs or [])[1:], rel=1e-5)


def test_stop_string_is_excluded(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    text = greedy(direct, PROMPT, max_tokens=16)
    assert "~" in text
    g, d = both(gw, direct, prompt=PROMPT, max_tokens=16, temperature=0, stop=["~", "zzz"])
    assert outputs(g) == [(0, text[: text.index("~")], "stop")]
    assert_same(g, d)


# ---------------------------------------------------------------- vLLM extras and emulations


@pytest.mark.parametrize(
    "extra",
    [
        {"top_k": 5},
        {"min_p": 0.1},
        {"repetition_penalty": 1.3},
        {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.3},
    ],
    ids=["top_k", "min_p", "repetition_penalty", "all"],
)
def test_vllm_extras_match_vllm(
    gw: openai.OpenAI, direct: openai.OpenAI, extra: dict[str, Any]
) -> None:
    g, d = both(gw, direct, prompt=PROMPT, temperature=1.0, seed=3, extra_body=extra)
    assert_same(g, d)


def test_vllm_extras_take_effect(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """Outputs that only come out if the extras reach vLLM's sampler."""
    text = greedy(direct, PROMPT)
    sampled = {"prompt": PROMPT, "temperature": 1.0, "seed": 3}
    assert create(gw, **sampled).choices[0].text != text  # sampling differs from greedy here
    assert create(gw, extra_body={"top_k": 1}, **sampled).choices[0].text == text
    assert create(gw, extra_body={"min_p": 1.0}, **sampled).choices[0].text == text
    penalized = create(gw, prompt=PROMPT, temperature=0, extra_body={"repetition_penalty": 2.0})
    assert penalized.choices[0].text != text


EOS, BOS = 2, 1  # the tiny model's </s> and <s>
FORCED = 50  # an ordinary token, forced with a +100 bias where a scenario needs a known token


def extras_both(
    gw: openai.OpenAI, direct: openai.OpenAI, **extra: Any
) -> tuple[Completion, Completion]:
    """A greedy request with vLLM extras through the gateway and straight to vLLM: the same."""
    g, d = both(gw, direct, prompt=PROMPT, temperature=0, extra_body=extra)
    assert_same(g, d)
    return g, d


def test_min_tokens_holds_back_eos(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    eos_first = {"logit_bias": {str(EOS): 100}}
    g, _ = extras_both(gw, direct, **eos_first)
    assert (counts(g.usage)[1], g.choices[0].finish_reason) == (1, "stop")  # EOS at once
    g, _ = extras_both(gw, direct, **eos_first, min_tokens=5)
    assert (counts(g.usage)[1], g.choices[0].finish_reason) == (6, "stop")  # 5 tokens, then EOS


def test_stop_token_ids_end_the_completion(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    forced = {"logit_bias": {str(FORCED): 100}}
    g, _ = extras_both(gw, direct, **forced)
    assert g.choices[0].finish_reason == "length" and g.choices[0].text  # the token, 12 times
    one = g.choices[0].text[: len(g.choices[0].text) // MAX_TOKENS]
    g, _ = extras_both(gw, direct, **forced, stop_token_ids=[FORCED])
    assert (g.choices[0].text, g.choices[0].finish_reason) == ("", "stop")
    g, _ = extras_both(gw, direct, **forced, stop_token_ids=[FORCED],
                       include_stop_str_in_output=True)  # fmt: skip
    assert (g.choices[0].text, g.choices[0].finish_reason) == (one, "stop")


def test_include_stop_str_in_output(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    text = greedy(direct, PROMPT, max_tokens=16)
    g, _ = extras_both(gw, direct, max_tokens=16, stop=["~"], include_stop_str_in_output=True)
    assert outputs(g) == [(0, text[: text.index("~") + 1], "stop")]


def test_allowed_token_ids_and_bad_words(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    free = greedy(direct, PROMPT)
    g, _ = extras_both(gw, direct, allowed_token_ids=[FORCED])
    assert g.choices[0].text != free and counts(g.usage)[1] == MAX_TOKENS
    g, _ = extras_both(gw, direct, bad_words=["er"])
    assert "er" not in g.choices[0].text and "er" in free


def test_special_tokens_in_the_text(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    bos = {"logit_bias": {str(BOS): 100}, "max_tokens": 3}
    g, _ = extras_both(gw, direct, **bos)
    assert g.choices[0].text == ""  # skipped by default
    g, _ = extras_both(gw, direct, **bos, skip_special_tokens=False)
    assert g.choices[0].text == "<s><s><s>"
    # The tiny model's fast tokenizer joins special tokens without spaces either way (the flag
    # acts in slow tokenizers): the same answer as vLLM's is what can be checked here.
    extras_both(gw, direct, **bos, skip_special_tokens=False, spaces_between_special_tokens=True)


def test_logprobs_above_five_match_vllm(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """vLLM's cap (max_logprobs, 20) on both paths, not OpenAI's 5."""
    g, d = both(gw, direct, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=12)
    assert_same(g, d)
    assert g.choices[0].logprobs is not None and d.choices[0].logprobs is not None
    assert g.choices[0].logprobs.tokens == d.choices[0].logprobs.tokens
    tops = zip(g.choices[0].logprobs.top_logprobs or [], d.choices[0].logprobs.top_logprobs or [],
               strict=True)  # fmt: skip
    for gt, dt in tops:
        assert gt is not None and dt is not None and len(gt) > 5
        assert gt == pytest.approx(dt, rel=1e-5)


def test_logprob_token_ids(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """The listed ids' logprobs at every position, in place of the top `logprobs`."""
    kw: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 1}
    g, d = both(gw, direct, **kw, extra_body={"logprob_token_ids": [FORCED, EOS]})
    assert_same(g, d)
    lp, ref = g.choices[0].logprobs, d.choices[0].logprobs
    assert lp is not None and ref is not None and lp.tokens == ref.tokens
    assert lp.top_logprobs is not None and ref.top_logprobs is not None
    for mine, theirs in zip(lp.top_logprobs, ref.top_logprobs, strict=True):
        assert mine is not None and theirs is not None and "</s>" in mine
        assert mine == pytest.approx(theirs, rel=1e-5)
    plain = create(gw, **kw).choices[0].logprobs
    assert plain is not None and plain.top_logprobs is not None
    assert all("</s>" not in top for top in plain.top_logprobs if top is not None)


@pytest.mark.parametrize(
    ("extra", "prompt_tokens"),
    [
        ({}, 10),  # "Once upon a time": BOS + 9 tokens of the tiny BPE
        ({"add_special_tokens": False}, 9),
        ({"truncate_prompt_tokens": 3}, 3),
        ({"truncate_prompt_tokens": 3, "truncation_side": "right"}, 3),
        ({"truncate_prompt_tokens": -1}, 10),
    ],
    ids=["plain", "no-special-tokens", "truncate-left", "truncate-right", "truncate-window"],
)
def test_prompt_tokenization_extras(
    gw: openai.OpenAI, direct: openai.OpenAI, extra: dict[str, Any], prompt_tokens: int
) -> None:
    g, _ = extras_both(gw, direct, **extra)
    assert counts(g.usage)[0] == prompt_tokens


def test_truncation_sides_differ(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    left, _ = extras_both(gw, direct, truncate_prompt_tokens=2)
    right, _ = extras_both(gw, direct, truncate_prompt_tokens=2, truncation_side="right")
    assert left.choices[0].text != right.choices[0].text


def test_truncation_beyond_the_window_is_a_400(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    for client in (gw, direct):
        with pytest.raises(openai.BadRequestError) as caught:
            create(client, prompt=PROMPT, extra_body={"truncate_prompt_tokens": WINDOW + 1})
        assert "truncate_prompt_tokens" in caught.value.message


def test_priority_is_taken(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """Without priority scheduling (both engines here) vLLM takes a priority and serves the
    request as any other."""
    for priority in (-5, 0, 3):
        extras_both(gw, direct, priority=priority)


@pytest.mark.parametrize("echo", [False, True])
def test_return_tokens_as_token_ids(gw: openai.OpenAI, direct: openai.OpenAI, echo: bool) -> None:
    extra = {"return_tokens_as_token_ids": True}
    g, d = both(gw, direct, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2, echo=echo,
                extra_body=extra)  # fmt: skip
    assert_same(g, d)
    lp, ref = g.choices[0].logprobs, d.choices[0].logprobs
    assert lp is not None and ref is not None and lp.tokens == ref.tokens
    assert lp.tokens and all(t.startswith("token_id:") for t in lp.tokens)
    assert lp.top_logprobs is not None and ref.top_logprobs is not None
    assert [sorted(t or {}) for t in lp.top_logprobs] == [sorted(t or {}) for t in ref.top_logprobs]


STRUCTURED: list[tuple[dict[str, Any], Any]] = [
    ({"choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
    ({"regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
    ({"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
               "additionalProperties": False}},
     lambda t: isinstance(orjson.loads(t)["n"], int)),
    ({"grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
    ({"json_object": True}, lambda t: isinstance(orjson.loads(t), dict)),
]  # fmt: skip


@pytest.mark.parametrize(("constraint", "holds"), STRUCTURED,
                         ids=["choice", "regex", "json", "grammar", "json_object"])  # fmt: skip
def test_structured_outputs(
    gw: openai.OpenAI, direct: openai.OpenAI, constraint: dict[str, Any], holds: Any
) -> None:
    g, d = both(gw, direct, prompt="Answer:", max_tokens=60, temperature=1.0, seed=4,
                extra_body={"structured_outputs": constraint})  # fmt: skip
    assert_same(g, d)
    assert g.choices[0].finish_reason == "stop" and holds(g.choices[0].text), g.choices[0].text


@pytest.mark.parametrize(
    "constraint",
    [{"regex": "([a-z"}, {"grammar": "root ::= ("}, {"json": {"type": "nonsense"}}],
    ids=["regex", "grammar", "json"],
)
def test_invalid_structured_outputs_are_400s(
    gw: openai.OpenAI, direct: openai.OpenAI, constraint: dict[str, Any]
) -> None:
    for client in (gw, direct):
        with pytest.raises(openai.BadRequestError):
            create(client, prompt="Answer:", extra_body={"structured_outputs": constraint})


# ---------------------------------------------------------------- vLLM's answers to its extras


def extra_of(choice: Any, key: str) -> Any:
    """A vLLM extra on a choice (the SDK keeps unknown keys as `model_extra`)."""
    return (choice.model_extra or {}).get(key)


def same_prompt_logprobs(ours: Any, theirs: Any) -> None:
    """vLLM's `prompt_logprobs` format: null first, then token id → {logprob, rank,
    decoded_token} per position, in the engine's order."""
    assert ours[0] is None and theirs[0] is None and len(ours) == len(theirs)
    for mine, ref in zip(ours[1:], theirs[1:], strict=True):
        assert list(mine) == list(ref)  # the same ids in the same order
        for token_id, entry in mine.items():
            assert entry.keys() == {"logprob", "rank", "decoded_token"}
            assert (entry["rank"], entry["decoded_token"]) == (
                ref[token_id]["rank"],
                ref[token_id]["decoded_token"],
            )
            assert entry["logprob"] == pytest.approx(ref[token_id]["logprob"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("asked", [0, 3])
def test_prompt_logprobs(gw: openai.OpenAI, direct: openai.OpenAI, asked: int) -> None:
    g, d = extras_both(gw, direct, prompt_logprobs=asked, max_tokens=2)
    ours, theirs = (
        extra_of(g.choices[0], "prompt_logprobs"),
        extra_of(d.choices[0], "prompt_logprobs"),
    )
    same_prompt_logprobs(ours, theirs)
    assert len(ours) == counts(g.usage)[0]  # one position per prompt token
    # The prompt's own token at each position, plus the top `asked` (vLLM's format).
    assert all(1 <= len(position) <= asked + 1 for position in ours[1:])
    assert extra_of(create(gw, prompt=PROMPT, max_tokens=2).choices[0], "prompt_logprobs") is None


def test_echo_with_logprobs_also_returns_prompt_logprobs(
    gw: openai.OpenAI, direct: openai.OpenAI
) -> None:
    """vLLM's server asks the engine for the echoed prompt's logprobs and shows them too."""
    g, d = both(gw, direct, prompt=PROMPT, max_tokens=2, temperature=0, echo=True, logprobs=1)
    same_prompt_logprobs(
        extra_of(g.choices[0], "prompt_logprobs"), extra_of(d.choices[0], "prompt_logprobs")
    )


def test_prompt_logprobs_refusals(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """With stream, and above the cap (max_logprobs, 20): 400s naming the field on both."""
    for client in (gw, direct):
        with pytest.raises(openai.BadRequestError) as caught:
            stream_all(client, prompt=PROMPT, extra_body={"prompt_logprobs": 1})
        assert "prompt_logprobs" in caught.value.message
        with pytest.raises(openai.BadRequestError) as caught:
            create(client, prompt=PROMPT, extra_body={"prompt_logprobs": 21})
        assert "prompt logprobs of 21" in caught.value.message


@pytest.mark.parametrize("echo", [False, True])
def test_return_token_ids(gw: openai.OpenAI, direct: openai.OpenAI, echo: bool) -> None:
    g, d = extras_both(gw, direct, return_token_ids=True, echo=echo, max_tokens=5)
    choice, ref = g.choices[0], d.choices[0]
    prompt_ids, ids = extra_of(choice, "prompt_token_ids"), extra_of(choice, "token_ids")
    assert prompt_ids == extra_of(ref, "prompt_token_ids") and prompt_ids[0] == BOS
    assert ids == extra_of(ref, "token_ids")
    assert (len(prompt_ids), len(ids)) == counts(g.usage)[:2]
    # vLLM's server echoes no prompt text when it returns the prompt's ids.
    assert choice.text == greedy(direct, PROMPT, max_tokens=5)
    plain = create(gw, prompt=PROMPT, max_tokens=5, temperature=0).choices[0]
    assert extra_of(plain, "token_ids") is None and extra_of(plain, "prompt_token_ids") is None


def test_return_token_ids_in_a_stream(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"prompt": PROMPT, "n": 2, **GREEDY_SAMPLING}
    kw["extra_body"] = {**kw["extra_body"], "return_token_ids": True}
    whole = create(direct, **kw)
    for client in (gw, direct):
        chunks = stream_all(client, **kw)
        for choice in whole.choices:
            mine = [c for chunk in chunks for c in chunk.choices if c.index == choice.index]
            firsts = [extra_of(c, "prompt_token_ids") for c in mine]
            assert firsts[0] == extra_of(choice, "prompt_token_ids")  # on the first chunk only
            assert all(f is None for f in firsts[1:])
            streamed = [i for c in mine for i in extra_of(c, "token_ids")]
            assert streamed == extra_of(choice, "token_ids")


def test_stop_reason(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """The stop string or token id that ended a choice; none for length."""
    g, d = extras_both(gw, direct, max_tokens=16, stop=["~"])
    assert extra_of(g.choices[0], "stop_reason") == extra_of(d.choices[0], "stop_reason") == "~"
    forced = {"logit_bias": {str(FORCED): 100}}
    g, _ = extras_both(gw, direct, **forced, stop_token_ids=[FORCED])
    assert extra_of(g.choices[0], "stop_reason") == FORCED
    g, _ = extras_both(gw, direct)
    assert g.choices[0].finish_reason == "length" and extra_of(g.choices[0], "stop_reason") is None


async def test_continuous_usage_stats(direct: openai.OpenAI, vllm_stack: Stack, path: str) -> None:
    """Every content chunk carries its choice's usage so far, as vLLM's server sends it: the
    prompt's tokens, and the tokens the choice has had (counted here by its token ids)."""
    kw: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "n": 2}
    kw.update(GREEDY_SAMPLING)
    kw["extra_body"] = {**kw["extra_body"], "return_token_ids": True}
    full = create(direct, **kw)
    # vLLM's continuous_usage_stats is not a key of the SDK's stream_options type (it sends
    # the dict as it is).
    options = cast(
        ChatCompletionStreamOptionsParam, {"include_usage": True, "continuous_usage_stats": True}
    )
    async with vllm_stack.async_client(path) as client:
        stream = await client.completions.create(stream=True, stream_options=options, **kw)
        chunks = [chunk async for chunk in stream]
    *content, last = chunks
    assert last.choices == [] and counts(last.usage) == counts(full.usage)
    seen: dict[int, int] = defaultdict(int)
    for chunk in content:
        [choice] = chunk.choices  # one choice per chunk, as vLLM sends them
        seen[choice.index] += len(extra_of(choice, "token_ids"))
        assert chunk.usage is not None
        assert chunk.usage.prompt_tokens == counts(full.usage)[0]
        assert chunk.usage.completion_tokens == seen[choice.index]
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + seen[choice.index]
    assert sum(seen.values()) == counts(full.usage)[1]
    # Asked without include_usage, vLLM sends no usage at all; nor does the gateway.
    async with vllm_stack.async_client(path) as client:
        alone = cast(
            ChatCompletionStreamOptionsParam,
            {"include_usage": False, "continuous_usage_stats": True},
        )
        stream = await client.completions.create(stream=True, stream_options=alone, **kw)
        assert all([chunk.usage is None async for chunk in stream])


# ---------------------------------------------------------------- beam search


BEAMS: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 6, "n": 2, "temperature": 0}


@pytest.mark.parametrize(
    ("penalty", "prompts"), [(1.0, PROMPT), (0.3, PROMPT), (1.0, [PROMPT, OTHER])]
)
def test_beam_search(
    gw: openai.OpenAI, direct: openai.OpenAI, penalty: float, prompts: Any
) -> None:
    extra = {"use_beam_search": True, "length_penalty": penalty}
    g, d = both(gw, direct, **{**BEAMS, "prompt": prompts}, extra_body=extra)
    assert_same(g, d)
    assert len(g.choices) == 2 * (1 if isinstance(prompts, str) else 2)
    assert len({c.text for c in g.choices[:2]}) == 2  # two distinct beams, best first
    assert [extra_of(c, "stop_reason") for c in g.choices] == [
        extra_of(c, "stop_reason") for c in d.choices
    ]


def test_beam_search_takes_effect(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """Beams of width 4 search where greedy decoding does not: they differ from the n=1 beam
    (greedy), and with logprobs each beam scores its own tokens."""
    one = create(gw, **{**BEAMS, "n": 1}, extra_body={"use_beam_search": True})
    assert one.choices[0].text == greedy(direct, PROMPT, max_tokens=6)
    four, ref = both(gw, direct, **{**BEAMS, "n": 4}, logprobs=1,
                     extra_body={"use_beam_search": True})  # fmt: skip
    assert_same(four, ref)
    assert len({c.text for c in four.choices}) == 4
    for choice, theirs in zip(four.choices, ref.choices, strict=True):
        assert choice.logprobs is not None and theirs.logprobs is not None
        assert choice.logprobs.tokens == theirs.logprobs.tokens


def test_beam_search_refusals(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """With stream: a 400 on both. What beam search ignores (stop, top_p, …), vLLM's server
    drops silently; the gateway refuses it, naming the field."""
    beam = {"use_beam_search": True}
    for client in (gw, direct):
        with pytest.raises(openai.BadRequestError):
            stream_all(client, prompt=PROMPT, extra_body=beam)
    create(direct, **BEAMS, stop=["~"], extra_body=beam)
    with pytest.raises(openai.BadRequestError) as caught:
        create(gw, **BEAMS, stop=["~"], extra_body=beam)
    assert caught.value.body["param"] == "stop"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        create(gw, **BEAMS, extra_body={"length_penalty": 0.5})
    assert caught.value.body["param"] == "length_penalty"  # type: ignore[index]


def test_top_p_zero_is_greedy(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):  # vLLM itself wants top_p in (0, 1]
        create(direct, prompt=PROMPT, top_p=0)
    g = create(gw, prompt=PROMPT, top_p=0, temperature=1.0, seed=5)
    assert g.choices[0].text == greedy(direct, PROMPT)


def test_best_of_with_greedy_sampling(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    """OpenAI accepts best_of with temperature 0; vLLM refuses n > 1 with greedy sampling."""
    g = create(gw, prompt=PROMPT, best_of=3, n=1, temperature=0)
    assert outputs(g) == [(0, greedy(direct, PROMPT), "length")]


def test_best_of_is_emulated(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    sampled: dict[str, Any] = {"prompt": PROMPT, "temperature": 1.0, "seed": 9}
    g = create(gw, best_of=3, n=1, **sampled)
    assert [c.index for c in g.choices] == [0]
    candidates = {c.text for c in create(direct, n=3, **sampled).choices}
    assert g.choices[0].text in candidates
    assert g.choices[0].logprobs is None  # ranking logprobs are not leaked


def test_mirostat_is_rejected_by_the_server_path(vllm_stack: Stack) -> None:
    """vLLM's server has no Mirostat (the engine path has: test_vllm_engine.py)."""
    with vllm_stack.client("server") as gw, pytest.raises(openai.BadRequestError) as caught:
        create(gw, prompt=PROMPT, extra_body={"mirostat_target": 5.0})
    err = caught.value
    assert err.status_code == 400
    assert err.param == "mirostat_target" or "mirostat_target" in err.message


# ---------------------------------------------------------------- context window


def prompt_of(direct: openai.OpenAI, words: int) -> tuple[str, int]:
    """A prompt and its token count (the tiny tokenizer: 6 tokens per "hello world ")."""
    prompt = "hello world " * words
    return prompt, counts(create(direct, prompt=prompt, max_tokens=1).usage)[0]


def test_prompt_longer_than_the_window(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    prompt = "hello world " * 200  # > WINDOW tokens on its own
    with pytest.raises(openai.BadRequestError):
        create(direct, prompt=prompt)
    with pytest.raises(openai.BadRequestError) as caught:
        create(gw, prompt=prompt)
    assert caught.value.code == "context_length_exceeded"


def test_prompt_plus_max_tokens_over_the_window(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    prompt, prompt_tokens = prompt_of(direct, 169)
    room = WINDOW - prompt_tokens
    assert 0 < room < MAX_TOKENS
    # vLLM itself lowers max_tokens silently, and so does the gateway on vLLM's paths unless
    # OpenAI's error is asked for (test_vllm_shape compares the lowered answers).
    assert counts(create(direct, prompt=prompt, max_tokens=MAX_TOKENS).usage)[1] == room
    with pytest.raises(openai.BadRequestError) as caught:
        create(gw, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body=ASK_ERROR)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "prompt"
    total = prompt_tokens + MAX_TOKENS
    assert f"maximum context length is {WINDOW} tokens" in caught.value.message
    assert f"you requested {total} tokens ({prompt_tokens} in your prompt;" in caught.value.message


def test_truncate_alias_lowers_max_tokens(gw: openai.OpenAI, direct: openai.OpenAI) -> None:
    prompt, prompt_tokens = prompt_of(direct, 169)
    room = WINDOW - prompt_tokens
    g = create(gw, model="tiny-trunc", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert g.model == "tiny-trunc"
    assert [(c.index, c.finish_reason) for c in g.choices] == [(0, "length")]
    assert counts(g.usage) == (prompt_tokens, room, WINDOW)
    assert g.choices[0].text == greedy(direct, prompt, max_tokens=room)
