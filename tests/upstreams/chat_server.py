"""`POST …/chat/completions` of the scripted upstreams, with the machinery of completions
(scripted.py): auth, the request log, `/__script` steps, markers in the messages' text, delays,
cut and stalled streams, `__midstream_error__`, `__slow_stream__`.

Imported by `scripted.create_app` when it builds the routes (so not at scripted's import: this
module imports scripted's helpers). Under `python -m tests.upstreams.scripted` those helpers come
from the `tests.upstreams.scripted` module, the one this handler uses throughout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from .chat_dialects import CHAT_DIALECTS, ChatDialect
from .chat_render import ChatResult, build_chat
from .chat_validate import ChatParams
from .magic import Magic
from .render import Result
from .scripted import (
    DONE,
    MIDSTREAM_CHUNKS,
    SLOW_CHUNKS,
    logged,
    misbehave,
    open_stream,
    send_cut_body,
    send_stream,
    sse,
)
from .state import ServerState, dumps
from .validate import Params


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await logged(request, react_chat)


async def react_chat(
    request: web.Request, state: ServerState, body: Any, magic: Magic, seq: int
) -> web.StreamResponse:
    """As completions: markers and script step, validation, then the answer."""
    await misbehave(request, state, magic)
    chat = CHAT_DIALECTS[state.dialect.name]
    params = chat.parse(body, state.window)
    if state.strict_models and params.model not in state.models:
        raise state.dialect.model_not_found(params.model)
    if params.stream:
        return await chat_stream(request, state, chat, params, magic, seq)
    result = build_chat(params, state.window, chat.include_stop, chat.named_finish)
    headers = chat_headers(state, params, result)
    resp = web.json_response(chat.body(params, result), headers=headers, dumps=dumps)
    resp.headers.update(magic.headers)
    if magic.cut_after is not None:
        return await send_cut_body(request, resp)
    return resp


def chat_headers(state: ServerState, params: ChatParams, result: ChatResult) -> dict[str, str]:
    """The dialect's response headers (Fireworks' name the prompt's tokens)."""
    as_completion = Result((), result.prompt_tokens, result.completion_tokens)
    return state.dialect.headers(Params(model=params.model, prompts=()), as_completion)


def slow_chat(params: ChatParams) -> ChatParams:
    """`__slow_stream__`: one choice of SLOW_CHUNKS words, nothing to stop it early."""
    return replace(
        params,
        n=1,
        max_tokens=SLOW_CHUNKS,
        stops=(),
        tools=(),
        response_format=None,
        truncate=False,
        ignore_eos=True,
    )


def chat_payloads(
    chat: ChatDialect, params: ChatParams, result: ChatResult, magic: Magic
) -> list[bytes]:
    events = [sse(e) for e in chat.stream_events(params, result)]
    if magic.cut_after is not None:
        return events[: magic.cut_after]
    if not magic.midstream_error:
        return [*events, DONE]
    error = chat.midstream_error_event()
    if error is None:  # Fireworks: the connection just breaks
        return events[:MIDSTREAM_CHUNKS]
    return [*events[:MIDSTREAM_CHUNKS], sse(error), DONE]


async def chat_stream(
    request: web.Request,
    state: ServerState,
    chat: ChatDialect,
    params: ChatParams,
    magic: Magic,
    seq: int,
) -> web.StreamResponse:
    window = state.window
    if magic.slow_stream:
        params, window = slow_chat(params), window + SLOW_CHUNKS
    result = build_chat(params, window, chat.include_stop, chat.named_finish)
    payloads = chat_payloads(chat, params, result, magic)
    resp, pace = await open_stream(request, state, magic, chat_headers(state, params, result))
    return await send_stream(request, resp, payloads, pace, state, seq)
