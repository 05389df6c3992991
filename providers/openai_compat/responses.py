"""The Responses API passed through to an upstream that serves it itself (OpenAI, vLLM's
server): the request mapped by the dialect's Responses table (providers.rules.responses), the
conversation sent as the upstream can take it, and the answer and the stream's events read into
the canonical response.

The conversation: when the turn before was answered by this same provider, which holds the whole
conversation under its own id (OpenAI, which keeps what it answered), the request continues from
that id, as the caller's `previous_response_id` meant; otherwise the gateway's stored turns are
sent inline, before this turn's input. Inline, what only the upstream that made it can read is
left out where the upstream cannot take it (OpenAI's reasoning items, and the item ids of other
targets' answers, name nothing at OpenAI).

The answer and the events are read by core.response_reading.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from core.answers import ResponseAnswer, ResponseEvent
from core.provider import AnswerShape, Call, Target
from core.response_reading import answer, event
from core.responses import ResponsesRequest
from providers.rules.params import Dialect, apply_rules
from providers.rules.responses import SELF_SET
from providers.transport.client import UpstreamClient


@dataclass(frozen=True, slots=True)
class Native:
    """How a dialect's upstream takes a conversation."""

    chains: bool  # it keeps what it answers, and continues from its own ids
    reasoning_inline: bool  # it reads reasoning items sent back inline (vLLM: their text)
    strip_ids: bool  # items sent inline must not carry ids it did not make


@dataclass(frozen=True, slots=True)
class Sent:
    """A Responses request as it goes upstream."""

    payload: bytes
    dropped: tuple[str, ...]
    whole: bool  # the upstream holds the whole conversation after this turn


def body(
    rules: Dialect, native: Native, provider: str, req: ResponsesRequest, target: Target
) -> Sent:
    applied = apply_rules(
        rules, req.fields, target=target.label, policy=target.unsupported_params, skip=SELF_SET
    )
    out = applied.body
    out["model"] = target.model
    prev = req.previous_upstream
    if native.chains and prev is not None and prev["provider"] == provider and prev["whole"]:
        out["previous_response_id"], out["input"] = prev["id"], req.fields["input"]
        whole = True
    elif req.history:
        out["input"] = [*_inline(req.history, native), *req.input]
        whole = False
    else:  # as the caller sent it
        out["input"], whole = req.fields["input"], True
    if req.stream:
        out["stream"] = True
    if native.chains:
        out["store"] = req.store  # kept upstream too, so that a next turn can continue there
    return Sent(orjson.dumps(out), applied.dropped, whole and req.store)


def _inline(items: list[dict[str, Any]], native: Native) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if item.get("type") == "reasoning" and not native.reasoning_inline:
            continue
        out.append({k: v for k, v in item.items() if k != "id"} if native.strip_ids else item)
    return out


# ---------------------------------------------------------------- the call


@dataclass(frozen=True, slots=True)
class Exchange:
    """One Responses request to one upstream: where it goes, what is sent, and what its answer
    is read for."""

    client: UpstreamClient
    url: str
    sent: Sent
    req: ResponsesRequest
    target: Target
    provider: str

    async def complete(self) -> ResponseAnswer:
        doc = await self.client.post_json(self.sent.payload, self.target, self.url)
        return answer(doc, self.req, self.target.label, self.provider, self.sent.whole)

    async def events(self) -> AsyncIterator[list[ResponseEvent]]:
        """The upstream's events, as they arrive: each without its number (the gateway
        numbers what it writes), a response in it read as the canonical one."""
        opened = await self.client.open_stream(self.sent.payload, self.target, self.url)
        label, whole = self.target.label, self.sent.whole
        try:
            yield []  # the upstream accepted: the caller's headers can go out now
            async for batch in self.client.batches(opened, self.target):
                yield [event(e, self.req, label, self.provider, whole) for e in batch]
        finally:
            await opened.aclose()


def call(exchange: Exchange, shape: AnswerShape) -> Call[ResponseAnswer, ResponseEvent]:
    return Call(exchange.target, exchange.sent.dropped, exchange.complete, exchange.events, shape)
