"""The scripted server's state (request log, stats, scripts) and shared response helpers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from .dialect import Dialect
from .errors import UpstreamError
from .fakegen import CONTEXT_WINDOW
from .magic import Script


@dataclass
class Stats:
    requests: int = 0
    streams_started: int = 0
    completed_streams: int = 0
    disconnects: int = 0  # streams whose client went away before the end
    cancelled: int = 0  # non-stream requests whose client went away before the answer
    dropped: int = 0  # closed on purpose: __close__, close/reset/cut_after steps, Fireworks cut
    disconnect_events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ServerState:
    dialect: Dialect
    api_key: str | None = None
    models: tuple[str, ...] = ()
    strict_models: bool = False
    window: int = CONTEXT_WINDOW
    chunk_delay_s: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    script: Script = field(default_factory=Script)

    def record(self, request: web.Request, body: Any) -> int:
        seq = len(self.log)
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.log.append(
            {
                "seq": seq,
                "time": time.time(),
                "method": request.method,
                "path": request.path,
                "query": request.rel_url.raw_query_string,  # as sent ("" without one)
                "headers": headers,
                "body": body,
                "outcome": None,
            }
        )
        self.stats.requests += 1
        return seq

    def finish(self, seq: int, outcome: str) -> None:
        """Note how request `seq` ended (once): ok | error | completed_stream | disconnect |
        cancelled | dropped."""
        if seq >= len(self.log) or self.log[seq]["outcome"] is not None:
            return  # reset meanwhile, or already noted
        self.log[seq]["outcome"] = outcome
        counter = _COUNTERS.get(outcome)
        if counter is not None:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    def reset(self) -> None:
        self.log.clear()
        self.stats = Stats()
        self.script = Script()


STATE = web.AppKey("state", ServerState)
_COUNTERS = {
    "completed_stream": "completed_streams",
    "disconnect": "disconnects",
    "cancelled": "cancelled",
    "dropped": "dropped",
}


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


def error_response(exc: UpstreamError) -> web.Response:
    if exc.text:
        resp = web.Response(status=exc.status, text=str(exc.body))
    else:
        resp = web.json_response(exc.body, status=exc.status, dumps=dumps)
    resp.headers.update(exc.headers)  # after: a scripted Content-Type may replace the body's
    return resp


def check_auth(state: ServerState, request: web.Request) -> None:
    if state.api_key is not None:
        state.dialect.check_key(request.headers, state.api_key)
