"""The response cache's two stages.

    lookup   (after plan, before admit) a request to a cache-enabled model: its key, then the
             entry that answers it, or the flight it waits on (an identical miss in this
             process), or the flight it leads; x-portkey-cache-status on its answer. A hit is
             admitted for no tokens.
    cached   (right before the attempts) a hit answers here, as JSON or as the stream its
             entry was first written as; a miss's answer, once whole, is put (a JSON answer
             before it is written, a stream before its end is: a caller who has read it
             finds it).

A model caches when its config has `cache:` or the request's Portkey config has one. A key is
the caller's namespace (its team's, else its key's: no tenant can learn what another asked),
the endpoint, the alias, what of the plan shapes answers (its targets, defaults, overrides),
and the request's fields but those that do not change the answer, top-level keys sorted.
Nested objects keep their order: a JSON schema's property order shapes the answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, Generic

from core.errors import InvalidRequest
from core.provider import Call, Target
from gateway.asgi import until_disconnect
from gateway.auth import Principal
from gateway.cache.entries import Entry, decode
from gateway.cache.store import Cache
from gateway.config.caching import CachePolicy
from gateway.config.portkey import PortkeyConfig
from gateway.observability import jsonline
from gateway.pipeline.endpoints import A, Caching, K, R
from gateway.pipeline.flow import Cached, Flow, Next, Stream, tapped
from gateway.routing.plans import Plan
from gateway.runtime import Runtime

HIT, MISS, REFRESH, DISABLED = "HIT", "MISS", "REFRESH", "DISABLED"
STATUS_HEADER = b"x-portkey-cache-status"
STATUS_HEADERS = MappingProxyType(
    {s: (STATUS_HEADER, s.encode()) for s in (HIT, MISS, REFRESH, DISABLED)}
)
RESULTS = MappingProxyType({s: s.lower() for s in (HIT, MISS, REFRESH, DISABLED)})  # metrics'
REFRESH_HEADER, NAMESPACE_HEADER = "x-portkey-cache-force-refresh", "x-portkey-cache-namespace"
CACHE_EVENT = "gateway.cache"
TRUTH = {"true": True, "false": False}
MIN_CHUNK_BYTES = 20  # no chunk is written in fewer: a stream of more cannot fit an entry


def lookup(proceed: Next[R, A, K]) -> Next[R, A, K]:
    async def looked_up(flow: Flow[R, A, K]) -> None:
        req, rt = flow.request, flow.inbound.runtime
        assert req is not None
        policy = _policy(rt, req.model, flow.portkey)
        if policy is None:  # most requests: one lookup of the alias, and on
            await proceed(flow)
            return
        state = flow.cache = _state(flow, policy)
        if state.status == DISABLED:
            _tell(flow, state, None)
            await proceed(flow)
            return
        cache = rt.cache
        try:
            await _found(flow, state, cache)
            await proceed(flow)
        finally:
            if state.leads:  # its waiters get what it made, or call the upstream themselves
                cache.land(state.key, state.made)

    return looked_up


def _policy(rt: Runtime, alias: str, portkey: PortkeyConfig | None) -> CachePolicy | None:
    """The alias's caching, or the Portkey config's (its max_age, the alias's `when`)."""
    model = rt.config.models.get(alias)
    policy = model.cache if model is not None else None
    if portkey is None or portkey.cache_s is None:
        return policy
    return CachePolicy(portkey.cache_s, policy.when if policy is not None else "always")


def _state(flow: Flow[R, A, K], policy: CachePolicy) -> Cached:
    """The request's status before its lookup (DISABLED, REFRESH, or MISS: to look up), and
    its key."""
    headers, req, plan = flow.inbound.headers, flow.request, flow.plan
    assert req is not None and plan is not None
    refresh, skip = _asked(headers)
    caching = flow.endpoint.caching
    if skip or getattr(req, "continuous_usage", False):  # a chunk's usage as it goes: no replay
        return Cached(DISABLED)
    if policy.when == "deterministic" and caching.sampled and not _repeats(req.fields, plan):
        return Cached(DISABLED)
    key = _key(flow, caching, headers.get(NAMESPACE_HEADER))
    return Cached(REFRESH if refresh else MISS, key, policy.ttl_s)


def _asked(headers: Mapping[str, str]) -> tuple[bool, bool]:
    """What the caller asked of the cache: to refresh the entry, or to skip the cache."""
    control, force = headers.get("cache-control"), headers.get(REFRESH_HEADER)
    if control is None and force is None:  # most requests
        return False, False
    directives = {d.strip().lower() for d in (control or "").split(",")}
    forced = False
    if force is not None:
        if force.strip().lower() not in TRUTH:
            raise InvalidRequest(f"{REFRESH_HEADER} must be true or false.", param=REFRESH_HEADER)
        forced = TRUTH[force.strip().lower()]
    return forced or "no-cache" in directives, "no-store" in directives


def _repeats(fields: Mapping[str, Any], plan: Plan) -> bool:
    """Whether the answer can repeat: one choice, greedy or seeded, as the first target gets
    the request (its defaults under the caller's fields, the overrides over them)."""
    leaf, target = plan.first()
    given = {**target.defaults, **fields, **leaf.overrides}
    if _more_than_one(given.get("n")) or _more_than_one(given.get("best_of")):
        return False
    return given.get("temperature", 1) == 0 or given.get("seed") is not None


def _more_than_one(value: object) -> bool:
    return type(value) is int and value > 1


def _key(flow: Flow[R, A, K], caching: Caching[A, K], namespace: str | None) -> bytes:
    req, principal, plan = flow.request, flow.principal, flow.plan
    assert req is not None and principal is not None and plan is not None
    fields = req.fields
    shaping = {k: fields[k] for k in sorted(fields) if k not in caching.neutral and k != "stream"}
    material = [_owner(principal), namespace, flow.endpoint.name, req.model, shaping]
    return hashlib.sha256(plan.scope() + jsonline.dumps(material, 0)).digest()


def _owner(principal: Principal) -> list[str]:
    """Whose entries: its team's, else its key's (the two kinds apart)."""
    if principal.team is not None:
        return ["team", principal.team]
    return ["key", principal.key_id]


async def _found(flow: Flow[R, A, K], state: Cached, cache: Cache) -> None:
    """The entry that answers the request, when there is one: in the cache, or the one an
    identical miss in this process is making (waited for). Else the request leads the
    flight of its key, unless another does: then it calls the upstream on its own."""
    refresh = state.status == REFRESH
    entry = None if refresh else await cache.get(state.key, state.ttl_s)
    if entry is None:
        flight = cache.join(state.key)
        if flight is None:
            state.leads = True
        elif not refresh:
            entry = await _waited(flight, flow)
    if entry is not None:
        state.status, state.entry = HIT, entry
    _tell(flow, state, entry)


async def _waited(flight: asyncio.Future[bytes | None], flow: Flow[R, A, K]) -> Entry | None:
    """The leader's entry, waited for as long as its first target may take to answer; None
    when it made none, or took longer. A caller who leaves meanwhile is gone (ClientGone)."""
    plan = flow.plan
    assert plan is not None
    limit = plan.first()[1].timeout_s
    try:
        waiting = asyncio.wait_for(asyncio.shield(flight), limit)
        made = await until_disconnect(waiting, flow.inbound.receive)
    except TimeoutError:
        return None
    return None if made is None else decode(made)  # its own copy


def _tell(flow: Flow[R, A, K], state: Cached, entry: Entry | None) -> None:
    """The status on the answer (and its age on a hit), in the metrics, and on the trace."""
    status = STATUS_HEADERS[state.status]
    age = None
    if entry is None:
        flow.reply.add_headers([status])
    else:
        age = max(0, int(time.time() - entry.stored_at))
        flow.reply.add_headers([status, (b"age", b"%d" % age)])
    flow.inbound.runtime.metrics.cache_request(flow.record.model, RESULTS[state.status])
    if flow.trace is not None:
        attributes: dict[str, Any] = {"gateway.cache.result": state.status.lower()}
        if age is not None:
            attributes["gateway.cache.age_s"] = age
        flow.trace.event(CACHE_EVENT, attributes)


# ---------------------------------------------------------------- cached


def cached(proceed: Next[R, A, K]) -> Next[R, A, K]:
    async def answered(flow: Flow[R, A, K]) -> None:
        state = flow.cache
        if state is None or state.status == DISABLED:
            await proceed(flow)
            return
        if state.entry is not None:
            _replayed(flow, state.entry)
            return
        await proceed(flow)
        if flow.stream is not None:
            kept = _Kept(flow, state)
            flow.stream = tapped(flow.stream, kept.seen, _ignored, kept.put)
            return
        answer = flow.answer
        assert answer is not None
        if flow.endpoint.caching.kept(answer):
            await _put(flow, state, answer, None)

    return answered


def _replayed(flow: Flow[R, A, K], entry: Entry) -> None:
    """A hit's answer: the entry's, as JSON, or as the stream it was first written as (an
    answer first had whole: its stream made from it)."""
    req = flow.request
    assert req is not None
    caching = flow.endpoint.caching
    dropped = tuple(entry.dropped) if entry.dropped else ()
    flow.call = Call(_target(flow, entry), dropped, _never, None, entry.shape)
    if not flow.streams:
        if caching.fresh is not None:
            caching.fresh(entry.answer, flow.created)
        flow.answer = entry.answer  # type: ignore[assignment]  # the endpoint's, as it put it
        return
    chunks = entry.chunks
    if chunks is None:
        assert caching.chunks is not None, "an endpoint that streams makes streams of answers"
        chunks = caching.chunks(entry.answer)  # type: ignore[arg-type]
    if caching.fresh is not None:
        for chunk in chunks:
            caching.fresh(chunk, flow.created)
    flow.stream = Stream(list(chunks), _no_more())  # type: ignore[arg-type]


def _target(flow: Flow[R, A, K], entry: Entry) -> Target:
    """The target that made the entry: the plan's first one, most often (no new one made)."""
    req, plan = flow.request, flow.plan
    assert req is not None and plan is not None
    target = plan.first()[1]
    if (target.provider, target.model) == (entry.provider, entry.model):
        return target
    return Target(req.model, entry.provider, entry.model)


async def _never() -> Any:
    raise AssertionError("a hit is not sent anywhere")


async def _no_more() -> AsyncIterator[list[K]]:
    return
    yield


def _ignored(whole: bool) -> None:
    return None


class _Kept(Generic[A, K]):
    """A miss's stream, its chunks kept as they pass (up to what an entry could hold); once it
    ran to its end, its answer put, before the stream's end is written."""

    def __init__(self, flow: Flow[R, A, K], state: Cached) -> None:
        self.flow, self.state = flow, state
        self.most = flow.inbound.runtime.cache.config.max_entry_bytes // MIN_CHUNK_BYTES
        self.chunks: list[K] | None = []

    def seen(self, batch: list[K]) -> None:
        if self.chunks is not None:
            self.chunks.extend(batch)
            if len(self.chunks) > self.most:  # too long for an entry: not kept
                self.chunks = None

    async def put(self) -> None:
        caching, chunks = self.flow.endpoint.caching, self.chunks
        answer = caching.whole(chunks) if chunks is not None and caching.whole else None
        if answer is not None and caching.kept(answer):
            await _put(self.flow, self.state, answer, chunks)


async def _put(flow: Flow[R, A, K], state: Cached, answer: A, chunks: list[K] | None) -> None:
    call = flow.call
    assert call is not None
    target = call.target
    entry = Entry(
        time.time(), target.provider, target.model, call.answer_shape, call.dropped, answer,
        chunks,
    )  # fmt: skip
    state.made = await flow.inbound.runtime.cache.put(state.key, entry, state.ttl_s)
