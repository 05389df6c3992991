"""The stages every inference endpoint's requests go through, in order:

    record        the request's metrics record: in flight while it runs, observed at its end
    authenticate  the caller's key; Portkey headers the gateway does not implement refused
    parse         the body read (bounded), its x-portkey-config, the endpoint's request
    recall        (an endpoint that stores answers: the Responses API) the earlier turns of
                  the conversation the request continues, from the store
    plan          the routing plan: the alias's tree, or a Portkey config's, for this caller
    lookup        (a cache-enabled model's requests) the cache's entry for the request, or the
                  identical miss in flight it waits for (gateway.pipeline.caching)
    admit         the rate limits' admission (its headers on every answer); after the rest,
                  the reservation settled to what was used
    write         the answer written: JSON, or SSE as the stream's batches come
    keep          (the same endpoints) the answer stored, when the request asked for it
    capture       a stream's finish reasons and text, for the trace and the request log
    cached        a cache hit answers here; a miss's whole answer is put in the cache
    [extra]       stages added for every endpoint (create_app's `stages`): after admission,
                  around the attempts; they see the JSON answer or tap the stream
    attempt       the plan's tries (gateway.routing.attempts): retries, fallback, breakers;
                  always last

Each stage is written as ASGI middleware is (gateway.pipeline.flow): given the rest, its step.
A batch's line skips record and authenticate (its key is the batch's, its body given; the
Batch API counts its lines) and otherwise runs the same stages.

Retries and fallback happen only before the first byte reaches the caller; after that a stream
either completes or ends with an error event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

import orjson

from core.errors import GatewayError, InvalidRequest, RateLimited
from core.provider import Call, Target
from gateway.asgi import (
    JSON_HEADERS,
    SSE_HEADERS,
    ClientGone,
    RawHeaders,
    read_body,
    until_disconnect,
)
from gateway.auth import Principal
from gateway.config import portkey
from gateway.governance.ledger import ledger
from gateway.metrics import RequestRecord
from gateway.observability.content import Gathered
from gateway.observability.tracing import Trace, Tracing, span_id
from gateway.pipeline import logline, spans
from gateway.pipeline.caching import cached, lookup
from gateway.pipeline.endpoints import ENDPOINTS, A, Endpoint, K, R
from gateway.pipeline.exchange import Inbound, Reply
from gateway.pipeline.flow import Flow, Next, Stage, Stream, compose, tapped
from gateway.pipeline.sse import Head, StreamResult
from gateway.ratelimit import Grant
from gateway.routing.attempts import Prepare
from gateway.routing.trees import Leaf

log = logging.getLogger("gateway.pipeline")
DROPPED_HEADER = b"x-gateway-dropped-params"
# Portkey headers the gateway does not implement: refusing beats ignoring them silently.
# (A custom host would make the gateway call a host its config does not name; a provider
# header would take the provider's key from the caller.)
UNSUPPORTED_HEADERS = ("x-portkey-custom-host", "x-portkey-provider")
CLIENT_GONE = 499  # nginx's "client closed request": the status the metrics give a disconnect
RATE_LIMIT_EVENT = "gateway.rate_limit"


# ---------------------------------------------------------------- record


def record(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """The request's record (observed once it is over, and written to the request log) and the
    in-flight gauge."""

    async def recorded(flow: Flow[R, A, K]) -> None:
        rt, rec, reply = flow.inbound.runtime, flow.record, flow.reply
        rt.metrics.inflight_add(1)
        rt.live += 1
        if rt.tracing is not None:
            _traced(flow, rt.tracing, flow.inbound.headers)
        try:
            await proceed(flow)
            rec.status = reply.status
        except Exception as exc:
            _failed(rec, exc, reply.status)
            raise
        finally:
            rt.live -= 1
            rt.metrics.inflight_add(-1)
            end = time.perf_counter()
            rt.metrics.observe(rec, end)
            _written(flow, end)

    return recorded


def _traced(flow: Flow[R, A, K], tracing: Tracing, headers: Mapping[str, str]) -> None:
    trace = flow.trace = tracing.begin(headers)
    if trace is not None:
        flow.record.trace_id = trace.trace_id


def _written(flow: Flow[R, A, K], end: float) -> None:
    """The request's trace record and request log line. Neither can fail the answer: one that
    cannot be made is dropped and counted (as a full queue drops it), and why is logged."""
    rt, trace = flow.inbound.runtime, flow.trace
    if trace is not None and rt.tracing is not None:
        try:
            rt.tracing.emit(spans.record(flow, trace, rt.tracing, end))
        except Exception:
            log.exception("request %s: its trace was dropped", flow.inbound.request_id)
            rt.metrics.spans_dropped(2 + len(flow.record.attempts or ()))
    if rt.request_log is not None:
        try:
            rt.request_log.write(logline.line(flow, end))
        except Exception:
            log.exception("request %s: its log line was dropped", flow.inbound.request_id)
            rt.metrics.request_log_dropped(1)


def journal(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """A batch line's request log line, once it is answered. A line refused by a rate limit is
    not over: the batch runner waits and serves it again."""

    async def journaled(flow: Flow[R, A, K]) -> None:
        rec, reply, tracing = flow.record, flow.reply, flow.inbound.runtime.tracing
        over = True
        if tracing is not None:
            _traced(flow, tracing, {})
        try:
            await proceed(flow)
            rec.status = reply.status
        except Exception as exc:
            over = not isinstance(exc, RateLimited)
            _failed(rec, exc, reply.status)
            raise
        finally:
            if over:
                _written(flow, time.perf_counter())

    return journaled


def _failed(rec: RequestRecord, exc: Exception, sent: int) -> None:
    """The record's status is what the caller got: the error's, unless a response had begun
    with `sent` (a caller who left is counted as such either way)."""
    if isinstance(exc, ClientGone):
        status, kind = CLIENT_GONE, "ClientGone"
    elif isinstance(exc, GatewayError):
        status, kind = exc.status, type(exc).__name__
        rec.error_code = exc.code
    else:
        status, kind = 500, "InternalError"
    rec.error_type = kind
    rec.status = status if not sent or status == CLIENT_GONE else sent


# ---------------------------------------------------------------- authenticate, parse, plan


def authenticate(proceed: Next[R, A, K]) -> Next[R, A, K]:
    def authenticated(flow: Flow[R, A, K]) -> Awaitable[None]:
        headers = flow.inbound.headers
        flow.principal = flow.inbound.runtime.auth.authenticate(headers)
        for name in UNSUPPORTED_HEADERS:
            if name in headers:
                raise InvalidRequest(
                    f"The header '{name}' is not supported by this gateway.", param=name
                )
        return proceed(flow)

    return authenticated


def parse(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """The body, then the request's x-portkey-config (checked before the body's fields, as it
    always was), then the endpoint's request."""

    async def parsed(flow: Flow[R, A, K]) -> None:
        inbound = flow.inbound
        rt = inbound.runtime
        config = rt.config
        body = flow.body
        if body is None:
            body = await read_body(inbound.headers, inbound.receive, config.server.max_body_bytes)
        flow.portkey = portkey.from_headers(inbound.headers, config.configs, config.providers)
        endpoint = flow.endpoint
        req = flow.request = endpoint.parse(body, config.server.limits)
        streaming = endpoint.streaming
        flow.streams = streaming is not None and streaming.wanted(req)
        flow.record.model = rt.model_label(req.model)
        flow.record.stream = flow.streams
        await proceed(flow)

    return parsed


