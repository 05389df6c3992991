"""Server-side request forgery: no header, Portkey config, request target, body or upstream answer
makes the gateway open a connection to a host its config does not name (probes that held from
the start, kept so that they hold).

Every probe points at the canary, a listener on another loopback address that no config names;
each test ends by asserting that nothing connected to it (`test_the_canary_sees_a_connection`
shows that a connection would be seen). A probe the gateway serves is served by the configured
upstream, as if the probe were not there; one it refuses is refused precisely (status, param).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.batches import finished, start, until
from tests.gateway_proc import GatewayProcess
from tests.security.held_support import (
    OPENAI_MODEL,
    PARSER_400_BODY,
    Canary,
    bearer,
    canary,  # noqa: F401  (a pytest fixture)
    exchange,
    json_request,
    request_bytes,
    upstream,  # noqa: F401  (a pytest fixture)
    upstream_prompts,
)
from tests.upstreams.fakegen import expected_text
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream

KEY = "sk-ssrf-probe"
ALIAS = "oa"
PROMPT = "Say this is a test"
BATCH_DEADLINE_S = 10.0  # a deadline on waiting, not a timing assertion


@pytest.fixture(scope="module")
def gateway(
    upstream: ScriptedUpstream,  # noqa: F811  (the imported fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("ssrf")
    config = f"""
auth:
  keys: [{{id: prober, key: {KEY}, models: ["*"], providers: [oai]}}]
providers:
  oai: {{type: openai, base_url: "{upstream.url}", api_key: {OPENAI_TEST_KEY}}}
models:
  {ALIAS}: {{targets: [{{provider: oai, model: {OPENAI_MODEL}}}]}}
files: {{store: "{workdir / "store"}"}}
batches: {{poll_s: 0.05}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield gw


@pytest.fixture
def watched(canary: Canary) -> Iterator[Canary]:  # noqa: F811
    """The canary, asserted untouched once the test is over."""
    before = canary.connections()
    yield canary
    assert canary.connections() == before, "the gateway connected to a host no config names"


@pytest.fixture
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=bearer(KEY), trust_env=False) as client:
        yield client


