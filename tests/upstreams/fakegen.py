"""Deterministic fake "model" behind the scripted upstreams: a word tokenizer and a word cycle.

Tokenizer: a text prompt's tokens are its whitespace-separated words, each carrying the
whitespace before it (so the tokens concatenate back to the prompt). A token-id prompt has one
token per id, rendered as `" t<id>"` when echoed.

Generation: candidate `c` of a prompt emits the words of `WORDS` cyclically, starting at
`(crc32(f"{seed}|{prompt_text}") + c) % len(WORDS)`. So choices of one prompt differ (for
c < 8), the same (prompt, seed) repeats, and every word appears within 8 tokens: a stop string
such as `" gamma"` always triggers when `max_tokens >= 8`.

Log-probs: generated token k of candidate c has logprob `-0.5 / (c + 1) * (1 + 0.01 * (k % 5))`.
A higher candidate index always has a higher mean logprob whatever the lengths, so with
`best_of=B, n=N` the winners are candidates B-1, B-2, …, B-N (best first).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

WORDS: tuple[str, ...] = (
    " alpha",
    " beta",
    " gamma",
    " delta",
    " epsilon",
    " zeta",
    " eta",
    " theta",
)
WORD_TOKEN_BASE = 1000  # token id of WORDS[i] is WORD_TOKEN_BASE + i
CONTEXT_WINDOW = 2048
_TOKEN_RE = re.compile(r"\s*\S+")


@dataclass(frozen=True)
class Token:
    """One token as returned: its text, id, logprob (None: no conditional) and alternatives."""

    text: str
    token_id: int
    logprob: float | None
    alternatives: tuple[tuple[str, int, float], ...] = ()


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: tuple[str, ...]
    token_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Sample:
    """One generated candidate, already cut at a stop string as the dialect wants."""

    candidate: int
    tokens: tuple[Token, ...]
    finish_reason: str
    completion_tokens: int
    stop_matched: str | None = None

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)

    @property
    def mean_logprob(self) -> float:
        values = [t.logprob for t in self.tokens if t.logprob is not None]
        return sum(values) / len(values) if values else 0.0


def split_words(text: str) -> tuple[str, ...]:
    """Tokens of a text: words with their leading whitespace; trailing blanks join the last."""
    tokens = _TOKEN_RE.findall(text)
    if not tokens:
        return (text,) if text else ()
    tail = text[sum(len(t) for t in tokens) :]
    if tail:
        tokens[-1] += tail
    return tuple(tokens)


def text_token_id(token: str) -> int:
    word = token.strip()
    for i, w in enumerate(WORDS):
        if w.strip() == word:
            return WORD_TOKEN_BASE + i
    return zlib.crc32(word.encode()) % WORD_TOKEN_BASE


def prompt_from_text(text: str) -> Prompt:
    tokens = split_words(text)
    return Prompt(text, tokens, tuple(text_token_id(t) for t in tokens))


def prompt_from_ids(ids: Sequence[int]) -> Prompt:
    tokens = tuple(f" t{i}" for i in ids)
    return Prompt("".join(tokens), tokens, tuple(ids))


def start_word(prompt_text: str, candidate: int, seed: int | None) -> int:
    base = zlib.crc32(f"{seed}|{prompt_text}".encode())
    return (base + candidate) % len(WORDS)


def token_logprob(candidate: int, position: int) -> float:
    return round(-0.5 / (candidate + 1) * (1 + 0.01 * (position % 5)), 6)


def alternatives(word_index: int, logprob: float, top_n: int) -> tuple[tuple[str, int, float], ...]:
    """`top_n` other words (never the sampled one), each 0.5 nats less likely than the last."""
    out = []
    for r in range(top_n):
        w = (word_index + 1 + r) % len(WORDS)
        out.append((WORDS[w], WORD_TOKEN_BASE + w, round(logprob - 0.5 * (r + 1), 6)))
    return tuple(out)


def word_token(candidate: int, position: int, word_index: int, top_n: int) -> Token:
    lp = token_logprob(candidate, position)
    alts = alternatives(word_index, lp, top_n)
    return Token(WORDS[word_index], WORD_TOKEN_BASE + word_index, lp, alts)


def prompt_logprob_tokens(prompt: Prompt, top_n: int, last: int | None = None) -> list[Token]:
    """Echoed prompt tokens (the last `last` of them); the prompt's first token has no logprob."""
    first = 0 if last is None else max(0, len(prompt) - last)
    out: list[Token] = []
    for j in range(first, len(prompt)):
        lp = None if j == 0 else round(-1.0 - 0.1 * (j % 3), 6)
        alts = () if lp is None else alternatives(j % len(WORDS), lp, top_n)
        out.append(Token(prompt.tokens[j], prompt.token_ids[j], lp, alts))
    return out


def find_stop(text: str, stops: Sequence[str], since: int) -> tuple[int, str] | None:
    """Earliest stop occurrence that ends after `since` (only newly generated text is new)."""
    longest = max((len(s) for s in stops), default=0)
    window_start = max(0, since - longest + 1)
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, window_start)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def cut_tokens(tokens: Sequence[Token], cut: int) -> tuple[Token, ...]:
    """Keep the text before `cut`; a token straddling the cut is shortened."""
    out: list[Token] = []
    offset = 0
    for tok in tokens:
        if offset >= cut:
            break
        keep = tok.text[: cut - offset]
        out.append(
            tok if keep == tok.text else Token(keep, tok.token_id, tok.logprob, tok.alternatives)
        )
        offset += len(tok.text)
    return tuple(out)


@dataclass(frozen=True)
class GenSpec:
    """How to generate: limits, stops and the dialect's stop-string policy."""

    max_tokens: int
    stops: tuple[str, ...] = ()
    include_stop: bool = False
    seed: int | None = None
    eos_after: int | None = None  # natural EOS after this many tokens (magic `__eos_<k>__`)
    top_n: int = 0  # alternatives per position


def generate(prompt: Prompt, candidate: int, spec: GenSpec) -> Sample:
    start = start_word(prompt.text, candidate, spec.seed)
    tokens: list[Token] = []
    text = ""
    for k in range(spec.max_tokens):
        if spec.eos_after is not None and k >= spec.eos_after:
            return Sample(candidate, tuple(tokens), "stop", k)
        tok = word_token(candidate, k, (start + k) % len(WORDS), spec.top_n)
        tokens.append(tok)
        since, text = len(text), text + tok.text
        hit = find_stop(text, spec.stops, since) if spec.stops else None
        if hit is not None:
            pos, stop = hit
            cut = pos + len(stop) if spec.include_stop else pos
            return Sample(candidate, cut_tokens(tokens, cut), "stop", k + 1, stop)
    return Sample(candidate, tuple(tokens), "length", len(tokens))


def expected_text(
    prompt: str, candidate: int = 0, max_tokens: int = 16, seed: int | None = None
) -> str:
    """The text candidate `candidate` of a text prompt generates without stops (for tests)."""
    return generate(prompt_from_text(prompt), candidate, GenSpec(max_tokens, seed=seed)).text


def best_of(prompt: Prompt, n: int, best: int, spec: GenSpec) -> list[Sample]:
    """Generate `best` candidates and keep the `n` with the highest mean logprob, best first."""
    samples = [generate(prompt, c, spec) for c in range(best)]
    ranked = sorted(samples, key=lambda s: (-s.mean_logprob, -s.candidate))
    return ranked[:n]
