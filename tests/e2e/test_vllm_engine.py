"""The in-process engine (`type: vllm`), one parameter at a time: each test asserts the
parameter's effect on the real engine, not just that it is accepted.

Runs on the session's vLLM stack (tests/e2e/vllm_stack.py), pinned to the engine path; the
parity suite (test_vllm_parity.py) runs the shared scenarios through both paths. The tiny model
is random: its texts are gibberish, but the same request gives the same tokens.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types import Completion

from tests.e2e.support import outputs, streamed_texts
from tests.e2e.vllm_stack import METERED_KEY, METERED_TPM, MODEL, Stack
from tests.vllm_proc import MODEL_DIR, require_vllm

require_vllm()

PROMPT = "Once upon a time"
PROMPT_IDS = [1, 342, 336, 269]  # a token-id prompt (BOS first, as text prompts are rendered)
EOS = 2  # "</s>" in the tiny tokenizer
FORCED = 342  # a token a logit_bias of 100 forces at every step
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
BITS = 1 / math.log(2)


@pytest.fixture(scope="module")
def engine(vllm_stack: Stack) -> Iterator[openai.OpenAI]:
    with vllm_stack.client("engine") as client:
        yield client


def create(client: openai.OpenAI, **kw: Any) -> Completion:
    kw.setdefault("model", MODEL)
    kw.setdefault("max_tokens", 12)
    resp: Completion = client.completions.create(**kw)
    return resp


def text(resp: Completion, i: int = 0) -> str:
    return resp.choices[i].text


def completion_tokens(resp: Completion) -> int:
    assert resp.usage is not None
    return resp.usage.completion_tokens


def greedy(client: openai.OpenAI, prompt: Any = PROMPT, max_tokens: int = 12) -> str:
    return text(create(client, prompt=prompt, max_tokens=max_tokens, temperature=0))


def token_logprobs(resp: Completion, i: int = 0) -> list[float]:
    lp = resp.choices[i].logprobs
    assert lp is not None and lp.token_logprobs is not None
    return [v for v in lp.token_logprobs if v is not None]


# ---------------------------------------------------------------- sampling


def test_temperature_zero_is_deterministic_and_sampling_is_not_greedy(
    engine: openai.OpenAI,
) -> None:
    first, second = greedy(engine), greedy(engine)
    assert first == second
    sampled = text(create(engine, prompt=PROMPT, temperature=1.0, seed=3))
    assert sampled != first


def test_same_seed_same_text_other_seed_other_text(engine: openai.OpenAI) -> None:
    a = create(engine, prompt=PROMPT, temperature=1.0, seed=21)
    b = create(engine, prompt=PROMPT, temperature=1.0, seed=21)
    c = create(engine, prompt=PROMPT, temperature=1.0, seed=22)
    assert outputs(a) == outputs(b)
    assert text(a) != text(c)


def test_top_k_one_equals_greedy(engine: openai.OpenAI) -> None:
    sampled = create(engine, prompt=PROMPT, temperature=1.0, seed=5, extra_body={"top_k": 1})
    assert text(sampled) == greedy(engine)


def test_top_k_keeps_every_token_in_the_top_k(engine: openai.OpenAI) -> None:
    """With logprobs=2 each position lists the sampled token and the top 2: three entries when
    the sampled token is not one of the top 2, which top_k=2 never allows."""
    kw: dict[str, Any] = {
        "prompt": PROMPT,
        "temperature": 1.5,
        "seed": 8,
        "max_tokens": 40,
        "logprobs": 2,
    }
    limited = create(engine, **kw, extra_body={"top_k": 2})
    free = create(engine, **kw)
    assert max(listed(limited)) <= 2
    assert max(listed(free)) == 3  # without top_k the same sampling leaves the top 2


def listed(resp: Completion) -> list[int]:
    """Entries per position in top_logprobs (tokens that decode alike share one entry)."""
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    return [len(top or {}) for top in lp.top_logprobs]


def test_top_p_tiny_and_min_p_one_are_greedy(engine: openai.OpenAI) -> None:
    expected = greedy(engine)
    assert text(create(engine, prompt=PROMPT, temperature=1.0, seed=4, top_p=0)) == expected
    assert text(create(engine, prompt=PROMPT, temperature=1.0, seed=4, top_p=1e-6)) == expected
    min_p = create(engine, prompt=PROMPT, temperature=1.0, seed=4, extra_body={"min_p": 1.0})
    assert text(min_p) == expected


@pytest.mark.parametrize(
    "penalty",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ],
    ids=["frequency", "presence", "repetition"],
)
def test_penalties_reduce_repetition(engine: openai.OpenAI, penalty: dict[str, Any]) -> None:
    """Greedy text here repeats one token ("erer…"); each penalty spreads it over more tokens."""
    kw: dict[str, Any] = {"prompt": PROMPT, "temperature": 0, "max_tokens": 24, "logprobs": 0}
    plain, penalized = create(engine, **kw), create(engine, **kw, **penalty)
    assert distinct_tokens(penalized) > distinct_tokens(plain)


def distinct_tokens(resp: Completion) -> int:
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None
    return len(set(lp.tokens))


# ---------------------------------------------------------------- length, stop, bias


def test_logit_bias_forces_a_token(engine: openai.OpenAI) -> None:
    resp = create(
        engine,
        prompt=PROMPT,
        temperature=1.0,
        seed=1,
        max_tokens=5,
        logprobs=0,
        logit_bias={str(FORCED): 100},
    )
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None
    assert len(set(lp.tokens)) == 1 and len(lp.tokens) == 5


def test_ignore_eos_generates_up_to_max_tokens(engine: openai.OpenAI) -> None:
    eos_always = {"logit_bias": {str(EOS): 100}, "temperature": 0, "max_tokens": 9}
    stops = create(engine, prompt=PROMPT, **eos_always)
    assert outputs(stops) == [(0, "", "stop")] and completion_tokens(stops) == 1
    ignored = create(engine, prompt=PROMPT, extra_body={"ignore_eos": True}, **eos_always)
    assert ignored.choices[0].finish_reason == "length"
    assert completion_tokens(ignored) == 9


def test_max_tokens_bounds_the_completion(engine: openai.OpenAI) -> None:
    for n in (1, 7):
        resp = create(engine, prompt=PROMPT, max_tokens=n, temperature=0)
        assert completion_tokens(resp) == n and resp.choices[0].finish_reason == "length"


def test_stop_string_cuts_the_text(engine: openai.OpenAI) -> None:
    full = greedy(engine, max_tokens=16)
    assert "~" in full
    resp = create(engine, prompt=PROMPT, max_tokens=16, temperature=0, stop="~")
    assert outputs(resp) == [(0, full[: full.index("~")], "stop")]


# ---------------------------------------------------------------- n, best_of, prompts


def test_n_sampled_choices_differ(engine: openai.OpenAI) -> None:
    resp = create(engine, prompt=PROMPT, n=3, temperature=1.0, seed=2)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert len({c.text for c in resp.choices}) == 3


def test_greedy_n_repeats_the_one_answer_and_counts_each(engine: openai.OpenAI) -> None:
    """vLLM refuses n > 1 with temperature 0; OpenAI gives n identical choices."""
    one = create(engine, prompt=PROMPT, temperature=0, max_tokens=6)
    three = create(engine, prompt=PROMPT, temperature=0, max_tokens=6, n=3)
    assert outputs(three) == [(i, text(one), "length") for i in range(3)]
    assert completion_tokens(three) == 3 * completion_tokens(one)


def test_best_of_returns_the_highest_mean_logprob(engine: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"prompt": PROMPT, "temperature": 1.0, "seed": 9, "max_tokens": 8}
    candidates = create(engine, n=4, logprobs=0, **kw)
    ranked = sorted(
        candidates.choices,
        key=lambda c: sum(token_logprobs(candidates, c.index)) / 8,
        reverse=True,
    )
    best = create(engine, n=2, best_of=4, **kw)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)  # ranking logprobs not shown
    assert completion_tokens(best) == 4 * 8  # every candidate was generated


def test_token_id_prompt_equals_its_text(engine: openai.OpenAI) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(MODEL_DIR))(PROMPT)["input_ids"]
    assert ids[0] == 1  # BOS, as the engine renders a text prompt
    by_ids = create(engine, prompt=ids, temperature=0, echo=True)
    by_text = create(engine, prompt=PROMPT, temperature=0)
    assert by_ids.usage is not None and by_text.usage is not None
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(ids)
    # echo of a token-id prompt shows its detokenized text, special tokens included
    assert text(by_ids) == "<s>" + PROMPT + text(by_text)


def test_batch_of_prompts_is_prompt_major(engine: openai.OpenAI) -> None:
    a, b = greedy(engine, PROMPT), greedy(engine, "The weather today is")
    resp = create(engine, prompt=[PROMPT, "The weather today is"], temperature=0, n=2)
    assert outputs(resp) == [(0, a, "length"), (1, a, "length"), (2, b, "length"), (3, b, "length")]


def test_suffix_is_refused_by_name(engine: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        create(engine, prompt=PROMPT, suffix="end")
    assert caught.value.param == "suffix"


# ---------------------------------------------------------------- logprobs and echo


def test_logprobs_agree_with_echoed_prompt_logprobs(engine: openai.OpenAI) -> None:
    """The logprobs of generated tokens equal those the engine gives the same tokens when they
    are part of an echoed prompt (a forced token, so its id is known)."""
    bias = {str(FORCED): 100}
    gen = create(
        engine, prompt=PROMPT_IDS, max_tokens=4, temperature=0, logprobs=1, logit_bias=bias
    )
    echoed = create(
        engine, prompt=[*PROMPT_IDS, *[FORCED] * 4], max_tokens=0, echo=True, logprobs=1
    )
    tail = echoed.choices[0].logprobs
    assert tail is not None and tail.token_logprobs is not None and tail.tokens is not None
    assert tail.token_logprobs[0] is None  # nothing precedes the first prompt token
    assert tail.token_logprobs[-4:] == pytest.approx(token_logprobs(gen), abs=1e-4)
    assert tail.tokens[-4:] == (gen.choices[0].logprobs.tokens if gen.choices[0].logprobs else [])


def test_echo_with_max_tokens_zero_returns_the_prompt(engine: openai.OpenAI) -> None:
    resp = create(engine, prompt=PROMPT, max_tokens=0, echo=True)
    assert text(resp) == PROMPT
    assert resp.choices[0].finish_reason == "length"


def test_echo_prepends_the_prompt(engine: openai.OpenAI) -> None:
    resp = create(engine, prompt=PROMPT, max_tokens=5, echo=True, temperature=0)
    assert text(resp) == PROMPT + greedy(engine, max_tokens=5)


# ---------------------------------------------------------------- structured outputs


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "ab", "schema": SCHEMA}},
        {"type": "json_object", "schema": SCHEMA},  # Fireworks' spelling
    ],
    ids=["json_schema", "json_object+schema"],
)
def test_json_output_validates_against_the_schema(
    engine: openai.OpenAI, response_format: dict[str, Any]
) -> None:
    for seed in (1, 2):
        resp = create(
            engine,
            prompt="JSON:",
            max_tokens=300,
            seed=seed,
            temperature=1.0,
            extra_body={"response_format": response_format},
        )
        assert resp.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(text(resp)), SCHEMA)


def test_json_object_output_parses(engine: openai.OpenAI) -> None:
    resp = create(
        engine,
        prompt="JSON:",
        max_tokens=300,
        seed=2,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert resp.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(text(resp)), dict)
    free = create(engine, prompt="JSON:", max_tokens=40, seed=2)
    with pytest.raises(ValueError):
        json.loads(text(free))


# ---------------------------------------------------------------- Mirostat


def mean_surprise_bits(resp: Completion) -> float:
    values = [-v * BITS for c in resp.choices for v in token_logprobs(resp, c.index)]
    return sum(values) / len(values)


def test_mirostat_moves_the_surprise_toward_its_target(engine: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "prompt": PROMPT,
        "n": 4,
        "max_tokens": 96,
        "temperature": 1.0,
        "seed": 13,
        "logprobs": 0,
    }
    free = mean_surprise_bits(create(engine, **kw, extra_body={"ignore_eos": True}))
    for target in (2.0, 5.0):
        extra = {"ignore_eos": True, "mirostat_target": target, "mirostat_lr": 0.2}
        steered = mean_surprise_bits(create(engine, **kw, extra_body=extra))
        assert abs(steered - target) < abs(free - target) - 0.5, (target, steered, free)


def test_mirostat_bad_values_are_400s_naming_them(engine: openai.OpenAI) -> None:
    for extra, param in (
        ({"mirostat_target": 0}, "mirostat_target"),
        ({"mirostat_target": 5, "mirostat_lr": -1}, "mirostat_lr"),
        ({"mirostat_lr": 0.1}, "mirostat_lr"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            create(engine, prompt=PROMPT, extra_body=extra)
        assert caught.value.param == param


def test_vllm_xargs_reach_the_logits_processors(engine: openai.OpenAI) -> None:
    """vllm_xargs go to SamplingParams.extra_args, as vLLM's server sends them: the engine's
    Mirostat processor reads its settings there, so the two spellings give the same tokens."""
    kw: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 24, "temperature": 1.0, "seed": 5}
    fields = create(engine, **kw, extra_body={"mirostat_target": 2.0, "mirostat_lr": 0.3})
    xargs = create(engine, **kw, extra_body={"vllm_xargs": {"mirostat_target": 2.0,
                                                             "mirostat_lr": 0.3}})  # fmt: skip
    plain = create(engine, **kw)
    assert xargs.choices[0].text == fields.choices[0].text != plain.choices[0].text


@pytest.mark.parametrize(
    ("kw", "param", "says"),
    [
        ({"prompt": [5, 100_000]}, "prompt", "Token id 100000 is out of vocabulary"),
        ({"prompt": [[5], [6, 394]]}, "prompt", "Token id 394 is out of vocabulary"),
        ({"prompt": ""}, "prompt", "must be provided and non-empty"),
        ({"prompt": "a", "extra_body": {"prompt_embeds": "AAAA"}}, "prompt_embeds",
         "not supported"),
        ({"prompt": "a", "logprobs": 21}, "logprobs", "greater than max allowed: 20"),
        ({"prompt": "a", "logprobs": -1}, "logprobs", "greater than max allowed: 20"),
    ],
)  # fmt: skip
def test_prompts_and_logprobs_the_engine_refuses(
    engine: openai.OpenAI, kw: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        create(engine, **kw)
    assert caught.value.param == param
    assert says in caught.value.message


def test_logprobs_above_openais_five_up_to_max_logprobs(engine: openai.OpenAI) -> None:
    resp = create(engine, prompt=PROMPT, max_tokens=3, logprobs=20, temperature=0)
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    # keyed by decoded text, as vLLM renders them: tokens that decode alike share an entry
    assert all(5 < len(top) <= 20 for top in lp.top_logprobs if top is not None)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"allowed_token_ids": [1, 100_000]}, "allowed_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"min_tokens": 20, "max_tokens": 8}, "min_tokens"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),  # above the engine's max_logprobs
    ],
)
def test_vllm_extras_refused_by_the_engine_name_the_field(
    engine: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        create(engine, prompt=PROMPT, extra_body=extra)
    assert caught.value.param == param


def test_embeddings_on_a_generating_engine_are_refused(engine: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        engine.embeddings.create(model="tiny-embed", input="hi")
    assert caught.value.param == "model"
    assert "does not serve embeddings" in caught.value.message


async def test_requests_without_mirostat_are_untouched(vllm_stack: Stack) -> None:
    """A Mirostat request batched with a plain one does not change the plain one's tokens."""
    kw: dict[str, Any] = {
        "model": MODEL,
        "prompt": PROMPT,
        "temperature": 1.0,
        "seed": 31,
        "max_tokens": 24,
    }
    async with vllm_stack.async_client("engine") as client:
        alone = await client.completions.create(**kw)
        steered = {"mirostat_target": 1.0, "ignore_eos": True}
        mixed, other = await asyncio.gather(
            client.completions.create(**kw),
            client.completions.create(**{**kw, "max_tokens": 64}, extra_body=steered),
        )
    assert outputs(mixed) == outputs(alone)
    assert other.choices[0].text[:8] != alone.choices[0].text[:8]


