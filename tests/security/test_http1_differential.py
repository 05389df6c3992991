"""The gateway's upstream client (providers/transport/http1.py) read against h11's client
side, on generated upstream answers (issue 33: one tenant's completion served to another).

An upstream that sent `103 Early Hints` before its `200` had the 103 taken as the answer: the
connection went back to the pool with the 200 still to come, and the next caller on it, another
key, was given the first one's completion. These tests hold the client to what an independent
parser reads in the same bytes, whatever the upstream sends and however it is split:

- the answer: the same status, headers and (decoded) body as h11's, or an error where h11 finds
  none (the bytes end early, or do not parse);
- the connection's reuse: back in the pool only when h11 could send another request on it and
  nothing came after the answer;
- isolation: two callers (two keys, their bodies echoed by the upstream in every head and body)
  on a pool of one connection, one after the other or the second waiting for the connection,
  never see each other's bytes;
- malformed answers (where parsers may differ): an error, or exactly h11's answer; the
  connection never reused unless h11 read it as valid and could reuse it too;
- bounds: heads to 64 KiB and 100 header lines, bodies (decoded) to the pool's bound.

Each example runs on a loop of its own (the default asyncio loop, and uvloop, which the gateway
runs on), against a real TCP server on 127.0.0.1 (tests/security/upstream_script.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import TypeVar

import pytest
import uvloop
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from providers.transport import http1

from .upstream_script import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    Answer,
    Exchange,
    Failed,
    Message,
    Outcome,
    Upstream,
    Verdict,
    ask,
    exchanges,
    malformed,
    oracle,
    pooled,
    settle,
)

T = TypeVar("T")
REQUEST_A = b'{"key": "tenant-A"}'  # two callers' bodies; the upstream echoes each in its answer
REQUEST_B = b'{"key": "tenant-B"}'
WITHIN_S = 1.0  # a bound on each exchange, not a timing: a client that hangs fails by it
HANG_S = 5.0  # past every deadline the client is given
MALFORMED_WITHIN_S = 0.5  # a parser may wait on a malformed head for bytes that never come
BODY_BOUND = 4096  # the pool's max_body_bytes in the bounds test
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
# Reproducible in CI: examples drawn from a fixed seed, nothing kept between runs.
checked = settings(
    deadline=None,
    database=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def run(loop: str, scenario: Callable[[], Coroutine[None, None, T]]) -> T:
    """The scenario on a loop of its own, a hang (the client waiting past every deadline it
    was given) failing it."""

    async def bounded() -> T:
        try:
            async with asyncio.timeout(HANG_S):
                return await scenario()
        except TimeoutError:
            raise AssertionError(f"still waiting after {HANG_S} s: a hang") from None

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(bounded())


async def one_exchange(
    exchange: Exchange, within_s: float, max_body: int | None = None
) -> tuple[Outcome, bool]:
    """Caller A's outcome, and whether its connection waits in the pool once the upstream has
    written everything and the client has read it (the pool's body bound: its default, or
    `max_body`)."""
    bound = {} if max_body is None else {"max_body_bytes": max_body}
    async with Upstream({REQUEST_A: exchange}) as upstream:
        pool = http1.Pool(upstream.url, {}, 1, 30.0, **bound)
        try:
            outcome = await ask(pool, REQUEST_A, within_s)
            await settle(pool, upstream.played[REQUEST_A])
            return outcome, pooled(pool)
        finally:
            pool.close()


def both_read(
    loop: str, exchange: Exchange, within_s: float
) -> tuple[Outcome, bool, Verdict, bool]:
    """Caller A's exchange read by ours (its outcome, and whether its connection was kept) and by
    h11 (its verdict), and whether the upstream closed after it; each noted for a failure's
    report."""
    data = exchange.wire(REQUEST_A)
    ends = exchange.ends_connection()
    note(f"the upstream sent {data!r}" + (" and closed" if ends else ""))
    ours, kept = run(loop, lambda: one_exchange(exchange, within_s))
    verdict = oracle(data, ends, REQUEST_A)
    note(f"ours: {ours!r}, kept: {kept}")
    note(f"h11: {verdict!r}")
    return ours, kept, verdict, ends


async def two_callers(
    first: Exchange, second: Exchange, together: bool, within_s: float = WITHIN_S
) -> tuple[Outcome, Outcome]:
    """A's and B's outcomes on a pool of one connection: B asks once all of A's exchange has
    been read, or (`together`) B waits for the connection while A's request is under way."""
    async with Upstream({REQUEST_A: first, REQUEST_B: second}) as upstream:
        pool = http1.Pool(upstream.url, {}, 1, 30.0)
        try:
            if together:
                a_asks = asyncio.create_task(ask(pool, REQUEST_A, within_s))
                b_asks = asyncio.create_task(ask(pool, REQUEST_B, within_s))  # waits for A's
                a, b = await a_asks, await b_asks
            else:
                a = await ask(pool, REQUEST_A, within_s)
                await settle(pool, upstream.played[REQUEST_A])
                b = await ask(pool, REQUEST_B, within_s)
            return a, b
        finally:
            pool.close()


