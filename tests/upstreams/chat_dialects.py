"""What the scripted chat upstreams answer, in each provider's shape.

OpenAI: `chatcmpl-` ids, `service_tier`, `system_fingerprint`; the message with `refusal: null`
and `annotations: []`; logprobs `{"content": [{token, logprob, bytes, top_logprobs}],
"refusal": null}`; usage with its `*_tokens_details`; a forced (named) tool call finishes
"stop". Streams: each choice's first delta `{"role": "assistant", "content": "", "refusal":
null}` (with a tool call: `content: null` and the first call's head), one delta per token or
argument piece, an empty delta with the finish_reason, and with `stream_options.include_usage`
`"usage": null` on every chunk and a last `choices: []` chunk with the usage.

Fireworks: bare UUID ids, stop strings kept in the content (as its completions), usage with
`prompt_tokens_details: {cached_tokens: 0}`, its content log-probs (`sampling_logprob`,
`token_id`, `text_offset`); every tool call finishes "tool_calls". Streams: a first delta
`{"role": "assistant"}`, then content or tool-call deltas, the finish_reason on the choice's last
one, `"usage": null` on every chunk but the stream's last, which carries the usage.

Azure OpenAI: OpenAI's, with its content filter's verdicts (dialect_azure.py):
`prompt_filter_results` on the answer and `content_filter_results` on each choice; a stream's
first event carries the prompt's verdicts alone (`choices: []`), then each chunk's choice its
own (`{}` without content). `__filtered_output__`: each choice ends "content_filter".
"""

from __future__ import annotations

import secrets
import string
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from .chat_render import CallOut, ChatChoiceOut, ChatResult
from .chat_validate import ChatParams, parse_fireworks_chat, parse_openai_chat
from .dialect_azure import prompt_event, prompt_filter_results, verdicts
from .fakegen import Token
from .magic import FILTERED_OUTPUT
from .render import content_logprobs

Json = dict[str, Any]
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ChunkPlan:
    """One stream delta of one choice."""

    index: int
    delta: Json
    tokens: tuple[Token, ...] = ()  # the content tokens it carries (for logprobs)
    finish_reason: str | None = None
    offset: int = 0  # text offset of its first token within the choice (Fireworks)


def interleave(per_choice: list[list[ChunkPlan]]) -> list[ChunkPlan]:
    """Round-robin over the choices, as an n > 1 stream sends them."""
    rounds = max((len(p) for p in per_choice), default=0)
    return [p[r] for r in range(rounds) for p in per_choice if r < len(p)]


def call_head(call: CallOut) -> Json:
    return {
        "index": call.index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }


def call_pieces(call: CallOut) -> list[Json]:
    return [
        {"tool_calls": [{"index": call.index, "function": {"arguments": piece}}]}
        for piece in call.pieces
    ]


def tool_calls(choice: ChatChoiceOut) -> list[Json]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in choice.calls
    ]


