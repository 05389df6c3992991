"""vLLM's shape on both of the gateway's vLLM paths: whole answers compared with vLLM's own
server's, keys and values (ids, times and the fingerprint's hash aside), JSON and streams, plain
and with each vLLM extra; vLLM's wording for its own inputs' errors; and OpenAI's strict shape
when a provider asks for it (`answer_shape: openai`).

Streams are compared chunk by chunk in form (each chunk's fields, with the text, token ids,
logprobs and running usage it carries blanked), runs of alike chunks taken as one, since how
tokens group into chunks depends on timing; the texts, the last chunks and the usage exactly.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from core.checks import INT64_MAX, INT64_MIN
from tests.e2e.vllm_stack import ASK_ERROR, MODEL, PATHS, VIRTUAL_KEY, WINDOW, Stack
from tests.vllm_proc import require_vllm

require_vllm()

PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]
COMPLETION, CHAT = "/completions", "/chat/completions"
BODIES: dict[str, dict[str, Any]] = {
    COMPLETION: {"model": MODEL, "prompt": PROMPT},
    CHAT: {"model": MODEL, "messages": MESSAGES},
}
FINGERPRINT = re.compile(r"vllm-\d+\.\d+\.\d+[^-]*(-[a-z]+\d*)*-[0-9a-f]{8}")
# Fields whose values are the server's own: which request, when.
MASKED = {"id": "<id>", "created": "<created>"}

COMPLETIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "logprobs": {"logprobs": 2},
    "echo-logprobs": {"echo": True, "logprobs": 1},
    "return_token_ids": {"return_token_ids": True},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "stop-string": {"stop": ["er"]},
    "stop_token_ids": {"stop_token_ids": [263]},
    "include_stop_str_in_output": {"stop": ["er"], "include_stop_str_in_output": True},
    "n2-seeded": {"n": 2, "temperature": 1.0, "seed": 7},
    "min_tokens": {"min_tokens": 3, "ignore_eos": True},
    "samplers": {
        "temperature": 1.0,
        "seed": 3,
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.3,
    },
    "special_tokens": {
        "logit_bias": {"1": 100},
        "skip_special_tokens": False,
        "spaces_between_special_tokens": True,
    },
    "allowed_token_ids": {"allowed_token_ids": [50]},
    "bad_words": {"bad_words": ["er"]},
    "structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}},
    "truncate_prompt_tokens": {"truncate_prompt_tokens": 3, "add_special_tokens": False},
    "tokens_as_ids": {"logprobs": 1, "return_tokens_as_token_ids": True},
    "logprob_token_ids": {"logprobs": 1, "logprob_token_ids": [50, 2]},
    "priority-xargs": {"priority": 1, "vllm_xargs": {"unused": 1}},
    "beam_search": {"use_beam_search": True, "n": 2, "length_penalty": 0.5},
    "an-empty-prompt-in-a-list": {"prompt": ["a", ""]},  # served: "" is the tokenizer's BOS
}
CHATS: dict[str, dict[str, Any]] = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "return_token_ids": {"return_token_ids": True},
    "stop-string": {"stop": ["a"]},
    "n2-seeded": {"n": 2, "temperature": 1.0, "seed": 7},
    "samplers": {"temperature": 1.0, "seed": 3, "top_k": 5, "min_p": 0.1},
    "structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}},
    "echo": {
        "echo": True,
        "messages": [*MESSAGES, {"role": "assistant", "content": "Once"}],
        "add_generation_prompt": False,
    },
    # Roles of a chat template's own (Llama 3.1's `ipython`, GLM's `observation`): vLLM hands
    # them to the template.
    "custom-roles": {
        "messages": [
            *MESSAGES,
            {"role": "ipython", "content": "42"},
            {"role": "observation", "content": [{"type": "text", "text": "sunny"}]},
        ]
    },
    "seed-int64-max": {"temperature": 1.0, "seed": INT64_MAX},
    "seed-int64-min": {"temperature": 1.0, "seed": INT64_MIN},
}
STREAMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "include_usage": {"stream_options": {"include_usage": True}},
    "continuous_usage": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    "return_token_ids": {"return_token_ids": True},
    "logprobs": {"logprobs": 1},
    "n2-seeded": {"n": 2, "temperature": 1.0, "seed": 7},
}
CHAT_STREAMS: dict[str, dict[str, Any]] = {
    **{k: v for k, v in STREAMS.items() if k != "logprobs"},
    "logprobs": {"logprobs": True, "top_logprobs": 1},
}


def cases(
    completions: dict[str, dict[str, Any]], chats: dict[str, dict[str, Any]]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Test id → (endpoint, the request's extra fields)."""
    out = {f"completions-{k}": (COMPLETION, v) for k, v in completions.items()}
    return out | {f"chat-{k}": (CHAT, v) for k, v in chats.items()}