# ---------------------------------------------------------------- streaming, concurrency


def test_stream_greedy_n_repeats_every_delta(engine: openai.OpenAI) -> None:
    with engine.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    expected = greedy(engine, max_tokens=6)
    assert streamed_texts([c for c in chunks if c.choices]) == {0: expected, 1: expected}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_stream_echo_and_logprobs(engine: openai.OpenAI) -> None:
    with engine.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1, stream=True
    ) as stream:
        chunks = list(stream)
    full = create(engine, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1)
    assert streamed_texts(chunks) == {0: text(full)}
    offsets = [
        o
        for c in chunks
        for ch in c.choices
        if ch.logprobs
        for o in (ch.logprobs.text_offset or [])
    ]
    assert full.choices[0].logprobs is not None
    assert offsets == full.choices[0].logprobs.text_offset


async def test_concurrent_requests_match_sequential_ones(vllm_stack: Stack) -> None:
    seeds = range(40, 48)
    kw: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0}
    async with vllm_stack.async_client("engine") as client:
        together = await asyncio.gather(*(client.completions.create(seed=s, **kw) for s in seeds))
        one_by_one = [await client.completions.create(seed=s, **kw) for s in seeds]
    assert [outputs(r) for r in together] == [outputs(r) for r in one_by_one]
    assert len({r.choices[0].text for r in together}) > 1


