"""OpenAI's Responses API on the scripted OpenAI upstream: `POST …/responses` (any prefix), and
the responses it keeps: GET and DELETE `…/responses/{id}`, GET `…/responses/{id}/input_items`.

`POST` goes through the machinery of completions and chat (scripted.py): auth, the request log
(outcomes `ok`, `error`, `completed_stream`, `disconnect`, `cancelled`, `dropped`), `/__script`
steps (statuses, delays, close/reset, `cut_after`, `stall_after`, headers), the markers in the
request's texts (its instructions and input: `__status_<code>__`, `__sleep_<ms>__`, `__close__`,
`__midstream_error__`, `__slow_stream__`, `__eos_<k>__`, `__tool__` …). The request's checks and
prompt: responses_request.py; the answer and the stream's events: responses_render.py.

A response is kept when `store` is not false (OpenAI's default), the failed one of a
`__midstream_error__` stream included, for `previous_response_id`, for the items a later input
names by id, and for the GET/DELETE routes. `/__reset` does not forget them (their ids are
unique). GET/DELETE/input_items check the key and are logged, but take no `/__script` step;
an unknown id is a 404 "Response with id '…' not found.".

Registered by `scripted.create_app` for the openai dialect only (after chat_server: this module
imports scripted's helpers, as chat_server does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .chat_render import build_chat
from .chat_server import chat_headers, slow_chat
from .errors import UpstreamError, openai_error
from .magic import Magic
from .responses_render import (
    Answer,
    failed_stream,
    new_id,
    numbered,
    render,
    sse,
    stream_events,
)
from .responses_request import ResponsesParams, item_kind, parse_responses, responses_texts
from .scripted import (
    SLOW_CHUNKS,
    logged,
    misbehave,
    open_stream,
    send_cut_body,
    send_stream,
)
from .state import STATE, ServerState, check_auth, dumps, error_response

Json = dict[str, Any]
ITEM_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
DEFAULT_PAGE = 20
MAX_PAGE = 100


# ---------------------------------------------------------------- what is kept


@dataclass
class Kept:
    response: Json
    context: list[Json]  # the conversation it answered: earlier turns' items, then its input

    def item_ids(self) -> set[str]:
        return {i["id"] for i in [*self.context, *self.response["output"]] if "id" in i}


@dataclass
class ResponseStore:
    """The responses this upstream keeps (`responses_request.Memory`)."""

    kept: dict[str, Kept] = field(default_factory=dict)

    def history(self, response_id: str) -> list[Json] | None:
        kept = self.kept.get(response_id)
        return None if kept is None else [*kept.context, *kept.response["output"]]

    def has_item(self, item_id: str) -> bool:
        return any(item_id in k.item_ids() for k in self.kept.values())

    def keep(self, params: ResponsesParams, response: Json) -> None:
        if params.store:
            context = [*params.history, *(stored_item(i) for i in params.items)]
            self.kept[response["id"]] = Kept(response, context)


RESPONSES = web.AppKey("responses", ResponseStore)


def stored_content(item: Json) -> list[Json]:
    """A message's content as OpenAI lists it: a string becomes one text part."""
    content = item["content"]
    if not isinstance(content, str):
        return list(content)
    if item["role"] == "assistant":
        return [{"type": "output_text", "text": content, "annotations": []}]
    return [{"type": "input_text", "text": content}]


def stored_item(item: Json) -> Json:
    """An input item as kept and listed: with its id (one made when it came without), type and
    status."""
    kind = item_kind(item)
    out = {"id": item.get("id") or new_id(ITEM_PREFIXES.get(kind, "item")), "type": kind}
    out.update((k, v) for k, v in item.items() if k not in ("id", "type"))
    if kind == "message":
        out["content"] = stored_content(item)
    out.setdefault("status", "completed")
    return out


# ---------------------------------------------------------------- POST …/responses


async def create_response(request: web.Request) -> web.StreamResponse:
    return await logged(request, react_responses, responses_texts)