@pytest.fixture(scope="module", params=PATHS)
def path(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120.0, trust_env=False) as client:
        yield client


def post(http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    resp = http.post(url, json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def both(
    http: httpx.Client, stack: Stack, path: str, endpoint: str, body: dict[str, Any]
) -> tuple[Any, Any]:
    """The gateway's answer on `path` and vLLM's server's, to the same request."""
    ours = post(http, f"{stack.gateway.url}/v1{endpoint}", body, stack.headers(path))
    theirs = post(http, f"{stack.server.url}{endpoint}", body, {})
    return ours, theirs


def masked(answer: dict[str, Any], path: str, theirs: dict[str, Any]) -> dict[str, Any]:
    """The answer without its own ids and times; the engine's fingerprint (a hash of its own
    configuration) checked for vLLM's form, then taken as the server's."""
    out = {**answer, **{k: v for k, v in MASKED.items() if k in answer}}
    if "system_fingerprint" in answer and path == "engine":
        fingerprint = answer["system_fingerprint"]
        assert fingerprint is None or FINGERPRINT.fullmatch(fingerprint), fingerprint
        out["system_fingerprint"] = theirs.get("system_fingerprint")
    return out


def same(ours: dict[str, Any], theirs: dict[str, Any], path: str) -> None:
    assert masked(ours, path, theirs) == masked(theirs, "server", theirs)


# ---------------------------------------------------------------- whole answers


WHOLE = cases(COMPLETIONS, CHATS)


@pytest.mark.parametrize(("endpoint", "extra"), WHOLE.values(), ids=WHOLE.keys())
def test_a_whole_answer_is_vllms(
    http: httpx.Client, vllm_stack: Stack, path: str, endpoint: str, extra: Any
) -> None:
    body = {**BODIES[endpoint], "max_tokens": 6, "temperature": 0, **extra}
    ours, theirs = both(http, vllm_stack, path, endpoint, body)
    same(ours, theirs, path)


# ---------------------------------------------------------------- streams


def events(http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """A stream's chunks, parsed; it must end with [DONE]."""
    with http.stream("POST", url, json=body, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        data = [line[5:].strip() for line in resp.iter_lines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    return [orjson.loads(d) for d in data[:-1]]


def form(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk's fields with what depends on how tokens were grouped blanked."""
    out = {**chunk, **{k: v for k, v in MASKED.items() if k in chunk}}
    out["choices"] = [_blank(c) for c in chunk["choices"]]
    if chunk["choices"] and isinstance(chunk.get("usage"), dict):
        out["usage"] = "<running usage>"
    return out


def _blank(choice: dict[str, Any]) -> dict[str, Any]:
    out = dict(choice)
    if "text" in out:  # empty too: a prefill's, or a token's whose text waits for the next
        out["text"] = "<text>"
    for key in ("token_ids", "logprobs"):
        if out.get(key) is not None:
            out[key] = f"<{key}>"
    delta = out.get("delta")
    if isinstance(delta, dict) and set(delta) <= {"content"}:
        # Text, or none yet (a token whose text waits for the next one's): how tokens group.
        out["delta"] = "<content>"
    return out


def forms(chunks: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each choice's chunks in form (choice -1: those of no choice, the usage), runs of alike
    ones as one. (vLLM writes one choice a chunk; the choices' chunks interleave as the engine
    made them.)"""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for chunk in chunks:
        shaped = form(chunk)
        mine = out[chunk["choices"][0]["index"] if chunk["choices"] else -1]
        if not mine or mine[-1] != shaped:
            mine.append(shaped)
    return dict(out)


def texts(chunks: list[dict[str, Any]]) -> dict[int, str]:
    parts: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = choice["text"] if "text" in choice else choice["delta"].get("content")
            parts[choice["index"]].append(piece or "")
    return {i: "".join(p) for i, p in parts.items()}


def same_streams(
    http: httpx.Client, stack: Stack, path: str, endpoint: str, body: dict[str, Any]
) -> None:
    ours = events(http, f"{stack.gateway.url}/v1{endpoint}", body, stack.headers(path))
    theirs = events(http, f"{stack.server.url}{endpoint}", body, {})
    assert texts(ours) == texts(theirs)
    fingerprints = {c["system_fingerprint"] for c in ours if "system_fingerprint" in c}
    if path == "engine":  # the engine's own (its configuration's hash): vLLM's form
        assert all(FINGERPRINT.fullmatch(f) for f in fingerprints), fingerprints
        theirs_fp = {c.get("system_fingerprint") for c in theirs} - {None}
        ours = [{**c, "system_fingerprint": next(iter(theirs_fp))} if "system_fingerprint" in c
                else c for c in ours]  # fmt: skip
    mine, vllms = forms(ours), forms(theirs)
    assert mine == vllms, orjson.dumps(
        {"ours": list(mine.items()), "vllm": list(vllms.items())}
    ).decode()
    if body.get("stream_options", {}).get("include_usage"):
        assert ours[-1]["usage"] == theirs[-1]["usage"]


STREAMED = cases(STREAMS, CHAT_STREAMS)


@pytest.mark.parametrize(("endpoint", "extra"), STREAMED.values(), ids=STREAMED.keys())
def test_a_stream_is_vllms(
    http: httpx.Client, vllm_stack: Stack, path: str, endpoint: str, extra: Any
) -> None:
    body = {**BODIES[endpoint], "max_tokens": 6, "temperature": 0, "stream": True, **extra}
    same_streams(http, vllm_stack, path, endpoint, body)


# ---------------------------------------------------------------- vLLM's own inputs


@pytest.mark.parametrize(
    "body",
    [{"prompt_embeds": []}, {"prompt": ""}, {"prompt": "", "prompt_embeds": []}],
    ids=["empty-prompt_embeds", "empty-prompt", "both-empty"],
)
def test_vllm_inputs_get_vllms_wording(
    http: httpx.Client, vllm_stack: Stack, path: str, body: dict[str, Any]
) -> None:
    body = {"model": MODEL, "max_tokens": 2, **body}
    ours = http.post(
        f"{vllm_stack.gateway.url}/v1/completions", json=body, headers=vllm_stack.headers(path)
    )
    theirs = http.post(f"{vllm_stack.server.url}/completions", json=body)
    assert (ours.status_code, theirs.status_code) == (400, 400)
    mine, vllms = ours.json()["error"], theirs.json()["error"]
    assert mine["param"] == vllms["param"] == "prompt"
    assert mine["message"] in vllms["message"]  # vLLM's adds " (parameter=prompt)"
    assert mine["message"] == "Either prompt or prompt_embeds must be provided and non-empty."


# ---------------------------------------------------------------- OpenAI's strict shape


def test_a_provider_may_answer_in_openais_shape(http: httpx.Client, vllm_stack: Stack) -> None:
    """`answer_shape: openai` on a vLLM path: no field that is not set, the fingerprint kept."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    headers = {**vllm_stack.headers("server"), VIRTUAL_KEY: "server-openai"}
    answer = post(http, f"{vllm_stack.gateway.url}/v1/completions", body, headers)
    assert set(answer) == {
        "id", "object", "created", "model", "choices", "usage", "system_fingerprint",
    }  # fmt: skip
    assert set(answer["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}
    assert set(answer["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    chunks = events(http, f"{vllm_stack.gateway.url}/v1/completions", {**body, "stream": True},
                    headers)  # fmt: skip
    assert all(set(c["choices"][0]) <= {"text", "index", "logprobs", "finish_reason"}
               for c in chunks if c["choices"])  # fmt: skip


# ---------------------------------------------------------------- vLLM's chat tests' differences
# What vLLM's own chat tests (and its users) met where the gateway answered otherwise than
# `vllm serve`: each compared here with vLLM's server on the same model, on both paths.

BOTH = [COMPLETION, CHAT]


def refusals(
    http: httpx.Client, stack: Stack, path: str, endpoint: str, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway's 400 on `path` and vLLM's server's, to the same request: their errors."""
    ours = http.post(f"{stack.gateway.url}/v1{endpoint}", json=body, headers=stack.headers(path))
    theirs = http.post(f"{stack.server.url}{endpoint}", json=body)
    assert (ours.status_code, theirs.status_code) == (400, 400), (ours.text, theirs.text)
    mine: dict[str, Any] = ours.json()["error"]
    vllms: dict[str, Any] = theirs.json()["error"]
    return mine, vllms


@pytest.mark.parametrize("endpoint", BOTH)
@pytest.mark.parametrize(
    ("seed", "kind"),
    [(INT64_MIN - 1, "greater_than_equal"), (INT64_MAX + 1, "less_than_equal"), (2**70, "")],
    ids=["below-int64", "above-int64", "above-uint64"],
)
def test_an_out_of_range_seed_is_an_integer_refused_in_vllms_words(
    http: httpx.Client, vllm_stack: Stack, path: str, endpoint: str, seed: int, kind: str
) -> None:
    """An integer beyond int64 stays an integer (not a float, as a JSON parser into doubles
    reads it), and the 400 names `seed`, with vLLM's check and bound."""
    body = {**BODIES[endpoint], "max_tokens": 2, "seed": seed}
    mine, vllms = refusals(http, vllm_stack, path, endpoint, body)
    assert (mine["param"], vllms["param"]) == ("seed", "body.seed")
    kind = kind or "less_than_equal"
    bound = INT64_MIN if seed < 0 else INT64_MAX
    words = re.search(r"'msg': '([^']*)'", vllms["message"])
    assert words is not None and str(bound) in words[1], vllms["message"]
    assert kind in vllms["message"] and f"'input': '{seed}'" in vllms["message"]
    assert mine["message"] == (f"Invalid value for 'seed' ({kind}): {words[1]}, got {seed}.")


@pytest.mark.parametrize("endpoint", BOTH)
def test_every_bad_logit_bias_key_is_named(
    http: httpx.Client, vllm_stack: Stack, path: str, endpoint: str
) -> None:
    body = {**BODIES[endpoint], "max_tokens": 2, "logit_bias": {"a": 1, "1": 2, "b c": 3}}
    mine, vllms = refusals(http, vllm_stack, path, endpoint, body)
    assert mine["param"] == vllms["param"] == "logit_bias"
    assert "['a', 'b c']" in vllms["message"]
    assert mine["message"].endswith('2 are not: "a", "b c".'), mine["message"]


def long_body(http: httpx.Client, stack: Stack, endpoint: str) -> tuple[dict[str, Any], int]:
    """A request whose prompt leaves a little room in the window, and the room it leaves (vLLM's
    server's own count of the prompt, rendered for chat)."""
    text = "hello world " * 160
    body = {**BODIES[endpoint], "temperature": 0, "ignore_eos": True}
    if endpoint == CHAT:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    probe = post(http, f"{stack.server.url}{endpoint}", {**body, "max_tokens": 1}, {})
    room = WINDOW - probe["usage"]["prompt_tokens"]
    assert 0 < room < 100
    return body, room


BOUNDS = [(COMPLETION, "max_tokens"), (CHAT, "max_tokens"), (CHAT, "max_completion_tokens")]


@pytest.mark.parametrize(("endpoint", "bound"), BOUNDS)
def test_a_bound_past_the_room_left_is_lowered_as_vllm_lowers_it(
    http: httpx.Client, vllm_stack: Stack, path: str, endpoint: str, bound: str
) -> None:
    """Unasked, vLLM's paths serve as vLLM does: the bound lowered to the room the prompt
    leaves. OpenAI's error when it is asked for; a bound past the whole window refused as vLLM
    refuses it."""
    body, room = long_body(http, vllm_stack, endpoint)
    lowered = {**body, bound: room + 50}
    ours, theirs = both(http, vllm_stack, path, endpoint, lowered)
    same(ours, theirs, path)
    assert ours["usage"]["completion_tokens"] == room
    mine = http.post(
        f"{vllm_stack.gateway.url}/v1{endpoint}",
        json={**lowered, **ASK_ERROR},
        headers=vllm_stack.headers(path),
    )
    assert mine.status_code == 400 and mine.json()["error"]["code"] == "context_length_exceeded"
    mine_err, vllms = refusals(http, vllm_stack, path, endpoint, {**body, bound: WINDOW + 1})
    assert mine_err["param"] == vllms["param"] == bound
    words = f"{bound}={WINDOW + 1} cannot be greater than max_model_len={WINDOW}"
    assert words in vllms["message"] and words in mine_err["message"]


@pytest.mark.parametrize("endpoint", BOTH)
def test_an_unknown_field_is_ignored_by_vllm_and_refused_by_the_engine(
    http: httpx.Client, vllm_stack: Stack, path: str, endpoint: str
) -> None:
    """vLLM's server logs and ignores a field it does not know (so does the vllm-server path,
    which hands it on). The engine refuses it: an ignored field is a changed request. Its 400
    says which vLLM's fields it knows, and how to hand a field to a logits processor, which
    then serves as vLLM's server serves it."""
    body = {**BODIES[endpoint], "max_tokens": 4, "temperature": 0}
    _, plain = both(http, vllm_stack, path, endpoint, body)
    unknown = {**body, "min_characters": 5}
    url, headers = f"{vllm_stack.gateway.url}/v1{endpoint}", vllm_stack.headers(path)
    theirs = post(http, f"{vllm_stack.server.url}{endpoint}", unknown, {})
    same(theirs, plain, "server")  # ignored by vLLM
    if path == "server":
        same(post(http, url, unknown, headers), theirs, path)
    else:
        refused = http.post(url, json=unknown, headers=headers)
        assert refused.status_code == 400
        err = refused.json()["error"]
        assert (err["param"], err["code"]) == ("min_characters", "unsupported_parameter")
        assert f"vLLM {vllm_version()}'s extras" in err["message"]
        assert '{"vllm_xargs": {"name": value}}' in err["message"]
    xargs = {**body, "vllm_xargs": {"min_characters": 5}}
    ours, theirs = both(http, vllm_stack, path, endpoint, xargs)
    same(ours, theirs, path)


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)
