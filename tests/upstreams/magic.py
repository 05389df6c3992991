"""Scripted failures chosen by markers in the prompt text, and per-server scripts.

Markers (anywhere in any text prompt of the request):
  __status_<code>__       answer <code> with the dialect's error body (429: retry-after 7)
  __status_429_quota__    OpenAI insufficient_quota (x-should-retry: false); Fireworks: plain 429
  __notjson_<code>__      answer <code> with text/plain "upstream exploded"
  __sleep_<ms>__          wait <ms> before answering (before any byte)
  __midstream_error__     stream: 2 content chunks, then OpenAI `data: {"error": …}` + [DONE];
                          Fireworks drops the connection
  __slow_stream__         stream one chunk per 100 ms for up to 60 s (disconnect tests)
  __close__               drop the connection without an answer
  __eos_<k>__             the fake model emits EOS after k tokens (finish "stop"; ignore_eos
                          wins on Fireworks)
  __content_filter__      Azure: 400 `code: content_filter` (the prompt refused); others ignore it
  __filtered_output__     Azure: the prompt's choices end `finish_reason: "content_filter"`, their
                          content_filter_results `filtered: true`; others ignore it

Per-server scripts (`POST /__script`) let one upstream of several misbehave, which prompt
markers cannot (every upstream sees the same prompt). A step's keys (others: 400):
  status, notjson, close, delay_ms, times   as the markers above; times -1 = until reset
  reset: true             like close, but the client sees a TCP RST (SO_LINGER 0)
  headers: {name: value}  added to the answer (error or not), replacing same-named ones
  cut_after: k            stream: headers + k events, then the connection closes (no [DONE]);
                          non-stream: headers + half the body, then it closes
  stall_after: k, stall_ms: m   stream: k events, m ms of silence, then the rest
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

_STATUS = re.compile(r"__status_(\d{3})(_quota)?__")
_NOTJSON = re.compile(r"__notjson_(\d{3})__")
_SLEEP = re.compile(r"__sleep_(\d+)__")
_EOS = re.compile(r"__eos_(\d+)__")
_CRLF = re.compile(r"[\r\n]")
CONTENT_FILTER = "__content_filter__"
FILTERED_OUTPUT = "__filtered_output__"  # read by the Azure dialect from each prompt's text


@dataclass(frozen=True)
class Magic:
    status: int | None = None
    quota: bool = False
    notjson: int | None = None
    sleep_ms: int = 0
    midstream_error: bool = False
    slow_stream: bool = False
    close: bool = False
    content_filter: bool = False
    # Set by /__script steps only (no marker):
    reset: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    stall_after: int | None = None
    stall_ms: int = 0


def _first(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    return pattern.search(text)


def parse_magic(texts: Iterable[str]) -> Magic:
    text = "\n".join(texts)
    status = _first(_STATUS, text)
    notjson = _first(_NOTJSON, text)
    sleep = _first(_SLEEP, text)
    return Magic(
        status=int(status.group(1)) if status else None,
        quota=bool(status and status.group(2)),
        notjson=int(notjson.group(1)) if notjson else None,
        sleep_ms=int(sleep.group(1)) if sleep else 0,
        midstream_error="__midstream_error__" in text,
        slow_stream="__slow_stream__" in text,
        close="__close__" in text,
        content_filter=CONTENT_FILTER in text,
    )


def eos_after(text: str) -> int | None:
    m = _EOS.search(text)
    return int(m.group(1)) if m else None


class ScriptError(ValueError):
    """A `/__script` step that does not parse; the message names the key (the route's 400)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is no count


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and v >= low


def _is_status(v: Any) -> bool:
    return v is None or (_is_int(v) and 200 <= v <= 599)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_headers(v: Any) -> bool:
    # CR/LF would make aiohttp fail while answering, after the step was used up.
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) and k and not _CRLF.search(k + x)
        for k, x in v.items()
    )


_NON_NEGATIVE = _int_at_least(0)
STEP_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "status": (_is_status, "an HTTP status 200-599 or null"),
    "notjson": (_is_bool, "a boolean"),
    "close": (_is_bool, "a boolean"),
    "reset": (_is_bool, "a boolean"),
    "delay_ms": (_NON_NEGATIVE, "an integer >= 0"),
    "times": (_int_at_least(-1), "an integer >= -1 (-1: until reset)"),
    "headers": (_is_headers, "an object of non-empty names to string values"),
    "cut_after": (_NON_NEGATIVE, "an integer >= 0"),
    "stall_after": (_NON_NEGATIVE, "an integer >= 0"),
    "stall_ms": (_NON_NEGATIVE, "an integer >= 0"),
}
# The server frames the body itself (cut_after cuts it on purpose).
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})


def check_step(data: Any) -> dict[str, Any]:
    """`data` if it is a valid step, else ScriptError naming the offending key."""
    if not isinstance(data, dict):
        raise ScriptError(f"a step must be an object, got {json.dumps(data)}")
    for key, value in data.items():
        if key not in STEP_KEYS:
            raise ScriptError(f"unknown key {key!r} (known: {', '.join(STEP_KEYS)})")
        check, expected = STEP_KEYS[key]
        if not check(value):
            raise ScriptError(f"{key!r} must be {expected}, got {json.dumps(value)}")
    check_combination(data)
    return data


def check_combination(data: dict[str, Any]) -> None:
    framing = sorted(FRAMING_HEADERS & {name.lower() for name in data.get("headers", {})})
    if framing:
        raise ScriptError(f"'headers' cannot set {', '.join(framing)} (see cut_after)")
    if ("stall_after" in data) != ("stall_ms" in data):
        raise ScriptError("'stall_after' and 'stall_ms' go together")


@dataclass
class ScriptStep:
    """One scripted reaction to the next completions request(s) of this server."""

    status: int | None = None
    notjson: bool = False
    close: bool = False
    reset: bool = False  # like close, with a TCP RST
    delay_ms: int = 0
    times: int = 1  # -1: until /__reset
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    stall_after: int | None = None
    stall_ms: int = 0

    @classmethod
    def from_json(cls, data: Any) -> ScriptStep:
        """A step from `/__script` JSON; ScriptError (a ValueError) when it is not one."""
        return cls(**check_step(data))

    def as_magic(self, magic: Magic) -> Magic:
        """A request's markers with this step laid over them."""
        return replace(
            magic,
            status=self.status if self.status and not self.notjson else magic.status,
            quota=magic.quota and not self.status,
            notjson=self.status if self.status and self.notjson else magic.notjson,
            sleep_ms=self.delay_ms or magic.sleep_ms,
            close=self.close or magic.close,
            reset=self.reset,
            headers=self.headers,
            cut_after=self.cut_after,
            stall_after=self.stall_after,
            stall_ms=self.stall_ms,
        )


def parse_steps(data: Any) -> list[ScriptStep]:
    """The body of `/__script` (a step or a list of steps); ScriptError names step and key."""
    items = data if isinstance(data, list) else [data]
    steps = []
    for i, item in enumerate(items):
        try:
            steps.append(ScriptStep.from_json(item))
        except ScriptError as exc:
            raise ScriptError(f"step {i}: {exc}") from None
    return steps


@dataclass
class Script:
    steps: list[ScriptStep] = field(default_factory=list)

    def take(self) -> ScriptStep | None:
        while self.steps and self.steps[0].times == 0:
            self.steps.pop(0)
        if not self.steps:
            return None
        step = self.steps[0]
        if step.times > 0:
            step.times -= 1
        return step
