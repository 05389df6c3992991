"""OpenAI's context-length check, for upstreams that clamp instead of failing.

vLLM's server lowers `max_tokens` to what its window leaves, silently, where OpenAI answers 400
`context_length_exceeded`. Unasked, the gateway serves as vLLM does; when the "error" behaviour
is asked for (OpenAI's), the gateway checks first,
with the server's own numbers: the window from `GET <base_url>/models` (`max_model_len`, fetched
once per model) and the prompt's token count from `POST /tokenize` at the server root.

Counting costs a round trip, so it is skipped when the prompt surely fits: a prompt of b UTF-8
bytes has at most b tokens plus a few special ones (BOS, a SentencePiece dummy prefix), since
byte-level BPE and SentencePiece tokens each cover at least one byte of it. Token-id prompts are
counted as they are. A chat is counted as the server renders it (its /tokenize takes messages),
unless its messages leave room for any template. A server without these routes (404) has nothing
to check against: the request goes as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from core.errors import ContextLengthExceeded, GatewayError, too_long, too_long_chat
from core.provider import Target
from providers.transport.client import UpstreamClient

SPECIAL_TOKENS_MARGIN = 8
# What a chat template may add around the messages (role markers, a default system line): a
# chat whose messages, as JSON, leave this much room surely fits without counting.
TEMPLATE_MARGIN = 512
# vLLM's /tokenize renders messages as its chat endpoint does, with these fields of the request.
TEMPLATE_FIELDS = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
)
UTF8_MAX_BYTES = 4  # per character: `len(text) * 4` bounds the bytes without encoding
NOT_FOUND = "upstream_not_found"  # the code of an upstream 404 (errors.py)


def server_root(base_url: str) -> str:
    """vLLM serves /tokenize beside /v1, not under it."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


class ContextGuard:
    """One per provider: the windows it has learnt, and the calls to learn more."""

    __slots__ = ("_can_count", "_client", "_models_url", "_tokenize_url", "_windows")

    def __init__(self, client: UpstreamClient, base_url: str, query: str = "") -> None:
        """`query`: the base URL's query string ("?…" or ""), which every call keeps."""
        self._client = client
        self._models_url = base_url + "/models" + query
        self._tokenize_url = server_root(base_url) + "/tokenize" + query
        self._windows: dict[str, int | None] = {}  # upstream model id → max_model_len
        self._can_count = True  # False once /tokenize turned out not to exist

    async def check(self, prompts: Sequence[Any], max_tokens: int, target: Target) -> None:
        """Raise ContextLengthExceeded if some prompt plus `max_tokens` exceeds the window of
        the target's model."""
        window = await self._window(target)
        if window is None:
            return  # the server does not say: nothing to check against
        counts = await asyncio.gather(
            *(self._count(p, max_tokens, window, target) for p in prompts)
        )
        for i, count in enumerate(counts):
            if count is not None and count + max_tokens > window:
                where = f" {i}" if len(prompts) > 1 else ""
                message = too_long(window, count, max_tokens, where)
                raise ContextLengthExceeded(message, param="prompt")

    async def check_chat(self, fields: Mapping[str, Any], max_tokens: int, target: Target) -> None:
        """As `check`, for a chat's rendered messages (`fields`: the request as validated)."""
        window = await self._window(target)
        if window is None or not self._can_count:
            return
        size = len(orjson.dumps(fields["messages"])) + len(orjson.dumps(fields.get("tools")))
        if size + TEMPLATE_MARGIN <= window - max_tokens:
            return
        tokenize = {k: fields[k] for k in TEMPLATE_FIELDS if k in fields}
        payload = orjson.dumps({"model": target.model, "messages": fields["messages"], **tokenize})
        answer = await self._call("POST", self._tokenize_url, payload, target)
        if answer is None:
            self._can_count = False
            return
        count = answer.get("count")
        if type(count) is int and count + max_tokens > window:
            message = too_long_chat(window, count, max_tokens)
            raise ContextLengthExceeded(message, param="messages")

    async def _window(self, target: Target) -> int | None:
        model = target.model
        if model in self._windows:
            return self._windows[model]
        listing = await self._call("GET", self._models_url, None, target)
        window = None
        for card in (listing or {}).get("data") or ():
            if isinstance(card, dict) and card.get("id") == model:
                value = card.get("max_model_len")
                window = value if type(value) is int and value > 0 else None
        self._windows[model] = window
        return window

    async def _count(self, prompt: Any, max_tokens: int, window: int, target: Target) -> int | None:
        """The prompt's tokens, or None when it surely fits without counting."""
        if not isinstance(prompt, str):
            return len(prompt)
        room = window - max_tokens - SPECIAL_TOKENS_MARGIN
        if len(prompt) * UTF8_MAX_BYTES <= room or len(prompt.encode()) <= room:
            return None
        if not self._can_count:
            return None
        payload = orjson.dumps({"model": target.model, "prompt": prompt})
        answer = await self._call("POST", self._tokenize_url, payload, target)
        if answer is None:
            self._can_count = False
            return None
        count = answer.get("count")
        return count if type(count) is int else None

    async def _call(
        self, method: str, url: str, payload: bytes | None, target: Target
    ) -> dict[str, Any] | None:
        """The answer, or None when the route does not exist there."""
        try:
            return await self._client.call_json(method, url, payload, target)
        except GatewayError as err:
            if err.code == NOT_FOUND:
                return None
            raise
