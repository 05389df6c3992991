"""The admin API, under `/admin/`, for the keys of `auth.admin_keys` only (presented as any key
is: gateway.auth): runtime keys and teams (gateway.governance.edits decides each change,
gateway.governance.store keeps them), and spend (gateway.governance.spend).

    GET, POST              /admin/keys                 list (the YAML's too) / create
    GET, PATCH, DELETE     /admin/keys/{id}            one, with its budgets' state / edit / revoke
    POST                   /admin/keys/{id}/rotate     a new secret; the old one for grace_s more
    GET, POST              /admin/teams
    GET, PATCH, DELETE     /admin/teams/{id}
    GET                    /admin/spend                the ledger's days by key, team or model

A new secret is in its call's answer only (`key`), never stored but as its digest, never shown
again. Every call is logged (logger `gateway.admin`): the admin key's id, the method, the path
and the status, never a secret.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

import orjson

from core.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound
from core.wire import Json, parse_json
from gateway.asgi import JSON_HEADERS, ClientGone, read_body
from gateway.governance import edits
from gateway.governance.ledger import day_hash
from gateway.governance.records import KEY_OBJECT, TEAM_OBJECT, key_object, team_object
from gateway.governance.spend import budget_rows, spend_document, spend_query
from gateway.pipeline.exchange import Inbound, Reply
from gateway.runtime import Runtime

log = logging.getLogger("gateway.admin")
PREFIX = "/admin/"
KEYS, TEAMS, SPEND = "/admin/keys", "/admin/teams", "/admin/spend"
KEY_PREFIX, TEAM_PREFIX = KEYS + "/", TEAMS + "/"
BUDGET_SCOPES = ("key", "team")  # a key's own budgets; its model budgets apply per alias
CLIENT_GONE = 499

# A call: the request and the id its path names ("" for none) → the answer's document.
Call = Callable[[Inbound, str], Awaitable[Json]]


async def handle(inbound: Inbound, reply: Reply) -> None:
    """Every admin path: the admin key first (401, or 403 for an inference key), then the
    call its path and method name."""
    admin, status = "-", 500
    try:
        admin = inbound.runtime.auth.admin(inbound.headers)
        call, name = _route(inbound)
        doc = await call(inbound, name)
        status = 200
        await reply.respond(200, orjson.dumps(doc), JSON_HEADERS)
    except GatewayError as err:
        status = err.status
        raise
    except ClientGone:
        status = CLIENT_GONE
        raise
    finally:
        path = repr(inbound.path[:200])[1:-1]  # a path's control characters stay on one line
        log.info("admin call by %s: %s %s -> %d", admin, inbound.method, path, status)


def _route(inbound: Inbound) -> tuple[Call, str]:
    collection, _, tail = inbound.path.removeprefix(PREFIX).partition("/")
    name, _, action = tail.partition("/")
    shape = "{id}/" + action if action else "{id}" if tail else ""
    calls = ROUTES.get((collection, shape)) if name or not tail else None
    if calls is None:
        raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")
    call = calls.get("GET" if inbound.method == "HEAD" else inbound.method)
    if call is None:
        raise MethodNotAllowed(f"Method {inbound.method} is not allowed here.")
    return call, name


async def _body(inbound: Inbound, optional: bool = False) -> Json:
    limit = inbound.runtime.config.server.max_body_bytes
    raw = await read_body(inbound.headers, inbound.receive, limit)
    if optional and not raw.strip():
        return {}
    return parse_json(raw)


# ---------------------------------------------------------------- keys


async def list_keys(inbound: Inbound, _: str) -> Json:
    rt = inbound.runtime
    current = await rt.accounts.sync()
    named = {k.id for k in rt.config.keys}
    runtime = sorted(current.keys.values(), key=lambda k: (k.created_at, k.id))
    keys = [*rt.config.keys, *(k for k in runtime if k.id not in named)]
    return {"object": "list", "data": [key_object(k) for k in keys]}


async def get_key(inbound: Inbound, key_id: str) -> Json:
    """The key, and each of its budgets in the current period."""
    rt = inbound.runtime
    k = edits.find_key(rt.config, await rt.accounts.sync(), key_id)
    rules = [r for r in rt.limiter.budget_rules(k.id) if r.scope in BUDGET_SCOPES]
    per_model = {  # a model budget counts each alias apart: one row per configured alias
        r.bucket: (alias, r)
        for alias in rt.config.models
        for r in rt.limiter.budget_rules(k.id, alias)
        if r.scope not in BUDGET_SCOPES
    }
    spent = await rt.limiter.read_counters([r.bucket for r in rules] + list(per_model))
    rows = budget_rows(rules, spent)
    for alias, r in per_model.values():
        rows += [{**row, "model": alias} for row in budget_rows([r], spent)]
    return {**key_object(k), "budgets": rows}


async def create_key(inbound: Inbound, _: str) -> Json:
    rt = inbound.runtime
    body = _counted_once(rt, await _body(inbound))
    issued = await rt.accounts.change(edits.create_key(rt.config, body))
    return {**key_object(issued.key), "key": issued.secret}


async def update_key(inbound: Inbound, key_id: str) -> Json:
    rt = inbound.runtime
    body = _counted_once(rt, await _body(inbound))
    return key_object(await rt.accounts.change(edits.update_key(rt.config, key_id, body)))


COUNTED = ("limits", "model_limits", "budget", "model_budgets")


def _counted_once(rt: Runtime, body: Json) -> Json:
    """Several workers count limits and budgets apart on the memory backend (each would admit
    the whole of one), as the YAML's are refused at start (Config.check_workers)."""
    if rt.workers > 1 and rt.config.rate_limit.backend == "memory" and isinstance(body, dict):
        for name in COUNTED:
            if body.get(name):
                raise InvalidRequest(
                    f"A {name.replace('_', ' ')} on the memory backend with {rt.workers} "
                    "workers would be counted in each worker apart; set rate_limit.backend: "
                    "redis, or run one worker.",
                    param=name,
                )
    return body


