"""The Batch API with the openai SDK, on a gateway of its own in front of the scripted OpenAI:
a file of requests uploaded, a batch created, run by the gateway through its own pipeline, and
its output and error files read back (completions, chat, embeddings, and the Responses API's lines
on a chat-only upstream); validation failures naming the line, cancel, the window's end, and
ownership."""

from __future__ import annotations

import contextlib
import functools
import io
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai.types import Batch

from tests.e2e.batches import DEADLINE_S, completed, finished, lines_of, requests, start, until
from tests.e2e.metrics_text import scrape
from tests.e2e.support import OPENAI_MODEL, scripted_providers
from tests.e2e.test_sdk_responses import TOOL_ASK, WEATHER
from tests.gateway_proc import GatewayProcess
from tests.upstreams.chat_fake import fake_arguments, pieces
from tests.upstreams.embeddings import vector
from tests.upstreams.fakegen import expected_text
from tests.upstreams.procs import ScriptedUpstream

KEY, OTHER = "sk-batches-one", "sk-batches-two"
WINDOW_S = 3
EMBED_MODEL = "text-embedding-3-small"


@pytest.fixture(scope="module")
def gateway(
    scripted_openai_server: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("batches")
    # `generic`: the scripted OpenAI as an openai-compatible server, which the gateway serves the
    # Responses API on as chat (alias `resp`)
    providers = orjson.dumps(
        scripted_providers(scripted_openai_server.url, "http://127.0.0.1:9", generic=True)
    )
    config = f"""
auth:
  keys:
    - {{id: one, key: {KEY}, models: ["*"]}}
    - {{id: two, key: {OTHER}, models: ["*"]}}
providers: {providers.decode()}
models:
  oa: {{targets: [{{provider: oai, model: {OPENAI_MODEL}}}]}}
  emb: {{endpoint: embeddings, targets: [{{provider: oai, model: {EMBED_MODEL}}}]}}
  resp: {{targets: [{{provider: generic, model: {OPENAI_MODEL}}}]}}
files: {{store: "{workdir / "store"}"}}
batches: {{max_concurrency: 4, poll_s: 0.05}}
request_log: {{path: "{workdir / "requests.log"}"}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield gw


@pytest.fixture
def sdk(
    gateway: GatewayProcess, scripted_openai_server: ScriptedUpstream
) -> Iterator[openai.OpenAI]:
    scripted_openai_server.reset()
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def test_a_batch_runs_through_the_pipeline(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    batch = start(sdk, requests(12) + requests(1, temperature=5).replace(b"req-0", b"bad-0"))
    assert batch.status == "validating" and batch.metadata == {"team": "evals"}
    done = until(sdk, batch.id, finished)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (13, 12)
    assert done.request_counts.failed == 1
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = lines_of(sdk, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(12))
    for x in out:
        i = int(x["custom_id"].removeprefix("req-"))
        assert x["response"]["status_code"] == 200 and x["error"] is None
        assert x["response"]["request_id"].startswith("req_") and x["id"].startswith("batch_req_")
        body = x["response"]["body"]
        assert body["model"] == "oa" and body["object"] == "text_completion"
        assert body["choices"][0]["text"] == expected_text(f"Say {i}", 0, 3)
    errors = lines_of(sdk, done.error_file_id)
    assert [(x["custom_id"], x["response"]["status_code"]) for x in errors] == [("bad-0", 400)]
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
    files = {f.id: f for f in sdk.files.list()}
    assert files[done.output_file_id].purpose == "batch_output"  # type: ignore[index]
    # the request log has a line for each, with the batch's id and the line's custom_id
    logged = logged_lines(gateway, done.id, 13)
    by_custom = {x["custom_id"]: x for x in logged}
    assert sorted(by_custom) == sorted([*(f"req-{i}" for i in range(12)), "bad-0"])
    for x in out:
        entry = by_custom[x["custom_id"]]
        assert entry["request_id"] == x["response"]["request_id"] and entry["status"] == 200
        assert (entry["key_id"], entry["model"], entry["provider"]) == ("one", "oa", "oai")
    assert by_custom["bad-0"]["status"] == 400 and by_custom["bad-0"]["attempts"] == []


def logged_lines(gateway: GatewayProcess, batch_id: str, n: int) -> list[dict[str, Any]]:
    """The request log's lines of one batch, once there are `n` (a probe: lines are written a
    moment after their request ends)."""
    path = gateway.config.parent / "requests.log"
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = path.read_bytes() if path.exists() else b""
        found = [x for x in map(orjson.loads, text.splitlines()) if x.get("batch_id") == batch_id]
        if len(found) >= n or time.monotonic() > deadline:
            assert len(found) == n
            return found
        time.sleep(0.05)


def test_chat_batches(sdk: openai.OpenAI) -> None:
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "oa", "messages": [{"role": "user", "content": f"Hi {i}"}]},
        }
        for i in range(3)
    ]
    content = b"\n".join(orjson.dumps(x) for x in lines)
    done = until(sdk, start(sdk, content, "/v1/chat/completions").id, finished)
    assert done.status == "completed"
    out = lines_of(sdk, done.output_file_id)
    assert {x["response"]["body"]["object"] for x in out} == {"chat.completion"}


def test_embeddings_batches(sdk: openai.OpenAI) -> None:
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "emb", "input": f"text {i}", "encoding_format": "float"},
        }
        for i in range(3)
    ]
    lines.append({**lines[0], "custom_id": "wrong", "body": {"model": "emb", "input": []}})
    content = b"\n".join(orjson.dumps(x) for x in lines)
    done = until(sdk, start(sdk, content, "/v1/embeddings").id, finished)
    assert done.status == "completed"
    out = {x["custom_id"]: x["response"]["body"] for x in lines_of(sdk, done.output_file_id)}
    assert sorted(out) == ["e0", "e1", "e2"]
    for i in range(3):
        assert out[f"e{i}"]["object"] == "list" and out[f"e{i}"]["model"] == "emb"
        got = out[f"e{i}"]["data"][0]["embedding"]
        assert got == pytest.approx(vector(f"text {i}", EMBED_MODEL, None), abs=1e-12)
    errors = lines_of(sdk, done.error_file_id)
    assert [(x["custom_id"], x["response"]["status_code"]) for x in errors] == [("wrong", 400)]
    assert errors[0]["response"]["body"]["error"]["param"] == "input"


def test_responses_batches(sdk: openai.OpenAI, scripted_openai_server: ScriptedUpstream) -> None:
    """`/v1/responses` lines on a chat-only upstream: each output line's body is the line's
    response object (its output items and usage, as the fake model answers the chat it means);
    a bad line is an error line naming the field, and sends nothing upstream."""

    def line(custom_id: str, **body: Any) -> dict[str, Any]:
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "resp", **body},
        }

    lines = [
        *(line(f"r{i}", input=f"Say {i}", max_output_tokens=16) for i in range(3)),
        line("tool", input=TOOL_ASK, tools=[WEATHER]),
        line("no-input", max_output_tokens=16),
        line("short", input="Say 0", max_output_tokens=15),  # below OpenAI's floor of 16
    ]
    content = b"\n".join(orjson.dumps(x) for x in lines)
    done = until(sdk, start(sdk, content, "/v1/responses").id, finished)
    assert done.status == "completed" and done.endpoint == "/v1/responses"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 2)
    out = {x["custom_id"]: x for x in lines_of(sdk, done.output_file_id)}
    assert sorted(out) == ["r0", "r1", "r2", "tool"]
    assert {x["response"]["status_code"] for x in out.values()} == {200}
    bodies = {custom_id: x["response"]["body"] for custom_id, x in out.items()}
    assert len({b["id"] for b in bodies.values()}) == 4
    for body in bodies.values():
        assert body["id"].startswith("resp_") and body["object"] == "response"
        assert body["model"] == "resp"
    for i in range(3):
        body = bodies[f"r{i}"]
        text = expected_text(f"Say {i}", 0, 16)
        assert (body["status"], body["incomplete_details"]) == (
            "incomplete",
            {"reason": "max_output_tokens"},
        )
        (message,) = body["output"]
        assert (message["type"], message["role"]) == ("message", "assistant")
        assert [(p["type"], p["text"]) for p in message["content"]] == [("output_text", text)]
        assert body["usage"]["input_tokens"] == 2 and body["usage"]["output_tokens"] == 16
        assert body["usage"]["total_tokens"] == 18
    tool = bodies["tool"]
    arguments = fake_arguments(WEATHER["parameters"])
    (call,) = tool["output"]
    assert (call["type"], call["name"], call["arguments"]) == (
        "function_call",
        "get_weather",
        arguments,
    )
    assert call["call_id"].startswith("call_") and call["status"] == "completed"
    assert tool["status"] == "completed" and tool["tools"][0]["name"] == "get_weather"
    assert tool["usage"]["output_tokens"] == len(pieces(arguments))
    assert tool["usage"]["input_tokens"] == len(TOOL_ASK.split())
    # The upstream got chat: one request a good line, the tool as a chat function.
    chats = [r["body"] for r in scripted_openai_server.requests()]
    assert len(chats) == 4 and all("input" not in c for c in chats)
    (sent,) = [c for c in chats if c.get("tools")]
    assert sent["messages"] == [{"role": "user", "content": TOOL_ASK}]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    errors = {x["custom_id"]: x for x in lines_of(sdk, done.error_file_id)}
    assert sorted(errors) == ["no-input", "short"]
    for custom_id, param in (("no-input", "input"), ("short", "max_output_tokens")):
        response = errors[custom_id]["response"]
        assert response["status_code"] == 400
        assert response["body"]["error"]["param"] == param, response


def test_a_bad_file_fails_the_batch_naming_the_line(sdk: openai.OpenAI) -> None:
    content = requests(2) + b"{oops\n" + requests(1, url="/v1/embeddings").replace(b"req-0", b"x")
    done = until(sdk, start(sdk, content).id, finished)
    assert done.status == "failed" and done.failed_at
    assert done.errors is not None and done.errors.data is not None
    assert [(e.code, e.line, e.param) for e in done.errors.data] == [
        ("invalid_json_line", 3, None),
        ("mismatched_endpoint", 4, "url"),
    ]
    assert done.errors.model_extra == {"total": 2}  # the gateway's count of them
    assert done.output_file_id is None
    # The error file has every line error (the object shows the first thousand).
    errors = lines_of(sdk, done.error_file_id)
    assert [(x["custom_id"], x["error"]["code"], x["error"]["line"]) for x in errors] == [
        (None, "invalid_json_line", 3),
        ("x", "mismatched_endpoint", 4),
    ]
    assert {x["response"] for x in errors} == {None}


def test_cancel_keeps_what_is_done(
    sdk: openai.OpenAI, scripted_openai_server: ScriptedUpstream
) -> None:
    scripted_openai_server.script({"delay_ms": 300, "times": -1})
    batch = start(sdk, requests(40))
    until(sdk, batch.id, lambda b: completed(b) > 0)
    cancelling = sdk.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = until(sdk, batch.id, finished)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts is not None and 0 < done.request_counts.completed < 40
    out = lines_of(sdk, done.output_file_id)
    assert len(out) == done.request_counts.completed
    assert len({x["custom_id"] for x in out}) == len(out)
    with pytest.raises(openai.BadRequestError):
        sdk.batches.cancel(batch.id)


def test_a_batch_yields_to_live_requests(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    """max_concurrency (4) lines in flight while nothing else is served; while a live request
    is, new lines wait until fewer than live_concurrency (1) are; then 4 again."""
    slow = requests(40, prompt="Say __sleep_200__")
    batch = start(sdk, slow)
    in_flight = functools.partial(lines_in_flight, gateway)
    wait_for(lambda: in_flight() == 4)
    with ThreadPoolExecutor(1) as pool:
        live = pool.submit(sdk.completions.create, model="oa", prompt="__sleep_3000__")
        wait_for(lambda: in_flight() <= 1)  # the lines out when it came finish, none follow
        seen = {in_flight() for _ in range(20)}
        assert not live.done() and seen <= {0, 1}, seen
        live.result()
    wait_for(lambda: in_flight() == 4)
    sdk.batches.cancel(batch.id)
    until(sdk, batch.id, finished)


def lines_in_flight(gateway: GatewayProcess) -> float:
    return scrape(gateway.url).value("gateway_batch_lines_in_flight")


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"


def test_batches_belong_to_their_key(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    batch = start(sdk, requests(1))
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=OTHER, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batch.id)
        assert [b.id for b in other.batches.list()] == []
        with pytest.raises(openai.NotFoundError):  # the input file is the first key's
            other.batches.create(
                input_file_id=batch.input_file_id,
                endpoint="/v1/completions",
                completion_window="24h",
            )
    assert batch.id in [b.id for b in sdk.batches.list()]
    until(sdk, batch.id, finished)


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"endpoint": "/v1/images"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-0000"}, "input_file_id"),
    ],
)
def test_bad_batches_are_400s_naming_the_field(
    sdk: openai.OpenAI, over: dict[str, Any], param: str
) -> None:
    made = sdk.files.create(file=("in.jsonl", io.BytesIO(requests(1))), purpose="batch")
    body = {"input_file_id": made.id, "endpoint": "/v1/completions", "completion_window": "24h"}
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.post("/batches", body={**body, **over}, cast_to=Batch)
    assert caught.value.status_code in (400, 404)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_a_gateway_killed_mid_batch_goes_on_where_it_was(
    gateway: GatewayProcess, scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    """SIGKILL during a batch, then a gateway started again on the same store: the batch
    completes, no finished line ran twice (at most those in flight at the kill ran again), and
    the output holds each custom_id once."""
    with killed_mid_batch(gateway, scripted_openai_server, tmp_path, 8) as (client, batch):
        done = until(client, batch.id, finished)
        assert done.status == "completed"
        out = lines_of(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(40))
    sent = len(scripted_openai_server.requests())
    assert 40 <= sent <= 40 + 4  # max_concurrency: the lines in flight at the kill


def test_an_input_file_deleted_under_a_batch_fails_it_keeping_what_is_done(
    gateway: GatewayProcess, scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    """The input file deleted while its batch runs, and the gateway killed: the one started
    again cannot read the lines anew, so the batch fails naming the file (not retried for
    ever), with the lines answered before in its output file."""
    deleting = killed_mid_batch(gateway, scripted_openai_server, tmp_path, 4, delete_input)
    with deleting as (client, batch):
        done = until(client, batch.id, finished)
        assert done.status == "failed" and done.failed_at
        assert done.errors is not None and done.errors.data is not None
        error = done.errors.data[0]
        assert (error.code, error.param, error.line) == ("file_not_found", "input_file_id", None)
        assert batch.input_file_id in (error.message or "")
        out = lines_of(client, done.output_file_id)
    assert len(out) >= 4 and len({x["custom_id"] for x in out}) == len(out)


@contextlib.contextmanager
def killed_mid_batch(
    gateway: GatewayProcess,
    upstream: ScriptedUpstream,
    tmp_path: Path,
    done_first: int,
    before_kill: Callable[[openai.OpenAI, Batch], None] = lambda client, batch: None,
) -> Iterator[tuple[openai.OpenAI, Batch]]:
    """A 40-line batch on a gateway of the module's config with a store of its own (no other
    runner on it, leases that lapse within a second), killed (SIGKILL) once `done_first` lines
    are done and `before_kill` ran; yields the SDK on a gateway started again, and the batch."""
    upstream.reset()
    upstream.script({"delay_ms": 100, "times": -1})
    store = str(gateway.config.parent / "store")
    config = (
        gateway.config.read_text()
        .replace(store, str(tmp_path / "store"))
        .replace("poll_s: 0.05}", "poll_s: 0.05, lease_s: 1}")
    )
    first = GatewayProcess(config, tmp_path)
    with openai.OpenAI(base_url=first.url + "/v1", api_key=KEY, max_retries=0) as client:
        batch = start(client, requests(40))
        until(client, batch.id, lambda b: completed(b) >= done_first)
        before_kill(client, batch)
    first.send_signal(signal.SIGKILL)
    first.stop()
    with (
        GatewayProcess(config, tmp_path) as again,
        openai.OpenAI(base_url=again.url + "/v1", api_key=KEY, max_retries=0) as client,
    ):
        yield client, batch
        assert " failed" not in again.logs()  # no run that raised, tried again and again


def delete_input(client: openai.OpenAI, batch: Batch) -> None:
    client.files.delete(batch.input_file_id)


def test_the_window_s_end_expires_the_batch_with_what_is_done(
    gateway: GatewayProcess, scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    scripted_openai_server.reset()
    scripted_openai_server.script({"delay_ms": 200, "times": -1})
    with one_second_window(gateway, tmp_path) as client:
        batch = start(client, requests(40))
        assert batch.expires_at == batch.created_at + 1
        done = until(client, batch.id, finished)
        assert done.status == "expired" and done.expired_at
        counts = done.request_counts
        assert counts is not None and 0 < counts.completed < 40
        assert counts.completed + counts.failed == 40
        out = lines_of(client, done.output_file_id)
        assert len(out) == counts.completed
        unrun = lines_of(client, done.error_file_id)
        assert len(unrun) == counts.failed
        assert {x["error"]["code"] for x in unrun} == {"batch_expired"}
        assert all(x["response"] is None for x in unrun)
        ran = {x["custom_id"] for x in out} | {x["custom_id"] for x in unrun}
        assert ran == {f"req-{i}" for i in range(40)}


def test_the_window_s_end_stops_the_lines_in_flight(
    gateway: GatewayProcess, scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    """Lines still waiting on their upstream when the window ends are expired then, not waited
    for: the upstream here answers after longer than the test waits for the batch."""
    scripted_openai_server.reset()
    scripted_openai_server.script({"delay_ms": int(2 * DEADLINE_S * 1000), "times": -1})
    try:
        with one_second_window(gateway, tmp_path) as client:
            batch = start(client, requests(3))
            done = until(client, batch.id, finished)
            assert done.status == "expired" and completed(done) == 0
            unrun = lines_of(client, done.error_file_id)
            assert {x["custom_id"]: x["error"]["code"] for x in unrun} == {
                f"req-{i}": "batch_expired" for i in range(3)
            }
    finally:
        scripted_openai_server.reset()


@contextlib.contextmanager
def one_second_window(gateway: GatewayProcess, tmp_path: Path) -> Iterator[openai.OpenAI]:
    """A gateway like the module's, on a store of its own, whose batches' window is 1 s."""
    store = str(gateway.config.parent / "store")
    config = (
        gateway.config.read_text()
        .replace(store, str(tmp_path / "store"))
        .replace("poll_s: 0.05}", "poll_s: 0.05, window_s: 1}")
    )
    with (
        GatewayProcess(config, tmp_path) as short,
        openai.OpenAI(base_url=short.url + "/v1", api_key=KEY, max_retries=0) as client,
    ):
        yield client