def seen_in(outcome: Outcome, request: bytes) -> bool:
    """The answer carries a piece of what `request`'s upstream exchange echoed."""
    if isinstance(outcome, Failed):
        return False
    texts = [outcome.body, *(value.encode("latin-1") for value in outcome.headers.values())]
    return any(request in text for text in texts)


def same(ours: Outcome, theirs: Outcome) -> bool:
    """The same answer, or both none. h11 lower-cases Transfer-Encoding's value (it reads no
    coding but chunked); the client passes it on as sent."""
    if isinstance(ours, Failed) or isinstance(theirs, Failed):
        return isinstance(ours, Failed) and isinstance(theirs, Failed)
    headers = dict(ours.headers)
    if "transfer-encoding" in headers:
        headers["transfer-encoding"] = headers["transfer-encoding"].lower()
    return (ours.status, headers, ours.body) == (theirs.status, theirs.headers, theirs.body)


def same_or_refused(ours: Outcome, theirs: Outcome) -> bool:
    return isinstance(ours, Failed) or same(ours, theirs)


def only_empty_lines(data: bytes) -> bool:
    """Empty lines between two responses, which llhttp skips as it looks for the next: what
    the client cannot tell from nothing, and harmless (they answer nobody)."""
    return bool(data) and not data.replace(b"\r\n", b"")


# ---------------------------------------------------------------- the P1 repro

EARLY_HINTS = Message(103, reason=b"Early Hints", echo_header=False, framing="none")
P1_FIRST = Exchange(
    (EARLY_HINTS, Message(200)),
    splits=(len(EARLY_HINTS.render(b"")),),  # the 200 comes in a read of its own
)
P1_SECOND = Exchange((Message(200),))


@pytest.mark.parametrize("together", [False, True], ids=["one-after-the-other", "waiting"])
async def test_early_hints_then_the_answer_go_to_the_caller_who_asked(together: bool) -> None:
    a, b = await two_callers(P1_FIRST, P1_SECOND, together)
    assert not seen_in(b, REQUEST_A), f"B was given A's bytes: {b}"
    assert a == oracle(P1_FIRST.wire(REQUEST_A), False, REQUEST_A).outcome
    assert b == oracle(P1_SECOND.wire(REQUEST_B), False, REQUEST_B).outcome
    assert isinstance(a, Answer) and a.status == 200 and REQUEST_A in a.body


# ---------------------------------------------------------------- valid answers


@pytest.mark.parametrize("loop", LOOPS)
@settings(checked, max_examples=150)
@given(exchange=exchanges())
def test_an_answer_is_read_as_h11_reads_it_and_kept_only_when_h11_could_reuse_it(
    loop: str, exchange: Exchange
) -> None:
    ours, kept, verdict, ends = both_read(loop, exchange, WITHIN_S)
    if isinstance(verdict.outcome, Failed):
        assert isinstance(ours, Failed), "an answer where h11 finds none"
    else:
        assert same(ours, verdict.outcome), "not the answer h11 reads"
    reusable = verdict.reusable and not verdict.leftover and not ends
    if verdict.reusable and not ends and only_empty_lines(verdict.leftover):
        return  # kept or not: either is right
    assert kept == reusable, "kept though h11 would not reuse it" if kept else "not kept"


# ---------------------------------------------------------------- isolation


@pytest.mark.parametrize("loop", LOOPS)
@settings(checked, max_examples=100)
@given(first=exchanges(), second=exchanges(), together=st.booleans())
@example(first=P1_FIRST, second=P1_SECOND, together=False)
@example(first=P1_FIRST, second=P1_SECOND, together=True)
def test_two_keys_on_one_pooled_connection_never_see_each_others_bytes(
    loop: str, first: Exchange, second: Exchange, together: bool
) -> None:
    if together:  # bytes that come once B's request is out are B's answer, to any client
        first = replace(first, after=None)
    note(f"to A: {first.wire(REQUEST_A)!r}" + (" and closed" if first.ends_connection() else ""))
    note(f"to B: {second.wire(REQUEST_B)!r}" + (" and closed" if second.ends_connection() else ""))
    a, b = run(loop, lambda: two_callers(first, second, together))
    note(f"A got {a!r}")
    note(f"B got {b!r}")
    assert not seen_in(b, REQUEST_A), "B was given A's bytes"
    assert not seen_in(a, REQUEST_B), "A was given B's bytes"
    for ours, exchange, request in ((a, first, REQUEST_A), (b, second, REQUEST_B)):
        theirs = oracle(exchange.wire(request), exchange.ends_connection(), request).outcome
        assert same_or_refused(ours, theirs), f"not h11's answer: {theirs!r}"
        if not together or request is REQUEST_A:
            assert isinstance(ours, Answer) or isinstance(theirs, Failed), "refused an answer"


