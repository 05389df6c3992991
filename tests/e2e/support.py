"""Shared parts of the scripted-upstream e2e suite: the gateway config, the expected outputs
(computed from the fake model, `tests.upstreams.fakegen`) and raw SSE reading.

One gateway serves every test module (conftest.py). Aliases:

    oa-instruct   openai dialect → scripted OpenAI
    fw-llama      fireworks dialect → scripted Fireworks (/inference/v1)
    generic       openai-compatible dialect → scripted OpenAI
    oa-drop       openai dialect, unsupported_params: drop
    oa-fast       openai dialect, timeout_s 0.5
    oa-trunc / fw-trunc   defaults: {context_length_exceeded_behavior: truncate}
    dead          a provider on a closed port
    fallback      dead first, then OpenAI
    oa-then-fw    fallback: OpenAI first, then Fireworks (scripts make OpenAI fail)
    accounts/e2e/models/slashy   an alias with slashes (served by Fireworks)
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import yaml
from openai import APIStatusError
from openai.types import Completion

from tests.gateway_proc import GatewayProcess
from tests.upstreams.fakegen import WORDS, alternatives, expected_text, token_logprob
from tests.upstreams.procs import FIREWORKS_TEST_KEY, OPENAI_TEST_KEY, ScriptedUpstream, free_port

POLL_DEADLINE_S = 10.0
POLL_INTERVAL_S = 0.05

FULL_KEY = "sk-e2e-full"
LIMITED_KEY = "sk-e2e-limited"

OPENAI_MODEL = "gpt-3.5-turbo-instruct"
FIREWORKS_MODEL = "accounts/fireworks/models/llama-v3p1-8b-instruct"

OA, FW, GENERIC = "oa-instruct", "fw-llama", "generic"
DROP, FAST, DEAD, FALLBACK = "oa-drop", "oa-fast", "dead", "fallback"
OA_THEN_FW = "oa-then-fw"
RETRY, RETRY_THEN_FW = "oa-retry", "oa-retry-then-fw"
OA_TRUNC, FW_TRUNC = "oa-trunc", "fw-trunc"
SLASHY = "accounts/e2e/models/slashy"
DIALECT_ALIASES = (OA, FW, GENERIC)  # the scenario suite runs against each
ALL_ALIASES = (
    *(OA, FW, GENERIC, DROP, FAST, OA_TRUNC, FW_TRUNC, DEAD, FALLBACK, OA_THEN_FW, SLASHY),
    *(RETRY, RETRY_THEN_FW),
)
LIMITED_ALIASES = (OA, DROP)

# provider/model as error messages name a target
TARGET_LABEL = {
    OA: f"oai/{OPENAI_MODEL}",
    FW: f"fw/{FIREWORKS_MODEL}",
    GENERIC: f"generic/{OPENAI_MODEL}",
}
# which scripted upstream serves an alias
UPSTREAM_OF = {OA: "openai", FW: "fireworks", GENERIC: "openai"}

MAX_BODY_BYTES = 64 * 1024
SMALL_TIMEOUT_S = 0.5
QUICK_RETRY = {"attempts": 2, "backoff_s": 0.02, "max_backoff_s": 0.05, "max_wait_s": 1}
CONTEXT_WINDOW = 2048
# A Portkey config: OpenAI, then Fireworks; in the YAML as NAMED_CONFIG, and sent inline.
NAMED_CONFIG = "oa-then-fw-config"
PORTKEY_OA_THEN_FW: dict[str, Any] = {
    "strategy": {"mode": "fallback"},
    "targets": [
        {"virtual_key": "oai", "override_params": {"model": OPENAI_MODEL}},
        {"virtual_key": "fw", "override_params": {"model": FIREWORKS_MODEL}},
    ],
}


def gateway_config(openai_url: str, fireworks_url: str, dead_port: int) -> str:
    """The YAML config of the session's gateway (aliases: see the module docstring)."""
    oai = {"provider": "oai", "model": OPENAI_MODEL}
    fw = {"provider": "fw", "model": FIREWORKS_MODEL}
    dead = {"provider": "deadp", "model": "nowhere"}
    truncate = {"context_length_exceeded_behavior": "truncate"}
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "max_body_bytes": MAX_BODY_BYTES},
        "auth": {
            "keys": [
                {
                    "id": "full",
                    "key": FULL_KEY,
                    "models": ["*"],
                    "providers": ["oai", "fw", "generic"],
                },
                {
                    "id": "limited",
                    "key": LIMITED_KEY,
                    "models": list(LIMITED_ALIASES),
                    "providers": ["fw"],
                },
            ]
        },
        "providers": {
            **scripted_providers(openai_url, fireworks_url, generic=True),
            "deadp": {
                "type": "openai",
                "base_url": f"http://127.0.0.1:{dead_port}/v1",
                "api_key": "unused",
                "connect_timeout_s": 2,
            },
        },
        "models": {
            OA: {"targets": [oai]},
            FW: {"targets": [fw]},
            GENERIC: {"targets": [{"provider": "generic", "model": OPENAI_MODEL}]},
            DROP: {"targets": [oai], "unsupported_params": "drop"},
            FAST: {"targets": [oai], "timeout_s": SMALL_TIMEOUT_S},
            OA_TRUNC: {"targets": [oai], "defaults": truncate},
            FW_TRUNC: {"targets": [fw], "defaults": truncate},
            DEAD: {"targets": [dead]},
            FALLBACK: {"strategy": "fallback", "targets": [dead, oai]},
            OA_THEN_FW: {"strategy": "fallback", "targets": [oai, fw]},
            SLASHY: {"targets": [fw]},
            RETRY: {"targets": [oai], "retry": QUICK_RETRY},
            RETRY_THEN_FW: {"strategy": "fallback", "targets": [oai, fw], "retry": QUICK_RETRY},
        },
        "configs": {NAMED_CONFIG: PORTKEY_OA_THEN_FW},
        # Tests script failures all session long: breakers would carry them from test to test
        # (test_faults has its own gateway for them).
        "circuit_breaker": {"failures": 0},
    }
    assert tuple(config["models"]) == ALL_ALIASES
    return yaml.dump(config, Dumper=_PlainDumper, sort_keys=False)


