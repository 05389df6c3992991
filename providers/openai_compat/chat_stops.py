"""OpenAI's stop semantics for chat answers from upstreams that may return the matched stop
string (Fireworks): the same cut as for completions (stops.py), applied to `message.content`
and to the content deltas of a stream, with the logprobs entries of the tokens cut.

A chat's content and its logprobs go through the completions machinery as a legacy choice: the
text is the content, and each logprobs entry is numbered in the legacy `text_offset` slot (an
`Entries` store holds them by number), so that cutting and merging keep entries and text
together; a token cut in the middle keeps its head, and its entry gets that head as its token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from core.answers import (
    ChatChoice,
    ChatChunkChoice,
    ChatDelta,
    ChatLogprobs,
    Choice,
    Logprobs,
    TokenLogprob,
)
from providers.openai_compat.stops import StopHoldBack, strip_stop


class Entries:
    """Chat logprobs entries by number, while they go through the legacy machinery."""

    __slots__ = ("_by_number", "_numbers")

    def __init__(self) -> None:
        self._by_number: dict[int, TokenLogprob] = {}
        self._numbers = itertools.count()

    def legacy(self, logprobs: ChatLogprobs | None) -> Logprobs | None:
        if logprobs is None:
            return None
        entries = logprobs["content"] or []
        numbers = [next(self._numbers) for _ in entries]
        self._by_number.update(zip(numbers, entries, strict=True))
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [None] * len(entries),
            "text_offset": numbers,
        }

    def chat(self, logprobs: Logprobs | None, refusal: ChatLogprobs | None) -> ChatLogprobs | None:
        """The entries that are left (each once: they leave the store), as chat logprobs."""
        if logprobs is None:
            return refusal
        content: list[TokenLogprob] = []
        for token, number in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):
            entry = self._by_number.pop(number)
            if entry["token"] != token:  # cut in the middle: its head
                entry = {**entry, "token": token, "bytes": list(token.encode())}
            content.append(entry)
        return {"content": content, "refusal": refusal["refusal"] if refusal else None}


def strip_chat_stop(choice: ChatChoice, stops: Sequence[str]) -> None:
    """Cut a trailing stop string from a finished chat choice's content (in place)."""
    content = choice["message"]["content"]
    if choice["finish_reason"] != "stop" or not content:
        return
    entries = Entries()
    legacy: Choice = {
        "text": content,
        "index": choice["index"],
        "logprobs": entries.legacy(choice["logprobs"]),
        "finish_reason": "stop",
    }
    strip_stop(legacy, stops)
    choice["message"]["content"] = legacy["text"]
    choice["logprobs"] = entries.chat(legacy["logprobs"], choice["logprobs"])


class ChatStopHoldBack:
    """Per-stream hold-back of content deltas that may begin a stop string. What is not content
    (the role, tool calls, a refusal) goes on at once."""

    __slots__ = ("_entries", "_hold")

    def __init__(self, stops: Sequence[str]) -> None:
        self._hold = StopHoldBack(stops)
        self._entries = Entries()

    def feed(self, choice: ChatChunkChoice) -> ChatChunkChoice | None:
        delta = choice["delta"]
        content = delta.get("content")
        rest = _without_text(delta)
        legacy: Choice = {
            "text": content or "",
            "index": choice["index"],
            "logprobs": self._entries.legacy(choice["logprobs"]),
            "finish_reason": choice["finish_reason"],
        }
        released = self._hold.feed(legacy)
        if released is None:
            return {**choice, "delta": rest, "logprobs": None} if rest else None
        return self._out(choice, rest, released)

    def flush(self) -> list[ChatChunkChoice]:
        """The stream ended without finishing some choices: what was held, as it is."""
        out = []
        for legacy in self._hold.flush():
            choice: ChatChunkChoice = {
                "index": legacy["index"],
                "delta": {},
                "logprobs": None,
                "finish_reason": None,
            }
            out.append(self._out(choice, {}, legacy))
        return out

    def _out(self, choice: ChatChunkChoice, rest: ChatDelta, released: Choice) -> ChatChunkChoice:
        delta: ChatDelta = {**rest}
        if released["text"]:
            delta["content"] = released["text"]
        return {
            **choice,
            "delta": delta,
            "logprobs": self._entries.chat(released["logprobs"], choice["logprobs"]),
            "finish_reason": released["finish_reason"],
        }


def _without_text(delta: ChatDelta) -> ChatDelta:
    """The delta but its content (a null content stays: it says there is none)."""
    rest: ChatDelta = {**delta}
    if rest.get("content") is not None:
        del rest["content"]
    return rest