def test_engine_is_ready_and_named_in_errors(vllm_stack: Stack) -> None:
    resp = httpx.get(vllm_stack.gateway.url + "/readyz", timeout=5.0)
    assert resp.status_code == 200
    with vllm_stack.client("engine") as client, pytest.raises(openai.BadRequestError) as caught:
        create(client, prompt=PROMPT, extra_body={"no_such_field": 1})
    assert caught.value.param == "no_such_field"
    assert "engine/" in caught.value.message


# ---------------------------------------------------------------- rate limits


def test_token_reservation_uses_the_engines_tokenizer(vllm_stack: Stack) -> None:
    """The engine's prompts are counted exactly at admission (the serving tokenizer), and the
    reservation is settled to the usage once the request ends."""
    url = vllm_stack.gateway.url + "/v1/completions"
    headers = {"Authorization": f"Bearer {METERED_KEY}", "x-portkey-virtual-key": "engine"}
    body = {"model": MODEL, "prompt": "The quick brown fox jumps", "max_tokens": 7}
    first = httpx.post(url, json={**body, "ignore_eos": True}, headers=headers, timeout=60)
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    reserved = usage["prompt_tokens"] + 7
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == METERED_TPM - reserved
    second = httpx.post(url, json={**body, "max_tokens": 3}, headers=headers, timeout=60)
    # the first was settled to its usage (here equal to its reservation: ignore_eos)
    used = usage["total_tokens"] + usage["prompt_tokens"] + 3
    remaining = int(second.headers["x-ratelimit-remaining-tokens"])
    assert METERED_TPM - used <= remaining <= METERED_TPM - used + 1700  # a second's refill
