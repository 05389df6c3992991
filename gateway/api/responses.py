"""The Responses API's stored responses: `GET /v1/responses/{id}` (the response object),
`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items` (a page of its input
items), each also without `/v1`. `POST /v1/responses` is an inference endpoint, the pipeline's
(its row in gateway.pipeline.endpoints), which keeps what it answers in the store
(gateway.jobs.responsestore).

A response belongs to its key's team, or to the key when it has none: to any other caller it
does not exist (404). Each query parameter is checked (a 400 naming it); `stream=true`, OpenAI's
replay of a background response's events, is refused: the gateway does not keep them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import parse_qsl

import orjson

from core.errors import InvalidRequest, MethodNotAllowed, NotFound, UnsupportedParameter
from core.files import INTEGER
from core.response_items import INCLUDABLE, LIST_DEFAULT, LIST_LIMIT, ORDERS
from gateway.asgi import JSON_HEADERS
from gateway.jobs.responsestore import ResponseStore, owner
from gateway.pipeline.exchange import Inbound, Reply

PREFIXES = ("/v1/responses/", "/responses/")
# OpenAI's values of `include` (the SDK's ResponseIncludable): accepted, and nothing more done.
# `include` as the SDK sends it (`include[]=…`, repeated) and as it may be written by hand.
INCLUDE_NAMES = ("include", "include[]")
BOOLEANS: Mapping[str, bool] = MappingProxyType({"true": True, "false": False})
SHOWN = 40  # of a bad value, the characters an error repeats

Pairs = Sequence[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class ItemsQuery:
    """An input items listing's query, checked."""

    limit: int
    order: str
    after: str | None


# One call of a stored response: the store, the owner, the response's id, the query, the reply.
Call = Callable[[ResponseStore, str, str, Pairs, Reply], Awaitable[None]]


async def response(inbound: Inbound, reply: Reply) -> None:
    """`/v1/responses/{id}` (GET, DELETE) and `/v1/responses/{id}/input_items` (GET)."""
    rt = inbound.runtime
    principal = rt.auth.authenticate(inbound.headers)
    prefix = next(p for p in PREFIXES if inbound.path.startswith(p))
    response_id, _, rest = inbound.path.removeprefix(prefix).partition("/")
    calls = CALLS.get(rest)
    if calls is None:
        raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")
    call = calls.get(inbound.method)
    if call is None:
        raise MethodNotAllowed(f"Method {inbound.method} is not allowed here.")
    pairs = parse_qsl(inbound.query.decode("latin-1"), keep_blank_values=True)
    await call(rt.responses, owner(principal), response_id, pairs, reply)


async def _retrieve(
    store: ResponseStore, owner: str, response_id: str, pairs: Pairs, reply: Reply
) -> None:
    retrieve_query(pairs)
    found = await store.get(owner, response_id)
    await reply.respond(200, orjson.dumps(found), JSON_HEADERS)


async def _delete(
    store: ResponseStore, owner: str, response_id: str, pairs: Pairs, reply: Reply
) -> None:
    gone = await store.delete(owner, response_id)
    await reply.respond(200, orjson.dumps(gone), JSON_HEADERS)


async def _input_items(
    store: ResponseStore, owner: str, response_id: str, pairs: Pairs, reply: Reply
) -> None:
    query = items_query(pairs)
    page = await store.input_items(
        owner, response_id, limit=query.limit, order=query.order, after=query.after
    )
    await reply.respond(200, orjson.dumps(page), JSON_HEADERS)


# What follows the id → the calls by method (HEAD: the server sends GET's answer without body).
CALLS: dict[str, dict[str, Call]] = {
    "": {"GET": _retrieve, "HEAD": _retrieve, "DELETE": _delete},
    "input_items": {"GET": _input_items, "HEAD": _input_items},
}


# ---------------------------------------------------------------- queries


def retrieve_query(pairs: Pairs) -> None:
    """`GET /v1/responses/{id}`'s query: `include` of OpenAI's values; `stream` false (true is
    refused). `include_obfuscation` and `starting_after` only matter to a stream: not read."""
    _include(pairs)
    params = dict(pairs)
    stream = _boolean(params.get("stream", "false"), "stream")
    if stream:
        raise UnsupportedParameter(
            "Streaming a stored response ('stream': true) is not supported: this gateway does "
            "not keep a response's events to replay them.",
            param="stream",
        )


def items_query(pairs: Pairs) -> ItemsQuery:
    """`GET /v1/responses/{id}/input_items`'s query: `limit`, `order`, `after`, `include`."""
    _include(pairs)
    params = dict(pairs)
    order = params.get("order", "desc")
    if order not in ORDERS:
        raise _one_of("order", order, ORDERS)
    limit = _integer(params.get("limit", str(LIST_DEFAULT)), "limit", *LIST_LIMIT)
    return ItemsQuery(limit, order, params.get("after"))


def _include(pairs: Pairs) -> None:
    for name, value in pairs:
        if name in INCLUDE_NAMES and value not in INCLUDABLE:
            raise _one_of("include", value, INCLUDABLE)


def _boolean(value: str, name: str) -> bool:
    if value.lower() not in BOOLEANS:
        raise _one_of(name, value, tuple(BOOLEANS))
    return BOOLEANS[value.lower()]


def _integer(value: str, name: str, lo: int, hi: int) -> int:
    if INTEGER.fullmatch(value) is None or not lo <= int(value) <= hi:
        raise InvalidRequest(
            f"Invalid '{name}': expected an integer from {lo} to {hi}, got '{value[:SHOWN]}'.",
            param=name,
        )
    return int(value)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> InvalidRequest:
    listed = ", ".join(f"'{a}'" for a in allowed)
    return InvalidRequest(
        f"Invalid value for '{name}': expected one of {listed}, got '{value[:SHOWN]}'.",
        param=name,
    )
