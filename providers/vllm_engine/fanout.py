"""How many sequences to ask of the engine for `n` and `best_of`, and which ones to return.

* Sampling: the engine generates `n` sequences per prompt.
* `best_of` > n (OpenAI's semantics, which vLLM no longer has): the engine generates `best_of`
  candidates with their logprobs; the `n` with the highest mean token logprob are returned,
  best first. Usage counts every candidate: that is what was generated (and what OpenAI bills).
* Greedy (temperature 0): every sequence would be the same text, and vLLM refuses n > 1 ("n
  must be 1 when using greedy sampling") where OpenAI returns n identical choices. The engine
  generates one and it is repeated n times; usage counts each copy, as OpenAI counts n choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

# vLLM treats a temperature below this as greedy (vllm.sampling_params._SAMPLING_EPS).
GREEDY_EPS = 1e-5


class Candidate(Protocol):
    """The part of vLLM's `CompletionOutput` ranking reads."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def cumulative_logprob(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Fanout:
    generate: int  # sequences the engine makes per prompt
    keep: int  # choices returned per prompt (the request's n)
    rank: bool  # best_of: keep the `keep` best of `generate`
    copies: int  # choices each generated sequence fills (greedy n > 1), else 1


def fanout(n: int, best_of: int | None, temperature: float) -> Fanout:
    if temperature < GREEDY_EPS:
        return Fanout(generate=1, keep=n, rank=False, copies=n)
    if best_of is not None and best_of > n:
        return Fanout(generate=best_of, keep=n, rank=True, copies=1)
    return Fanout(generate=n, keep=n, rank=False, copies=1)


def beam_fanout(n: int) -> Fanout:
    """Beam search: the engine's n best beams, as they come (best first)."""
    return Fanout(generate=n, keep=n, rank=False, copies=1)


def temperature_of(body: Mapping[str, Any]) -> float:
    """The temperature vLLM will use (its server's default is 1.0, as OpenAI's)."""
    value = body.get("temperature")
    return 1.0 if value is None else float(value)


def mean_logprob(seq: Candidate) -> float:
    """Mean logprob of the generated tokens; -inf without any, so such a candidate never wins."""
    if seq.cumulative_logprob is None or not seq.token_ids:
        return float("-inf")
    return seq.cumulative_logprob / len(seq.token_ids)


C = TypeVar("C", bound=Candidate)


def select(outputs: Sequence[C], fan: Fanout) -> list[C]:
    """One prompt's engine outputs (by index) → its returned sequences, choice order. A repeated
    greedy sequence appears `copies` times."""
    ordered = sorted(outputs, key=_index)
    if fan.rank:
        return sorted(ordered, key=mean_logprob, reverse=True)[: fan.keep]  # stable on ties
    return [seq for seq in ordered for _ in range(fan.copies)]


def _index(seq: Any) -> int:
    return int(getattr(seq, "index", 0))
