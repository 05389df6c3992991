"""The HTTP side: pooled connections per provider (http1.py), JSON calls and SSE streams.

Everything that does not change per request (the origin, headers, TLS, the proxy, the pool) is
fixed at construction. Deadlines are set on the request's connection (http1.py says why), in the
loop's time: the head by the target's first_byte_s, the whole answer by its timeout_s, a
stream's each read by its timeout_s. A request cancelled under way aborts its connection, so the
upstream sees it. Failures leave here already translated into the gateway's error tree
(errors.py).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Mapping
from urllib.parse import urlsplit

import orjson

from core.errors import GatewayError
from core.provider import Target
from core.wire import Json
from providers.transport.errors import (
    bad_answer,
    event_error,
    first_byte_timeout,
    parse_body,
    transport_error,
    upstream_error,
)
from providers.transport.http1 import (
    MAX_BODY_BYTES,
    HttpClientError,
    Origin,
    Pool,
    Response,
    ResponseTimeout,
)
from providers.transport.proxy import Proxy
from providers.transport.sse import DONE, SSEDecoder
from providers.transport.tls import verifies

MAX_ERROR_BODY = 64 * 1024  # error bodies are short; a proxy's HTML page is cut here
KEEPALIVE_S = 30.0
DRAIN_S = 1.0  # after [DONE], how long to wait for the end of the body before closing
DRAIN_BYTES = 64 * 1024
MAX_PATHS = 64
log = logging.getLogger("providers.transport")


class UpstreamStream:
    """An open streamed response, its status 2xx. `aclose` ends it: a body not read to its end
    closes the connection, so the upstream sees the caller leave and stops generating; a body
    read to its end leaves the connection to the pool."""

    __slots__ = ("_clock", "response")

    def __init__(self, response: Response, clock: Callable[[], float]) -> None:
        self.response = response
        self._clock = clock

    def due_in(self, seconds: float) -> None:
        """What is read next must come within `seconds`."""
        self.response.until(self._clock() + seconds)

    async def next_chunk(self, seconds: float) -> bytes | None:
        """What has arrived of the body, waiting up to `seconds` for some; None at its end."""
        self.due_in(seconds)
        return await self.response.chunk()

    async def aclose(self) -> None:
        self.response.close()


class UpstreamClient:
    """One upstream's calls. `idle_timeout_s`: how long a pooled connection is kept unused;
    `tls`: an https upstream's context (None: the default one); `proxy`: the proxy it is
    reached through (None: directly); `name`: the provider's, for the log."""

    __slots__ = (
        "_connect_s", "_headers", "_idle_s", "_limit", "_max_body", "_name", "_paths", "_pool",
        "_proxy", "_secret", "_tls", "_url",
    )  # fmt: skip

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int,
        connect_timeout_s: float,
        max_response_bytes: int = MAX_BODY_BYTES,
        secret: str = "",
        idle_timeout_s: float = KEEPALIVE_S,
        tls: ssl.SSLContext | None = None,
        proxy: Proxy | None = None,
        name: str = "",
    ) -> None:
        self._url = url
        self._headers = dict(headers)
        self._limit = max_connections
        self._connect_s = connect_timeout_s
        self._max_body = max_response_bytes
        self._secret = secret  # only to scrub it from upstream error messages
        self._idle_s = idle_timeout_s
        self._tls = tls
        self._proxy = proxy
        self._name = name
        self._pool: Pool | None = None
        self._paths: dict[str, str] = {}  # the few addresses of this upstream in use

    async def start(self) -> None:
        if self._tls is not None and not verifies(self._tls):  # at every start: not forgotten
            log.warning(
                "providers.%s.tls.verify is false: the certificate of %s is not checked, and "
                "anyone on the way can read and answer its requests",
                self._name, Origin.of(self._url).authority,
            )  # fmt: skip
        if self._proxy is not None:
            log.info("providers.%s: reached through the proxy %s", self._name, self._proxy.shown)
        if self._pool is None:
            self._pool = Pool(
                self._url, self._headers, self._limit, self._idle_s, self._max_body,
                tls=self._tls, proxy=self._proxy,
            )  # fmt: skip

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def ready(self) -> bool:
        return self._pool is not None

    async def _sent(
        self, method: str, url: str, target: Target, payload: bytes | None
    ) -> tuple[Response, float]:
        """The response, once its status and headers are in (within the target's first_byte_s
        when it has one, else its timeout_s), and when its timeout_s runs out."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        path = self._paths.get(url) or self._path(url)
        now = pool.clock()
        end = now + target.timeout_s
        first_byte = target.first_byte_s
        head = end if first_byte is None else min(end, now + first_byte)
        connect_s = target.connect_s or self._connect_s
        try:
            extra = b"traceparent: %s\r\n" % target.trace.encode() if target.trace else b""
            return await pool.request(method, path, payload or b"", connect_s, head, extra), end
        except ResponseTimeout:
            if first_byte is not None and head < end:
                raise first_byte_timeout(target) from None
            raise

    def _path(self, url: str) -> str:
        """The request target of an address of this upstream (its path and query, or the whole
        URL when sent to a forward proxy); an address elsewhere is a bug, refused: the pool
        connects only where the config said."""
        assert self._pool is not None
        if Origin.of(url) != self._pool.origin:
            raise RuntimeError(f"{url!r} is not an address of {self._url!r}")
        parts = urlsplit(url)
        path = self._pool.target((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        if len(self._paths) < MAX_PATHS:
            self._paths[url] = path
        return path

    def post_json(
        self, payload: bytes, target: Target, url: str | None = None
    ) -> Coroutine[None, None, Json]:
        """POST to the completions URL (or `url`, another endpoint of this upstream) and parse
        the answer once; any non-2xx becomes a gateway error."""
        return self.call_json("POST", url or self._url, payload, target)

    async def call_json(self, method: str, url: str, payload: bytes | None, target: Target) -> Json:
        """One JSON call to `url` (an address of this same upstream, never a caller's), its
        whole answer within the target's timeout_s."""
        return self.document(await self.call_raw(method, url, payload, target), target.label)

    async def call_raw(self, method: str, url: str, payload: bytes | None, target: Target) -> bytes:
        """As `call_json`, the answer's body as it came (a 2xx's: any other is an error)."""
        label = target.label
        try:
            resp, end = await self._sent(method, url, target, payload)
            try:
                resp.until(end)
                raw = await resp.read()
            finally:
                resp.close()
        except HttpClientError as exc:
            raise transport_error(exc, label) from None
        if not 200 <= resp.status < 300:
            self._refused(resp.status, label)
            detail = parse_body(raw[:MAX_ERROR_BODY])
            raise upstream_error(resp.status, detail, resp.headers, label, self._secret)
        return raw

    def _refused(self, status: int, label: str) -> None:
        """A forward proxy's refusal (its 407) is the proxy's error, not the upstream's."""
        refused = None if self._pool is None else self._pool.refused(status)
        if refused is not None:
            raise transport_error(refused, label)

    def document(self, raw: bytes, label: str) -> Json:
        """A 2xx answer's JSON object; an error object is the upstream's error."""
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
    ) -> UpstreamStream:
        """POST a streaming request (to the completions URL, or `url`); returns the open
        response once its status is known to be 2xx. The caller owns it: it must be closed
        (`aclose`; batches() does when it ends)."""
        label = target.label
        assert self._pool is not None
        try:
            resp, end = await self._sent("POST", url or self._url, target, payload)
        except HttpClientError as exc:
            raise transport_error(exc, label) from None
        opened = UpstreamStream(resp, self._pool.clock)
        if 200 <= resp.status < 300:
            return opened
        try:
            resp.until(end)
            raw = await resp.read(MAX_ERROR_BODY)
        except HttpClientError:
            raw = b""
        finally:
            resp.close()
        self._refused(resp.status, label)
        raise upstream_error(resp.status, parse_body(raw), resp.headers, label, self._secret)

    async def batches(
        self, opened: UpstreamStream, target: Target
    ) -> AsyncGenerator[list[Json], None]:
        """The JSON events of an open stream up to `[DONE]`, one list per read from the socket
        (what arrived together), each read within the target's timeout_s. If the consumer stops
        early (aclose or cancellation: the caller went away), the connection is closed at once,
        so the upstream sees the disconnect and stops generating."""
        label = target.label
        try:
            if opened.response.content_type == "application/json":
                # Some servers answer a stream request with one JSON document; its shape is
                # that of a (single, complete) stream chunk.
                opened.due_in(target.timeout_s)
                raw = await opened.response.read()
                yield [self.document(raw, label)]
                return
            decoder = SSEDecoder()
            while (chunk := await opened.next_chunk(target.timeout_s)) is not None:
                batch, done, failure = self._parse(decoder.feed(chunk), label)
                if batch:  # what came before a bad event still reaches the caller
                    yield batch
                if failure is not None:
                    raise failure
                if done:
                    await _drain(opened)
                    return
            batch, _, failure = self._parse(decoder.flush(), label)
            if batch:
                yield batch
            if failure is not None:
                raise failure
        except HttpClientError as exc:
            raise transport_error(exc, label, answering=True) from None
        finally:
            await opened.aclose()

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


async def _drain(opened: UpstreamStream) -> None:
    """Read what follows `[DONE]` (normally just the end of the chunked body) so the connection
    can go back to the pool; a body that does not end soon is cut off by the close."""
    left = DRAIN_BYTES
    try:
        opened.due_in(DRAIN_S)
        while left > 0 and (chunk := await opened.response.chunk()) is not None:
            left -= len(chunk)
    except HttpClientError:
        pass
