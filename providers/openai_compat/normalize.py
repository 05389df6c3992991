"""Upstream answers → the canonical shape of core/answers.py.

Canonical output is OpenAI's: choices in `prompt_idx * n + i` order with `text`, `index`,
`logprobs` (legacy four lists, or null) and `finish_reason`. vLLM's per-choice answers to its
extras ride along when the request asked for them and they are not null (`extras_for`), and so do
what a dialect's upstream adds unasked (Azure's content filter results, per choice and per
answer); other provider extras (`raw_output`, `perf_metrics`, …) are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from core.answers import Choice, Chunk, Completion, Logprobs, Usage
from core.errors import UpstreamError
from providers.openai_compat.stops import StopHoldBack, strip_stop
from providers.transport.errors import bad_answer

FINISH: Mapping[str, str] = MappingProxyType(
    {
        "stop": "stop",
        "length": "length",
        "content_filter": "content_filter",
        # spellings of other OpenAI-compatible servers
        "eos": "stop",
        "eos_token": "stop",
        "stop_sequence": "stop",
        "max_tokens": "length",
    }
)
# vLLM's per-choice answers to its extras, kept as the upstream sent them: which field of
# the request asks for each (`stop_reason` is always there).
EXTRAS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "return_token_ids": ("prompt_token_ids", "token_ids"),
        "prompt_logprobs": ("prompt_logprobs",),
    }
)
PLAIN_EXTRAS = ("stop_reason",)
# Fireworks `error`, vLLM `abort`: the choice did not complete; its text cannot be trusted.
FAILED = frozenset({"error", "abort", "cancelled"})


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class Normalization:
    """What the caller asked for that decides the canonical output."""

    label: str  # the target, for error messages
    want_logprobs: bool
    stops: tuple[str, ...] = ()  # stop strings to cut (dialects that may include them)
    # With echo of text prompts: each prompt's length, i.e. the leading characters of its
    # choices' texts that were not generated (a stop string is never cut from them).
    echoed: tuple[int, ...] = ()
    n: int = 1  # choices per prompt: choice `index` belongs to prompt `index // n`
    # vLLM's continuous_usage_stats went upstream: content chunks keep their usage.
    continuous_usage: bool = False
    extras: tuple[str, ...] = ("stop_reason",)  # per-choice keys kept when not null
    # Every delta becomes a chunk, empty ones too (the caller gets vLLM's server's chunks).
    keep_empty: bool = False
    # The chunks that end a choice wait for the upstream's system_fingerprint (FingerprintWait).
    await_fingerprint: bool = False
    # Answer-level keys the upstream adds unasked, kept when not null (Azure's
    # prompt_filter_results); a stream's, from an event without choices, ride on the next chunk.
    upstream_extras: tuple[str, ...] = ()

    def protected(self, index: int) -> int:
        prompt = index // self.n
        return self.echoed[prompt] if prompt < len(self.echoed) else 0


def extras_for(fields: Mapping[str, Any], plain: tuple[str, ...] = PLAIN_EXTRAS) -> tuple[str, ...]:
    """The per-choice extras a request asks for, after `plain` (those of every request: the
    dialect's own, e.g. Azure's content filter results); echo with logprobs asks vLLM for the
    prompt's logprobs, and its server shows them."""
    if fields.keys().isdisjoint(EXTRAS) and not fields.get("echo"):
        return plain  # what nearly every request asks
    keys = list(plain)
    for field, answers in EXTRAS.items():
        value = fields.get(field)
        if value is not None and value is not False:  # prompt_logprobs=0 asks too
            keys.extend(answers)
    echo_logprobs = fields.get("echo") and fields.get("logprobs") is not None
    if echo_logprobs and "prompt_logprobs" not in keys:
        keys.append("prompt_logprobs")
    return tuple(keys)


# ---------------------------------------------------------------- pieces


def finish_reason(
    value: Any, index: int, label: str, table: Mapping[str, str] = FINISH
) -> str | None:
    if value is None:
        return None
    if value in FAILED:
        raise UpstreamError(
            f"Upstream {label} failed while generating choice {index} (finish_reason {value!r}).",
            target=label,
            code="upstream_generation_failed",
        )
    return table.get(value, "stop")  # an unknown spelling still means the choice ended


