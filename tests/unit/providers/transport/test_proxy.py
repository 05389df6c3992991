"""Egress proxies (providers/transport/proxy.py): a proxy's URL read, credentials kept out of
sight, the environment's proxies as curl reads them, the CONNECT request, and a proxy's answer to
it read as llhttp reads heads (tests/security/test_http1_differential.py holds that reading to
h11's)."""

from __future__ import annotations

import base64

import pytest

from providers.transport.proxy import (
    MAX_ANSWER_BYTES,
    BadAnswer,
    Proxy,
    TunnelAnswer,
    connect_request,
    from_environment,
    refusal,
)

PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "REQUEST_METHOD")


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment with no proxy set (either case), for the test to set its own."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def credentials(proxy: Proxy) -> str:
    assert proxy.authorization is not None and proxy.authorization.startswith("Basic ")
    return base64.b64decode(proxy.authorization.removeprefix("Basic ")).decode()


# ---------------------------------------------------------------- a proxy's URL


def test_a_proxy_url_with_credentials() -> None:
    proxy = Proxy.of("http://us%40er:p%3Ass%20w@proxy.corp:3128")
    assert (proxy.host, proxy.port) == ("proxy.corp", 3128)
    assert credentials(proxy) == "us@er:p:ss w"  # percent-decoded, as curl sends them
    assert proxy.shown == "http://proxy.corp:3128"
    assert "p:ss" not in repr(proxy) and "Basic" not in repr(proxy)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("proxy.corp:3128", "proxy.corp", 3128),  # no scheme: http, as curl reads it
        ("http://proxy.corp", "proxy.corp", 80),
        ("http://[::1]:8080/", "::1", 8080),
        ("HTTP://Proxy.Corp:1", "proxy.corp", 1),
    ],
)
def test_proxy_urls(url: str, host: str, port: int) -> None:
    proxy = Proxy.of(url)
    assert (proxy.host, proxy.port, proxy.authorization) == (host, port, None)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://user:secret@proxy.corp:3128", "https:// proxies are not supported"),
        ("socks5://user:secret@proxy.corp:1080", "socks5:// proxies are not supported"),
        ("http://user:secret@proxy.corp:99999", "port"),
        ("http://user:secret@proxy.corp:x", "port"),
        ("http://user:secret@proxy.corp:3128/path", "no path"),
        ("http://user:secret@:3128", "host:port"),
    ],
)
def test_a_bad_proxy_url_is_refused_without_its_credentials(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        Proxy.of(url)
    assert "secret" not in str(caught.value)


# ---------------------------------------------------------------- the environment


def test_the_environment_names_a_proxy_per_scheme(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("HTTPS_PROXY", "http://a:b@secure.proxy:3128")
    environ.setenv("HTTP_PROXY", "plain.proxy:8080")
    secure = from_environment("https", "api.example", 443)
    assert secure is not None and secure.shown == "http://secure.proxy:3128"
    assert credentials(secure) == "a:b"
    plain = from_environment("http", "api.example", 80)
    assert plain is not None and plain.shown == "http://plain.proxy:8080"


def test_lower_case_wins(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("HTTPS_PROXY", "http://upper:1")
    environ.setenv("https_proxy", "http://lower:2")
    proxy = from_environment("https", "api.example", 443)
    assert proxy is not None and proxy.shown == "http://lower:2"


@pytest.mark.parametrize(
    ("no_proxy", "host", "bypassed"),
    [
        ("llm.internal", "llm.internal", True),
        ("internal", "llm.internal", True),  # a domain suffix
        (".internal", "llm.internal", True),
        ("other.internal", "llm.internal", False),
        ("xinternal", "llm.internal", False),
        ("*", "anything.example", True),
        ("a.example, 127.0.0.1 ,b.example", "127.0.0.1", True),
        ("llm.internal:8443", "llm.internal", True),  # host:port, as the upstream's
        ("llm.internal:9999", "llm.internal", False),
        ("::1", "::1", True),
    ],
)
def test_no_proxy(environ: pytest.MonkeyPatch, no_proxy: str, host: str, bypassed: bool) -> None:
    environ.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    environ.setenv("NO_PROXY", no_proxy)
    assert (from_environment("https", host, 8443) is None) is bypassed


def test_no_proxy_set_no_proxy_used(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("HTTP_PROXY", "http://proxy.corp:3128")
    assert from_environment("https", "api.example", 443) is None  # HTTP_PROXY is for http


def test_a_cgi_request_method_turns_http_proxy_off(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("HTTP_PROXY", "http://attacker:1")  # httpoxy: a request's Proxy header
    environ.setenv("REQUEST_METHOD", "GET")
    assert from_environment("http", "api.example", 80) is None


# ---------------------------------------------------------------- CONNECT


def test_the_connect_request() -> None:
    proxy = Proxy.of("http://u:p@proxy.corp:3128")
    assert connect_request("llm.internal", 8443, proxy) == (
        b"CONNECT llm.internal:8443 HTTP/1.1\r\nhost: llm.internal:8443\r\n"
        b"proxy-authorization: Basic dTpw\r\n\r\n"
    )
    bare = connect_request("::1", 443, Proxy.of("proxy.corp:1"))
    assert bare == b"CONNECT [::1]:443 HTTP/1.1\r\nhost: [::1]:443\r\n\r\n"


def read(*parts: bytes) -> int | None:
    answer = TunnelAnswer()
    for part in parts:
        status = answer.feed(part)
        if status is not None:
            return status
    return None


@pytest.mark.parametrize(
    ("parts", "status"),
    [
        ((b"HTTP/1.1 200 Connection established\r\n\r\n",), 200),
        ((b"HTTP/1.0 200 OK\r\nProxy-agent: x\r\n\r\n",), 200),
        ((b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",), 200),
        ((b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",), 200),
        ((b"HTTP/1.1 2", b"00 OK\r", b"\n", b"\r\n"), 200),
        ((b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 3\r\n\r\nno!",), 407),
        ((b"HTTP/1.1 403 Forbidden\r\n\r\n",), 403),
        ((b"HTTP/1.1 200 OK\r\n",), None),  # more to come
    ],
)
def test_an_answer_to_connect(parts: tuple[bytes, ...], status: int | None) -> None:
    assert read(*parts) == status


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"HTTP/1.1 200 OK\r\n\r\n\x16\x03\x01", "bytes after its 200"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", "101"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not HTTP/1.1"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "not HTTP/1.1"),
        (b"\r\n\r\n", "not HTTP/1.1"),
        (b"HTTP/1.1 200 OK\r\nx: " + b"v" * MAX_ANSWER_BYTES, f"over {MAX_ANSWER_BYTES}"),
        (b"HTTP/1.1 100 Continue\r\nx: " + b"v" * MAX_ANSWER_BYTES + b"\r\n\r\n", "over"),
    ],
)
def test_what_is_no_answer_to_connect(data: bytes, says: str) -> None:
    with pytest.raises(BadAnswer, match=says):
        read(data)


def test_a_refusal_in_words() -> None:
    assert refusal(407) == "407 (proxy authentication required)"
    assert refusal(418) == "418"