async def react_responses(
    request: web.Request, state: ServerState, body: Any, magic: Magic, seq: int
) -> web.StreamResponse:
    """As chat: markers and script step, validation, then the answer."""
    await misbehave(request, state, magic)
    store = request.app[RESPONSES]
    params = parse_responses(body, state.window, store)
    if state.strict_models and params.chat.model not in state.models:
        raise state.dialect.model_not_found(params.chat.model)
    if params.stream:
        return await stream_response(request, state, params, magic, seq)
    result = build_chat(params.chat, state.window, False, "stop")
    answer = render(params, result)
    store.keep(params, answer.response)
    headers = chat_headers(state, params.chat, result)
    resp = web.json_response(answer.response, headers=headers, dumps=dumps)
    resp.headers.update(magic.headers)
    if magic.cut_after is not None:
        return await send_cut_body(request, resp)
    return resp


def stream_payloads(
    answer: Answer, params: ResponsesParams, magic: Magic
) -> tuple[list[Json], Json]:
    """The stream's events (numbered) and the response it ends with."""
    events = stream_events(answer, params.obfuscate)
    final = answer.response
    if magic.midstream_error:
        events, final = failed_stream(events, final)
    return numbered(events), final


async def stream_response(
    request: web.Request, state: ServerState, params: ResponsesParams, magic: Magic, seq: int
) -> web.StreamResponse:
    chat, window = params.chat, state.window
    if magic.slow_stream:
        chat, window = slow_chat(chat), window + SLOW_CHUNKS
    result = build_chat(chat, window, False, "stop")
    events, final = stream_payloads(render(params, result), params, magic)
    request.app[RESPONSES].keep(params, final)
    payloads = [sse(ev) for ev in events]
    if magic.cut_after is not None:
        payloads = payloads[: magic.cut_after]
    resp, pace = await open_stream(request, state, magic, chat_headers(state, chat, result))
    whole = magic.cut_after is None
    return await send_stream(request, resp, payloads, pace, state, seq, whole)


# ---------------------------------------------------------------- the kept responses


def not_found(response_id: str) -> UpstreamError:
    return openai_error(404, f"Response with id '{response_id}' not found.")


Act = Callable[[web.Request, ResponseStore, str], Json]


async def on_kept(request: web.Request, act: Act) -> web.StreamResponse:
    """A request about a kept response: the key checked, the request logged."""
    state = request.app[STATE]
    seq = state.record(request, None)
    try:
        check_auth(state, request)
        doc = act(request, request.app[RESPONSES], request.match_info["response_id"])
    except UpstreamError as exc:
        state.finish(seq, "error")
        return error_response(exc)
    state.finish(seq, "ok")
    return web.json_response(doc, dumps=dumps)


def _kept(store: ResponseStore, response_id: str) -> Kept:
    kept = store.kept.get(response_id)
    if kept is None:
        raise not_found(response_id)
    return kept


def retrieve(request: web.Request, store: ResponseStore, response_id: str) -> Json:
    return _kept(store, response_id).response


def delete(request: web.Request, store: ResponseStore, response_id: str) -> Json:
    _kept(store, response_id)
    del store.kept[response_id]
    return {"id": response_id, "object": "response", "deleted": True}


def _page_size(raw: str | None) -> int:
    try:
        limit = DEFAULT_PAGE if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise openai_error(
            400,
            f"Invalid 'limit': expected an integer between 1 and {MAX_PAGE}.",
            param="limit",
        )
    return limit


def list_items(request: web.Request, store: ResponseStore, response_id: str) -> Json:
    """The items the response answered (its conversation), OpenAI's cursor paging: `limit`
    (1..100, 20), `order` (`desc` by default), `after` (an item id)."""
    items = list(_kept(store, response_id).context)
    if request.query.get("order", "desc") == "desc":
        items.reverse()
    after = request.query.get("after")
    ids = [i["id"] for i in items]
    if after is not None and after in ids:
        items = items[ids.index(after) + 1 :]
    limit = _page_size(request.query.get("limit"))
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


async def get_response(request: web.Request) -> web.StreamResponse:
    return await on_kept(request, retrieve)


async def delete_response(request: web.Request) -> web.StreamResponse:
    return await on_kept(request, delete)


async def get_input_items(request: web.Request) -> web.StreamResponse:
    return await on_kept(request, list_items)


def add_responses_routes(app: web.Application) -> None:
    app[RESPONSES] = ResponseStore()
    app.router.add_post("/{prefix:.*}responses", create_response)
    app.router.add_get("/{prefix:.*}responses/{response_id}", get_response)
    app.router.add_delete("/{prefix:.*}responses/{response_id}", delete_response)
    app.router.add_get("/{prefix:.*}responses/{response_id}/input_items", get_input_items)
