"""The HTTP side: one pooled aiohttp session per provider, JSON calls and SSE streams.

Everything that does not change per request (URL, headers, the pool) is fixed at construction.
Failures leave here already translated into the gateway's error tree (errors.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Mapping

import aiohttp
import orjson

from core.errors import GatewayError
from core.provider import Target
from core.wire import Json

from .errors import (
    bad_answer,
    event_error,
    first_byte_timeout,
    parse_body,
    transport_error,
    upstream_error,
)
from .sse import DONE, SSEDecoder

MAX_ERROR_BODY = 64 * 1024  # error bodies are short; a proxy's HTML page is cut here
DNS_TTL_S = 300
KEEPALIVE_S = 30.0
DRAIN_S = 1.0  # after [DONE], how long to wait for the end of the body before closing
DRAIN_BYTES = 64 * 1024
MAX_TIMEOUTS = 64


class UpstreamClient:
    __slots__ = ("_connect_s", "_headers", "_limit", "_secret", "_session", "_timeouts", "_url")

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int,
        connect_timeout_s: float,
        secret: str = "",
    ) -> None:
        self._url = url
        self._headers = dict(headers)
        self._limit = max_connections
        self._connect_s = connect_timeout_s
        self._secret = secret  # only to scrub it from upstream error messages
        self._session: aiohttp.ClientSession | None = None
        # Timeouts come from config, so there are few: built once, not per request (bounded
        # all the same, in case a caller ever passes computed ones).
        self._timeouts: dict[tuple[float, float | None, bool], aiohttp.ClientTimeout] = {}

    def _timeout(self, target: Target, stream: bool) -> aiohttp.ClientTimeout:
        """A JSON call: a total deadline. A stream: none (its length is the caller's
        max_tokens); the target's timeout bounds each wait for the next bytes instead."""
        key = (target.timeout_s, target.connect_s, stream)
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(
                total=None if stream else target.timeout_s,
                sock_connect=target.connect_s or self._connect_s,
                sock_read=target.timeout_s if stream else None,
            )
            if len(self._timeouts) >= MAX_TIMEOUTS:
                self._timeouts.clear()
            self._timeouts[key] = timeout
        return timeout

    async def start(self) -> None:
        if self._session is not None:
            return
        connector = aiohttp.TCPConnector(
            limit=self._limit, ttl_dns_cache=DNS_TTL_S, keepalive_timeout=KEEPALIVE_S
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            raise_for_status=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # upstream cookies must not leak between callers
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def ready(self) -> bool:
        return self._session is not None and not self._session.closed

    async def _request(
        self, method: str, url: str, target: Target, payload: bytes | None, stream: bool
    ) -> aiohttp.ClientResponse:
        """The response, once its status and headers are in: within the target's first_byte_s
        when it has one."""
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        # A redirect means a wrong base_url; following it would turn the POST into a GET.
        sent = self._session.request(
            method, url, data=payload, timeout=self._timeout(target, stream), allow_redirects=False
        )
        if target.first_byte_s is None:
            return await sent
        deadline = asyncio.timeout(target.first_byte_s)
        try:
            async with deadline:
                return await sent
        except TimeoutError:
            if not deadline.expired():
                raise  # aiohttp's own (connect) timeout
            raise first_byte_timeout(target) from None

    async def post_json(self, payload: bytes, target: Target, url: str | None = None) -> Json:
        """POST to the completions URL (or `url`, another endpoint of this upstream) and parse
        the answer once; any non-2xx becomes a gateway error."""
        return await self.call_json("POST", url or self._url, payload, target)

    async def call_json(self, method: str, url: str, payload: bytes | None, target: Target) -> Json:
        """One JSON call to `url` (an address of this same upstream, never a caller's)."""
        label = target.label
        try:
            async with await self._request(method, url, target, payload, False) as resp:
                raw = await resp.read()
                if not 200 <= resp.status < 300:
                    detail = parse_body(raw[:MAX_ERROR_BODY])
                    raise upstream_error(resp.status, detail, resp.headers, label, self._secret)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise transport_error(exc, label) from None
        return self._document(raw, label)

    def _document(self, raw: bytes, label: str) -> Json:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise bad_answer(label, "a response that is not JSON") from None
        if not isinstance(data, dict):
            raise bad_answer(label, "a response that is not a JSON object")
        if data.get("error") and "choices" not in data:
            raise event_error(data, label, self._secret)
        return data

    async def open_stream(
        self, payload: bytes, target: Target, url: str | None = None
    ) -> aiohttp.ClientResponse:
        """POST a streaming request (to the completions URL, or `url`); returns the open
        response once its status is known to be 2xx. The caller owns it: it must be closed
        (events() does, and so must the caller if it never gets to iterate)."""
        label = target.label
        try:
            resp = await self._request("POST", url or self._url, target, payload, True)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise transport_error(exc, label) from None
        if 200 <= resp.status < 300:
            return resp
        try:
            raw = await resp.content.read(MAX_ERROR_BODY)
        except (aiohttp.ClientError, TimeoutError):
            raw = b""
        finally:
            resp.release()  # reused only if the body was read to its end
        raise upstream_error(resp.status, parse_body(raw), resp.headers, label, self._secret)

    async def batches(
        self, resp: aiohttp.ClientResponse, label: str
    ) -> AsyncGenerator[list[Json], None]:
        """The JSON events of an open stream up to `[DONE]`, one list per read from the socket
        (what arrived together). If the consumer stops early (aclose or cancellation: the
        caller went away), the connection is closed at once, so the upstream sees the
        disconnect and stops generating."""
        finished = False
        try:
            if resp.content_type == "application/json":
                # Some servers answer a stream request with one JSON document; its shape is
                # that of a (single, complete) stream chunk.
                yield [self._document(await resp.read(), label)]
                finished = True
                return
            decoder = SSEDecoder()
            async for chunk in resp.content.iter_any():
                batch, done, failure = self._parse(decoder.feed(chunk), label)
                if batch:  # what came before a bad event still reaches the caller
                    yield batch
                if failure is not None:
                    raise failure
                if done:
                    finished = await _drain(resp)
                    return
            batch, _, failure = self._parse(decoder.flush(), label)
            if batch:
                yield batch
            if failure is not None:
                raise failure
            finished = True
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise transport_error(exc, label) from None
        finally:
            if finished:
                resp.release()
            else:
                resp.close()

    def _parse(
        self, datas: Iterable[bytes], label: str
    ) -> tuple[list[Json], bool, GatewayError | None]:
        """The events in `datas`; whether `[DONE]` came; the error at a bad or error event
        (with the events before it)."""
        batch: list[Json] = []
        try:
            for data in datas:
                if data.startswith(DONE):
                    return batch, True, None
                batch.append(self._event(data, label))
        except GatewayError as err:
            return batch, False, err
        return batch, False, None

    def _event(self, data: bytes, label: str) -> Json:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise bad_answer(label, "a stream event that is not JSON") from None
        if not isinstance(event, dict):
            raise bad_answer(label, "a stream event that is not a JSON object")
        if event.get("error"):
            raise event_error(event, label, self._secret)
        return event


async def _drain(resp: aiohttp.ClientResponse) -> bool:
    """Read what follows `[DONE]` (normally just the end of the chunked body) so the connection
    can go back to the pool; True when the body ended."""
    try:
        async with asyncio.timeout(DRAIN_S):
            left = DRAIN_BYTES
            while left > 0:
                data = await resp.content.read(left)
                if not data:
                    return True
                left -= len(data)
    except (aiohttp.ClientError, TimeoutError):
        pass
    return False
