"""Upstreams reached through a real egress proxy (tinyproxy, in a subprocess of its own): an
https upstream through a CONNECT tunnel (TLS to the upstream inside it, certificates from a
test CA), a plain http upstream by absolute-form requests, the proxy's Basic credentials sent
when it requires them, its refusal a 502 that names the proxy and never the credentials,
HTTPS_PROXY from the environment with NO_PROXY, `proxy: none` over the environment, and one
tunnel carrying many requests.

What went through the proxy is what tinyproxy's log says it did (a CONNECT line per tunnel,
an absolute-form line per forwarded request) and what the upstream saw (tinyproxy's Via header
on a forwarded request; the connections it accepted). Readiness is probed (a TCP connect to the
proxy, /readyz of the gateway), never waited for by a sleep.
"""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from tests.gateway_proc import GatewayProcess
from tests.security.raw_upstream import RawUpstream, Request, completion, gateway_config, response
from tests.upstreams.procs import POLL_INTERVAL_S, free_port

KEY = "sk-proxy"
USER, PASSWORD = "proxy-user-7f3a", "pr0xy-s3cret-9c1e"  # distinctive: searched for in the logs
READY_S = 10.0
pytestmark = pytest.mark.skipif(shutil.which("tinyproxy") is None, reason="needs tinyproxy")


@dataclass
class Tinyproxy:
    port: int
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self, what: str) -> int:
        """How many requests tinyproxy logged whose request line begins with `what`
        ("CONNECT 127.0.0.1:443", "POST http://127.0.0.1:80/")."""
        line = re.compile(r"Request \(file descriptor \d+\): " + re.escape(what))
        return sum(1 for text in self.log.read_text().splitlines() if line.search(text))


def _config(port: int, log: Path, ports: Sequence[int], auth: bool) -> str:
    lines = [
        f"Port {port}",
        "Listen 127.0.0.1",
        "Timeout 60",
        "MaxClients 64",
        "Allow 127.0.0.1",
        "LogLevel Info",
        f'LogFile "{log}"',
        'ViaProxyName "tinyproxy"',
        *(f"ConnectPort {p}" for p in ports),  # tunnels only to the test's upstreams
    ]
    if auth:
        lines.append(f"BasicAuth {USER} {PASSWORD}")
    return "\n".join(lines) + "\n"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


