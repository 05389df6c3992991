"""The scripted upstreams, run as subprocesses, keep the documented quirks the gateway's
normalisation is tested against."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import aiohttp
import httpx
import orjson
import pytest

from tests.upstreams.fakegen import CONTEXT_WINDOW, expected_text
from tests.upstreams.procs import (
    FIREWORKS_TEST_KEY,
    OPENAI_TEST_KEY,
    ScriptedUpstream,
    free_port,
    wait_http_ready,
)

FW_MODEL = "accounts/fireworks/models/llama-v3p1-8b-instruct"
Json = dict[str, Any]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as c:
        yield c


def _key(up: ScriptedUpstream) -> str:
    return OPENAI_TEST_KEY if up.dialect == "openai" else FIREWORKS_TEST_KEY


def post(client: httpx.Client, up: ScriptedUpstream, body: Json, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {_key(up)}"}
    return client.post(up.url + "/completions", json={"model": "m", **body}, headers=headers, **kw)


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except the final `[DONE]`."""
    datas = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else orjson.loads(d) for d in datas]


def stream_texts(events: list[Any]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for ev in events[:-1]:
        for ch in ev["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    return texts


# ----------------------------------------------------------------------------- helpers


def test_free_port_and_wait_http_ready_times_out() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="not ready"):
        wait_http_ready(f"http://127.0.0.1:{port}/health", timeout=0.3)
    assert time.monotonic() - start < 2


# ----------------------------------------------------------------------------- OpenAI


def test_openai_shape_ids_indices_usage(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    r = post(client, scripted_openai, {"prompt": ["one two", "three"], "n": 2, "max_tokens": 4})
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["system_fingerprint"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][1]["text"] == expected_text("one two", 1, 4)
    assert body["choices"][2]["text"] == expected_text("three", 0, 4)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19}
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}


