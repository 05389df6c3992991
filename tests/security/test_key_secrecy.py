"""API keys stay out of the gateway's output: its log (at debug, with the access log on) and its
metrics (probes that held from the start, kept so that they hold).

Every way a key reaches the gateway is tried, valid and invalid: `Authorization: Bearer`,
`x-portkey-api-key` (with a provider's key in Authorization beside it, as Portkey clients send
it), a malformed Authorization, the query string; on listings, completions (streamed, failed
upstream, refused), uploads, and a request the HTTP parser refuses. The log must show those
requests (one access-log line each) and the metrics must count them, so that what is looked
through is the real output; no key's secret part may be in either.
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.security.held_support import (
    OPENAI_MODEL,
    exchange,
    upstream,  # noqa: F401  (a pytest fixture)
)
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream

ALIAS = "oa"


def _key(who: str) -> str:
    return f"sk-{who}-{uuid.uuid4().hex}"


ALICE, BOB = _key("alice"), _key("bob")
WRONG, WRONG_PORTKEY = _key("wrong"), _key("wrong-portkey")
PROVIDER_KEY = _key("provider")  # a Portkey client's provider key, in Authorization
SECRETS = (ALICE, BOB, WRONG, WRONG_PORTKEY, PROVIDER_KEY)


def secret_parts(key: str) -> tuple[str, str]:
    """The key, and its random part (found even if a prefix were cut off or masked)."""
    return key, key.rsplit("-", 1)[1]


@pytest.fixture(scope="module")
def gateway(
    upstream: ScriptedUpstream,  # noqa: F811  (the imported fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("secrecy")
    config = f"""
auth:
  keys:
    - {{id: alice, key: {ALICE}, models: ["*"], providers: [oai]}}
    - {{id: bob, key: {BOB}, models: ["*"]}}
providers:
  oai: {{type: openai, base_url: "{upstream.url}", api_key: {OPENAI_TEST_KEY}}}
models:
  {ALIAS}: {{targets: [{{provider: oai, model: {OPENAI_MODEL}}}]}}
files: {{store: "{workdir / "store"}"}}
"""
    with GatewayProcess(config, workdir, log_level="debug", extra_args=("--access-log",)) as gw:
        yield gw


@dataclass(frozen=True)
class Call:
    """A request and the access-log line it must leave."""

    method: str
    path: str  # as the access log shows it (the query string included)
    headers: dict[str, str]
    status: int
    body: dict[str, object] | None = None

    def send(self, http: httpx.Client) -> None:
        response = http.request(self.method, self.path, headers=self.headers, json=self.body)
        assert response.status_code == self.status, response.text
        for secret in SECRETS:  # nor in what the caller gets back
            assert secret not in response.text

    @property
    def logged(self) -> re.Pattern[str]:
        line = f'"{self.method} {self.path} HTTP/1.1" {self.status}'
        return re.compile(re.escape(line))


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _completion(prompt: str, **extra: object) -> dict[str, object]:
    return {"model": ALIAS, "prompt": prompt, "max_tokens": 2, **extra}


CALLS = (
    Call("GET", "/v1/models", _bearer(ALICE), 200),
    Call("GET", "/v1/models", {"x-portkey-api-key": BOB}, 200),
    Call("GET", "/v1/models", _bearer(WRONG), 401),
    Call("GET", "/v1/models", {"x-portkey-api-key": WRONG_PORTKEY}, 401),
    Call("GET", "/v1/models", {"Authorization": f"Basic {ALICE}"}, 401),
    Call("GET", f"/v1/models/{ALIAS}", {"Authorization": f"Token {WRONG}"}, 401),
    Call("POST", "/v1/completions", _bearer(ALICE), 200, _completion("secrecy one")),
    Call(
        "POST",
        "/v1/completions",
        {"x-portkey-api-key": BOB, **_bearer(PROVIDER_KEY)},
        200,
        _completion("secrecy two"),
    ),
    Call(
        "POST",
        "/v1/completions",
        {"x-portkey-api-key": ALICE, "x-portkey-virtual-key": "oai"},
        200,
        _completion("secrecy three", stream=True),
    ),
    Call("POST", "/v1/completions", _bearer(ALICE), 502, _completion("__status_500__")),
    Call("POST", "/v1/completions", _bearer(WRONG), 401, _completion("secrecy four")),
    Call("POST", "/v1/completions", _bearer(BOB), 400, {"model": ALIAS, "prompt": 7.5}),
    Call("GET", "/v1/files", _bearer(ALICE), 200),
    Call("GET", "/v1/batches", {"x-portkey-api-key": WRONG_PORTKEY}, 401),
)


@pytest.fixture(scope="module")
def traffic(gateway: GatewayProcess) -> GatewayProcess:
    """Every call made once, plus an upload and a request the HTTP parser refuses."""
    with httpx.Client(base_url=gateway.url, trust_env=False) as http:
        for call in CALLS:
            call.send(http)
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0) as sdk:
        sdk.files.create(file=("keys.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    malformed = (
        f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {ALICE}\r\n"
        "Content-Length: 1\r\nContent-Length: 2\r\n\r\n{}"
    ).encode()
    assert [r.status for r in exchange(gateway.port, malformed).responses] == [400]
    return gateway


def test_the_log_shows_the_requests_and_no_key(traffic: GatewayProcess) -> None:
    logs = traffic.logs()
    for call in CALLS:
        assert call.logged.search(logs), f"no access-log line for {call}"
    assert '"POST /v1/files HTTP/1.1" 200' in logs
    assert "Invalid HTTP request received." in logs
    for secret in SECRETS:
        for part in secret_parts(secret):
            assert part not in logs


def test_the_metrics_count_the_requests_and_show_no_key(traffic: GatewayProcess) -> None:
    scraped = scrape(traffic.url)
    assert scraped.value("gateway_requests_total", model=ALIAS, status="200") >= 3
    text = httpx.get(traffic.url + "/metrics", trust_env=False).text
    for secret in SECRETS:
        for part in secret_parts(secret):
            assert part not in text


QUERY_CALLS: tuple[Callable[[str], Call], ...] = (
    lambda key: Call("GET", f"/v1/models?api_key={key}", _bearer(ALICE), 200),
    lambda key: Call("GET", f"/v1/models?key={key}", {}, 401),
    lambda key: Call("GET", f"/v1/files?purpose=batch&api-key={key}", _bearer(ALICE), 200),
)


def test_a_key_in_the_query_string_is_not_logged(gateway: GatewayProcess) -> None:
    """Callers do put keys in URLs (`?api_key=`, `?key=`): the gateway reads none from there,
    and must write none into its log either."""
    keys = (ALICE, _key("query"))
    calls = [make(key) for key in keys for make in QUERY_CALLS]
    with httpx.Client(base_url=gateway.url, trust_env=False) as http:
        for call in calls:
            call.send(http)
    logs = gateway.logs()
    for call in calls:
        method_path = f'"{call.method} {call.path.split("?")[0]}'
        assert method_path in logs, f"no access-log line for {call}"
    for key in keys:
        for part in secret_parts(key):
            assert part not in logs
