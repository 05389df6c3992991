"""Routes besides completions: models, readiness, and the test controls (__requests,
__reset, __stats, __script)."""

from __future__ import annotations

from dataclasses import asdict

from aiohttp import web

from .errors import UpstreamError
from .magic import parse_steps
from .state import STATE, check_auth, dumps, error_response


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        check_auth(state, request)
    except UpstreamError as exc:
        return error_response(exc)
    return web.json_response(state.dialect.models(list(state.models)), dumps=dumps)


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model = request.match_info["model_id"]
    try:
        check_auth(state, request)
        if state.strict_models and model not in state.models:
            raise state.dialect.model_not_found(model)
    except UpstreamError as exc:
        return error_response(exc)
    return web.json_response(state.dialect.model_card(model), dumps=dumps)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "dialect": request.app[STATE].dialect.name})


async def requests_log(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].log, dumps=dumps)


async def reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return web.json_response({"ok": True})


async def stats(request: web.Request) -> web.Response:
    data = asdict(request.app[STATE].stats)
    events = data["disconnect_events"]
    data["last_disconnect_time"] = events[-1]["time"] if events else None
    return web.json_response(data, dumps=dumps)


async def script(request: web.Request) -> web.Response:
    """Queue reactions for the next completions requests: a step or a list of steps (see
    magic.py, README.md). Nothing is queued when one step is invalid: 400 naming its key."""
    try:
        steps = parse_steps(await request.json())
    except ValueError as exc:  # ScriptError, or a body that is not JSON
        return web.json_response({"error": str(exc)}, status=400)
    state = request.app[STATE]
    state.script.steps.extend(steps)
    return web.json_response({"queued": len(state.script.steps)})
