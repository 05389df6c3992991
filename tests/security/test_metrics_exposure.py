"""/metrics exposure (issue 33, P4), against `gateway serve` as users run it.

/metrics lists every alias, provider and upstream model, and a render is CPU work: whoever
reached the API port could read it, and scrapers at once each cost a render on the event loop.
Now `metrics.listen` serves it on a listener of its own (the API port answers 404 for it), a
small one: GET or HEAD /metrics only, a bounded request head, a timeout, a cap on connections;
with `--workers 2` every worker listens on the address (SO_REUSEPORT) and answers the whole.
`metrics.require_key` makes a scrape present an API key (401 in OpenAI's shape without). Scrapes
during a render share it, and those within `metrics.min_interval_s` of a render get its text; a
render counts itself in `gateway_metrics_renders_total`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.metrics_text import parse
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import free_port

KEY = "k-scraper-secret"
AUTH = {"authorization": f"Bearer {KEY}"}
TIMEOUT_S = 0.5  # the listener's, for a request head: small, so a test waits it out quickly
CAP = 3  # the listener's open connections
INTERVAL_S = 60.0  # a render's text is served this long: every scrape of a test comes within it
RENDERS = "gateway_metrics_renders_total"
POLL_S = 10.0


def config(metrics: str) -> str:
    """An upstream that refuses connections: a completion is a 502, counted all the same."""
    return f"""
auth: {{keys: [{{id: scraper, key: {KEY}}}]}}
providers: {{up: {{type: openai, base_url: "http://127.0.0.1:9/v1", api_key: sk-x}}}}
models: {{m: {{targets: [{{provider: up, model: u}}]}}}}
metrics: {metrics}
"""


class Listening:
    def __init__(self, gw: GatewayProcess, port: int) -> None:
        self.gw = gw
        self.port = port
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def listening(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listening]:
    port = free_port()
    metrics = (
        f"{{listen: '127.0.0.1:{port}', require_key: true, min_interval_s: 0, "
        f"timeout_s: {TIMEOUT_S}, max_connections: {CAP}}}"
    )
    with GatewayProcess(config(metrics), tmp_path_factory.mktemp("listen")) as gw:
        yield Listening(gw, port)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(config("{require_key: true}"), tmp_path_factory.mktemp("keyed")) as gw:
        yield gw


def complete(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "x"}, headers=AUTH)
    assert r.status_code == 502


def assert_error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    error: dict[str, object] = r.json()["error"]
    assert {"message", "type", "param", "code"} <= error.keys()
    return error


# ---------------------------------------------------------------- a listener of its own


def test_with_listen_the_api_port_answers_404_and_the_metrics_port_serves(
    listening: Listening,
) -> None:
    complete(listening.gw.url)
    assert_error(httpx.get(f"{listening.gw.url}/metrics", headers=AUTH), 404)
    assert_error(httpx.get(f"{listening.gw.url}/metrics"), 404)  # no key asked: not there
    r = httpx.get(f"{listening.url}/metrics", headers=AUTH)
    assert r.status_code == 200 and r.headers["connection"] == "close"
    assert parse(r).value("gateway_requests_total", model="m", status="502") >= 1
    head = httpx.head(f"{listening.url}/metrics", headers=AUTH)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) > 0


def test_the_metrics_port_wants_a_key_with_require_key(listening: Listening) -> None:
    error = assert_error(httpx.get(f"{listening.url}/metrics"), 401)
    assert error["code"] == "missing_api_key"
    wrong = {"authorization": "Bearer k-not-configured"}
    assert_error(httpx.get(f"{listening.url}/metrics", headers=wrong), 401)
    assert httpx.get(f"{listening.url}/metrics", headers={"x-portkey-api-key": KEY}).is_success


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/metrics", 405),
        ("DELETE", "/metrics", 405),
        ("GET", "/", 404),
        ("GET", "/v1/models", 404),  # the listener serves metrics, not the API
        ("POST", "/v1/completions", 404),
        ("GET", "/livez", 404),
        ("GET", "/metrics/x", 404),
    ],
)
def test_the_metrics_port_serves_get_and_head_of_metrics_only(
    listening: Listening, method: str, path: str, status: int
) -> None:
    r = httpx.request(method, f"{listening.url}{path}", headers=AUTH, json={"model": "m"})
    assert_error(r, status)
    if status == 405:
        assert r.headers["allow"] == "GET, HEAD"


def raw(port: int, data: bytes) -> bytes:
    """Send `data`, then read until the listener closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=POLL_S) as s:
        s.sendall(data)
        return read_all(s)


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_request_head_over_the_bound_is_refused(listening: Listening) -> None:
    head = b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 16384 + b"\r\n\r\n"
    assert raw(listening.port, head).startswith(b"HTTP/1.1 431 ")


