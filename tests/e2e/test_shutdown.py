"""Stopping the gateway as Kubernetes does (SIGTERM after the preStop wait): it stops accepting
at once, lets a stream in progress finish within --shutdown-timeout, then exits 0; a stream
that outlasts the timeout is cut, and the process still exits (the pod's grace period is
preStop + this timeout + a margin, so the kubelet's SIGKILL never comes first)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.support import FULL_KEY, auth, scripted_providers
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import ScriptedUpstream

BODY = {"model": "m", "prompt": "Say this is a test", "max_tokens": 8, "stream": True}
EXIT_WAIT_S = 30.0  # a deadline for the process to go, not a timing assertion


def config(upstream: ScriptedUpstream) -> str:
    providers = scripted_providers(upstream.url, "http://127.0.0.1:1/v1")
    return yaml.safe_dump({
        "auth": {"keys": [{"id": "k", "key": FULL_KEY}]},
        "providers": {"oai": providers["oai"]},
        "models": {"m": {"targets": [{"provider": "oai"}]}},
    })  # fmt: skip


@pytest.fixture
def upstream(scripted_openai_server: ScriptedUpstream) -> Iterator[ScriptedUpstream]:
    scripted_openai_server.reset()
    yield scripted_openai_server
    scripted_openai_server.reset()


def stop_mid_stream(gw: GatewayProcess, upstream: ScriptedUpstream, stall_ms: int) -> bytes:
    """Start a stream the upstream stalls after 2 events, SIGTERM the gateway once the first
    event is through, and return what the caller got."""
    upstream.script({"stall_after": 2, "stall_ms": stall_ms})
    body = b""
    with (
        httpx.Client(base_url=gw.url, timeout=30.0, trust_env=False) as http,
        http.stream("POST", "/v1/completions", json=BODY, headers=auth()) as resp,
    ):
        assert resp.status_code == 200
        chunks = resp.iter_raw()
        body += next(chunks)
        gw.send_signal(signal.SIGTERM)
        wait_refused(gw)
        try:
            for chunk in chunks:
                body += chunk
        except httpx.RemoteProtocolError:
            pass  # cut: the body is incomplete
    return body


def wait_refused(gw: GatewayProcess) -> None:
    """New connections are refused once the signal is handled (while the stream goes on).

    A probe whose connection was accepted just before the listener closed is closed unanswered
    by the shutdown (uvicorn closes every connection with no request under way): the server
    stopped, but the test has not seen a refusal yet, so it probes again. (Taking that close for
    a failure made this test fail now and then on a loaded machine.)"""
    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        try:
            httpx.get(gw.url + "/livez", timeout=5.0, trust_env=False)
        except httpx.ConnectError:
            return
        except (httpx.RemoteProtocolError, httpx.ReadError):
            pass  # accepted, then closed by the shutdown before it was read
        assert time.monotonic() < deadline, "the gateway kept accepting after SIGTERM"
        time.sleep(0.02)


def exits_gracefully(gw: GatewayProcess) -> None:
    """uvicorn re-raises the SIGTERM once its shutdown is done (exit status 143, as Kubernetes
    expects); what matters is that the shutdown ran to its end."""
    proc: subprocess.Popen[bytes] = gw._server.proc
    assert proc.wait(EXIT_WAIT_S) in (0, -signal.SIGTERM)
    assert "Application shutdown complete." in gw.logs()


@pytest.mark.parametrize(
    ("shutdown_timeout", "stall_ms", "finishes"),
    [("30", 1500, True), ("0.5", 20_000, False)],
    ids=["within-the-timeout", "longer-than-the-timeout"],
)
def test_a_stream_in_progress_at_sigterm(
    upstream: ScriptedUpstream, tmp_path: Path, shutdown_timeout: str, stall_ms: int,
    finishes: bool,
) -> None:  # fmt: skip
    args = (f"--shutdown-timeout={shutdown_timeout}",)
    with GatewayProcess(config(upstream), tmp_path, log_level="info", extra_args=args) as gw:
        body = stop_mid_stream(gw, upstream, stall_ms)
        assert body.endswith(b"data: [DONE]\n\n") == finishes
        assert (b'"finish_reason":"length"' in body) == finishes
        exits_gracefully(gw)


def test_requests_racing_the_signal_are_answered_refused_or_closed(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """Probes sent without pause while SIGTERM arrives: each is answered, refused, or (accepted
    just before the listener closed) closed unanswered, an error a client retries; none hangs
    or gets a wrong answer, and the process exits."""
    outcomes: list[str] = []
    stop = threading.Event()
    with GatewayProcess(config(upstream), tmp_path, log_level="info") as gw:

        def probe() -> None:
            while not stop.is_set():
                try:
                    r = httpx.get(gw.url + "/livez", timeout=EXIT_WAIT_S, trust_env=False)
                    outcomes.append(f"answered {r.status_code}")
                except httpx.ConnectError:
                    outcomes.append("refused")
                except (httpx.RemoteProtocolError, httpx.ReadError):
                    outcomes.append("closed")

        probes = [threading.Thread(target=probe) for _ in range(4)]
        for t in probes:
            t.start()
        seen(outcomes, "answered 200")
        gw.send_signal(signal.SIGTERM)
        seen(outcomes, "refused")
        stop.set()
        for t in probes:
            t.join(EXIT_WAIT_S)
        exits_gracefully(gw)
    assert set(outcomes) <= {"answered 200", "refused", "closed"}, set(outcomes)


def seen(outcomes: list[str], outcome: str) -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while outcome not in outcomes:
        assert time.monotonic() < deadline, f"no probe {outcome}"
        time.sleep(0.01)
