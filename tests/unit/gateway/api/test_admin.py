"""The admin API in-process, on the memory backend (runtime keys in the files store, in a temporary
directory): who may call it, keys and teams made, changed, rotated and revoked (and used at
once for inference), the YAML's read-only, bad bodies named, a key's budgets and the spend
ledger, the log of every call, the answers against the API document, and the YAML beside the
store at start and at reload."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from core import openapi
from core.errors import ConfigError
from gateway.api import admin
from gateway.api.app import GatewayApp, create_app
from gateway.config import parse
from gateway.config.accounts import ID
from gateway.governance import edits, spend
from gateway.governance.budgets import PERIODS
from gateway.governance.ledger import GROUPS, ledger
from gateway.reload import successor
from tests.unit.core.test_openapi import judge
from tests.unit.gateway.reload.test_handover import Fake

ADMIN, INFERENCE = "sk-admin", "sk-yaml"


def document(store: Path, **changes: Any) -> dict[str, Any]:
    return {
        "auth": {
            "keys": [{"id": "yaml-key", "key": INFERENCE}],
            "admin_keys": [{"id": "ops", "key": ADMIN}],
        },
        "providers": {"up": {"type": "openai", "base_url": "http://up.invalid/v1"}},
        "models": {"m": {"targets": [{"provider": "up", "model": "x"}]}},
        "teams": {"yaml-team": {"models": ["*"]}},
        "files": {"store": str(store)},
        **changes,
    }


async def serve(doc: dict[str, Any]) -> GatewayApp:
    app = create_app(parse(yaml.safe_dump(doc)), build=lambda block: Fake(block.name))
    await app.runtime.start()
    return app


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    app = await serve(document(tmp_path))
    try:
        yield app
    finally:
        await app.runtime.aclose()


@pytest.fixture
async def client(app: GatewayApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


async def call(
    client: httpx.AsyncClient, method: str, path: str, body: Any = None, key: str = ADMIN
) -> httpx.Response:
    content = None if body is None else orjson.dumps(body)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return await client.request(method, path, content=content, headers=headers)


def ok(r: httpx.Response, schema: str) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    judge(schema).validate(doc)
    return doc


def refused(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    judge("Error").validate(r.json())
    if param is not None:
        assert err["param"] == param, err
    return err


async def models(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})


# ---------------------------------------------------------------- who may call


async def test_admin_keys_only(client: httpx.AsyncClient) -> None:
    r = await client.get("/admin/keys")
    assert refused(r, 401)["code"] == "missing_api_key"
    refused(await call(client, "GET", "/admin/keys", key="sk-nope"), 401)
    denied = refused(await call(client, "GET", "/admin/keys", key=INFERENCE), 403)
    assert denied["code"] == "permission_denied"
    refused(await models(client, ADMIN), 401)  # an admin key is no inference key
    r = await client.get("/admin/teams", headers={"x-portkey-api-key": ADMIN})
    assert r.status_code == 200
    refused(await call(client, "GET", "/admin/nothing"), 404)
    refused(await call(client, "PUT", "/admin/keys"), 405)
    refused(await call(client, "POST", "/admin/keys/yaml-key"), 405)
    refused(await call(client, "GET", "/admin/keys/yaml-key/nothing"), 404)


# ---------------------------------------------------------------- keys


async def test_a_created_key_works_at_once_and_its_secret_is_shown_once(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    body = {"id": "search-api", "models": ["m"], "limits": {"rpm": 5}, "team": "yaml-team"}
    made = ok(await call(client, "POST", "/admin/keys", body), "AdminKeyIssued")
    secret = made["key"]
    assert re.fullmatch(r"sk-gw-[A-Za-z0-9_-]{43,}", secret)
    assert made["source"] == "runtime" and made["team"] == "yaml-team"
    assert made["limits"] == {"rpm": 5} and made["rotated_until"] is None
    assert [m["id"] for m in (await models(client, secret)).json()["data"]] == ["m"]
    shown = ok(await call(client, "GET", "/admin/keys/search-api"), "AdminKeyDetail")
    digest = hashlib.sha256(secret.encode()).hexdigest()
    for text in (orjson.dumps(shown), (await call(client, "GET", "/admin/keys")).content):
        assert secret.encode() not in text and digest.encode() not in text
    listed = ok(await call(client, "GET", "/admin/keys"), "AdminKeyList")["data"]
    assert [(k["id"], k["source"]) for k in listed] == [
        ("yaml-key", "config"),
        ("search-api", "runtime"),
    ]
    stored = b"".join(p.read_bytes() for p in (tmp_path / "_gateway").rglob("*.json"))
    assert secret.encode() not in stored


async def test_an_id_is_generated_when_none_is_given(client: httpx.AsyncClient) -> None:
    made = ok(await call(client, "POST", "/admin/keys", {}), "AdminKeyIssued")
    assert ID.fullmatch(made["id"]) and made["models"] == ["*"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"limits": {"rpm": 0}}, "limits.rpm"),
        ({"limits": {"rps": 1}}, "limits.rps"),
        ({"team": "nope"}, "team"),
        ({"providers": ["nope"]}, "providers[0]"),
        ({"models": "m"}, "models"),
        ({"budget": {"usd": "-1", "period": "day"}}, "budget.usd"),
        ({"budget": {"usd": 1, "period": "year"}}, "budget.period"),
        ({"model_budgets": {"m": {"usd": 1}}}, "model_budgets.m.period"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"id": "no spaces"}, "id"),
        ({"secret": "mine", "sha256": "x"}, "secret"),
        ({"key": "sk-chosen"}, "key"),
    ],
)
async def test_a_bad_field_is_a_400_naming_it(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    refused(await call(client, "POST", "/admin/keys", body), 400, param)


async def test_bodies_that_are_not_objects_are_refused(client: httpx.AsyncClient) -> None:
    refused(await call(client, "POST", "/admin/keys", [1]), 400)
    r = await client.post("/admin/keys", content=b"{", headers={"authorization": f"Bearer {ADMIN}"})
    refused(r, 400)


async def test_taken_ids_are_a_409(client: httpx.AsyncClient) -> None:
    err = refused(await call(client, "POST", "/admin/keys", {"id": "yaml-key"}), 409, "id")
    assert err["code"] == "conflict" and err["type"] == "invalid_request_error"
    await call(client, "POST", "/admin/keys", {"id": "twice"})
    refused(await call(client, "POST", "/admin/keys", {"id": "twice"}), 409, "id")
    refused(await call(client, "POST", "/admin/teams", {"id": "yaml-team"}), 409, "id")


async def test_the_yaml_is_read_only_here(client: httpx.AsyncClient) -> None:
    for method, path, body in (
        ("PATCH", "/admin/keys/yaml-key", {"models": ["m"]}),
        ("DELETE", "/admin/keys/yaml-key", None),
        ("POST", "/admin/keys/yaml-key/rotate", None),
        ("PATCH", "/admin/teams/yaml-team", {"models": ["m"]}),
        ("DELETE", "/admin/teams/yaml-team", None),
    ):
        err = refused(await call(client, method, path, body), 403)
        assert "config file" in err["message"], err
    shown = ok(await call(client, "GET", "/admin/keys/yaml-key"), "AdminKeyDetail")
    assert shown["source"] == "config" and shown["created_at"] is None
    refused(await call(client, "GET", "/admin/keys/none"), 404)
    refused(await call(client, "PATCH", "/admin/keys/none", {}), 404)


async def test_a_patch_changes_what_it_names_and_null_clears(client: httpx.AsyncClient) -> None:
    body = {"id": "p", "team": "yaml-team", "budget": {"usd": "2.5", "period": "week"}}
    made = ok(await call(client, "POST", "/admin/keys", body), "AdminKeyIssued")
    r = await call(client, "PATCH", "/admin/keys/p", {"models": ["m"], "team": None})
    changed = ok(r, "AdminKey")
    assert changed["models"] == ["m"] and changed["team"] is None
    assert changed["budget"] == {"usd": "2.5", "period": "week"}  # left out: kept
    assert changed["created_at"] == made["created_at"]
    cleared = ok(await call(client, "PATCH", "/admin/keys/p", {"budget": None}), "AdminKey")
    assert cleared["budget"] is None
    assert (await models(client, made["key"])).status_code == 200  # the same secret
    refused(await call(client, "PATCH", "/admin/keys/p", {"id": "q"}), 400, "id")
    refused(
        await call(client, "PATCH", "/admin/keys/p", {"limits": {"tpm": -1}}), 400, "limits.tpm"
    )


async def test_a_deleted_key_is_refused_at_once(client: httpx.AsyncClient) -> None:
    made = ok(await call(client, "POST", "/admin/keys", {"id": "d"}), "AdminKeyIssued")
    gone = ok(await call(client, "DELETE", "/admin/keys/d"), "AdminDeleted")
    assert gone == {"id": "d", "object": "gateway.key", "deleted": True}
    refused(await models(client, made["key"]), 401)
    refused(await call(client, "DELETE", "/admin/keys/d"), 404)


async def test_an_expired_key_is_refused_as_expired(client: httpx.AsyncClient) -> None:
    body = {"id": "old", "expires_at": "2020-01-01T00:00:00Z"}
    made = ok(await call(client, "POST", "/admin/keys", body), "AdminKeyIssued")
    assert made["expires_at"] == 1577836800
    assert refused(await models(client, made["key"]), 401)["message"] == "This API key has expired."


async def test_a_rotation_keeps_the_old_secret_for_its_grace(client: httpx.AsyncClient) -> None:
    first = ok(await call(client, "POST", "/admin/keys", {"id": "r"}), "AdminKeyIssued")["key"]
    r = await call(client, "POST", "/admin/keys/r/rotate", {"grace_s": 3600})
    rotated = ok(r, "AdminKeyIssued")
    second = rotated["key"]
    assert second != first and rotated["rotated_until"] is not None
    for key in (first, second):
        assert (await models(client, key)).status_code == 200
    third = ok(await call(client, "POST", "/admin/keys/r/rotate"), "AdminKeyIssued")["key"]
    refused(await models(client, second), 401)  # no grace: gone at once
    for key in (first, third):  # the first one's grace runs on
        assert (await models(client, key)).status_code == 200
    r = await call(client, "POST", "/admin/keys/r/rotate", {"grace_s": edits.MAX_GRACE_S + 1})
    refused(r, 400, "grace_s")
    refused(await call(client, "POST", "/admin/keys/r/rotate", {"grace": 1}), 400, "grace")


# ---------------------------------------------------------------- teams


async def test_teams_bound_their_keys_and_go_only_once_empty(client: httpx.AsyncClient) -> None:
    team = ok(await call(client, "POST", "/admin/teams", {"id": "t", "models": ["m"]}), "AdminTeam")
    assert team["source"] == "runtime" and team["providers"] is None
    made = ok(await call(client, "POST", "/admin/keys", {"id": "k", "team": "t"}), "AdminKeyIssued")
    assert [m["id"] for m in (await models(client, made["key"])).json()["data"]] == ["m"]
    ok(await call(client, "PATCH", "/admin/teams/t", {"models": ["other"]}), "AdminTeam")
    assert (await models(client, made["key"])).json()["data"] == []
    err = refused(await call(client, "DELETE", "/admin/teams/t"), 409)
    assert "still has keys: k." in err["message"]
    await call(client, "DELETE", "/admin/keys/k")
    ok(await call(client, "DELETE", "/admin/teams/t"), "AdminDeleted")
    listed = ok(await call(client, "GET", "/admin/teams"), "AdminTeamList")["data"]
    assert [t["id"] for t in listed] == ["yaml-team"]
    refused(await call(client, "GET", "/admin/teams/t"), 404)
    refused(await call(client, "POST", "/admin/teams", {"models": ["m"], "x": 1}), 400, "x")


# ---------------------------------------------------------------- money


async def test_a_keys_budgets_show_their_period(client: httpx.AsyncClient, app: GatewayApp) -> None:
    await call(client, "POST", "/admin/teams", {"id": "t", "budget": {"usd": 5, "period": "total"}})
    body = {"id": "b", "team": "t", "budget": {"usd": "0.01", "period": "month"}}
    ok(await call(client, "POST", "/admin/keys", body), "AdminKeyIssued")
    grant = await app.runtime.limiter.admit("b", "m", "m", lambda: (0, 2_000_000_000))
    grant.settle(0, 2_000_000_000)
    shown = ok(await call(client, "GET", "/admin/keys/b"), "AdminKeyDetail")
    today = dt.datetime.now(dt.UTC).date()
    month = dt.date(today.year + today.month // 12, today.month % 12 + 1, 1)
    assert shown["budgets"] == [
        {
            "scope": "key",
            "usd": "0.01",
            "period": "month",
            "spent_usd": "0.002",
            "remaining_usd": "0.008",
            "resets_at": f"{month.isoformat()}T00:00:00Z",
        },
        {
            "scope": "team",
            "usd": "5",
            "period": "total",
            "spent_usd": "0.002",
            "remaining_usd": "4.998",
            "resets_at": None,
        },
    ]


async def test_spend_by_day_and_group(client: httpx.AsyncClient, app: GatewayApp) -> None:
    day = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)
    app.runtime.limiter.spend(ledger("search-api", "t", "m", 12_300_000_000, day))
    app.runtime.limiter.spend(ledger("other", None, "m", 1, day + dt.timedelta(days=1)))
    r = await client.get(
        "/admin/spend",
        params={"group_by": "key", "start": "2026-11-27", "end": "2026-11-29"},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert ok(r, "AdminSpend") == {
        "object": "list",
        "group_by": "key",
        "start": "2026-11-27",
        "end": "2026-11-29",
        "data": [
            {"date": "2026-11-28", "key": "search-api", "spend_usd": "0.0123"},
            {"date": "2026-11-29", "key": "other", "spend_usd": "0.000000000001"},
        ],
    }
    r = await call(client, "GET", "/admin/spend?group_by=model&start=2026-11-28&end=2026-11-29")
    assert [row["spend_usd"] for row in ok(r, "AdminSpend")["data"]] == [
        "0.0123",
        "0.000000000001",
    ]
    r = await call(client, "GET", "/admin/spend?group_by=team&start=2026-11-28&end=2026-11-28")
    assert ok(r, "AdminSpend")["data"] == [
        {"date": "2026-11-28", "team": "t", "spend_usd": "0.0123"}
    ]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("group_by=user", "group_by"),
        ("start=2026-13-01", "start"),
        ("end=28.11.2026", "end"),
        ("start=2026-11-29&end=2026-11-28", "start"),
        ("start=2025-01-01&end=2026-11-28", "start"),
        ("since=2026-11-28", "since"),
    ],
)
async def test_bad_spend_queries_name_their_parameter(
    client: httpx.AsyncClient, query: str, param: str
) -> None:
    refused(await call(client, "GET", f"/admin/spend?{query}"), 400, param)


async def test_a_range_of_400_days_is_the_most(client: httpx.AsyncClient) -> None:
    end = dt.date(2026, 11, 28)
    start = end - dt.timedelta(days=399)
    r = await call(client, "GET", f"/admin/spend?start={start}&end={end}")
    assert ok(r, "AdminSpend")["data"] == []


# ---------------------------------------------------------------- the log


async def test_every_call_is_logged_without_secrets(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.admin")
    made = ok(await call(client, "POST", "/admin/keys", {"id": "logged"}), "AdminKeyIssued")
    rotated = ok(await call(client, "POST", "/admin/keys/logged/rotate"), "AdminKeyIssued")
    await call(client, "GET", "/admin/keys", key=INFERENCE)
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.admin"]
    assert lines == [
        "admin call by ops: POST /admin/keys -> 200",
        "admin call by ops: POST /admin/keys/logged/rotate -> 200",
        "admin call by -: GET /admin/keys -> 403",
    ]
    text = caplog.text
    for secret in (made["key"], rotated["key"]):
        assert secret not in text and hashlib.sha256(secret.encode()).hexdigest() not in text


# ---------------------------------------------------------------- the YAML beside the store


async def test_an_id_in_the_yaml_and_the_store_refuses_the_reload_and_the_start(
    client: httpx.AsyncClient, app: GatewayApp, tmp_path: Path
) -> None:
    await call(client, "POST", "/admin/keys", {"id": "made-here"})
    await call(client, "POST", "/admin/teams", {"id": "team-here"})
    doc = document(tmp_path)
    doc["auth"]["keys"].append({"id": "made-here", "key": "sk-other"})
    with pytest.raises(ConfigError) as refused_reload:
        await successor(app.runtime, parse(yaml.safe_dump(doc)))
    assert refused_reload.value.path == "auth.keys[1].id"
    with pytest.raises(ConfigError) as refused_start:
        await serve(doc)
    assert refused_start.value.path == "auth.keys[1].id"
    teams = document(tmp_path, teams={"yaml-team": {}, "team-here": {}})
    with pytest.raises(ConfigError) as refused_team:
        await successor(app.runtime, parse(yaml.safe_dump(teams)))
    assert refused_team.value.path == "teams.team-here"


async def test_a_reload_keeps_the_store_and_its_keys(
    client: httpx.AsyncClient, app: GatewayApp, tmp_path: Path
) -> None:
    made = ok(await call(client, "POST", "/admin/keys", {"id": "kept"}), "AdminKeyIssued")
    handover = await successor(app.runtime, parse(yaml.safe_dump(document(tmp_path))))
    assert handover.runtime.accounts is app.runtime.accounts and not handover.fresh_accounts
    app.swap(handover.runtime)
    assert (await models(client, made["key"])).status_code == 200
    await call(client, "DELETE", "/admin/keys/kept")  # the new runtime hears of it
    refused(await models(client, made["key"]), 401)


async def test_a_reload_to_another_store_reads_its_keys(
    client: httpx.AsyncClient, app: GatewayApp, tmp_path: Path
) -> None:
    made = ok(await call(client, "POST", "/admin/keys", {"id": "first"}), "AdminKeyIssued")
    other = parse(yaml.safe_dump(document(tmp_path / "other")))
    handover = await successor(app.runtime, other)
    assert handover.fresh_accounts and handover.leftovers.accounts is app.runtime.accounts
    app.swap(handover.runtime)
    await handover.leftovers.aclose()
    refused(await models(client, made["key"]), 401)
    assert ok(await call(client, "GET", "/admin/keys"), "AdminKeyList")["data"][1:] == []


# ---------------------------------------------------------------- the document's bounds


def test_the_documents_bounds_are_the_gateways() -> None:
    assert f"^{ID.pattern}$" == openapi.ADMIN_ID
    assert openapi.BUDGET_PERIODS == PERIODS
    assert openapi.MAX_GRACE_S == edits.MAX_GRACE_S
    assert openapi.MAX_SPEND_DAYS == spend.MAX_DAYS
    assert tuple(GROUPS) == openapi.SPEND_GROUPS
    assert set(admin.EXACT_PATHS) | set(admin.PREFIXED_PATHS) <= {
        p if "{" not in p else p[: p.index("{")] for p in openapi.paths()
    }


async def test_limits_on_the_memory_backend_with_several_workers_are_refused(
    client: httpx.AsyncClient, app: GatewayApp
) -> None:
    """As the YAML's are at start: each worker would count them apart."""
    app.runtime.workers = 2
    for field, value in {
        "limits": {"rpm": 5},
        "budget": {"usd": 1, "period": "day"},
        "model_budgets": {"m": {"usd": 1, "period": "day"}},
    }.items():
        err = refused(await call(client, "POST", "/admin/keys", {field: value}), 400, field)
        assert "2 workers" in err["message"]
        refused(await call(client, "POST", "/admin/teams", {"id": "t", field: value}), 400, field)
    ok(await call(client, "POST", "/admin/keys", {"models": ["m"]}), "AdminKeyIssued")
    app.runtime.workers = 1
    ok(await call(client, "POST", "/admin/keys", {"limits": {"rpm": 5}}), "AdminKeyIssued")