def legacy_logprobs(raw: Any) -> Logprobs | None:
    """Legacy `{tokens, token_logprobs, top_logprobs, text_offset}`, from the legacy form (extras
    such as `token_ids` dropped) or from Fireworks' `{"content": [...]}` form."""
    if not isinstance(raw, dict):
        return None
    content = raw.get("content")
    if isinstance(content, list):
        return _from_content(content)
    tokens = list(raw.get("tokens") or ())
    size = len(tokens)
    return {
        "tokens": tokens,
        "token_logprobs": list(raw.get("token_logprobs") or [None] * size),
        "top_logprobs": list(raw.get("top_logprobs") or [None] * size),
        "text_offset": list(raw.get("text_offset") or _offsets(tokens, 0)),
    }


def _from_content(content: Sequence[Any]) -> Logprobs:
    entries = [e for e in content if isinstance(e, dict)]
    tokens = [str(e.get("token", "")) for e in entries]
    offsets: list[Any] = [e.get("text_offset") for e in entries]
    return {
        "tokens": tokens,
        "token_logprobs": [e.get("logprob") for e in entries],
        "top_logprobs": [_top(e.get("top_logprobs")) for e in entries],
        "text_offset": offsets if None not in offsets else _offsets(tokens, 0),
    }


def _top(alternatives: Any) -> dict[str, Any] | None:
    if not isinstance(alternatives, list) or not alternatives:
        return None
    return {str(a.get("token", "")): a.get("logprob") for a in alternatives if isinstance(a, dict)}


def _offsets(tokens: Iterable[str], start: int) -> list[int]:
    out = []
    for token in tokens:
        out.append(start)
        start += len(token)
    return out


def usage(raw: Any) -> Usage | None:
    """OpenAI usage; Fireworks may send `completion_tokens: null`."""
    if not isinstance(raw, dict):
        return None
    prompt = _count(raw.get("prompt_tokens"))
    completion = raw.get("completion_tokens")
    if type(completion) is not int:
        total = raw.get("total_tokens")
        completion = max(total - prompt, 0) if type(total) is int else 0
    total = prompt + completion
    out: Usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    if isinstance(raw.get("prompt_tokens_details"), dict):
        out["prompt_tokens_details"] = raw["prompt_tokens_details"]
    if isinstance(raw.get("completion_tokens_details"), dict):
        out["completion_tokens_details"] = raw["completion_tokens_details"]
    return out


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def keep(raw: Mapping[str, Any], out: Any, keys: tuple[str, ...]) -> None:
    """Copy `keys` that are not null from an upstream's object to the canonical one."""
    for key in keys:
        if raw.get(key) is not None:
            out[key] = raw[key]


def choice(raw: Any, position: int, shape: Normalization, final: bool) -> Choice:
    """One canonical choice (or stream delta); `final` for non-stream answers, where a choice
    has always ended."""
    if not isinstance(raw, dict):
        raise bad_answer(shape.label, "a choice that is not a JSON object")
    index = raw.get("index")
    index = index if type(index) is int else position
    reason = finish_reason(raw.get("finish_reason"), index, shape.label)
    out: Choice = {
        "text": raw.get("text") or "",
        "index": index,
        "logprobs": legacy_logprobs(raw.get("logprobs")),
        "finish_reason": reason or ("stop" if final else None),
    }
    for key in shape.extras:
        if raw.get(key) is not None:
            out[key] = raw[key]  # type: ignore[literal-required]  # keys of EXTRAS, all Choice's
    return out


# ---------------------------------------------------------------- whole answers


def choices(body: Mapping[str, Any], shape: Normalization) -> list[Choice]:
    """The choices of a non-stream answer, in index order, logprobs still as returned."""
    raw = body.get("choices")
    if not isinstance(raw, list):
        raise bad_answer(shape.label, "a response without choices")
    out = [choice(c, i, shape, final=True) for i, c in enumerate(raw)]
    out.sort(key=lambda c: c["index"])
    return out


def finish(body: Mapping[str, Any], picked: list[Choice], shape: Normalization) -> Completion:
    """The canonical completion from the chosen choices."""
    for c in picked:
        if shape.stops:
            strip_stop(c, shape.stops, shape.protected(c["index"]))
        if not shape.want_logprobs:
            c["logprobs"] = None
    out: Completion = {"choices": picked, "usage": usage(body.get("usage"))}
    fingerprint = body.get("system_fingerprint")
    if isinstance(fingerprint, str):
        out["system_fingerprint"] = fingerprint
    keep(body, out, shape.upstream_extras)
    return out


