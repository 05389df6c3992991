"""What a request said and was answered, for the request log when `capture_content` is on: the
answer's choices (from a JSON answer, or gathered from a stream's chunks as they are written),
with the operator's `redact` patterns applied to every string before it is written."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_GATHERED = 1024 * 1024  # characters of a stream's text kept per request; past it, cut
REDACTED = "[REDACTED]"


def redacted(value: Any, patterns: Sequence[re.Pattern[str]]) -> Any:
    """`value` (JSON-shaped) with every match of `patterns` in its strings replaced."""
    if not patterns:
        return value
    if isinstance(value, str):
        for p in patterns:
            value = p.sub(REDACTED, value)
        return value
    if isinstance(value, Mapping):
        return {k: redacted(v, patterns) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v, patterns) for v in value]
    return value


def answered(answer: Any) -> list[dict[str, Any]] | None:
    """A JSON answer's choices as the log tells them: a completion's text, a chat's message
    (content, tool calls), a response's output as one choice. None for answers without text
    (embeddings)."""
    if isinstance(answer, Mapping) and isinstance(answer.get("output"), list):
        return [_output(answer["output"])]
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not isinstance(choices, list):
        return None
    out: list[dict[str, Any]] = []
    for c in choices:
        message = c.get("message")
        if isinstance(message, Mapping):
            entry = {"index": c.get("index"), "content": message.get("content")}
            if message.get("tool_calls"):
                entry["tool_calls"] = message["tool_calls"]
            out.append(entry)
        else:
            out.append({"index": c.get("index"), "content": c.get("text")})
    return out


def _output(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A response's output items as a choice: its messages' text, its function calls."""
    texts = [
        part.get("text") or part.get("refusal") or ""
        for item in items
        if item.get("type") == "message"
        for part in item.get("content") or ()
    ]
    entry: dict[str, Any] = {"index": 0, "content": "".join(texts)}
    calls = [_call(item) for item in items if item.get("type") == "function_call"]
    if calls:
        entry["tool_calls"] = calls
    return entry


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")}


class Gathered:
    """A stream's text per choice, gathered from its chunks as they are written: `seen` takes
    each batch of chunks (completions' `text`, chat's `delta.content` and tool call
    arguments)."""

    def __init__(self) -> None:
        self._texts: dict[int, list[str]] = {}
        self._tools: dict[tuple[int, int], dict[str, Any]] = {}
        self._size = 0
        self.cut = False  # past MAX_GATHERED: the rest was not kept

    def seen(self, batch: Sequence[Any]) -> None:
        for chunk in batch:
            kind = chunk.get("type")
            if kind is not None:  # a Responses stream's event
                self._event(kind, chunk)
                continue
            for c in chunk.get("choices") or ():
                index = c.get("index", 0)
                delta = c.get("delta")
                if isinstance(delta, Mapping):
                    self._keep(index, delta.get("content"))
                    for call in delta.get("tool_calls") or ():
                        self._tool(index, call)
                else:
                    self._keep(index, c.get("text"))

    def _event(self, kind: str, event: Mapping[str, Any]) -> None:
        """A Responses event: its text deltas, and each function call once it is whole."""
        if kind == "response.output_text.delta":
            self._keep(0, event.get("delta"))
        elif kind == "response.output_item.done":
            item = event.get("item") or {}
            arguments = item.get("arguments")
            if item.get("type") == "function_call" and self._fits(len(arguments or "")):
                self._tools[(0, event.get("output_index", 0))] = _call(item)

    def _keep(self, index: int, text: Any) -> None:
        if isinstance(text, str) and text and self._fits(len(text)):
            self._texts.setdefault(index, []).append(text)

    def _tool(self, index: int, call: Mapping[str, Any]) -> None:
        held = self._tools.setdefault((index, call.get("index", 0)), {"arguments": ""})
        function = call.get("function") or {}
        if call.get("id"):
            held["id"] = call["id"]
        if function.get("name"):
            held["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and self._fits(len(arguments)):
            held["arguments"] += arguments

    def _fits(self, size: int) -> bool:
        if self._size + size > MAX_GATHERED:
            self.cut = True
            return False
        self._size += size
        return True

    def choices(self) -> list[dict[str, Any]]:
        indexes = sorted({*self._texts, *(i for i, _ in self._tools)})
        out: list[dict[str, Any]] = []
        for i in indexes:
            entry: dict[str, Any] = {"index": i, "content": "".join(self._texts.get(i, ()))}
            tools = [t for (c, _), t in sorted(self._tools.items()) if c == i]
            if tools:
                entry["tool_calls"] = tools
            out.append(entry)
        return out