@contextmanager
def tinyproxy(workdir: Path, ports: Sequence[int], auth: bool = False) -> Iterator[Tinyproxy]:
    """tinyproxy in the foreground on a free port, tunnelling only to `ports`; with BasicAuth
    (USER, PASSWORD) when `auth`. Ready once it accepts a connection."""
    port = free_port()
    log = workdir / f"tinyproxy-{port}.log"
    conf = workdir / f"tinyproxy-{port}.conf"
    conf.write_text(_config(port, log, ports, auth))
    output = (workdir / f"tinyproxy-{port}.out").open("wb")
    proc = subprocess.Popen(
        ["tinyproxy", "-d", "-c", str(conf)],
        stdout=output,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + READY_S
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tinyproxy did not start: {log.read_text(errors='replace')}")
            time.sleep(POLL_INTERVAL_S)
        yield Tinyproxy(port, log, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        output.close()


def _ok(request: Request) -> bytes:
    return response(200, completion("fine"))


@dataclass
class Net:
    gateway: GatewayProcess
    open: Tinyproxy  # no credentials asked for: the environment's HTTPS_PROXY
    guarded: Tinyproxy  # BasicAuth
    upstreams: dict[str, RawUpstream]

    def ask(self, alias: str) -> httpx.Response:
        body = {"model": alias, "prompt": "hi", "max_tokens": 1}
        headers = {"authorization": f"Bearer {KEY}"}
        url = self.gateway.url + "/v1/completions"
        return httpx.post(url, json=body, headers=headers, timeout=15, trust_env=False)

    def port(self, alias: str) -> int:
        return self.upstreams[alias].port


def _tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context


# alias: (TLS, the provider's proxy; None: the environment's)
PLAN = {
    "via-env": (True, None),  # HTTPS_PROXY: the open proxy
    "bypassed": (True, None),  # NO_PROXY=localhost: direct
    "direct": (True, "none"),  # proxy: none, over HTTPS_PROXY
    "tls-auth": (True, "guarded"),
    "plain-auth": (False, "guarded"),
    "tls-wrong": (True, "wrong"),
    "plain-wrong": (False, "wrong"),
    "tls-anonymous": (True, "anonymous"),
    "plain-anonymous": (False, "anonymous"),
}


def _proxy(name: str | None, guarded: Tinyproxy) -> str:
    where = f"127.0.0.1:{guarded.port}"
    return {
        None: "",
        "none": ", proxy: none",
        "guarded": f", proxy: 'http://{USER}:{PASSWORD}@{where}'",
        "wrong": f", proxy: 'http://{USER}:not-{PASSWORD}@{where}'",
        "anonymous": f", proxy: 'http://{where}'",
    }[name]


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    workdir: Path = tmp_path_factory.mktemp("proxy")
    ca = trustme.CA()
    ca_file = workdir / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with ExitStack() as stack:
        ups = {
            alias: stack.enter_context(RawUpstream(_ok, tls=_tls(ca) if tls else None))
            for alias, (tls, _) in PLAN.items()
        }
        ports = [up.port for up in ups.values()]
        opened = stack.enter_context(tinyproxy(workdir, ports))
        guarded = stack.enter_context(tinyproxy(workdir, ports, auth=True))
        urls = {alias: up.url for alias, up in ups.items()}
        urls["bypassed"] = urls["bypassed"].replace("127.0.0.1", "localhost")
        extra = {alias: _proxy(name, guarded) for alias, (_, name) in PLAN.items()}
        env = {
            "SSL_CERT_FILE": str(ca_file),
            "HTTPS_PROXY": opened.url,
            "HTTP_PROXY": opened.url,
            "NO_PROXY": "localhost",
        }
        gateway = GatewayProcess(
            gateway_config(urls, {"proxy": KEY}, extra), workdir, env=env, log_level="info"
        )
        yield Net(stack.enter_context(gateway), opened, guarded, ups)


def _fine(resp: httpx.Response) -> None:
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "fine"


def test_an_https_upstream_through_the_environments_proxy(net: Net) -> None:
    _fine(net.ask("via-env"))
    assert net.open.requests(f"CONNECT 127.0.0.1:{net.port('via-env')} ") == 1


def test_one_tunnel_carries_many_requests(net: Net) -> None:
    up = net.upstreams["via-env"]
    before = net.open.requests(f"CONNECT 127.0.0.1:{up.port} ")
    for _ in range(5):
        _fine(net.ask("via-env"))
    assert net.open.requests(f"CONNECT 127.0.0.1:{up.port} ") == max(before, 1)
    assert up.connections == 1 and {r.connection for r in up.requests} == {0}


def test_no_proxy_is_honoured(net: Net) -> None:
    _fine(net.ask("bypassed"))
    assert net.open.requests(f"CONNECT localhost:{net.port('bypassed')}") == 0
    assert net.upstreams["bypassed"].connections == 1


def test_proxy_none_overrides_the_environment(net: Net) -> None:
    _fine(net.ask("direct"))
    assert net.open.requests(f"CONNECT 127.0.0.1:{net.port('direct')} ") == 0
    assert net.upstreams["direct"].requests


def test_credentials_open_the_tunnel(net: Net) -> None:
    _fine(net.ask("tls-auth"))
    assert net.guarded.requests(f"CONNECT 127.0.0.1:{net.port('tls-auth')} ") == 1


def test_a_plain_upstream_through_absolute_form_requests(net: Net) -> None:
    _fine(net.ask("plain-auth"))
    up = net.upstreams["plain-auth"]
    assert net.guarded.requests(f"POST http://127.0.0.1:{up.port}/v1/completions ") >= 1
    head = up.requests[-1].head.decode("latin-1").lower()
    assert head.startswith("post /v1/completions http/1.")  # origin-form past the proxy
    assert "\r\nvia: 1.1 tinyproxy" in head  # the proxy's mark on what it forwarded
    assert "proxy-authorization" not in head  # the proxy's credentials stop at the proxy


# alias: tinyproxy's refusal (a 401 to credentials it does not know, a 407 to none at all)
REFUSED = {"tls-wrong": 401, "tls-anonymous": 407, "plain-anonymous": 407}


@pytest.mark.parametrize("alias", sorted(REFUSED))
def test_the_proxys_refusal_is_a_502_naming_the_proxy(net: Net, alias: str) -> None:
    resp = net.ask(alias)
    assert resp.status_code == 502, resp.text
    message = resp.json()["error"]["message"]
    assert f"its proxy {net.guarded.url} refused" in message, message
    assert f": {REFUSED[alias]} (" in message and f"{alias}/m" in message, message
    assert not net.upstreams[alias].requests  # never reached
    for secret in (USER, PASSWORD):
        assert secret not in resp.text


def test_wrong_credentials_on_a_forwarded_request(net: Net) -> None:
    """tinyproxy answers them with a 401, which in answer to a forwarded request cannot be told
    from the upstream's own 401: a 502 all the same (the gateway's credentials, not the
    caller's), and never the credentials."""
    resp = net.ask("plain-wrong")
    assert resp.status_code == 502, resp.text
    assert not net.upstreams["plain-wrong"].requests
    for secret in (USER, PASSWORD):
        assert secret not in resp.text


def test_the_credentials_are_nowhere_in_the_gateways_log(net: Net) -> None:
    for alias in ("tls-auth", "plain-auth", "tls-wrong", "plain-wrong", "plain-anonymous"):
        net.ask(alias)
    logs = net.gateway.logs()
    assert f"reached through the proxy {net.guarded.url}" in logs  # the proxy, named
    for secret in (USER, PASSWORD):
        assert secret not in logs