async def delete_key(inbound: Inbound, key_id: str) -> Json:
    rt = inbound.runtime
    gone = await rt.accounts.change(edits.delete_key(rt.config, key_id))
    return {"id": gone.id, "object": KEY_OBJECT, "deleted": True}


async def rotate_key(inbound: Inbound, key_id: str) -> Json:
    rt = inbound.runtime
    body = await _body(inbound, optional=True)
    issued = await rt.accounts.change(edits.rotate_key(rt.config, key_id, body))
    return {**key_object(issued.key), "key": issued.secret}


# ---------------------------------------------------------------- teams


async def list_teams(inbound: Inbound, _: str) -> Json:
    rt = inbound.runtime
    current = await rt.accounts.sync()
    runtime = sorted(current.teams.values(), key=lambda t: (t.created_at, t.id))
    teams = [*rt.config.teams.values(), *(t for t in runtime if t.id not in rt.config.teams)]
    return {"object": "list", "data": [team_object(t) for t in teams]}


async def get_team(inbound: Inbound, team_id: str) -> Json:
    rt = inbound.runtime
    return team_object(edits.find_team(rt.config, await rt.accounts.sync(), team_id))


async def create_team(inbound: Inbound, _: str) -> Json:
    rt = inbound.runtime
    body = _counted_once(rt, await _body(inbound))
    return team_object(await rt.accounts.change(edits.create_team(rt.config, body)))


async def update_team(inbound: Inbound, team_id: str) -> Json:
    rt = inbound.runtime
    body = _counted_once(rt, await _body(inbound))
    return team_object(await rt.accounts.change(edits.update_team(rt.config, team_id, body)))


async def delete_team(inbound: Inbound, team_id: str) -> Json:
    rt = inbound.runtime
    gone = await rt.accounts.change(edits.delete_team(rt.config, team_id))
    return {"id": gone.id, "object": TEAM_OBJECT, "deleted": True}


# ---------------------------------------------------------------- spend


async def spend(inbound: Inbound, _: str) -> Json:
    params = dict(parse_qsl(inbound.query.decode("latin-1"), keep_blank_values=True))
    query = spend_query(params, dt.datetime.now(dt.UTC).date())
    ledger = await inbound.runtime.limiter.read_ledger([day_hash(d) for d in query.days()])
    return spend_document(query, ledger)


# (collection, the path after it) → method → call
ROUTES: dict[tuple[str, str], dict[str, Call]] = {
    ("keys", ""): {"GET": list_keys, "POST": create_key},
    ("keys", "{id}"): {"GET": get_key, "PATCH": update_key, "DELETE": delete_key},
    ("keys", "{id}/rotate"): {"POST": rotate_key},
    ("teams", ""): {"GET": list_teams, "POST": create_team},
    ("teams", "{id}"): {"GET": get_team, "PATCH": update_team, "DELETE": delete_team},
    ("spend", ""): {"GET": spend},
}
# The app's tables (gateway.api.app): exact paths, and the prefixes of those with an id.
EXACT_PATHS = {
    KEYS: ("GET", "HEAD", "POST"),
    TEAMS: ("GET", "HEAD", "POST"),
    SPEND: ("GET", "HEAD"),
}
PREFIXED_PATHS = {
    KEY_PREFIX: ("GET", "HEAD", "POST", "PATCH", "DELETE"),
    TEAM_PREFIX: ("GET", "HEAD", "PATCH", "DELETE"),
}
