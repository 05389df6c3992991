"""uvicorn's own HTTP protocol tests (tests/protocols/test_http.py of its sdist, at the version
pyproject.toml pins), run against the gateway's protocol (gateway/server/protocol.py).

scripts/uvicorn_suite.py fetches them (`make test` runs it first; this module runs it too, and
fails collection if it fails). Each test that takes uvicorn's `http_protocol_cls` fixture runs
twice (conftest.py): `[gateway]` on GatewayHttpProtocol, `[uvicorn]` on uvicorn's own httptools
protocol, the control that the harness's mock loop (suite.py) changes nothing. The tests that
name uvicorn's httptools protocol outright run the gateway's. The two tables below say what is
not run and where the gateway's protocol answers otherwise; the run ends with a count.
"""

from __future__ import annotations

from tests.protocol_suite.suite import load

# uvicorn's tests not run here: each checks uvicorn's internals or another protocol.
DESELECTED: dict[str, str] = {
    "test_keepalive_timeout_with_pipelined_requests": (
        "reads uvicorn's timeout_keep_alive_task, cancelled while a request is answered; the "
        "gateway's one timer a connection is moved when it fires early (test_keepalive_timeout "
        "runs)"
    ),
    "test_keepalive_timeout_with_pipelined_websocket_upgrade": (
        "reads timeout_keep_alive_task after a WebSocket upgrade; uvicorn skips it for its "
        "httptools protocol"
    ),
    "test_supported_upgrade_request": (
        "a WebSocket handshake through wsproto, not installed (a skip); the gateway serves no "
        "WebSocket: an upgrade is a plain request (test_unsupported_ws_upgrade_request runs)"
    ),
    "test_huge_headers_h11protocol_failure": "uvicorn's h11 protocol, named outright",
    "test_huge_headers_h11protocol_failure_with_setting": "uvicorn's h11 protocol, named outright",
    "test_huge_headers_h11_max_incomplete": "uvicorn's h11 protocol, named outright",
}

# Where the gateway's protocol answers otherwise: strict xfails, so that a change on either side
# shows. "deliberate": the gateway's behaviour is the one to keep ("to fix": uvicorn's is).
UPGRADE_WARNINGS = (
    "deliberate: the gateway serves no WebSocket or h2c, so an Upgrade request is answered as a "
    "plain one (as uvicorn answers it) without uvicorn's warnings, 'Unsupported upgrade "
    "request.' and the advice to install a WebSocket library, which any client could call up"
)
HUGE_HEAD = (
    "deliberate: a request whose Cookie header alone is 64 KiB: uvicorn's httptools protocol "
    "takes a head of any size and answers 200; the gateway's answers 431 past its limit "
    "(gateway.server.protocol.ListenerLimits.max_head_bytes, 65,536 bytes by default)"
)
QUERY_HIDDEN = (
    "deliberate: the access log leaves a request's query string out ('/?...'): a caller may put "
    "a key there (?api_key=), and keys are never logged (gateway.server.protocol.QueryHidden)"
)
DIFFERENCES: dict[str, str] = {
    "test_request_logging[gateway-/?foo]": QUERY_HIDDEN,
    "test_request_logging[gateway-/?foo=bar]": QUERY_HIDDEN,
    "test_request_logging[gateway-/?foo=bar&baz=1]": QUERY_HIDDEN,
    "test_huge_headers_httptools_will_pass": HUGE_HEAD,
    "test_huge_headers_httptools": HUGE_HEAD,
    "test_header_upgrade_is_not_websocket_depend_installed[gateway]": UPGRADE_WARNINGS,
    "test_header_upgrade_is_websocket_depend_not_installed[gateway]": UPGRADE_WARNINGS,
    "test_unsupported_ws_upgrade_request_warn_on_auto[gateway]": UPGRADE_WARNINGS,
}

SUITE = load()
TESTS = {name: test for name, test in vars(SUITE).items() if name.startswith("test_")}
if not TESTS:
    raise RuntimeError(f"no tests in {SUITE.__file__}")
globals().update(TESTS)  # collected here, as this module's
