"""SSE rendering of canonical chunks, and the disconnect watch.

Every event is `data: <one-line JSON>\\n\\n`; `data: [DONE]\\n\\n` is always last. An error after
the headers went out becomes `data: {"error": …}` and then `[DONE]`: the only channel left, and
the openai SDK raises it as an `APIError`. The caller's disconnect is watched by
`gateway.asgi.until_disconnect`, which cancels the pump.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import NamedTuple, TypeVar, cast

import orjson

from core.answers import Usage
from core.errors import GatewayError, error_event, internal
from core.provider import AnswerShape
from gateway.asgi import Send

DONE_EVENT = b"data: [DONE]\n\n"
CHAT_CHUNK = "chat.completion.chunk"  # a chat stream's chunks' `object`
log = logging.getLogger("gateway.sse")
K = TypeVar("K", bound=Mapping[str, object])  # a stream's chunks (completions', chat's)


class Head(NamedTuple):
    """What every event of one stream repeats: the answer's id, time and model (the caller's
    alias), whether the caller asked for the usage, its chunks' `object`, and its shape."""

    id: str
    created: int
    model: str
    include_usage: bool
    kind: str
    shape: AnswerShape


class Envelope:
    """The fixed part of every chunk of one response, encoded once (again only if the upstream's
    `system_fingerprint` appears or changes)."""

    __slots__ = ("_fixed", "_head", "_tail", "include_usage")

    def __init__(
        self,
        completion_id: str,
        created: int,
        model: str,
        include_usage: bool,
        kind: str = "text_completion",
    ) -> None:
        """`kind`: the chunks' `object` (a chat's are CHAT_CHUNK)."""
        self.include_usage = include_usage
        self._fixed = {"id": completion_id, "object": kind, "created": created, "model": model}
        self._head = self._encode(self._fixed)
        # OpenAI puts "usage": null on content chunks when the caller asked for usage.
        self._tail = b',"usage":null}\n\n' if include_usage else b"}\n\n"

    @staticmethod
    def _encode(fixed: dict[str, object]) -> bytes:
        return b"data: " + orjson.dumps(fixed)[:-1] + b',"choices":'

    def fingerprint(self, value: str) -> None:
        """Every chunk from now on carries `system_fingerprint`, as OpenAI's do."""
        self._head = self._encode({**self._fixed, "system_fingerprint": value})

    def chunk(
        self,
        choices: Sequence[Mapping[str, object]],
        usage: Usage | None = None,
        prompt_ids: list[int] | None = None,
        prompt_filters: object = None,
    ) -> bytes:
        """A content chunk; `usage` is its choice's usage so far (vLLM's continuous usage);
        `prompt_ids` the prompt's token ids (vLLM's return_token_ids, on a chat's first chunk);
        `prompt_filters` Azure's content filter's verdicts on the prompts (on the first one)."""
        body = self._head + orjson.dumps(choices)
        if prompt_ids is not None:
            body += b',"prompt_token_ids":' + orjson.dumps(prompt_ids)
        if prompt_filters is not None:
            body += b',"prompt_filter_results":' + orjson.dumps(prompt_filters)
        if usage is not None:
            return body + b',"usage":' + orjson.dumps(usage) + b"}\n\n"
        return body + self._tail

    def usage(self, usage: Usage) -> bytes:
        return self._head + b'[],"usage":' + orjson.dumps(usage) + b"}\n\n"


class StreamResult:
    """What the stream delivered, for accounting once it is over."""

    __slots__ = ("error", "first_at", "usage", "write_s")

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.error: GatewayError | None = None
        self.first_at = 0.0  # perf_counter() when the first text went out
        self.write_s = 0.0  # time spent rendering and writing (the gateway's own)


async def pump(
    send: Send,
    first: list[K],
    rest: AsyncIterator[list[K]],
    env: Envelope,
    include_usage: bool,
    result: StreamResult,
) -> None:
    """Send each batch of chunks as one body: what arrived together leaves together, which
    spares a write (a system call) per event."""
    try:
        await _write(send, first, env, result)
        async for batch in rest:
            await _write(send, batch, env, result)
        if include_usage and result.usage is not None:
            await _body(send, env.usage(result.usage))
    except GatewayError as err:
        result.error = err
        await _body(send, error_event(err))
    except Exception as exc:  # an adapter bug must still end the stream properly
        log.exception("stream failed")
        result.error = internal(exc)
        await _body(send, error_event(result.error))
    finally:
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()
    await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})


async def _write(send: Send, batch: list[K], env: Envelope, result: StreamResult) -> None:
    began = time.perf_counter()
    events = []
    for item in batch:
        fingerprint = item.get("system_fingerprint")
        if fingerprint is not None:
            env.fingerprint(cast(str, fingerprint))
        choices = cast("Sequence[Mapping[str, object]] | None", item.get("choices"))
        usage = cast("Usage | None", item.get("usage"))
        if choices:
            ids = item.get("prompt_token_ids")  # a chat's, from vLLM
            filters = item.get("prompt_filter_results")  # Azure's, on the first chunk
            events.append(env.chunk(choices, usage, ids if type(ids) is list else None, filters))
        elif usage is not None:  # the request's usage, shown at the end
            result.usage = usage
    if events:
        await _body(send, events[0] if len(events) == 1 else b"".join(events))
        if not result.first_at:
            result.first_at = time.perf_counter()
    result.write_s += time.perf_counter() - began


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})