def test_openai_stop_is_excluded(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = post(client, scripted_openai, {"prompt": "p", "stop": [" gamma"], "max_tokens": 16})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert " gamma" not in choice["text"]
    assert (choice["text"] + " gamma") in expected_text("p", 0, 16)


def test_openai_rejects_unknown_fields(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    r = post(client, scripted_openai, {"prompt": "p", "top_k": 5})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "Unrecognized request argument supplied: top_k",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


def test_openai_context_error(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = post(client, scripted_openai, {"prompt": "w " * 60, "max_tokens": 2000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert err["message"] == (
        "This model's maximum context length is 2048 tokens, however you requested 2060 tokens "
        "(60 in your prompt; 2000 for the completion). Please reduce your prompt; or completion "
        "length."
    )


def test_openai_stream_options_need_stream(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    r = post(client, scripted_openai, {"prompt": "p", "stream_options": {"include_usage": True}})
    assert r.status_code == 400
    assert "only allowed when 'stream' is enabled" in r.json()["error"]["message"]


def test_openai_stream_usage_chunk(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    body = {"prompt": "p", "n": 2, "max_tokens": 3, "stream": True}
    r = post(client, scripted_openai, {**body, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    *content, usage_chunk = events[:-1]
    assert all(ev["usage"] is None and len(ev["choices"]) == 1 for ev in content)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    assert stream_texts(events) == {i: expected_text("p", i, 3) for i in range(2)}
    plain = sse_events(post(client, scripted_openai, body).text)
    assert all("usage" not in ev for ev in plain[:-1])


def test_openai_best_of_returns_highest_candidate(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    r = post(client, scripted_openai, {"prompt": "p", "best_of": 3, "max_tokens": 4})
    body = r.json()
    assert [c["text"] for c in body["choices"]] == [expected_text("p", 2, 4)]
    assert body["usage"]["completion_tokens"] == 12  # every candidate counts


def test_openai_echo_logprobs(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    body = {"prompt": "a b", "echo": True, "logprobs": 2, "max_tokens": 3}
    choice = post(client, scripted_openai, body).json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "a b" + expected_text("a b", 0, 3)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == len(lp["text_offset"]) == 5
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(len(t) == 3 for t in lp["top_logprobs"][1:])


def test_openai_auth(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = client.post(
        scripted_openai.url + "/completions",
        json={"model": "m", "prompt": "p"},
        headers={"Authorization": "Bearer wrong-key"},
    )
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_openai_magic_statuses(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = post(client, scripted_openai, {"prompt": "x __status_429__"})
    assert r.status_code == 429
    assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == ("7", "7000")
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    r = post(client, scripted_openai, {"prompt": "x __status_429_quota__"})
    assert r.json()["error"]["type"] == "insufficient_quota"
    assert r.headers["x-should-retry"] == "false"
    r = post(client, scripted_openai, {"prompt": "x __status_503__"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    r = post(client, scripted_openai, {"prompt": "x __notjson_502__"})
    assert r.status_code == 502 and r.text == "upstream exploded"
    assert r.headers["content-type"].startswith("text/plain")


def test_openai_midstream_error(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = post(client, scripted_openai, {"prompt": "__midstream_error__", "stream": True})
    events = sse_events(r.text)
    assert len(events) == 4 and events[-1] == "[DONE]"
    assert events[2]["error"]["type"] == "server_error"


def test_close_and_sleep(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, scripted_openai, {"prompt": "__close__"})
    start = time.monotonic()
    assert post(client, scripted_openai, {"prompt": "__sleep_300__"}).status_code == 200
    assert time.monotonic() - start >= 0.3
    with pytest.raises(httpx.ReadTimeout):
        post(client, scripted_openai, {"prompt": "__sleep_5000__"}, timeout=0.2)


def test_control_log_script_reset(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    scripted_openai.script({"status": 503, "times": 1})
    assert post(client, scripted_openai, {"prompt": "p"}).status_code == 503
    assert post(client, scripted_openai, {"prompt": "p"}).status_code == 200
    log = scripted_openai.requests()
    assert [e["outcome"] for e in log] == ["error", "ok"]
    assert log[0]["body"] == {"model": "m", "prompt": "p"}
    assert log[0]["headers"]["authorization"] == f"Bearer {OPENAI_TEST_KEY}"
    scripted_openai.reset()
    assert scripted_openai.requests() == []


def test_slow_stream_disconnect_is_counted(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    body = {"model": "m", "prompt": "__slow_stream__", "stream": True}
    headers = {"Authorization": f"Bearer {OPENAI_TEST_KEY}"}
    url = scripted_openai.url + "/completions"
    with client.stream("POST", url, json=body, headers=headers) as r:
        lines = (line for line in r.iter_lines() if line)
        assert [next(lines) for _ in range(2)]
    left = time.time()
    stats = _wait_for(scripted_openai, lambda s: s["disconnects"] == 1)
    assert stats["completed_streams"] == 0
    assert stats["last_disconnect_time"] - left < 1.0


def _wait_for(up: ScriptedUpstream, cond: Callable[[Json], bool], timeout: float = 3.0) -> Json:
    deadline = time.monotonic() + timeout
    while True:
        stats: Json = up.stats()
        if cond(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


# ----------------------------------------------------------------------------- script faults


def test_script_headers_replace_dialect_ones(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    scripted_openai.script({"status": 429, "headers": {"Retry-After": "0", "retry-after-ms": "50"}})
    r = post(client, scripted_openai, {"prompt": "p"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert r.headers.get_list("retry-after") == ["0"]
    assert r.headers.get_list("retry-after-ms") == ["50"]


def test_script_headers_on_errors_and_answers(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    extra = {"x-extra": "1", "Fireworks-Prompt-Tokens": "99"}
    scripted_fireworks.script(
        {"status": 503, "headers": {"x-should-retry": "false"}}, {"headers": extra, "times": 2}
    )
    r = post(client, scripted_fireworks, {"prompt": "p"})
    assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
    assert "fault" in r.json()
    plain = post(client, scripted_fireworks, {"prompt": "p"})
    streamed = post(client, scripted_fireworks, {"prompt": "p", "stream": True})
    for resp in (plain, streamed):
        assert resp.status_code == 200 and resp.headers["x-extra"] == "1"
        assert resp.headers.get_list("fireworks-prompt-tokens") == ["99"]
    assert sse_events(streamed.text)[-1] == "[DONE]"


STREAM_BODY: Json = {"prompt": "p", "max_tokens": 4, "stream": True}


def open_stream(
    client: httpx.Client, up: ScriptedUpstream, body: Json
) -> AbstractContextManager[httpx.Response]:
    """`client.stream` of a completions request: the response as soon as its headers are in."""
    headers = {"Authorization": f"Bearer {_key(up)}"}
    url = up.url + "/completions"
    return client.stream("POST", url, json={"model": "m", **body}, headers=headers)


@pytest.mark.parametrize("k", [0, 2])
async def test_script_cut_stream_after_k_events(scripted_openai: ScriptedUpstream, k: int) -> None:
    scripted_openai.script({"cut_after": k})
    headers = {"Authorization": f"Bearer {OPENAI_TEST_KEY}"}
    body = {"model": "m", **STREAM_BODY}
    lines: list[bytes] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(scripted_openai.url + "/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
        with pytest.raises(aiohttp.ClientPayloadError):  # no [DONE], no end of body
            async for line in r.content:
                lines.append(line)
    events = sse_events(b"".join(lines).decode())
    assert len(events) == k and "[DONE]" not in events
    assert [e["outcome"] for e in scripted_openai.requests()] == ["dropped"]
    assert scripted_openai.stats()["dropped"] == 1


def test_script_cut_body(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    scripted_openai.script({"cut_after": 1})
    got = bytearray()
    with open_stream(client, scripted_openai, {"prompt": "p"}) as r:
        assert r.status_code == 200 and r.headers["x-request-id"].startswith("req_")
        with pytest.raises(httpx.RemoteProtocolError):
            for part in r.iter_raw():
                got += part
    assert 0 < len(got) < int(r.headers["content-length"])
    assert scripted_openai.requests()[0]["outcome"] == "dropped"


def _raw_post(up: ScriptedUpstream) -> socket.socket:
    """A completions request on a plain socket, to see how the server ends the connection."""
    body = orjson.dumps({"model": "m", "prompt": "p"})
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {_key(up)}\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.create_connection((up.host, up.port), timeout=10.0)
    sock.sendall(head.encode() + body)
    return sock


def test_script_reset_is_a_tcp_rst(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    scripted_openai.script({"reset": True, "times": 2}, {"close": True})
    with _raw_post(scripted_openai) as sock, pytest.raises(ConnectionResetError):
        sock.recv(1024)
    with pytest.raises(httpx.ReadError, match="reset"):
        post(client, scripted_openai, {"prompt": "p"})
    with pytest.raises(httpx.RemoteProtocolError):  # close: a clean FIN, no answer
        post(client, scripted_openai, {"prompt": "p"})
    assert [e["outcome"] for e in scripted_openai.requests()] == ["dropped"] * 3


def test_script_stall_between_events(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    scripted_openai.script({"stall_after": 2, "stall_ms": 300, "times": 2})
    start = time.monotonic()
    lines: list[str] = []
    arrivals: list[float] = []
    with open_stream(client, scripted_openai, STREAM_BODY) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                arrivals.append(time.monotonic())
    assert arrivals[2] - start >= 0.3 and arrivals[-1] - start < 10.0
    assert sse_events("\n".join(lines))[-1] == "[DONE]"
    assert post(client, scripted_openai, {"prompt": "p"}).status_code == 200  # non-stream: ignored
    assert [e["outcome"] for e in scripted_openai.requests()] == ["completed_stream", "ok"]


def test_script_delay_comes_before_stream_headers(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    scripted_openai.script({"delay_ms": 300})
    start = time.monotonic()
    with open_stream(client, scripted_openai, STREAM_BODY) as r:
        assert time.monotonic() - start >= 0.3  # the headers came after the delay
        assert sse_events(r.read().decode())[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("step", "named"),
    [
        ({"dalay_ms": 5}, "'dalay_ms'"),
        ({"times": "2"}, "'times'"),
        ({"close": 1}, "'close'"),
        ({"status": True}, "'status'"),
        ({"headers": {"retry-after": 1}}, "'headers'"),
        ({"headers": {"Content-Length": "3"}}, "content-length"),
        ({"cut_after": -1}, "'cut_after'"),
        ({"stall_after": 2}, "'stall_ms'"),
        ("close", "object"),
    ],
)
def test_script_rejects_bad_steps(
    client: httpx.Client, scripted_openai: ScriptedUpstream, step: Any, named: str
) -> None:
    legacy = {"status": 503, "notjson": False, "close": False, "delay_ms": 0, "times": 1}
    r = client.post(scripted_openai.root + "/__script", json=[legacy, step])
    assert r.status_code == 400
    assert r.json()["error"].startswith("step 1: ") and named in r.json()["error"]
    assert post(client, scripted_openai, {"prompt": "p"}).status_code == 200  # nothing queued
    scripted_openai.script(legacy)
    assert post(client, scripted_openai, {"prompt": "p"}).status_code == 503


def test_script_helper_raises_with_the_reason(scripted_openai: ScriptedUpstream) -> None:
    with pytest.raises(httpx.HTTPStatusError, match=r"400.*unknown key 'dalay_ms'"):
        scripted_openai.script({"dalay_ms": 5})


def test_models(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    headers = {"Authorization": f"Bearer {OPENAI_TEST_KEY}"}
    data = client.get(scripted_openai.url + "/models", headers=headers).json()
    assert data["object"] == "list"
    assert "gpt-3.5-turbo-instruct" in [m["id"] for m in data["data"]]


# ----------------------------------------------------------------------------- Fireworks


def test_fireworks_ids_and_stop_included(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    r = post(client, scripted_fireworks, {"prompt": "p", "stop": " gamma", "max_tokens": 16})
    body = r.json()
    uuid.UUID(body["id"])
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"].endswith(" gamma")
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_fireworks_stream_usage_on_last_chunk(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    body = {"prompt": "p", "n": 2, "max_tokens": 16, "stop": [" gamma"], "stream": True}
    events = sse_events(post(client, scripted_fireworks, body).text)
    assert events[-1] == "[DONE]"
    content = events[:-1]
    assert all(ev["usage"] is None for ev in content[:-1])
    assert content[-1]["usage"]["completion_tokens"] > 0 and content[-1]["choices"]
    assert all(t.endswith(" gamma") for t in stream_texts(events).values())


@pytest.mark.parametrize(
    "field", [{"best_of": 2}, {"suffix": "x"}, {"stream_options": {}}, {"frobnicate": 1}]
)
def test_fireworks_extra_fields_422(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream, field: Json
) -> None:
    r = post(client, scripted_fireworks, {"prompt": "p", **field})
    assert r.status_code == 422
    (name,) = field
    assert r.json() == {
        "detail": [
            {
                "loc": ["body", name],
                "msg": "Extra inputs are not permitted",
                "type": "extra_forbidden",
            }
        ]
    }


def test_fireworks_extensions(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    extras = {
        "top_k": 40,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "mirostat_target": 5.0,
        "mirostat_lr": 0.1,
        "ignore_eos": True,
        "response_format": {"type": "json_object"},
    }
    assert post(client, scripted_fireworks, {"prompt": "p", **extras}).status_code == 200
    r = post(client, scripted_fireworks, {"prompt": "p", "top_k": 101})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "less_than_equal"


def test_fireworks_context_truncate_or_error(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    body = {"prompt": "w " * 60, "max_tokens": 2000}
    choice_usage = post(client, scripted_fireworks, body).json()["usage"]
    assert choice_usage["completion_tokens"] == CONTEXT_WINDOW - 60
    r = post(client, scripted_fireworks, {**body, "context_length_exceeded_behavior": "error"})
    assert r.status_code == 400 and "too long" in r.json()["error"]["message"]


def test_fireworks_logprob_formats(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    body = {"prompt": "p", "max_tokens": 2, "logprobs": True, "top_logprobs": 2}
    entry = post(client, scripted_fireworks, body).json()["choices"][0]["logprobs"]["content"][0]
    assert set(entry) >= {
        "token",
        "logprob",
        "sampling_logprob",
        "token_id",
        "bytes",
        "text_offset",
        "top_logprobs",
    }
    assert len(entry["top_logprobs"]) == 2
    legacy = post(client, scripted_fireworks, {**body, "logprobs": 1}).json()
    assert legacy["choices"][0]["logprobs"]["token_ids"]
    extras = {"raw_output": True, "return_token_ids": True, "perf_metrics_in_response": True}
    full = post(client, scripted_fireworks, {"prompt": "p", **extras}).json()
    assert {"raw_output", "token_ids"} <= set(full["choices"][0]) and "perf_metrics" in full


def test_fireworks_magic_errors(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    r = post(client, scripted_fireworks, {"prompt": "__status_500__"})
    assert r.status_code == 500 and r.json()["fault"]["faultstring"] == "Internal error"
    r = post(client, scripted_fireworks, {"prompt": "__status_429__"})
    assert r.headers["retry-after"] == "7" and "retry-after-ms" not in r.headers
    assert isinstance(r.json()["detail"], str)
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, scripted_fireworks, {"prompt": "__midstream_error__", "stream": True})


def test_fireworks_eos_and_ignore_eos(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    body = {"prompt": "__eos_2__", "max_tokens": 5}
    eos = post(client, scripted_fireworks, body).json()
    assert eos["usage"]["completion_tokens"] == 2
    assert eos["choices"][0]["finish_reason"] == "stop"
    ignored = post(client, scripted_fireworks, {**body, "ignore_eos": True}).json()
    assert ignored["choices"][0]["finish_reason"] == "length"


def test_fireworks_paths(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    assert scripted_fireworks.url.endswith("/inference/v1")
    headers = {"Authorization": f"Bearer {FIREWORKS_TEST_KEY}"}
    r = client.post(
        scripted_fireworks.root + "/v1/completions",
        headers=headers,
        json={"model": FW_MODEL, "prompt": "p"},
    )
    assert r.status_code == 200
    r = client.post(scripted_fireworks.url + "/completions", json={"model": "m", "prompt": "p"})
    assert r.status_code == 401
