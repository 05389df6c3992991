"""The admin API in a gateway process on the memory backend (runtime keys in the files store, the
default ./data/files of its working directory): a key made through it serves the openai SDK at
once, and outlives a restart of the gateway; a revoked one is refused at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import AuthenticationError, OpenAI

from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream

ADMIN = "sk-e2e-admin"


def config(upstream: str) -> str:
    doc: dict[str, Any] = {
        "auth": {"keys": [], "admin_keys": [{"id": "ops", "key": ADMIN}]},
        "providers": {"up": {"type": "openai", "base_url": upstream, "api_key": OPENAI_TEST_KEY}},
        "models": {"m": {"targets": [{"provider": "up", "model": "gpt-test"}]}},
    }
    return yaml.safe_dump(doc)


def admin(gw: GatewayProcess, method: str, path: str, body: Any = None) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=gw.url, timeout=10.0, trust_env=False) as http:
        r = http.request(method, path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def complete(gw: GatewayProcess, key: str) -> str:
    with OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0) as sdk:
        return sdk.completions.create(model="m", prompt="a b", max_tokens=2).choices[0].text


def test_a_runtime_key_serves_at_once_outlives_a_restart_and_is_revoked_at_once(
    scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    text = config(scripted_openai_server.url)
    with GatewayProcess(text, tmp_path) as gw:
        made = admin(gw, "POST", "/admin/keys", {"id": "search-api", "models": ["m"]})
        assert complete(gw, made["key"])
    assert (tmp_path / "data" / "files" / "_gateway" / "accounts").is_dir()
    with GatewayProcess(text, tmp_path, log_level="info") as gw:
        assert complete(gw, made["key"])
        listed = admin(gw, "GET", "/admin/keys")["data"]
        assert [(k["id"], k["source"]) for k in listed] == [("search-api", "runtime")]
        admin(gw, "DELETE", "/admin/keys/search-api")
        with pytest.raises(AuthenticationError):
            complete(gw, made["key"])
        assert "admin call by ops: DELETE /admin/keys/search-api -> 200" in gw.logs()
