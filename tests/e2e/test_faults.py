"""Faults injected by the scripted upstreams, seen through the openai SDK: 500s, 429 with
retry-after, a slow first byte, a refused and a reset connection, a stream cut in the middle,
circuit breakers; and the SDK's own retries against the gateway's answers (it retries 408,
409, 429 and 5xx unless `x-should-retry` says otherwise).

The module has a gateway of its own, with breakers on. Every test uses aliases of its own, on
upstream model ids of their own, so one test's failures never open another test's circuit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.metrics_text import scrape
from tests.e2e.support import (
    FIREWORKS_MODEL,
    FULL_KEY,
    auth,
    error_body,
    raw_stream,
    scripted_gateway,
    scripted_providers,
)
from tests.gateway_proc import GatewayProcess
from tests.upstreams.fakegen import expected_text
from tests.upstreams.procs import ScriptedUpstream

PROMPT = "Say this is a test"
QUICK = {"attempts": 1, "backoff_s": 0.02, "max_backoff_s": 0.05, "max_wait_s": 2}
FIRST_BYTE_S = 0.4
COOLDOWN_S = 1.0
FW = {"provider": "fw", "model": FIREWORKS_MODEL}
SDK_CASES = ("503", "500", "408", "429", "429-no-retry", "400", "400-retry")


def oai(model: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "oai", "model": model, **extra}


def aliases() -> dict[str, Any]:
    slow = oai("m-slow", timeout={"first_byte_s": FIRST_BYTE_S})
    return {
        "t500": {"strategy": "fallback", "retry": QUICK, "targets": [oai("m-500"), FW]},
        "t429": {"retry": {**QUICK, "attempts": 2}, "targets": [oai("m-429")]},
        "tslow": {"strategy": "fallback", "targets": [slow, FW]},
        "trefused": {"strategy": "fallback", "targets": [{"provider": "deadp"}, oai("m-ref")]},
        "treset": {"retry": QUICK, "targets": [oai("m-reset")]},
        "treset-once": {"targets": [oai("m-reset-once")]},
        "tcut": {"strategy": "fallback", "targets": [oai("m-cut"), FW]},
        "tcb": {"strategy": "fallback", "targets": [oai("m-cb"), FW]},
        "tprobe": {"targets": [oai("m-probe")]},
        **{f"sdk-{case}": {"targets": [oai(f"m-sdk-{case}")]} for case in SDK_CASES},
    }


def config(openai_url: str, fireworks_url: str, dead_port: int) -> str:
    return yaml.safe_dump(
        {
            "auth": {"keys": [{"id": "full", "key": FULL_KEY}]},
            "providers": {
                **scripted_providers(openai_url, fireworks_url),
                "deadp": {"type": "openai", "base_url": f"http://127.0.0.1:{dead_port}/v1"},
            },
            "models": aliases(),
            "circuit_breaker": {"failures": 3, "cooldown_s": COOLDOWN_S},
        }
    )


class Faults:
    def __init__(self, gw: GatewayProcess, oa: ScriptedUpstream, fw: ScriptedUpstream) -> None:
        self.gw, self.openai, self.fireworks = gw, oa, fw
        self.sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key=FULL_KEY, max_retries=0)
        self.http = httpx.Client(base_url=gw.url, timeout=30.0, trust_env=False)

    def text(self, model: str, **kw: Any) -> str:
        text: str = self.sdk.completions.create(model=model, prompt=PROMPT, **kw).choices[0].text
        return text

    def models_called(self, upstream: ScriptedUpstream) -> list[str]:
        return [r["body"]["model"] for r in upstream.requests()]


faults_gateway = scripted_gateway(config, "faults_gateway")


@pytest.fixture(scope="module")
def faults(
    faults_gateway: GatewayProcess,
    scripted_openai_server: ScriptedUpstream,
    scripted_fireworks_server: ScriptedUpstream,
) -> Iterator[Faults]:
    f = Faults(faults_gateway, scripted_openai_server, scripted_fireworks_server)
    with f.sdk, f.http:
        yield f


@pytest.fixture
def env(faults: Faults) -> Faults:
    faults.openai.reset()
    faults.fireworks.reset()
    return faults


ANSWER = expected_text(PROMPT, 0, 16)


def test_500s_are_retried_then_fall_back(env: Faults) -> None:
    env.openai.script({"status": 500, "times": -1})
    assert env.text("t500") == ANSWER
    assert env.models_called(env.openai) == ["m-500", "m-500"]  # the try and its retry
    assert env.models_called(env.fireworks) == [FIREWORKS_MODEL]


def test_a_429_is_retried_after_the_wait_it_asks_for(env: Faults) -> None:
    env.openai.script({"status": 429, "times": 2, "headers": {"retry-after-ms": "150"}})
    began = time.monotonic()
    assert env.text("t429") == ANSWER
    assert time.monotonic() - began >= 0.3  # two waits of 150 ms, as asked (not the backoff)
    assert [r["outcome"] for r in env.openai.requests()] == ["error", "error", "ok"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_slow_first_byte_falls_back(env: Faults, stream: bool) -> None:
    env.openai.script({"delay_ms": 5000, "times": -1})
    if stream:
        chunks = env.sdk.completions.create(model="tslow", prompt=PROMPT, stream=True)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == ANSWER
    else:
        assert env.text("tslow") == ANSWER
    assert env.models_called(env.fireworks) == [FIREWORKS_MODEL]
    assert [r["outcome"] for r in env.openai.requests()] == ["cancelled"]  # cut off, not waited


def test_a_refused_connection_falls_back(env: Faults) -> None:
    assert env.text("trefused") == ANSWER
    assert env.models_called(env.openai) == ["m-ref"]
    metrics = scrape(env.gw.url)
    assert metrics.value("gateway_upstream_errors_total", kind="unreachable", provider="deadp")


def test_a_reset_connection_is_retried_or_reported(env: Faults) -> None:
    env.openai.script({"reset": True, "times": 1})
    assert env.text("treset") == ANSWER
    assert [r["outcome"] for r in env.openai.requests()] == ["dropped", "ok"]
    env.openai.script({"reset": True, "times": 1})
    with pytest.raises(openai.APIStatusError) as info:
        env.text("treset-once")
    assert info.value.status_code == 502
    assert error_body(info.value)["code"] == "upstream_unreachable"


def test_a_stream_cut_in_the_middle_ends_with_an_error_event(env: Faults) -> None:
    env.openai.script({"cut_after": 3, "times": 1})
    got = raw_stream(env.http, {"model": "tcut", "prompt": PROMPT, "stream": True})
    events = got.data()
    assert got.status == 200 and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "upstream_response_incomplete" and "broke off" in error["message"]
    texts = "".join(e["choices"][0]["text"] for e in events[:-2] if e.get("choices"))
    assert ANSWER.startswith(texts) and 0 < len(texts) < len(ANSWER)  # what came, then the error
    assert env.fireworks.requests() == []  # after the first byte: no fallback
    env.openai.script({"cut_after": 3, "times": 1})
    with pytest.raises(openai.APIError, match="broke off"):
        list(env.sdk.completions.create(model="tcut", prompt=PROMPT, stream=True))


def test_a_failing_target_is_skipped_then_probed(env: Faults) -> None:
    env.openai.script({"status": 503, "times": -1})
    for _ in range(5):
        assert env.text("tcb") == ANSWER
    assert env.models_called(env.openai) == ["m-cb"] * 3  # then its circuit opened
    assert state(env, "m-cb") == 2
    env.openai.reset()
    deadline = time.monotonic() + 10 * COOLDOWN_S
    while not env.openai.requests():  # after the cool-down, a request probes it again
        assert time.monotonic() < deadline, "the open circuit was never probed"
        assert env.text("tcb") == ANSWER
        time.sleep(0.05)
    assert state(env, "m-cb") == 0


def state(env: Faults, model: str) -> float:
    return scrape(env.gw.url).value("gateway_circuit_state", provider="oai", upstream_model=model)


# ---------------------------------------------------------------- the SDK's own retries


@pytest.mark.parametrize(
    ("case", "script", "calls"),
    [
        ("503", {"status": 503}, 3),  # ≥ 500: retried (2 retries by default)
        ("500", {"status": 500}, 3),
        ("408", {"delay_ms": 3000}, 3),  # Portkey's request_timeout 408: retried
        ("429", {"status": 429, "headers": {"retry-after-ms": "10"}}, 3),
        ("429-no-retry", {"status": 429, "headers": {"x-should-retry": "false"}}, 1),
        ("400", {"status": 400}, 1),
        # An upstream's retry hint on a 400 is not passed on: the request stays bad.
        ("400-retry", {"status": 400, "headers": {"x-should-retry": "true"}}, 1),
    ],
)
def test_the_sdk_retries_what_the_gateway_says_it_may(
    env: Faults, case: str, script: dict[str, Any], calls: int
) -> None:
    env.openai.script({**script, "times": -1})
    headers = {"x-portkey-request-timeout": "200"} if case == "408" else {}
    with (
        openai.OpenAI(base_url=env.gw.url + "/v1", api_key=FULL_KEY, max_retries=2) as sdk,
        pytest.raises(openai.APIStatusError) as info,
    ):
        sdk.completions.create(model=f"sdk-{case}", prompt=PROMPT, extra_headers=headers)
    assert len(env.openai.requests()) == calls
    if case == "429-no-retry":
        assert info.value.response.headers["x-should-retry"] == "false"


def test_the_gateways_retry_after_reaches_the_sdk(env: Faults) -> None:
    env.openai.script({"status": 503, "times": -1, "headers": {"retry-after": "0"}})
    r = env.http.post("/v1/completions", json={"model": "tprobe", "prompt": PROMPT}, headers=auth())
    assert r.status_code == 502 and r.headers["retry-after"] == "0"  # the upstream's, passed on
