"""The request log through the pipeline: one line per request when it ends, with the key's id
and team, the alias, the target that answered after which tries, tokens, cost, status and
times; for failures and streams too; never the key or the prompt. A reload opens the file anew
(logrotate's move, then SIGHUP), and the old runtime's lines go to the moved file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from core.errors import ConfigError
from gateway import config
from gateway.config import RequestLogConfig
from gateway.observability import content
from gateway.reload.handover import successor
from gateway.runtime import Runtime
from tests.unit.gateway.pipeline.test_charges import CONFIG, chat, post, serving

PROMPT = "x" * 40  # what chat() sends


def logged_config(path: Path) -> str:
    return CONFIG + f'request_log: {{path: "{path}"}}\n'


Logged = tuple[httpx.AsyncClient, Runtime, Path]


@pytest.fixture
async def logged(tmp_path: Path) -> AsyncIterator[Logged]:
    path = tmp_path / "requests.log"
    async with serving(logged_config(path)) as (client, rt, _):
        yield client, rt, path


async def lines(rt: Runtime, path: Path) -> list[dict[str, Any]]:
    """What the log holds once it wrote what was queued (closing it writes all)."""
    assert rt.request_log is not None
    await rt.request_log.aclose()
    rt.request_log = None
    return [orjson.loads(line) for line in read(path).splitlines()]


def read(path: Path) -> bytes:
    return path.read_bytes()


async def test_a_request_that_fell_back_is_one_line_with_its_tries(logged: Logged) -> None:
    client, rt, path = logged
    r = await post(client, "sk-a", chat(), "/v1/chat/completions")
    assert r.status_code == 200
    [entry] = await lines(rt, path)
    assert entry["request_id"] == r.headers["x-request-id"]
    assert (entry["key_id"], entry["team"], entry["model"]) == ("a", "t", "fb")
    assert (entry["provider"], entry["upstream_model"]) == ("cheap", "small")
    assert (entry["endpoint"], entry["stream"], entry["status"]) == ("chat/completions", False, 200)
    assert entry["error"] is None
    assert [(a["target"], a["outcome"]) for a in entry["attempts"]] == [
        ("premium/big", "502"),
        ("cheap/small", "ok"),
    ]
    assert entry["usage"] == {"prompt": 1200, "completion": 300, "cached": 1000, "reasoning": 200}
    assert entry["cost_usd"] == "0.0013"  # test_charges' CHEAP_COST
    assert entry["latency_ms"] > 0 and entry["ttft_ms"] is None
    assert entry["time"].endswith("Z")


async def test_a_stream_has_its_time_to_first_token(logged: Logged) -> None:
    client, rt, path = logged
    r = await post(client, "sk-a", chat("fb", stream=True), "/v1/chat/completions")
    assert r.status_code == 200 and "[DONE]" in r.text
    [entry] = await lines(rt, path)
    assert entry["stream"] is True and entry["status"] == 200
    assert 0 < entry["ttft_ms"] <= entry["latency_ms"]


async def test_a_failure_is_logged_with_its_error(logged: Logged) -> None:
    client, rt, path = logged
    r = await post(client, "sk-a", chat("down"), "/v1/chat/completions")
    assert r.status_code == 502
    r2 = await post(client, "sk-nobody", chat(), "/v1/chat/completions")
    assert r2.status_code == 401
    bad, unauthorized = await lines(rt, path)
    assert bad["status"] == 502 and bad["error"]["type"] == "UpstreamError"
    assert [a["outcome"] for a in bad["attempts"]] == ["502", "502"]
    assert bad["provider"] is None and bad["usage"] is None
    assert unauthorized["status"] == 401 and unauthorized["key_id"] is None
    assert unauthorized["error"] == {"type": "AuthenticationFailed", "code": "invalid_api_key"}


async def test_no_key_and_no_text_reach_the_log(logged: Logged) -> None:
    client, rt, path = logged
    await post(client, "sk-a", chat(), "/v1/chat/completions")
    await post(client, "sk-a", chat("fb", stream=True), "/v1/chat/completions")
    await post(client, "sk-nobody", chat(), "/v1/chat/completions")
    await lines(rt, path)
    held = read(path)
    for secret in (b"sk-a", b"sk-nobody", PROMPT.encode(), b"cheap:0"):  # cheap:0: an answer
        assert secret not in held


async def test_a_reload_opens_the_file_anew(logged: Logged, tmp_path: Path) -> None:
    client, rt, path = logged
    await post(client, "sk-a", chat(), "/v1/chat/completions")
    path.rename(tmp_path / "requests.log.1")  # logrotate moves it, then signals a reload
    handover = await successor(
        rt, config.parse(logged_config(path)), lambda block: rt.providers[block.name]
    )
    assert handover.runtime.request_log is not None
    assert handover.runtime.request_log is not rt.request_log
    await handover.leftovers.aclose()  # the old runtime's requests are over
    rt.request_log = None
    await handover.runtime.request_log.aclose()
    assert len(read(tmp_path / "requests.log.1").splitlines()) == 1
    assert read(path) == b""


async def test_captured_content_is_what_was_sent_and_answered_after_redaction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "requests.log"
    text = CONFIG + (
        f'request_log: {{path: "{path}", capture_content: true, '
        "redact: ['x{10}', 'cheap:[0-9]']}\n"
    )
    async with serving(text) as (client, rt, _):
        body = {"model": "fb", "max_tokens": 5, "n": 2}
        said = {"role": "user", "content": "mine xxxxxxxxxxxx is secret"}
        for stream in (False, True):
            sent = orjson.dumps({**body, "messages": [said], "stream": stream})
            r = await post(client, "sk-a", sent, "/v1/chat/completions")
            assert r.status_code == 200
        json_entry, stream_entry = await lines(rt, path)
    for entry in (json_entry, stream_entry):
        assert entry["request"] == {
            "messages": [{"role": "user", "content": "mine [REDACTED]xx is secret"}]
        }
    assert json_entry["response"] == {
        "choices": [{"index": 0, "content": "[REDACTED]"}, {"index": 1, "content": "[REDACTED]"}],
        "cut": False,
    }
    assert stream_entry["response"] == {
        "choices": [{"index": 0, "content": "hi"}, {"index": 1, "content": "hi"}],
        "cut": False,
    }
    assert b"sk-a" not in read(path)


def test_a_stream_s_text_and_tool_calls_are_gathered_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(content, "MAX_GATHERED", 12)
    g = content.Gathered()
    g.seen(
        [{"choices": [{"index": 0, "text": "Hello"}]}, {"choices": [{"index": 1, "text": "Hi"}]}]
    )
    g.seen([{"choices": [{"index": 0, "text": " world, and more"}]}])  # past 12: cut
    assert g.choices() == [{"index": 0, "content": "Hello"}, {"index": 1, "content": "Hi"}]
    assert g.cut
    chat = content.Gathered()
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a"'}}
    chat.seen([{"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}])
    more = {"index": 0, "function": {"arguments": ": 1}"}}
    chat.seen([{"choices": [{"index": 0, "delta": {"tool_calls": [more]}}]}])
    assert chat.choices() == [
        {
            "index": 0,
            "content": "",
            "tool_calls": [{"arguments": '{"a": 1}', "id": "call_1", "name": "f"}],
        }
    ]


def test_the_config_takes_off_stdout_or_a_path() -> None:
    assert config.parse(CONFIG).request_log == RequestLogConfig()
    assert config.parse(CONFIG + "request_log: off\n").request_log == RequestLogConfig()
    assert config.parse(CONFIG + "request_log: {path: off}\n").request_log.path is None
    assert config.parse(CONFIG + "request_log: {path: stdout}\n").request_log.path == "stdout"
    assert config.parse(CONFIG + "request_log: {path: /var/log/gw.log}\n").request_log == (
        RequestLogConfig("/var/log/gw.log")
    )
    for bad, where in (
        ("request_log: {path: 5}", "request_log.path"),
        ("request_log: {path: ''}", "request_log.path"),
        ("request_log: {pth: stdout}", "request_log.pth"),
        ("request_log: [stdout]", "request_log"),
        ("request_log: {path: stdout, redact: ['(']}", "request_log.redact[0]"),
        ("request_log: {path: stdout, redact: 'x'}", "request_log.redact"),
        ("request_log: {path: stdout, capture_content: 1}", "request_log.capture_content"),
    ):
        with pytest.raises(ConfigError) as err:
            config.parse(CONFIG + bad + "\n")
        assert err.value.path == where


async def test_a_response_s_line_has_its_instructions_input_and_output(tmp_path: Path) -> None:
    """The Responses API's requests log as the others do: with capture_content, what was sent
    (instructions, input) and the output (text, function calls), from a JSON answer and a
    stream's events; its operation and usage as any request's."""
    path = tmp_path / "requests.log"
    text = CONFIG + f'request_log: {{path: "{path}", capture_content: true}}\n'
    async with serving(text) as (client, rt, _):
        body = {"model": "fb", "instructions": "Be brief.", "input": "hi there", "store": False}
        for stream in (False, True):
            sent = orjson.dumps({**body, "stream": stream})
            r = await post(client, "sk-a", sent, "/v1/responses")
            assert r.status_code == 200, r.text
        json_entry, stream_entry = await lines(rt, path)
    # The scripted provider answers "cheap:<n>" whole, and "hi" streamed.
    for entry, said in ((json_entry, "cheap:0"), (stream_entry, "hi")):
        assert entry["request"] == {"instructions": "Be brief.", "input": "hi there"}
        assert entry["response"]["choices"] == [{"index": 0, "content": said}]
        assert entry["endpoint"] == "responses" and entry["usage"]["prompt"] is not None


def test_a_responses_stream_s_text_and_function_calls_are_gathered() -> None:
    g = content.Gathered()
    g.seen([{"type": "response.output_text.delta", "delta": "Hel"}])
    g.seen([{"type": "response.output_text.delta", "delta": "lo"}])
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    g.seen([{"type": "response.output_item.done", "output_index": 1, "item": call}])
    assert g.choices() == [
        {
            "index": 0,
            "content": "Hello",
            "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}],
        }
    ]
    answer = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}]}
    assert content.answered(answer) == [{"index": 0, "content": "Hi"}]