def complete(
    http: httpx.Client, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    payload = {"model": ALIAS, "prompt": PROMPT, "max_tokens": 2, **body}
    return http.post("/v1/completions", json=payload, headers=headers)


def error_param(response: httpx.Response) -> Any:
    return response.json()["error"]["param"]


def test_the_canary_sees_a_connection(canary: Canary) -> None:  # noqa: F811
    """The probes' observation works: a connection to the canary is counted."""
    before = len(canary.connections())
    socket.create_connection((canary.host, canary.port)).close()
    assert len(canary.connections()) == before + 1


# ---------------------------------------------------------------- headers


# Headers a proxy or framework reads as "where this request is going"; the gateway reads none.
FORWARDING: dict[str, Callable[[Canary], dict[str, str]]] = {
    "host": lambda c: {"Host": c.authority},
    "x-forwarded": lambda c: {
        "X-Forwarded-Host": c.authority,
        "X-Forwarded-Proto": "http",
        "X-Forwarded-Port": str(c.port),
        "X-Forwarded-Server": c.authority,
        "X-Host": c.authority,
    },
    "forwarded": lambda c: {"Forwarded": f'for=192.0.2.1;host="{c.authority}";proto=http'},
    "original-url": lambda c: {
        "X-Original-URL": c.root + "/v1/completions",
        "X-Rewrite-URL": c.root + "/v1/completions",
    },
    "portkey-metadata": lambda c: {
        "x-portkey-metadata": orjson.dumps({"url": c.root, "_user": c.root}).decode(),
        "x-portkey-trace-id": c.root,
    },
    "portkey-forward-headers": lambda c: {
        "x-portkey-forward-headers": "host,x-forwarded-host",
        "X-Forwarded-Host": c.authority,
    },
}


@pytest.mark.parametrize("name", FORWARDING)
def test_forwarding_headers_change_nothing_about_the_upstream(
    http: httpx.Client, up: ScriptedUpstream, watched: Canary, name: str
) -> None:
    response = complete(http, FORWARDING[name](watched))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == expected_text(PROMPT, 0, 2)
    (seen,) = up.requests()
    assert seen["headers"]["host"] == up.root.removeprefix("http://")


# Portkey headers whose values are hosts or providers: refused, with the header named.
REFUSED_HEADERS: dict[str, tuple[Callable[[Canary], dict[str, str]], int, str]] = {
    "custom-host": (
        lambda c: {"x-portkey-custom-host": c.root + "/v1"},
        400,
        "x-portkey-custom-host",
    ),
    "provider-url": (
        lambda c: {"x-portkey-provider": c.root + "/v1"},
        400,
        "x-portkey-provider",
    ),
    "provider-slug": (lambda c: {"x-portkey-provider": "openai"}, 400, "x-portkey-provider"),
    "virtual-key-url": (
        lambda c: {"x-portkey-virtual-key": c.root + "/v1"},
        403,
        "x-portkey-virtual-key",
    ),
    "config-url": (lambda c: {"x-portkey-config": c.root + "/config.json"}, 400, "config"),
    "custom-host-with-virtual-key": (
        lambda c: {"x-portkey-virtual-key": "oai", "x-portkey-custom-host": c.root + "/v1"},
        400,
        "x-portkey-custom-host",
    ),
}


@pytest.mark.parametrize("name", REFUSED_HEADERS)
def test_portkey_headers_naming_a_host_are_refused(
    http: httpx.Client, up: ScriptedUpstream, watched: Canary, name: str
) -> None:
    headers, status, param = REFUSED_HEADERS[name]
    response = complete(http, headers(watched))
    assert (response.status_code, error_param(response)) == (status, param), response.text
    assert up.requests() == []


# ---------------------------------------------------------------- Portkey configs


def _fallback(*targets: dict[str, Any]) -> dict[str, Any]:
    return {"strategy": {"mode": "fallback"}, "targets": list(targets)}


# Configs that would reach the canary if honoured: each a 400 naming the field.
REFUSED_CONFIGS: dict[str, tuple[Callable[[str], dict[str, Any]], str]] = {
    "custom-host": (lambda u: {"custom_host": u}, "config.custom_host"),
    "provider-and-custom-host": (
        lambda u: {"provider": "oai", "custom_host": u},
        "config.custom_host",
    ),
    "target-custom-host": (
        lambda u: _fallback({"virtual_key": "oai", "custom_host": u}),
        "config.targets[0].custom_host",
    ),
    "nested-custom-host": (
        lambda u: _fallback({"provider": "oai"}, _fallback({"provider": "oai", "custom_host": u})),
        "config.targets[1].targets[0].custom_host",
    ),
    "provider-url": (lambda u: {"provider": u}, "config.provider"),
    "virtual-key-url": (lambda u: {"virtual_key": u}, "config.virtual_key"),
    "loadbalance-target-url": (
        lambda u: {
            "strategy": {"mode": "loadbalance"},
            "targets": [{"provider": "oai"}, {"provider": u}],
        },
        "config.targets[1].provider",
    ),
    "base-url-override": (
        lambda u: {"provider": "oai", "override_params": {"base_url": u}},
        "config.override_params.base_url",
    ),
    "base-url-key": (lambda u: {"base_url": u}, "config.base_url"),
    "forward-headers": (
        lambda u: {"provider": "oai", "forward_headers": ["host", "x-forwarded-host"]},
        "config.forward_headers",
    ),
}


@pytest.mark.parametrize("name", REFUSED_CONFIGS)
def test_portkey_configs_naming_a_host_are_refused(
    http: httpx.Client, up: ScriptedUpstream, watched: Canary, name: str
) -> None:
    config, param = REFUSED_CONFIGS[name]
    header = {"x-portkey-config": orjson.dumps(config(watched.root + "/v1")).decode()}
    response = complete(http, header)
    assert (response.status_code, error_param(response)) == (400, param), response.text
    assert up.requests() == []


def test_a_url_as_the_model_goes_to_the_configured_upstream_as_a_name(
    http: httpx.Client, up: ScriptedUpstream, watched: Canary
) -> None:
    """Where a caller may name the upstream's model (a config's override, a virtual key), a URL
    is only a model's name, sent to the provider the config names."""
    url = watched.root + "/v1"
    config = {"provider": "oai", "override_params": {"model": url}}
    by_config = complete(http, {"x-portkey-config": orjson.dumps(config).decode()})
    by_virtual_key = complete(http, {"x-portkey-virtual-key": "oai"}, model=url)
    assert [by_config.status_code, by_virtual_key.status_code] == [200, 200]
    assert [r["body"]["model"] for r in up.requests()] == [url, url]
    for alias in (url, f"@{url}/{OPENAI_MODEL}"):  # no virtual key: an alias, which it is not
        unknown = complete(http, model=alias)
        assert (unknown.status_code, error_param(unknown)) == (404, "model")
    assert len(up.requests()) == 2


# ---------------------------------------------------------------- request targets


def _absolute(c: Canary, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    """A request in absolute form (a proxy's request), to the canary."""
    target, host = c.root + path, {"Host": c.authority}
    if body is None:
        return request_bytes(method, target, {**host, **bearer(KEY)})
    return json_request(target, KEY, body, host)


def test_an_absolute_form_completion_is_served_by_the_configured_upstream(
    gateway: GatewayProcess, up: ScriptedUpstream, watched: Canary
) -> None:
    body = {"model": ALIAS, "prompt": PROMPT, "max_tokens": 2}
    data = _absolute(watched, "POST", "/v1/completions", body)
    (response,) = exchange(gateway.port, data, ("POST",), until_close=False).responses
    assert response.status == 200
    assert response.json()["choices"][0]["text"] == expected_text(PROMPT, 0, 2)
    assert upstream_prompts(up) == [PROMPT]


def test_an_absolute_form_listing_is_the_gateways_own(
    gateway: GatewayProcess, watched: Canary
) -> None:
    data = _absolute(watched, "GET", "/v1/models")
    (response,) = exchange(gateway.port, data, ("GET",), until_close=False).responses
    assert response.status == 200
    assert [m["id"] for m in response.json()["data"]] == [ALIAS]


def test_connect_is_refused(gateway: GatewayProcess, watched: Canary) -> None:
    target = watched.authority
    data = request_bytes("CONNECT", target, {"Host": target, **bearer(KEY)})
    reply = exchange(gateway.port, data, ("CONNECT",))
    assert [r.status for r in reply.responses] == [400]
    assert reply.responses[0].body == PARSER_400_BODY
    assert reply.closed


def test_a_scheme_relative_target_is_a_path_that_does_not_exist(
    gateway: GatewayProcess, watched: Canary
) -> None:
    data = request_bytes("GET", f"//{watched.authority}/v1/models", bearer(KEY))
    (response,) = exchange(gateway.port, data, ("GET",), until_close=False).responses
    assert (response.status, response.json()["error"]["code"]) == (404, "not_found")


# ---------------------------------------------------------------- bodies and upstream answers


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_an_upstream_redirect_is_not_followed(
    http: httpx.Client, up: ScriptedUpstream, watched: Canary, status: int
) -> None:
    """A faulty upstream's redirect is its failure (502), not a place to go."""
    up.script({"status": status, "headers": {"location": watched.root + "/v1/completions"}})
    response = complete(http)
    assert (response.status_code, response.json()["error"]["type"]) == (502, "upstream_error")
    assert len(up.requests()) == 1


def test_urls_in_chat_content_are_passed_on_not_fetched(
    http: httpx.Client, up: ScriptedUpstream, watched: Canary
) -> None:
    image = {"type": "image_url", "image_url": {"url": watched.root + "/cat.png"}}
    content = [{"type": "text", "text": PROMPT}, image]
    payload = {"model": ALIAS, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    response = http.post("/v1/chat/completions", json=payload)
    assert response.status_code == 200, response.text
    (seen,) = up.requests()
    assert seen["body"]["messages"][0]["content"][1] == image


def test_a_batch_line_naming_another_host_fails_without_a_call(
    gateway: GatewayProcess, up: ScriptedUpstream, watched: Canary
) -> None:
    line = {
        "custom_id": "r0",
        "method": "POST",
        "url": watched.root + "/v1/completions",
        "body": {"model": ALIAS, "prompt": PROMPT, "max_tokens": 2},
    }
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as client:
        made = start(client, orjson.dumps(line) + b"\n")
        batch = until(client, made.id, finished, BATCH_DEADLINE_S)
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    assert [(e.code, e.param, e.line) for e in batch.errors.data] == [
        ("mismatched_endpoint", "url", 1)
    ]
    assert up.requests() == []