def plan(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """The routing plan: a Portkey config and a virtual key honoured, never widening the key's
    rights (gateway.routing.plans)."""

    def planned(flow: Flow[R, A, K]) -> Awaitable[None]:
        inbound, principal, req = flow.inbound, flow.principal, flow.request
        assert principal is not None and req is not None, "authenticate and parse come first"
        virtual_key = inbound.headers.get("x-portkey-virtual-key")
        if flow.trace is not None:  # the GenAI operation begins
            flow.trace.began = time.perf_counter()
        flow.plan = inbound.runtime.router.plan(
            principal, req.model, virtual_key, flow.portkey, endpoint=flow.endpoint.name
        )
        return proceed(flow)

    return planned


# ---------------------------------------------------------------- recall and keep


def recall(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """An endpoint that continues stored answers (the Responses API): the request's earlier
    turns, from the store, before anything is reserved for it."""

    async def recalled(flow: Flow[R, A, K]) -> None:
        conversation, principal, req = flow.endpoint.conversation, flow.principal, flow.request
        assert conversation is not None and principal is not None and req is not None
        flow.request = await conversation.recall(flow.inbound.runtime, principal, req)
        await proceed(flow)

    return recalled


def keep(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """Its answer stored when the request asked for it: a JSON answer before it is written (a
    caller who reads it back finds it), a stream once its last event is out and before the
    stream's end (an answer whose caller left is not kept)."""

    async def kept(flow: Flow[R, A, K]) -> None:
        await proceed(flow)
        conversation, req, call = flow.endpoint.conversation, flow.request, flow.call
        assert conversation is not None and req is not None and call is not None
        if not conversation.stored(req):
            return
        if flow.stream is None:
            assert flow.answer is not None
            flow.document = flow.endpoint.document(
                flow.answer, req.model, flow.id, flow.created, call.answer_shape
            )
            await _stored(flow, flow.answer, flow.document)
            return
        stream = flow.stream
        flow.stream = Stream(stream.first, _kept(flow, stream.rest))

    return kept


async def _kept(flow: Flow[R, A, K], rest: AsyncIterator[list[K]]) -> AsyncIterator[list[K]]:
    conversation, req, call = flow.endpoint.conversation, flow.request, flow.call
    assert conversation is not None and req is not None and call is not None
    last: A | None = None
    try:
        async for batch in rest:
            last = conversation.final(batch) or last
            yield batch
    finally:
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()
    if last is not None:
        doc = flow.endpoint.document(last, req.model, flow.id, flow.created, call.answer_shape)
        await _stored(flow, last, doc)


async def _stored(flow: Flow[R, A, K], answer: A, doc: Mapping[str, object]) -> None:
    """The answer kept; a store that fails costs the caller the stored copy, not the answer
    (reading it back is a 404), and is logged."""
    conversation, principal, req = flow.endpoint.conversation, flow.principal, flow.request
    assert conversation is not None and principal is not None and req is not None
    try:
        await conversation.keep(flow.inbound.runtime, principal, req, answer, doc)
    except Exception:
        log.exception("request %s: its answer was not stored", flow.inbound.request_id)


# ---------------------------------------------------------------- admit (and settle)


def admit(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """Admission against the rate limits and budgets, whose headers every answer carries; once
    the rest is done, the reservation settled with what was used, and what it cost charged."""

    async def admitted(flow: Flow[R, A, K]) -> None:
        rt, rec, reply = flow.inbound.runtime, flow.record, flow.reply
        the_plan, principal, req = flow.plan, flow.principal, flow.request
        assert the_plan is not None and principal is not None and req is not None

        def reserve() -> tuple[int, int]:
            if flow.cache is not None and flow.cache.entry is not None:
                return 0, 0  # a hit: no tokens, and nothing to pay
            prompt, output = flow.endpoint.reserve(rt, req, the_plan)
            top_in, top_out = rt.prices.ceiling(the_plan.targets()) if rt.prices else (0, 0)
            return prompt + output, prompt * top_in + output * top_out

        trace = flow.trace
        began = time.perf_counter()
        try:
            grant = await rt.limiter.admit(principal.key_id, req.model, rec.model, reserve)
        except GatewayError as exc:
            if trace is not None:
                _limited(trace, exc.code or "refused", began)
            raise
        if trace is not None and grant.ask is not None:  # limits were checked
            _limited(trace, "allowed", began)
        flow.grant = grant
        reply.add_headers(grant.headers)
        try:
            await proceed(flow)
        except GatewayError:
            if not reply.started:
                grant.settle(0, 0)  # refused or failed before any output: nothing was generated
            raise
        finally:
            _charge(flow, grant, principal)

    return admitted


def _limited(trace: Trace, result: str, began: float) -> None:
    """The limits' decision, on the trace: and how long it took (a Redis round trip)."""
    took = time.perf_counter() - began
    trace.event(RATE_LIMIT_EVENT, {"gateway.rate_limit.result": result,
                                   "gateway.rate_limit.wait_s": took})  # fmt: skip


def _charge(flow: Flow[R, A, K], grant: Grant, principal: Principal) -> None:
    """The reservation settled to what was used (unknown usage keeps it), and what the request
    cost added to its key's, team's and model's spend."""
    rt, rec, call = flow.inbound.runtime, flow.record, flow.call
    usage = rec.usage
    if flow.cache is not None and flow.cache.entry is not None:  # a hit: 0 tokens, 0 spent
        charged = grant.settle(0, 0)
        rec.cost = charged if rt.prices else None
        return
    if not rt.prices:  # nothing is priced: every request costs 0
        grant.settle(rec.total_tokens, None if usage is None else 0)
        return
    cost: int | None = None
    if usage is not None and call is not None:
        target = call.target
        price = rt.prices.price(target.provider, target.model)
        if price is None:
            rt.metrics.unpriced(rec.model, target.provider)
        cost = price.cost(usage) if price is not None else 0
    charged = grant.settle(rec.total_tokens, cost)
    rec.cost = charged
    if charged:
        rt.limiter.spend(ledger(principal.key_id, principal.team, rec.model, charged))
        provider = call.target.provider if call is not None else ""
        rt.metrics.spend(principal.team or "", rec.model, provider, charged)


# ---------------------------------------------------------------- capture


def capture(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """A traced stream's finish reasons, and with capture_content (of the request log or the
    traces) its text, gathered as it is written (a JSON answer is read whole at the end)."""

    async def captured(flow: Flow[R, A, K]) -> None:
        await proceed(flow)
        stream = flow.stream
        if stream is None:
            return
        rt, trace = flow.inbound.runtime, flow.trace
        if trace is not None:  # its finish reasons
            stream = flow.stream = tapped(stream, trace.seen, _ignored)
        logged = rt.request_log is not None and rt.config.request_log.capture_content
        spanned = trace is not None and rt.config.telemetry.capture_content
        if logged or spanned:
            flow.gathered = gathered = Gathered()
            flow.stream = tapped(stream, gathered.seen, _ignored)

    return captured


def _ignored(whole: bool) -> None:
    return None


# ---------------------------------------------------------------- write


def write(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """The answer written once the stages after this one have it: a JSON document, or the
    stream as SSE until it ends or the caller leaves."""

    async def written(flow: Flow[R, A, K]) -> None:
        endpoint = flow.endpoint
        if endpoint.id_prefix:
            flow.id = endpoint.id_prefix + flow.inbound.ids.next()
        flow.created = int(time.time())
        await proceed(flow)
        call, req = flow.call, flow.request
        assert call is not None and req is not None, "the attempt stage answers"
        if flow.stream is not None:
            await _pumped(flow, req, call, flow.stream)
            return
        answer = flow.answer
        assert answer is not None
        flow.record.use(answer.get("usage"))
        doc = flow.document or endpoint.document(
            answer, req.model, flow.id, flow.created, call.answer_shape
        )
        await flow.reply.respond(200, orjson.dumps(doc), _headers(JSON_HEADERS, call.dropped))

    return written


async def _pumped(flow: Flow[R, A, K], req: R, call: Call[A, K], stream: Stream[K]) -> None:
    """The stream written as SSE; its time and usage recorded."""
    streaming, inbound, reply, rec = flow.endpoint.streaming, flow.inbound, flow.reply, flow.record
    assert streaming is not None
    head = Head(
        flow.id, flow.created, req.model, streaming.include_usage(req), streaming.chunk_object,
        call.answer_shape,
    )  # fmt: skip
    await reply.start_stream(_headers(SSE_HEADERS, call.dropped))
    result = StreamResult()
    began = time.perf_counter()
    try:
        await until_disconnect(
            streaming.pump(reply.send, stream.first, stream.rest, head, result), inbound.receive
        )
    finally:  # the time not spent writing is time spent waiting on the provider
        rec.upstream_s += time.perf_counter() - began - result.write_s
        rec.first_token = result.first_at
        rec.use(result.usage)
    if result.error is not None:
        rec.error_type = type(result.error).__name__


def _headers(base: RawHeaders, dropped: tuple[str, ...]) -> RawHeaders:
    if not dropped:
        return base
    return [*base, (DROPPED_HEADER, ",".join(dropped).encode())]


# ---------------------------------------------------------------- attempt


def attempt(proceed: Next[R, A, K]) -> Next[R, A, K]:
    """The plan's tries until one answers: its answer (a stream's first batch, so that a
    failure before it can still be retried or fall back), else the error. A Portkey config's
    requests learn what answered, and after how many retries (also when nothing did)."""

    async def attempted(flow: Flow[R, A, K]) -> None:
        inbound, endpoint, req, the_plan = flow.inbound, flow.endpoint, flow.request, flow.plan
        assert req is not None and the_plan is not None
        rt, receive, rec = inbound.runtime, inbound.receive, flow.record

        def prepare(leaf: Leaf, target: Target) -> Call[A, K]:
            return endpoint.prepare(rt, req, leaf, target)

        tries: Prepare[Call[A, K]] = _in_background(prepare) if inbound.background else prepare
        if flow.trace is not None:
            tries = _with_traceparent(tries, flow.trace)
        if flow.streams:
            outcome = await rt.attempts.run(the_plan, tries, _first_batch, receive, rec)
            _portkey_headers(flow, outcome.used, outcome.retries)
            flow.call, (first, rest) = outcome.result()
            flow.stream = Stream(first, rest)
        else:
            done = await rt.attempts.run(the_plan, tries, _complete, receive, rec)
            _portkey_headers(flow, done.used, done.retries)
            flow.call, flow.answer = done.result()
        # The last stage (Pipeline puts it there): nothing comes after the answer is had, so
        # `proceed`, the pipeline's end, is not awaited (a coroutine less a request).

    return attempted


def _complete(call: Call[A, K]) -> Awaitable[A]:
    return call.complete()


async def _first_batch(call: Call[A, K]) -> tuple[list[K], AsyncIterator[list[K]]]:
    """The stream and its first batch: until it comes, a failure is still a plain JSON error
    response, and the attempt can be retried or fall back."""
    assert call.stream is not None, "an endpoint that streams binds its stream"
    batches = call.stream().__aiter__()
    try:
        return await batches.__anext__(), batches
    except StopAsyncIteration:
        return [], batches
    except BaseException:
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            await aclose()
        raise


def _portkey_headers(flow: Flow[R, A, K], used: Leaf | None, retries: int) -> None:
    the_plan = flow.plan
    if the_plan is None or not the_plan.portkey or used is None:
        return
    flow.reply.add_headers(
        [
            (b"x-portkey-last-used-option-index", used.path.encode()),
            (b"x-portkey-retry-attempt-count", str(retries).encode()),
            (b"x-portkey-provider", used.provider.encode()),
        ]
    )


def _in_background(prepare: Prepare[Call[A, K]]) -> Prepare[Call[A, K]]:
    def background(leaf: Leaf, target: Target) -> Call[A, K]:
        return prepare(leaf, replace(target, background=True))

    return background


def _with_traceparent(prepare: Prepare[Call[A, K]], trace: Trace) -> Prepare[Call[A, K]]:
    """Each try sent with a traceparent of its own: its span's, the parent of whatever the
    target records."""

    def traced(leaf: Leaf, target: Target) -> Call[A, K]:
        return prepare(leaf, target.traced(trace.traceparent(span_id())))

    return traced


# ---------------------------------------------------------------- the pipeline

Handler = Callable[[Inbound, Reply], Awaitable[None]]
CONVERSATION_STAGES: tuple[Stage, ...] = (recall, keep)
# A batch's line: its runtime and ids in `inbound`, its answer captured by `reply`.
LineServer = Callable[[Inbound, Reply, RequestRecord, Principal, bytes], Awaitable[None]]


class Pipeline:
    """The stages, chained once per endpoint: a live request's path and a batch line's."""

    def __init__(self, extra: Sequence[Stage] = ()) -> None:
        tail: tuple[Stage, ...] = (write, keep, capture, cached, *extra, attempt)
        self.live: tuple[Stage, ...] = (
            record, authenticate, parse, recall, plan, lookup, admit, *tail,
        )  # fmt: skip
        self.line: tuple[Stage, ...] = (journal, parse, recall, plan, lookup, admit, *tail)

    @staticmethod
    def stages(stages: tuple[Stage, ...], endpoint: Endpoint[R, A, K]) -> tuple[Stage, ...]:
        """The stages `endpoint` runs: those of stored answers only where it keeps them."""
        if endpoint.conversation is not None:
            return stages
        return tuple(s for s in stages if s not in CONVERSATION_STAGES)

    def handler(self, endpoint: Endpoint[R, A, K]) -> Handler:
        """The endpoint's HTTP handler: a live request's flow through every stage."""
        run = compose(self.stages(self.live, endpoint), endpoint)

        def handle(inbound: Inbound, reply: Reply) -> Awaitable[None]:
            rec = RequestRecord(time.perf_counter(), operation=endpoint.operation)
            return run(Flow(endpoint, inbound, reply, rec))

        return handle

    def line_server(self, endpoint: Endpoint[R, A, K]) -> LineServer:
        """How the batch runner serves one of the endpoint's lines."""
        run = compose(self.stages(self.line, endpoint), endpoint)

        def serve(
            inbound: Inbound, reply: Reply, rec: RequestRecord, principal: Principal, body: bytes
        ) -> Awaitable[None]:
            flow = Flow(endpoint, inbound, reply, rec)
            flow.principal, flow.body = principal, body
            return run(flow)

        return serve

    def lines(self) -> dict[str, tuple[LineServer, str]]:
        """Each endpoint's batch URL → how its lines are served, and their metrics operation."""
        return {e.batch_url: (e.made(self.line_server), e.operation) for e in ENDPOINTS}
