"""The answers a provider returns, typed: the canonical shapes every adapter normalizes to.

Canonical output is OpenAI's legacy completions shape: choices in `prompt_idx * n + i` order,
legacy logprobs, stop strings excluded, usage as OpenAI counts it. The gateway then stamps `id`,
`object`, `created` and `model` (the caller's alias).

* `Completion`: a whole answer.
* A stream is batches (lists) of `Chunk`s: all that is ready at once, which the gateway writes to
  the caller in one piece. It may begin with an empty batch once the upstream has accepted the
  request (so the caller's response headers go out at once). A content chunk's choices are the
  choices' deltas: a `Choice` with the text since the last one, whose `finish_reason` is set on
  its last delta only. With continuous usage, a content chunk also has `usage`: its choice's
  usage so far. The last chunk is `{"choices": [], "usage": …}` whenever the upstream reported
  usage. A chunk may carry `system_fingerprint`: it holds for that chunk and every later one.
* A choice may also carry vLLM's extras, each only when not null: `stop_reason` (the stop
  string or token id that ended it), `prompt_logprobs` (vLLM's format), `prompt_token_ids` (a
  stream's first delta of the choice) and `token_ids`. Written in vLLM's shape
  (gateway/pipeline/shapes.py), they are on every answer, null when not set: the types say so.
* `Embeddings`: one embedding per input, in input order, each in the request's
  `encoding_format`: a list of floats, or OpenAI's base64 of little-endian float32 values. A
  list of floats may be relayed as the upstream wrote it: its JSON, an orjson.Fragment.
"""

from __future__ import annotations

from typing import Any, NotRequired, Required, TypedDict

from orjson import Fragment


class Logprobs(TypedDict):
    """OpenAI's legacy logprobs: four lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # OpenAI's breakdowns (cached, reasoning, audio, … tokens), as the upstream reported them.
    prompt_tokens_details: NotRequired[dict[str, int] | None]
    completion_tokens_details: NotRequired[dict[str, int] | None]


class PromptLogprob(TypedDict):
    """vLLM's own `prompt_logprobs` entry (not OpenAI's format)."""

    logprob: float
    rank: int | None
    decoded_token: str | None


# Per prompt position, token id (as a string) → its entry; null where nothing precedes.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class Choice(TypedDict):
    """A choice of a whole answer, or a delta of one in a stream."""

    text: str
    index: int
    logprobs: Logprobs | None
    finish_reason: str | None  # stop | length | content_filter; None while a stream goes on
    stop_reason: NotRequired[int | str | None]
    prompt_logprobs: NotRequired[PromptLogprobs | None]
    prompt_token_ids: NotRequired[list[int] | None]
    token_ids: NotRequired[list[int] | None]


class Chunk(TypedDict):
    choices: list[Choice]
    usage: NotRequired[Usage]
    system_fingerprint: NotRequired[str | None]


class Completion(TypedDict):
    choices: list[Choice]
    usage: Usage | None
    system_fingerprint: NotRequired[str | None]


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class Embeddings(TypedDict):
    data: list[list[float] | Fragment] | list[str]
    usage: EmbeddingUsage


# ---------------------------------------------------------------- chat


class ToolFunction(TypedDict):
    name: str
    arguments: str  # JSON, as the model wrote it


class ToolCall(TypedDict):
    id: str
    type: str  # "function"
    function: ToolFunction


class ChatMessage(TypedDict):
    role: str  # "assistant"
    content: str | None
    refusal: str | None
    tool_calls: NotRequired[list[ToolCall]]


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    content: list[TokenLogprob] | None
    refusal: NotRequired[list[TokenLogprob] | None]


class ChatChoice(TypedDict):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None  # stop | length | tool_calls | content_filter
    stop_reason: NotRequired[int | str | None]
    token_ids: NotRequired[list[int] | None]


class ChatCompletion(TypedDict):
    choices: list[ChatChoice]
    usage: Usage | None
    system_fingerprint: NotRequired[str | None]
    prompt_token_ids: NotRequired[list[int] | None]  # vLLM's return_token_ids
    prompt_logprobs: NotRequired[PromptLogprobs | None]


class ToolCallDelta(TypedDict, total=False):
    """A piece of a tool call in a stream: its id, type and name first, then argument pieces."""

    index: Required[int]
    id: str
    type: str
    function: ToolFunctionDelta


class ToolFunctionDelta(TypedDict, total=False):
    name: str
    arguments: str


class ChatDelta(TypedDict, total=False):
    role: str  # on each choice's first delta
    content: str | None
    refusal: str | None
    tool_calls: list[ToolCallDelta]


class ChatChunkChoice(TypedDict):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None  # on each choice's last chunk only
    stop_reason: NotRequired[int | str | None]
    token_ids: NotRequired[list[int] | None]


class ChatChunk(TypedDict):
    choices: list[ChatChunkChoice]
    usage: NotRequired[Usage]
    system_fingerprint: NotRequired[str | None]
    prompt_token_ids: NotRequired[list[int] | None]
    prompt_text: NotRequired[str | None]  # vLLM's, on a chat stream's first chunks


# What a stream's batches hold, whichever the endpoint.
StreamChunk = Chunk | ChatChunk


# ---------------------------------------------------------------- responses


class ResponseAnswer(TypedDict):
    """A Responses API answer: OpenAI's `response` object but for what the gateway stamps (`id`,
    `object`, `created_at`, `model`), with its usage in the canonical `Usage` (the rate limits,
    spend and the request log read it as they read a chat's), rendered as the Responses API's
    own (`input_tokens`, `output_tokens`, their details) when written."""

    status: str  # completed | incomplete | failed | in_progress (a stream's first events)
    output: list[dict[str, Any]]  # OpenAI's output items (messages, function calls, reasoning)
    usage: Usage | None
    incomplete_details: dict[str, Any] | None  # {"reason": "max_output_tokens" | …}
    error: dict[str, Any] | None  # {"code", "message"} of a failed response
    # The request's fields the response object repeats (instructions, temperature, tools, …),
    # as the target answered them or as the gateway made them from the request.
    echo: dict[str, Any]
    # An upstream that keeps responses itself: its id of this one, and whether it holds the
    # whole conversation under it (a next turn may then continue from that id).
    upstream: NotRequired[Upstream]


class Upstream(TypedDict):
    provider: str
    id: str
    whole: bool


class ResponseEvent(TypedDict, total=False):
    """One event of a Responses stream, as OpenAI names it (`type`), without its
    `sequence_number` (the gateway numbers the events it writes). An event that carries the
    response (`response.created`, …, `response.completed`) holds it as a `ResponseAnswer`."""

    type: Required[str]
    response: ResponseAnswer
    item: dict[str, Any]
    part: dict[str, Any]
    output_index: int
    content_index: int
    item_id: str
    delta: str
    text: str
    arguments: str
    logprobs: list[dict[str, Any]]
    name: str
    # A failure's error, as the stream's `error` event says it.
    code: str | None
    message: str
    param: str | None