def scripted_providers(
    openai_url: str, fireworks_url: str, *, generic: bool = False
) -> dict[str, Any]:
    """`oai` and `fw`: the scripted upstreams, and with `generic` the scripted OpenAI as an
    openai-compatible server."""
    providers: dict[str, Any] = {
        "oai": {"type": "openai", "base_url": openai_url, "api_key": OPENAI_TEST_KEY},
        "fw": {"type": "fireworks", "base_url": fireworks_url, "api_key": FIREWORKS_TEST_KEY},
    }
    if generic:
        providers["generic"] = {**providers["oai"], "type": "openai-compatible"}
    return providers


def scripted_gateway(config: Callable[[str, str, int], str], fixture_name: str) -> Any:
    """A module-scoped fixture `fixture_name`: a gateway of a suite's own on the session's
    scripted upstreams, configured by `config(openai_url, fireworks_url, a dead port)`."""

    @pytest.fixture(scope="module", name=fixture_name)
    def gateway(
        scripted_openai_server: ScriptedUpstream,
        scripted_fireworks_server: ScriptedUpstream,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[GatewayProcess]:
        text = config(scripted_openai_server.url, scripted_fireworks_server.url, free_port())
        with GatewayProcess(text, tmp_path_factory.mktemp(fixture_name)) as gw:
            yield gw

    return gateway


class _PlainDumper(yaml.SafeDumper):
    """No &anchors/*aliases for the targets used by several models: a config a person reads."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# ---------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Expected:
    """One choice as OpenAI would return it from the fake model."""

    text: str
    finish_reason: str
    completion_tokens: int


def expect(
    prompt: str,
    candidate: int = 0,
    max_tokens: int = 16,
    stop: str | None = None,
    seed: int | None = None,
) -> Expected:
    """Candidate `candidate` of a text prompt; a stop string is excluded from the text, and the
    token that completed it is still counted (OpenAI bills it)."""
    full = expected_text(prompt, candidate, max_tokens, seed)
    cut = full.find(stop) if stop else -1
    if cut < 0:
        return Expected(full, "length", max_tokens)
    text = full[:cut]
    return Expected(text, "stop", len(text.split()) + 1)


def token_prompt_text(ids: Sequence[int]) -> str:
    """How the fake model reads a token-id prompt."""
    return "".join(f" t{i}" for i in ids)


def prompt_tokens(prompts: Iterable[str]) -> int:
    return sum(len(p.split()) for p in prompts)


def expected_logprobs(text: str, candidate: int, top: int) -> dict[str, Any]:
    """Legacy logprobs of a generated text (non-stream: offsets from 0)."""
    tokens = [" " + w for w in text.split()]
    offsets, top_logprobs, logprobs, pos = [], [], [], 0
    for k, token in enumerate(tokens):
        lp = token_logprob(candidate, k)
        alts = alternatives(WORDS.index(token), lp, top)
        offsets.append(pos)
        pos += len(token)
        logprobs.append(lp)
        top_logprobs.append({token: lp, **{t: v for t, _, v in alts}})
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


# ---------------------------------------------------------------- SDK results


def outputs(resp: Completion) -> list[tuple[int, str, str]]:
    return [(c.index, c.text, c.finish_reason) for c in resp.choices]


def streamed_texts(chunks: Sequence[Completion]) -> dict[int, str]:
    parts: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            parts[choice.index].append(choice.text)
    return {index: "".join(p) for index, p in sorted(parts.items())}


def chunk_finishes(chunks: Sequence[Completion]) -> dict[int, list[str | None]]:
    """Per choice index, the finish_reason of each of its chunks, in order."""
    found: dict[int, list[str | None]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            found[choice.index].append(choice.finish_reason)
    return dict(sorted(found.items()))


# ---------------------------------------------------------------- raw HTTP


def error_body(exc: APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


def auth(key: str = FULL_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class RawStream:
    status: int
    headers: httpx.Headers
    body: bytes

    @property
    def events(self) -> list[bytes]:
        """The raw events; the body must be exactly `data: …\\n\\n` repeated."""
        assert self.body.endswith(b"\n\n"), self.body[-200:]
        return self.body[:-2].split(b"\n\n")

    def data(self) -> list[Any]:
        """Each event's JSON (the final `[DONE]` as the string "[DONE]")."""
        out: list[Any] = []
        for event in self.events:
            assert event.startswith(b"data: ") and b"\n" not in event, event
            payload = event[len(b"data: ") :]
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
        return out


def raw_stream(http: httpx.Client, body: dict[str, Any], key: str = FULL_KEY) -> RawStream:
    """POST to the gateway (`http` has its base_url) and read the whole body."""
    resp = http.post("/v1/completions", json=body, headers=auth(key))
    return RawStream(resp.status_code, resp.headers, resp.content)


def poll_stats(
    upstream: ScriptedUpstream, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The upstream's stats once `done(stats)` holds; fails after POLL_DEADLINE_S. A deadline on
    waiting, not a timing assertion: what is checked is that the event happened at all."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while True:
        stats = upstream.stats()
        if done(stats):
            return stats
        assert time.monotonic() < deadline, f"upstream stats never got there: {stats}"
        time.sleep(POLL_INTERVAL_S)
