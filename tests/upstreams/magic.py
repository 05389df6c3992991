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

Per-server scripts (`POST /__script`) let one upstream of several misbehave, which prompt
markers cannot (every upstream sees the same prompt).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_STATUS = re.compile(r"__status_(\d{3})(_quota)?__")
_NOTJSON = re.compile(r"__notjson_(\d{3})__")
_SLEEP = re.compile(r"__sleep_(\d+)__")
_EOS = re.compile(r"__eos_(\d+)__")


@dataclass(frozen=True)
class Magic:
    status: int | None = None
    quota: bool = False
    notjson: int | None = None
    sleep_ms: int = 0
    midstream_error: bool = False
    slow_stream: bool = False
    close: bool = False


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
    )


def eos_after(text: str) -> int | None:
    m = _EOS.search(text)
    return int(m.group(1)) if m else None


@dataclass
class ScriptStep:
    """One scripted reaction to the next completions request(s) of this server."""

    status: int | None = None
    notjson: bool = False
    close: bool = False
    delay_ms: int = 0
    times: int = 1  # -1: until /__reset

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScriptStep:
        return cls(
            status=data.get("status"),
            notjson=bool(data.get("notjson", False)),
            close=bool(data.get("close", False)),
            delay_ms=int(data.get("delay_ms", 0)),
            times=int(data.get("times", 1)),
        )

    def as_magic(self, magic: Magic) -> Magic:
        """A request's markers with this step laid over them."""
        return Magic(
            status=self.status if self.status and not self.notjson else magic.status,
            quota=magic.quota and not self.status,
            notjson=self.status if self.status and self.notjson else magic.notjson,
            sleep_ms=self.delay_ms or magic.sleep_ms,
            midstream_error=magic.midstream_error,
            slow_stream=magic.slow_stream,
            close=self.close or magic.close,
        )


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
