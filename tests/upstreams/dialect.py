"""The dialect interface: what differs between scripted upstreams (addresses, keys, ids, stop
strings, usage placement in streams, log-prob formats, error shapes, extra fields, headers), with
the OpenAI-like defaults. Dialects: dialect_openai.py, dialect_fireworks.py, dialect_azure.py."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from .errors import UpstreamError
from .render import ChoiceOut, Delta, Result, legacy_logprobs, plan_deltas
from .validate import Params

Json = dict[str, Any]


class Dialect:
    name: ClassVar[str] = ""
    include_stop: ClassVar[bool] = False  # stop strings stay in the returned text
    finish_separately: ClassVar[bool] = False  # stream finish_reason on its own empty chunk
    default_models: ClassVar[tuple[str, ...]] = ()

    def route(self, path: str, query: Mapping[str, str], body: Any) -> Any:
        """The body as this path serves it, or the dialect's error for an address it does not
        have (Azure's deployments and api-versions); any prefix serves by default."""
        return body

    def check_key(self, headers: Mapping[str, str], key: str) -> None:
        """The dialect's error unless the request carries `key` where the dialect wants it."""
        header = headers.get("Authorization")
        if header != f"Bearer {key}":
            raise self.auth_error(header)

    def content_filter_error(self) -> UpstreamError | None:
        """The refusal of a prompt with `__content_filter__` (None: the dialect has none)."""
        return None

    def parse(self, body: Any, window: int) -> Params:
        raise NotImplementedError

    def new_id(self) -> str:
        raise NotImplementedError

    def auth_error(self, authorization: str | None) -> UpstreamError:
        raise NotImplementedError

    def status_error(self, status: int, quota: bool) -> UpstreamError:
        raise NotImplementedError

    def model_not_found(self, model: str) -> UpstreamError:
        raise NotImplementedError

    def head(self, params: Params) -> Json:
        return {
            "id": self.new_id(),
            "object": "text_completion",
            "created": _now(),
            "model": params.model,
        }

    def headers(self, params: Params, result: Result) -> dict[str, str]:
        return {}

    def usage(self, result: Result) -> Json:
        return result.usage()

    def choice_logprobs(self, params: Params, delta: Delta) -> Json | None:
        if params.logprobs is None:
            return None
        return legacy_logprobs(delta.tokens, delta.offset, params.logprobs)

    def choice(self, params: Params, delta: Delta) -> Json:
        return {
            "text": delta.text,
            "index": delta.index,
            "logprobs": self.choice_logprobs(params, delta),
            "finish_reason": delta.finish_reason,
        }

    def body(self, params: Params, result: Result) -> Json:
        choices = [self.full_choice(params, c) for c in result.choices]
        return {**self.head(params), "choices": choices, "usage": self.usage(result)}

    def full_choice(self, params: Params, c: ChoiceOut) -> Json:
        delta = Delta(c.index, c.tokens, c.sample.finish_reason, 0)
        return self.choice(params, delta)

    def chunk(self, params: Params, head: Json, delta: Delta) -> Json:
        return {**head, "choices": [self.choice(params, delta)]}

    def stream_events(self, params: Params, result: Result) -> list[Json]:
        head = self.head(params)
        deltas = plan_deltas(result, self.finish_separately)
        return self.finish_stream(
            params, result, head, [self.chunk(params, head, d) for d in deltas]
        )

    def finish_stream(
        self, params: Params, result: Result, head: Json, chunks: list[Json]
    ) -> list[Json]:
        return chunks

    def midstream_error_event(self) -> Json | None:
        """The error event after 2 chunks, or None: drop the connection instead."""
        return None

    def models(self, names: list[str]) -> Json:
        return {"object": "list", "data": [self.model_card(n) for n in names]}

    def model_card(self, name: str) -> Json:
        return {"id": name, "object": "model", "created": 1686935002, "owned_by": "system"}


def _now() -> int:
    return int(time.time())
