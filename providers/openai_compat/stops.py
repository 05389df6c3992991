"""OpenAI stop semantics for upstreams that may return the matched stop string (Fireworks).

OpenAI: "The returned text will not contain the stop sequence." When a choice finished with
"stop" and its text ends with a requested stop string, that tail is cut, together with the
logprobs entries of the tokens inside it (a token straddling the cut keeps its head).

While streaming, a delta that might be the beginning of a stop string cannot be sent yet:
`StopHoldBack` keeps whole deltas (with their logprobs) until the text they end with can no
longer grow into a stop string, and settles them when the choice finishes.

Only generated text can hold a matched stop string: with `echo`, the leading characters that
are the echoed prompt (`protected`) are never cut, even when the model generated nothing after
a prompt that happens to end with a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.answers import Choice, Logprobs


def matched_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string the text ends with; the longest one when several do, since generation
    ended at the earliest possible start of a match."""
    best: str | None = None
    for stop in stops:
        if text.endswith(stop) and (best is None or len(stop) > len(best)):
            best = stop
    return best


def strip_stop(choice: Choice, stops: Sequence[str], protected: int = 0) -> None:
    """Cut a trailing stop string from a canonical choice (in place) if it finished on one; the
    first `protected` characters of its text (an echoed prompt) are not generated text."""
    if choice.get("finish_reason") != "stop":
        return
    stop = matched_stop(choice["text"], stops)
    if stop is None or len(choice["text"]) - len(stop) < protected:
        return
    choice["text"] = choice["text"][: len(choice["text"]) - len(stop)]
    if choice["logprobs"] is not None:
        choice["logprobs"] = trim_logprobs(choice["logprobs"], len(stop))


def trim_logprobs(logprobs: Logprobs, chars: int) -> Logprobs:
    """Drop the entries of the tokens lying in the last `chars` characters of the text."""
    tokens = list(logprobs["tokens"])
    keep = len(tokens)
    while chars > 0 and keep > 0:
        token = tokens[keep - 1]
        if len(token) <= chars:
            chars -= len(token)
            keep -= 1
        else:  # straddles the cut: keep its head
            tokens[keep - 1] = token[: len(token) - chars]
            chars = 0
    return {
        "tokens": tokens[:keep],
        "token_logprobs": logprobs["token_logprobs"][:keep],
        "top_logprobs": logprobs["top_logprobs"][:keep],
        "text_offset": logprobs["text_offset"][:keep],
    }


def merge(deltas: Sequence[Choice]) -> Choice:
    """Several deltas of one choice as one (text and logprobs concatenated)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    parts = [d["logprobs"] for d in deltas if d["logprobs"] is not None]
    logprobs: Logprobs | None = None
    if parts:
        logprobs = {
            "tokens": [x for p in parts for x in p["tokens"]],
            "token_logprobs": [x for p in parts for x in p["token_logprobs"]],
            "top_logprobs": [x for p in parts for x in p["top_logprobs"]],
            "text_offset": [x for p in parts for x in p["text_offset"]],
        }
    return {
        "text": "".join(d["text"] for d in deltas),
        "index": last["index"],
        "logprobs": logprobs,
        "finish_reason": last["finish_reason"],
    }


class StopHoldBack:
    """Per-stream hold-back of deltas that may begin a stop string (one instance per request).
    `protected(index)`: how many leading characters of that choice are an echoed prompt."""

    __slots__ = ("_held", "_longest", "_protected", "_sent", "_stops")

    def __init__(self, stops: Sequence[str], protected: Callable[[int], int] | None = None) -> None:
        self._stops = tuple(stops)
        self._longest = max(len(s) for s in stops)
        self._protected = protected
        self._held: dict[int, list[Choice]] = {}  # choice index → deltas not sent yet
        self._sent: dict[int, int] = {}  # choice index → characters already released

    def feed(self, delta: Choice) -> Choice | None:
        """What may be sent now of this choice, merged into one delta, or None."""
        index = delta["index"]
        held = self._held.setdefault(index, [])
        held.append(delta)
        if delta["finish_reason"] is not None:
            del self._held[index]
            done = merge(held)
            strip_stop(done, self._stops, self._unsent_protected(index))
            return done
        start = self._risky_start("".join(d["text"] for d in held))
        released: list[Choice] = []
        end = 0
        while held and end + len(held[0]["text"]) <= start:
            end += len(held[0]["text"])
            released.append(held.pop(0))
        if not released:
            return None
        self._sent[index] = self._sent.get(index, 0) + end
        return merge(released)

    def _unsent_protected(self, index: int) -> int:
        """Protected (echoed) characters among those not released yet."""
        if self._protected is None:
            return 0
        return max(0, self._protected(index) - self._sent.get(index, 0))

    def flush(self) -> list[Choice]:
        """The stream ended without finishing some choices: send what was held as it is."""
        out = [merge(held) for held in self._held.values() if held]
        self._held.clear()
        return out

    def _risky_start(self, text: str) -> int:
        """Where the longest tail of `text` that is a prefix of a stop string begins (a tail
        that is a whole stop string counts: it is cut once the choice finishes)."""
        for size in range(min(len(text), self._longest), 0, -1):
            tail = text[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return len(text) - size
        return len(text)