class FingerprintWait:
    """vLLM's server writes its system_fingerprint on the chunks that end a choice, unless
    usage was asked for: then only on the usage chunk, and the gateway always asks for usage.
    For a caller who did not, the chunks from the first one that ends a choice on wait for the
    fingerprint (the usage chunk comes right after the last one), so that they can carry it."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[Any] = []

    def holds(self, chunk: Any, known: bool) -> bool:
        """Whether `chunk` waits (kept here, in order)."""
        if known or not (self._held or any(c["finish_reason"] for c in chunk["choices"])):
            return False
        self._held.append(chunk)
        return True

    def release(self) -> list[Any]:
        out, self._held = self._held, []
        return out


class StreamNormalizer:
    """Upstream stream events → canonical chunks: content chunks carry `choices` (and, with
    continuous usage, the usage so far of their choice); the request's usage, wherever the
    upstream put it (its own chunk, or the last content chunk as Fireworks does), becomes one
    final `{"choices": [], "usage": …}`. The upstream's `system_fingerprint` rides on
    the first chunk out after it appears or changes (the renderer keeps it for later chunks), and
    so do the upstream's answer-level extras that come on an event without choices."""

    __slots__ = ("_fingerprint", "_hold", "_pending", "_shape", "_usage", "_wait")

    def __init__(self, shape: Normalization) -> None:
        self._shape = shape
        self._hold = StopHoldBack(shape.stops, shape.protected) if shape.stops else None
        self._usage: Any = None
        self._fingerprint: str | None = None
        # What the next chunk out carries: a new fingerprint, the upstream's extras.
        self._pending: dict[str, Any] | None = None
        self._wait = FingerprintWait() if shape.await_fingerprint else None

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if event.get("usage") is not None:
            self._usage = event["usage"]
        fingerprint = event.get("system_fingerprint")
        if isinstance(fingerprint, str) and fingerprint != self._fingerprint:
            self._fingerprint = fingerprint
            self._pending = {**(self._pending or {}), "system_fingerprint": fingerprint}
        raw = event.get("choices")
        if not raw or not isinstance(raw, list):
            if self._shape.upstream_extras:  # Azure's prompt_filter_results come first, alone
                self._pending = pending(self._pending, event, self._shape.upstream_extras)
            # (A dialect with upstream extras has no fingerprint to wait for.)
            return self._waited() if self._pending is not None else []
        deltas = []
        for position, item in enumerate(raw):
            delta: Choice | None = choice(item, position, self._shape, final=False)
            if self._hold is not None:
                delta = self._hold.feed(delta)  # type: ignore[arg-type]
            if delta is None:
                continue
            if not self._shape.want_logprobs:
                delta["logprobs"] = None
            if self._shape.keep_empty or _carries(delta):
                deltas.append(delta)
        if not deltas:
            return []
        chunk: Chunk = {"choices": deltas}
        if self._shape.continuous_usage:
            so_far = usage(event.get("usage"))
            if so_far is not None:
                chunk["usage"] = so_far  # the choice's usage so far
        if self._wait is None:
            return [self._stamp(chunk)]
        if self._wait.holds(chunk, self._fingerprint is not None):
            return []
        return [*self._waited(), self._stamp(chunk)]

    def _waited(self) -> list[Chunk]:
        """The chunks that waited for the fingerprint, the first one carrying it."""
        if self._wait is None:
            return []
        return [self._stamp(chunk) for chunk in self._wait.release()]

    def end(self) -> list[Chunk]:
        out: list[Chunk] = self._waited()
        held = self._hold.flush() if self._hold is not None else []
        if held:
            out.append(self._stamp({"choices": held}))
        final = usage(self._usage)
        if final is not None:
            out.append(self._stamp({"choices": [], "usage": final}))
        return out

    def _stamp(self, chunk: Chunk) -> Chunk:
        if self._pending is not None:
            chunk.update(self._pending)  # type: ignore[typeddict-item]  # fingerprint, extras
            self._pending = None
        return chunk


def pending(
    held: dict[str, Any] | None, event: Mapping[str, Any], keys: tuple[str, ...]
) -> dict[str, Any] | None:
    """What waits for the next chunk out, with `event`'s `keys` that are not null."""
    found = {key: event[key] for key in keys if event.get(key) is not None}
    return {**(held or {}), **found} if found else held


# Azure's per-choice verdicts: an asynchronous filter's come on a delta of their own.
FILTER_RESULTS = "content_filter_results"


def _carries(delta: Choice) -> bool:
    """Empty deltas (chunked prefill, keep-alives) are not worth a chunk; tokens whose text is
    held back (vLLM's `token_ids`) are."""
    lp = delta["logprobs"]
    return (
        bool(delta["text"])
        or delta["finish_reason"] is not None
        or bool(lp and lp["tokens"])
        or bool(delta.get("token_ids"))
        or "prompt_token_ids" in delta
        or bool(delta.get(FILTER_RESULTS))
    )
