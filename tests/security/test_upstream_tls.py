"""A TLS failure with an upstream is a 502 that names its reason: an unknown CA, a host name the
certificate does not match, an expired certificate, or an upstream that wants a client
certificate. Before, the first three all read "CERTIFICATE_VERIFY_FAILED" and the last "closed
the connection".

Real TLS: upstreams with certificates from test CAs (trustme); the gateway trusts the test CA
through SSL_CERT_FILE, which the standard library's default context reads, or through a
provider's own `tls` block: its CA (`ca_file`), its client certificate (`cert_file`,
`key_file`), or no verification at all (`verify: false`, warned of at start). A refused
certificate is not tried again on the same target (it would be refused again), but a fallback
moves on to the next.
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from tests.gateway_proc import GatewayProcess
from tests.security.raw_upstream import RawUpstream, Request, completion, gateway_config, response

KEY = "sk-tls"
# alias: what the 502 must say
EXPECTED = {
    "unknown-ca": "signed by an unknown CA",
    "wrong-host": "does not match the host name",
    "expired": "has expired",
    "wants-client-cert": "requires a client certificate",
}


def _ok(request: Request) -> bytes:
    return response(200, completion("fine"))


def _server(cert: trustme.LeafCert, want_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    if want_client_cert:
        trustme.CA().configure_trust(ctx)  # a CA the gateway has no certificate of
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    trusted, stranger = trustme.CA(), trustme.CA()
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    contexts = {
        "unknown-ca": _server(stranger.issue_cert("127.0.0.1")),
        "wrong-host": _server(trusted.issue_cert("upstream.example")),
        "expired": _server(
            trusted.issue_cert("127.0.0.1", not_before=past, not_after=past + datetime.timedelta(1))
        ),
        "wants-client-cert": _server(trusted.issue_cert("127.0.0.1"), want_client_cert=True),
        "good": _server(trusted.issue_cert("127.0.0.1")),
    }
    workdir: Path = tmp_path_factory.mktemp("tls")
    ca_file = workdir / "ca.pem"
    trusted.cert_pem.write_to_path(str(ca_file))
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(RawUpstream(_ok, tls=ctx)).url
            for name, ctx in contexts.items()
        }
        config = gateway_config(urls, {"tls": KEY})
        env = {"SSL_CERT_FILE": str(ca_file)}
        yield stack.enter_context(GatewayProcess(config, workdir, env=env))


def _ask(gw: GatewayProcess, alias: str) -> httpx.Response:
    body = {"model": alias, "prompt": "hi", "max_tokens": 1}
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(gw.url + "/v1/completions", json=body, headers=headers, timeout=10)


def test_a_trusted_upstream_answers(gateway: GatewayProcess) -> None:
    resp = _ask(gateway, "good")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "fine"


@pytest.mark.parametrize("alias", sorted(EXPECTED))
def test_the_502_names_the_reason(gateway: GatewayProcess, alias: str) -> None:
    resp = _ask(gateway, alias)
    assert resp.status_code == 502, resp.text
    message = resp.json()["error"]["message"]
    assert EXPECTED[alias] in message, message
    assert f"{alias}/m" in message  # the target that failed


# ---------------------------------------------------------------- a provider's own tls block


@dataclass
class Provided:
    """A gateway whose providers each have a `tls` block, and their upstreams."""

    gateway: GatewayProcess
    upstreams: dict[str, RawUpstream]


def _pem(workdir: Path, name: str, blob: trustme.Blob) -> str:
    path = workdir / f"{name}.pem"
    blob.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="module")
def provided(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provided]:
    trusted, stranger, client_ca = trustme.CA(), trustme.CA(), trustme.CA()
    workdir: Path = tmp_path_factory.mktemp("tls-provided")
    ca = _pem(workdir, "ca", trusted.cert_pem)
    client = client_ca.issue_cert("gateway@example")
    cert = _pem(workdir, "client", client.cert_chain_pems[0])
    key = _pem(workdir, "client-key", client.private_key_pem)
    wants_client = _server(trusted.issue_cert("127.0.0.1"))
    client_ca.configure_trust(wants_client)
    wants_client.verify_mode = ssl.CERT_REQUIRED
    own = f"{{ca_file: '{ca}'}}"
    # name: (the upstream's TLS, the provider's tls block)
    plan = {
        "own-ca": (_server(trusted.issue_cert("127.0.0.1")), own),
        "wrong-ca": (_server(stranger.issue_cert("127.0.0.1")), own),
        "wrong-host": (_server(trusted.issue_cert("upstream.example")), own),
        "client-cert": (
            wants_client,
            f"{{ca_file: '{ca}', cert_file: '{cert}', key_file: '{key}'}}",
        ),
        "insecure": (_server(stranger.issue_cert("upstream.example")), "{verify: false}"),
        "refused-then-fallback": (_server(stranger.issue_cert("127.0.0.1")), own),
        "refused-alone": (_server(stranger.issue_cert("127.0.0.1")), own),
    }
    models = {
        "fallback": "{strategy: fallback, retry: {attempts: 3, backoff_s: 0.01}, targets: "
        "[{provider: refused-then-fallback, model: m}, {provider: own-ca, model: m}]}",
        "retried": "{retry: {attempts: 3, backoff_s: 0.01}, targets: "
        "[{provider: refused-alone, model: m}]}",
    }
    with ExitStack() as stack:
        ups = {
            name: stack.enter_context(RawUpstream(_ok, tls=ctx)) for name, (ctx, _) in plan.items()
        }
        extra = {name: f", tls: {block}" for name, (_, block) in plan.items()}
        config = gateway_config({n: u.url for n, u in ups.items()}, {"tls": KEY}, extra, models)
        # The system's store replaced by an unrelated CA: only each provider's own CA is trusted.
        env = {"SSL_CERT_FILE": _pem(workdir, "unrelated", trustme.CA().cert_pem)}
        yield Provided(stack.enter_context(GatewayProcess(config, workdir, env=env)), ups)


@pytest.mark.parametrize("alias", ["own-ca", "client-cert", "insecure"])
def test_a_providers_own_tls_answers(provided: Provided, alias: str) -> None:
    resp = _ask(provided.gateway, alias)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "fine"


@pytest.mark.parametrize(
    ("alias", "reason"),
    [("wrong-ca", "signed by an unknown CA"), ("wrong-host", "does not match the host name")],
)
def test_a_providers_own_ca_refuses_what_it_did_not_sign(
    provided: Provided, alias: str, reason: str
) -> None:
    resp = _ask(provided.gateway, alias)
    assert resp.status_code == 502, resp.text
    message = resp.json()["error"]["message"]
    assert "its certificate was refused" in message and reason in message, message
    assert f"{alias}/m" in message


def test_verify_false_is_warned_of_at_start(provided: Provided) -> None:
    warned = [line for line in provided.gateway.logs().splitlines() if "insecure" in line]
    assert any("tls.verify is false" in line for line in warned), provided.gateway.logs()


def test_a_refused_certificate_is_not_retried(provided: Provided) -> None:
    upstream = provided.upstreams["refused-alone"]
    before = upstream.connections
    resp = _ask(provided.gateway, "retried")
    assert resp.status_code == 502, resp.text
    assert "its certificate was refused" in resp.json()["error"]["message"]
    assert upstream.connections == before + 1, "tried again on the same target"


def test_a_refused_certificate_falls_back_to_the_next_target(provided: Provided) -> None:
    refused = provided.upstreams["refused-then-fallback"]
    before = refused.connections
    resp = _ask(provided.gateway, "fallback")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "fine"
    assert refused.connections == before + 1  # once, then the fallback's target