# ---------------------------------------------------------------- malformed answers


@pytest.mark.parametrize("loop", LOOPS)
@settings(checked, max_examples=150)
@given(exchange=malformed)
def test_a_malformed_answer_is_refused_or_read_as_h11_reads_it_and_never_reused(
    loop: str, exchange: Exchange
) -> None:
    ours, kept, verdict, ends = both_read(loop, exchange, MALFORMED_WITHIN_S)
    assert same_or_refused(ours, verdict.outcome), "an answer h11 does not read"
    if kept:  # only after an answer h11 reads the same, and would send the next request after
        reusable = verdict.reusable and not verdict.leftover and not ends
        assert reusable, "a connection that carried a malformed answer was kept"


# ---------------------------------------------------------------- bounds


def filler(count: int, size: int = 8) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((b"x-filler-%d" % i, b"v" * size) for i in range(count))


@st.composite
def oversized(draw: st.DrawFn) -> Exchange:
    """Heads near or past 100 header lines or 64 KiB (interim heads counted in), bodies near
    or past the pool's bound, a compressed body that inflates far past it."""
    kind = draw(st.sampled_from(("lines", "head", "interims", "body", "bomb")))
    plain = Message(200, echo_header=False, echo_body=False)
    messages: tuple[Message, ...]
    if kind == "lines":  # the final head's lines: its framing one and the fillers
        count = draw(st.integers(MAX_HEADERS - 3, MAX_HEADERS + 3))
        where = draw(st.sampled_from(("final", "interim")))
        if where == "final":
            messages = (Message(200, headers=filler(count - 1), echo_header=False),)
        else:
            messages = (Message(103, headers=filler(count), echo_header=False, framing="none"),
                        plain)  # fmt: skip
    elif kind == "head":  # clear of the bound either way: reads may end anywhere
        size = draw(st.sampled_from((16, 40, 72, 96, 200))) * 1024
        messages = (Message(200, headers=((b"x-big", b"v" * size),), echo_header=False),)
    elif kind == "interims":
        each = draw(st.sampled_from((8, 20, 30))) * 1024
        count = draw(st.integers(1, 6))
        big = Message(103, headers=((b"x-big", b"v" * each),), echo_header=False, framing="none")
        messages = (*([big] * count), plain)
    elif kind == "body":
        size = draw(st.sampled_from((BODY_BOUND - 1, BODY_BOUND, BODY_BOUND + 1)))
        size = draw(st.one_of(st.just(size), st.integers(0, 3 * BODY_BOUND)))
        messages = (
            Message(
                200,
                framing=draw(st.sampled_from(("length", "chunked", "eof"))),
                encoding=draw(st.sampled_from((None, b"gzip", b"deflate"))),
                body=b"b" * size,
                echo_header=False,
                echo_body=False,
            ),
        )
    else:
        coding = draw(st.sampled_from((b"gzip", b"deflate")))
        bomb = b"\0" * (1 << 22)
        messages = (Message(200, encoding=coding, body=bomb, echo_header=False, echo_body=False),)
    return Exchange(messages, splits=tuple(draw(st.lists(st.integers(1, 1 << 20), max_size=4))))


def bounded(exchange: Exchange) -> Outcome:
    """h11's answer, refused where it passes the client's bounds."""
    heads = [message.render(b"").split(b"\r\n\r\n", 1)[0] for message in exchange.messages]
    if any(head.count(b"\r\n") > MAX_HEADERS for head in heads):  # lines after the status line
        return Failed("ResponseIncomplete: too many header lines")
    if sum(len(head) + 4 for head in heads) > MAX_HEAD_BYTES:
        return Failed("ResponseIncomplete: a head too large")
    verdict = oracle(exchange.wire(REQUEST_A), exchange.ends_connection(), REQUEST_A, 1 << 24)
    if isinstance(verdict.outcome, Answer) and len(verdict.outcome.body) > BODY_BOUND:
        return Failed("ResponseTooLarge")
    return verdict.outcome


@pytest.mark.parametrize("loop", LOOPS)
@settings(checked, max_examples=60)
@given(exchange=oversized())
def test_heads_and_bodies_past_their_bounds_are_refused(loop: str, exchange: Exchange) -> None:
    expected = bounded(exchange)
    ours, kept = run(loop, lambda: one_exchange(exchange, WITHIN_S, BODY_BOUND))
    note(f"ours: {ours!r}, kept: {kept}; expected: {expected!r}")
    if isinstance(expected, Failed):
        assert isinstance(ours, Failed), "an answer past the bounds"
        kind = expected.why.split(":", 1)[0]
        assert ours.why.startswith(kind), f"not {kind}"
        assert not kept
    else:
        assert ours == expected