def test_a_malformed_request_is_a_400(listening: Listening) -> None:
    for head in (b"GET /metrics\r\n\r\n", b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n"):
        assert raw(listening.port, head).startswith(b"HTTP/1.1 400 ")


def test_a_silent_or_slow_client_is_cut_off_at_the_timeout(listening: Listening) -> None:
    """Half a request head, then nothing: the listener closes without an answer."""
    started = time.monotonic()
    assert raw(listening.port, b"GET /metrics HTTP/1.1\r\nhost: x\r\n") == b""
    assert time.monotonic() - started < POLL_S


def test_connections_over_the_cap_are_answered_503(listening: Listening) -> None:
    held = [socket.create_connection(("127.0.0.1", listening.port)) for _ in range(CAP)]
    try:
        with socket.create_connection(("127.0.0.1", listening.port), timeout=POLL_S) as extra:
            assert read_all(extra).startswith(b"HTTP/1.1 503 ")
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + POLL_S  # the closed ones free their places once seen
    while (r := httpx.get(f"{listening.url}/metrics", headers=AUTH)).status_code == 503:
        assert time.monotonic() < deadline
    assert r.status_code == 200


# ---------------------------------------------------------------- a key on the API port


def test_require_key_wants_a_configured_key(keyed: GatewayProcess) -> None:
    error = assert_error(httpx.get(f"{keyed.url}/metrics"), 401)
    assert error["code"] == "missing_api_key"
    wrong = {"authorization": "Bearer k-not-configured"}
    assert_error(httpx.get(f"{keyed.url}/metrics", headers=wrong), 401)
    assert httpx.get(f"{keyed.url}/metrics", headers=AUTH).status_code == 200


def test_twenty_scrapers_at_once_cost_one_render(tmp_path: Path) -> None:
    """A request, then 20 scrapes at once: they share the first render (during it, or its text
    kept for min_interval_s), which counts the request; a scrape after them gets the same."""
    metrics = f"{{require_key: true, min_interval_s: {INTERVAL_S}}}"
    with GatewayProcess(config(metrics), tmp_path) as gw:
        complete(gw.url)

        async def scrapes() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=POLL_S) as c:
                return await asyncio.gather(*(c.get("/metrics") for _ in range(20)))

        answers = asyncio.run(scrapes())
        assert {r.status_code for r in answers} == {200}
        assert len({r.content for r in answers}) == 1
        shared = parse(answers[0])
        assert shared.value(RENDERS) == 1
        assert shared.value("gateway_requests_total", model="m", status="502") == 1
        later = httpx.get(f"{gw.url}/metrics", headers=AUTH)
        assert later.content == answers[0].content


# ---------------------------------------------------------------- several workers


def test_every_worker_serves_the_whole_on_the_metrics_port(tmp_path: Path) -> None:
    port = free_port()
    metrics = f"{{listen: '127.0.0.1:{port}', min_interval_s: 0}}"
    with GatewayProcess(config(metrics), tmp_path, workers=2) as gw:
        deadline = time.monotonic() + POLL_S
        while len(listeners(gw.pid, port)) < 2:  # each worker binds as it starts
            assert time.monotonic() < deadline, listeners(gw.pid, port)
        for _ in range(4):
            complete(gw.url)
        url = f"http://127.0.0.1:{port}/metrics"
        totals = {parse(httpx.get(url)).value("gateway_requests_total") for _ in range(12)}
        assert totals == {4}  # whichever worker answered (a new connection each time)
        assert httpx.get(f"{gw.url}/metrics").status_code == 404


def listeners(parent: int, port: int) -> set[int]:
    """The children of `parent` holding a socket that listens on `port` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    holders = set()
    for pid in children(parent):
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            if any(os.readlink(fd_dir / fd) in inodes for fd in os.listdir(fd_dir)):
                holders.add(pid)
        except OSError:  # gone, or an fd closed while read
            continue
    return holders


def children(parent: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            out.append(int(stat.parent.name))
    return out
