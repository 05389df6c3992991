"""The Provider protocol every adapter implements, and the canonical shapes it returns.

Canonical output is OpenAI's legacy completions shape, already normalized by the adapter:
choices in `prompt_idx * n + i` order, legacy logprobs, stop strings excluded, usage as OpenAI
counts it. The gateway then stamps `id`, `object`, `created` and `model` (the caller's alias).

* `complete()` returns `{"choices": [...], "usage": {...}, "system_fingerprint"?: str}`.
* `stream()` yields batches (lists) of chunks: all that is ready at once, which the gateway
  writes to the caller in one piece. It may first yield `[]` once the upstream has accepted the
  request (so the caller's response headers go out at once). A chunk is
  `{"choices": [choice deltas]}`; a delta has `text`, `index`, `logprobs`, `finish_reason`
  (non-null only on that choice's last delta). With `continuous_usage`, a content chunk also
  has `usage`: its choice's usage so far. The last chunk is
  `{"choices": [], "usage": {...}}` whenever the upstream reported usage. A chunk may carry
  `system_fingerprint`: it holds for that chunk and every later one.
* A choice (or delta) may also carry vLLM's extras, each only when not null: `stop_reason`
  (the stop string or token id that ended it), `prompt_logprobs` (vLLM's format),
  `prompt_token_ids` (a stream's first delta of the choice) and `token_ids`.
* `embed()` returns `{"data": [one embedding per input, in input order], "usage":
  {"prompt_tokens", "total_tokens"}}`, each embedding in the request's `encoding_format`: a list
  of floats, or OpenAI's base64 of little-endian float32 values.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from gateway.embeddings import EmbeddingRequest
from gateway.schemas import CompletionRequest
from providers.params import Policy

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Target:
    """One place a model alias can be served from (built at startup, from config)."""

    alias: str  # what the caller asked for
    provider: str  # provider name in config (also its virtual key)
    model: str  # model id at the provider
    # A whole JSON answer; for a stream, each wait for its next output (its length is the
    # caller's max_tokens, so it has no total deadline).
    timeout_s: float = 60.0
    unsupported_params: Policy = "reject"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    connect_s: float | None = None  # opening a connection; None: the provider's own setting
    first_byte_s: float | None = None  # until the answer begins; None: timeout_s

    @property
    def label(self) -> str:
        """How errors name this target: provider and upstream model."""
        return f"{self.provider}/{self.model}"


@dataclass(slots=True)
class Prepared:
    """A request mapped for one target; `dropped` goes into the response header."""

    target: Target
    request: CompletionRequest | EmbeddingRequest
    dropped: tuple[str, ...]
    state: Any = None  # the adapter's own (e.g. the upstream body)


def completion_of(prepared: Prepared) -> CompletionRequest:
    """The completion request a completion call was prepared from."""
    request = prepared.request
    assert isinstance(request, CompletionRequest)
    return request


class Provider(Protocol):
    name: str
    type_tags: ClassVar[tuple[str, ...]]
    # A config reload may build a second instance beside the running one (which serves the
    # requests in flight, then closes). False: it holds what cannot be had twice (a model in
    # memory), so its block changes only with a restart.
    reloadable: ClassVar[bool]

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def ready(self) -> bool: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Each text's prompt tokens as this provider counts them, if it can tell without I/O
        (the rate limiter's reservation); None: the gateway estimates."""
        ...

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared:
        """Apply the dialect rules; raise InvalidRequest/UnsupportedParameter before any I/O."""
        ...

    async def complete(self, prepared: Prepared) -> Json: ...

    def stream(self, prepared: Prepared) -> AsyncIterator[list[Json]]: ...

    def prepare_embedding(self, request: EmbeddingRequest, target: Target) -> Prepared:
        """As `prepare`, for embeddings; an InvalidRequest naming `model` if the target does
        not serve them."""
        ...

    async def embed(self, prepared: Prepared) -> Json: ...


class ProviderFactory(Protocol):
    def __call__(
        self, name: str, type_tag: str, settings: Mapping[str, Any], path: str
    ) -> Provider:
        """Build from the provider's config block; raise ConfigError naming the YAML path."""
        ...
