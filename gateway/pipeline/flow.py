"""One inference request's flow through the pipeline, and what a stage is.

A `Flow` is what the stages know of one request, filled in as it goes: its endpoint's row, its
HTTP exchange (`Inbound`, `Reply`), its metrics record, then its caller, body, request, plan,
admission, the call that answered and its answer (`answer` for JSON, `stream` for a stream).

A `Stage` is one step of every endpoint's path, written as ASGI middleware is: given the rest of
the pipeline (`proceed`), it returns its own step, which does its part, hands the flow on with
`await proceed(flow)`, and may act again once that returns (a stage wraps the ones after it).
The steps are chained once per endpoint, so a request pays for one call per stage, no more. A
stage that wants to see a stream's batches as they are written replaces `flow.stream` with a
tapped one (`tapped`) after `proceed` has filled it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol

from core.provider import Call
from gateway.auth import Principal
from gateway.cache.entries import Entry
from gateway.config.portkey import PortkeyConfig
from gateway.metrics import RequestRecord
from gateway.observability.content import Gathered
from gateway.observability.tracing import Trace
from gateway.pipeline.endpoints import A, Endpoint, K, R
from gateway.pipeline.exchange import Inbound, Reply
from gateway.ratelimit import Grant
from gateway.routing.plans import Plan


class Cached:
    """A request to a cache-enabled model, as the cache stages see it (gateway.pipeline.caching):
    its status, its key, and the entry that answers it (a hit) or that its answer made."""

    __slots__ = ("entry", "key", "leads", "made", "status", "ttl_s")

    def __init__(self, status: str, key: bytes = b"", ttl_s: int = 0) -> None:
        self.status = status  # HIT, MISS, REFRESH or DISABLED (x-portkey-cache-status)
        self.key = key
        self.ttl_s = ttl_s
        self.entry: Entry | None = None  # a hit's
        self.leads = False  # it leads the flight of its key: the others wait for its entry
        self.made: bytes | None = None  # the entry its answer made, once put (encoded)


@dataclass(slots=True)
class Stream(Generic[K]):
    """A stream that began: its first batch (which came before any byte was written, while the
    attempts could still retry), then the rest."""

    first: list[K]
    rest: AsyncIterator[list[K]]


class Flow(Generic[R, A, K]):
    """One request as the stages see it; each field is set by the stage named beside it.

    A flow is made per request with its first fields only: the others start as the class's
    defaults, and are written when known (a dataclass would write all fifteen at each start)."""

    principal: Principal | None = None  # authenticate (a batch's line: its key's)
    body: bytes | None = None  # parse (a batch's line: given)
    portkey: PortkeyConfig | None = None  # parse: the request's x-portkey-config
    request: R | None = None  # parse
    streams: bool = False  # parse: the request asked for a stream
    plan: Plan | None = None  # plan
    grant: Grant | None = None  # admit
    id: str = ""  # write: the answer's id
    created: int = 0  # write: the answer's time (Unix seconds)
    document: Mapping[str, object] | None = None  # keep: a JSON answer's document, as stored
    call: Call[A, K] | None = None  # attempt: what the target that answered was sent
    answer: A | None = None  # attempt: a JSON answer
    stream: Stream[K] | None = None  # attempt: a stream's answer
    gathered: Gathered | None = None  # capture: a stream's text, for the request log
    trace: Trace | None = None  # record (journal): its trace, when it is traced
    cache: Cached | None = None  # lookup: a cache-enabled model's request

    def __init__(
        self,
        endpoint: Endpoint[R, A, K],
        inbound: Inbound,
        reply: Reply,
        record: RequestRecord,  # observed by the record stage at the end
    ) -> None:
        self.endpoint = endpoint
        self.inbound = inbound
        self.reply = reply
        self.record = record


Next = Callable[[Flow[R, A, K]], Awaitable[None]]


class Stage(Protocol):
    """A step of the pipeline, the same for every endpoint: given the rest of the pipeline, its
    own step."""

    def __call__(self, proceed: Next[R, A, K], /) -> Next[R, A, K]: ...


def compose(stages: Sequence[Stage], endpoint: Endpoint[R, A, K]) -> Next[R, A, K]:
    """The stages chained, first to last, for `endpoint`'s flows (built once, not per request;
    the endpoint fixes the flows' types)."""
    run: Next[R, A, K] = _end
    for stage in reversed(stages):
        run = stage(run)
    return run


async def _end(flow: Flow[R, A, K]) -> None:
    return None


def tapped(
    stream: Stream[K],
    seen: Callable[[list[K]], None],
    ended: Callable[[bool], None],
    then: Callable[[], Awaitable[None]] | None = None,
) -> Stream[K]:
    """`stream`, with `seen` called on each batch as it is taken and `ended` once at its end:
    True when it ran to its end, False when it failed or was closed early (the caller left).
    `then`, after a stream that ran to its end, is awaited before the stream ends."""
    seen(stream.first)
    return Stream(stream.first, _tap(stream.rest, seen, ended, then))


async def _tap(
    rest: AsyncIterator[list[K]],
    seen: Callable[[list[K]], None],
    ended: Callable[[bool], None],
    then: Callable[[], Awaitable[None]] | None,
) -> AsyncIterator[list[K]]:
    whole = False
    try:
        async for batch in rest:
            seen(batch)
            yield batch
        whole = True
    finally:
        aclose = getattr(rest, "aclose", None)
        if not whole and aclose is not None:
            await aclose()
        ended(whole)
    if then is not None:  # only reached when the stream ran to its end
        await then()
