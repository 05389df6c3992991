"""Dialect-neutral results: choices (with echo and best_of), usage, stream deltas, log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .fakegen import GenSpec, Prompt, Sample, Token, best_of, generate, prompt_logprob_tokens
from .magic import eos_after
from .validate import Params


@dataclass(frozen=True)
class ChoiceOut:
    index: int
    prompt: Prompt
    echo: tuple[Token, ...]
    sample: Sample

    @property
    def tokens(self) -> tuple[Token, ...]:
        return self.echo + self.sample.tokens

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


@dataclass(frozen=True)
class Result:
    choices: tuple[ChoiceOut, ...]
    prompt_tokens: int
    completion_tokens: int  # over every generated candidate (best_of: all of them)

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }


@dataclass(frozen=True)
class Delta:
    """One stream chunk's worth of one choice; `offset` = its text offset within the choice."""

    index: int
    tokens: tuple[Token, ...]
    finish_reason: str | None
    offset: int

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


def gen_spec(params: Params, prompt: Prompt, include_stop: bool, window: int) -> GenSpec:
    budget = params.max_tokens
    if params.truncate:
        budget = max(0, min(budget, window - len(prompt)))
    eos = None if params.ignore_eos else eos_after(prompt.text)
    return GenSpec(budget, params.stops, include_stop, params.seed, eos, params.top_n)


def _echo(params: Params, prompt: Prompt) -> tuple[Token, ...]:
    if params.echo is None:
        return ()
    return tuple(prompt_logprob_tokens(prompt, params.top_n, params.echo))


def _samples(params: Params, prompt: Prompt, spec: GenSpec) -> tuple[list[Sample], int]:
    if params.best_of > params.n:
        kept = best_of(prompt, params.n, params.best_of, spec)
        every = [generate(prompt, c, spec) for c in range(params.best_of)]
        return kept, sum(s.completion_tokens for s in every)
    samples = [generate(prompt, i, spec) for i in range(params.n)]
    return samples, sum(s.completion_tokens for s in samples)


def build(params: Params, include_stop: bool, window: int) -> Result:
    choices: list[ChoiceOut] = []
    generated = 0
    for p_idx, prompt in enumerate(params.prompts):
        spec = gen_spec(params, prompt, include_stop, window)
        samples, count = _samples(params, prompt, spec)
        generated += count
        echo = _echo(params, prompt)
        choices += [ChoiceOut(p_idx * params.n + i, prompt, echo, s) for i, s in enumerate(samples)]
    prompt_tokens = sum(len(p) for p in params.prompts)
    return Result(tuple(choices), prompt_tokens, generated)


def _segments(choice: ChoiceOut) -> list[tuple[Token, ...]]:
    """Stream pieces of a choice: the echo rides on the first generated token."""
    gen = choice.sample.tokens
    if not gen:
        return [choice.echo] if choice.echo else []
    return [choice.echo + gen[:1]] + [(t,) for t in gen[1:]]


def choice_deltas(choice: ChoiceOut, finish_separately: bool) -> list[Delta]:
    deltas: list[Delta] = []
    offset = 0
    for seg in _segments(choice):
        deltas.append(Delta(choice.index, seg, None, offset))
        offset += sum(len(t.text) for t in seg)
    finish = choice.sample.finish_reason
    if finish_separately or not deltas:
        deltas.append(Delta(choice.index, (), finish, offset))
    else:
        last = deltas[-1]
        deltas[-1] = Delta(last.index, last.tokens, finish, last.offset)
    return deltas


def plan_deltas(result: Result, finish_separately: bool) -> list[Delta]:
    """Round-robin interleaving of the choices' deltas, as an n>1 / multi-prompt stream does."""
    per_choice = [choice_deltas(c, finish_separately) for c in result.choices]
    rounds = max((len(d) for d in per_choice), default=0)
    return [d[r] for r in range(rounds) for d in per_choice if r < len(d)]


def _top_dict(tok: Token, top_n: int) -> dict[str, float] | None:
    if tok.logprob is None:
        return None
    out = {tok.text: tok.logprob}
    for text, _id, lp in tok.alternatives[:top_n]:
        out.setdefault(text, lp)
    return out


def legacy_logprobs(
    tokens: Sequence[Token], offset: int, top_n: int, with_ids: bool = False
) -> dict[str, Any]:
    offsets, pos = [], offset
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok.text)
    out: dict[str, Any] = {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [_top_dict(t, top_n) for t in tokens],
        "text_offset": offsets,
    }
    if with_ids:
        out["token_ids"] = [t.token_id for t in tokens]
    return out


def _content_entry(tok: Token, offset: int, top: int) -> dict[str, Any]:
    tops = [(tok.text, tok.token_id, tok.logprob), *tok.alternatives][:top]
    return {
        "token": tok.text,
        "logprob": tok.logprob,
        "sampling_logprob": tok.logprob,
        "token_id": tok.token_id,
        "bytes": list(tok.text.encode()),
        "text_offset": offset,
        "top_logprobs": [
            {"token": t, "logprob": lp, "token_id": i, "bytes": list(t.encode())}
            for t, i, lp in tops
        ],
    }


def content_logprobs(tokens: Sequence[Token], offset: int, top: int) -> dict[str, Any]:
    """Fireworks' `logprobs: true` format: `{"content": [{token, logprob, …, top_logprobs}]}`."""
    entries, pos = [], offset
    for tok in tokens:
        entries.append(_content_entry(tok, pos, top))
        pos += len(tok.text)
    return {"content": entries}