class ChatDialect:
    name: ClassVar[str] = ""
    include_stop: ClassVar[bool] = False
    named_finish: ClassVar[str] = "tool_calls"

    def parse(self, body: Any, window: int) -> ChatParams:
        raise NotImplementedError

    def new_id(self) -> str:
        raise NotImplementedError

    def head(self, params: ChatParams, obj: str) -> Json:
        return {
            "id": self.new_id(),
            "object": obj,
            "created": int(time.time()),
            "model": params.model,
        }

    def usage(self, result: ChatResult) -> Json:
        return result.usage()

    def message(self, choice: ChatChoiceOut) -> Json:
        raise NotImplementedError

    def logprobs(self, params: ChatParams, tokens: tuple[Token, ...], offset: int) -> Json | None:
        raise NotImplementedError

    def body(self, params: ChatParams, result: ChatResult) -> Json:
        choices = [
            {
                "index": c.index,
                "message": self.message(c),
                "logprobs": self.logprobs(params, c.tokens, 0) if params.logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in result.choices
        ]
        head = self.head(params, "chat.completion")
        return {**head, "choices": choices, "usage": self.usage(result)}

    def plans(self, choice: ChatChoiceOut) -> list[ChunkPlan]:
        raise NotImplementedError

    def chunk_choice(self, params: ChatParams, plan: ChunkPlan) -> Json:
        logprobs = None
        if params.logprobs and plan.tokens:
            logprobs = self.logprobs(params, plan.tokens, plan.offset)
        return {
            "index": plan.index,
            "delta": plan.delta,
            "logprobs": logprobs,
            "finish_reason": plan.finish_reason,
        }

    def stream_events(self, params: ChatParams, result: ChatResult) -> list[Json]:
        raise NotImplementedError

    def midstream_error_event(self) -> Json | None:
        return None


def _content_plans(choice: ChatChoiceOut) -> list[ChunkPlan]:
    plans, offset = [], 0
    for tok in choice.tokens:
        plans.append(ChunkPlan(choice.index, {"content": tok.text}, (tok,), None, offset))
        offset += len(tok.text)
    return plans


def _call_plans(choice: ChatChoiceOut, first_head_given: bool) -> list[ChunkPlan]:
    plans = []
    for call in choice.calls:
        if call.index > 0 or not first_head_given:
            plans.append(ChunkPlan(choice.index, {"tool_calls": [call_head(call)]}))
        plans += [ChunkPlan(choice.index, delta) for delta in call_pieces(call)]
    return plans


class OpenAIChat(ChatDialect):
    name = "openai"
    named_finish = "stop"  # a forced function call finishes "stop" on OpenAI

    def parse(self, body: Any, window: int) -> ChatParams:
        return parse_openai_chat(body, window)

    def new_id(self) -> str:
        return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(29))

    def head(self, params: ChatParams, obj: str) -> Json:
        return {
            **super().head(params, obj),
            "service_tier": "default",
            "system_fingerprint": "fp_scripted01",
        }

    def usage(self, result: ChatResult) -> Json:
        return {
            **result.usage(),
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def message(self, choice: ChatChoiceOut) -> Json:
        out: Json = {"role": "assistant", "content": choice.content, "refusal": None}
        if choice.calls:
            out["tool_calls"] = tool_calls(choice)
        out["annotations"] = []
        return out

    def logprobs(self, params: ChatParams, tokens: tuple[Token, ...], offset: int) -> Json | None:
        return {"content": [openai_entry(t, params.top_logprobs) for t in tokens], "refusal": None}

    def plans(self, choice: ChatChoiceOut) -> list[ChunkPlan]:
        if choice.calls:
            first = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call_head(choice.calls[0])],
                "refusal": None,
            }
            body = _call_plans(choice, first_head_given=True)
        else:
            first = {"role": "assistant", "content": "", "refusal": None}
            body = _content_plans(choice)
        last = ChunkPlan(choice.index, {}, finish_reason=choice.finish_reason)
        return [ChunkPlan(choice.index, first), *body, last]

    def stream_events(self, params: ChatParams, result: ChatResult) -> list[Json]:
        head = self.head(params, "chat.completion.chunk")
        plans = interleave([self.plans(c) for c in result.choices])
        events = []
        for plan in plans:
            event = {**head, "choices": [self.chunk_choice(params, plan)]}
            if params.include_usage:
                event["usage"] = None
            events.append(event)
        if params.include_usage:
            events.append({**head, "choices": [], "usage": self.usage(result)})
        return events

    def midstream_error_event(self) -> Json | None:
        return {
            "error": {
                "message": "The server had an error while processing your request. Sorry "
                "about that!",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }


def openai_entry(tok: Token, top: int) -> Json:
    tops = [(tok.text, tok.logprob), *((t, lp) for t, _id, lp in tok.alternatives)][:top]
    return {
        "token": tok.text,
        "logprob": tok.logprob,
        "bytes": list(tok.text.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in tops],
    }


class FireworksChat(ChatDialect):
    name = "fireworks"
    include_stop = True

    def parse(self, body: Any, window: int) -> ChatParams:
        return parse_fireworks_chat(body, window)

    def new_id(self) -> str:
        return str(uuid.uuid4())

    def usage(self, result: ChatResult) -> Json:
        return {**result.usage(), "prompt_tokens_details": {"cached_tokens": 0}}

    def message(self, choice: ChatChoiceOut) -> Json:
        out: Json = {"role": "assistant", "content": choice.content}
        if choice.calls:
            out["tool_calls"] = tool_calls(choice)
        return out

    def logprobs(self, params: ChatParams, tokens: tuple[Token, ...], offset: int) -> Json | None:
        return content_logprobs(tokens, offset, params.top_logprobs)

    def plans(self, choice: ChatChoiceOut) -> list[ChunkPlan]:
        if choice.calls:
            body = _call_plans(choice, first_head_given=False)
        else:
            body = _content_plans(choice)
        plans = [ChunkPlan(choice.index, {"role": "assistant"}), *body]
        if len(plans) == 1:  # nothing generated: the finish on an empty delta
            plans.append(ChunkPlan(choice.index, {}))
        last = plans[-1]
        plans[-1] = ChunkPlan(
            last.index, last.delta, last.tokens, choice.finish_reason, last.offset
        )
        return plans

    def stream_events(self, params: ChatParams, result: ChatResult) -> list[Json]:
        head = self.head(params, "chat.completion.chunk")
        plans = interleave([self.plans(c) for c in result.choices])
        events = [
            {**head, "choices": [self.chunk_choice(params, plan)], "usage": None} for plan in plans
        ]
        if events:
            events[-1]["usage"] = self.usage(result)
        return events


class AzureChat(OpenAIChat):
    name = "azure"

    def body(self, params: ChatParams, result: ChatResult) -> Json:
        filtered = FILTERED_OUTPUT in params.prompt.text
        out = super().body(params, result)
        for choice in out["choices"]:
            choice["content_filter_results"] = verdicts(filtered)
            if filtered:
                choice["finish_reason"] = "content_filter"
        return {**out, "prompt_filter_results": prompt_filter_results(1)}

    def stream_events(self, params: ChatParams, result: ChatResult) -> list[Json]:
        filtered = FILTERED_OUTPUT in params.prompt.text
        events = super().stream_events(params, result)
        for event in events:
            for choice in event["choices"]:
                said = choice["delta"].get("content") or choice["delta"].get("tool_calls")
                choice["content_filter_results"] = verdicts(filtered) if said else {}
                if filtered and choice["finish_reason"] is not None:
                    choice["finish_reason"] = "content_filter"
        return [prompt_event(1), *events]


CHAT_DIALECTS: dict[str, ChatDialect] = {
    "openai": OpenAIChat(),
    "fireworks": FireworksChat(),
    "azure": AzureChat(),
}
