"""The tokens a request may use, estimated before it is sent: what the rate limiter reserves at
admission and settles to what was used (gateway.ratelimit). Each estimate is a `Reserve`: the
prompt's tokens and the most the answer may generate, apart, since budgets price them apart."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import orjson

from core.chat import ChatRequest, apply_chat_defaults, apply_chat_overrides
from core.chat_bridge import chat_request
from core.completions import CompletionRequest, apply_overrides
from core.embeddings import EmbeddingRequest
from core.provider import Target
from core.responses import ResponsesRequest, apply_responses_defaults, apply_responses_overrides
from gateway.routing.plans import Plan
from gateway.runtime import Runtime

# A chat without max_tokens may use what the context window leaves: the reservation assumes a
# typical answer, and is settled to what was used.
UNBOUNDED_RESERVE = 256
# What a chat message costs beyond its text when the gateway estimates (role, separators).
MESSAGE_OVERHEAD = 4
Reserve = tuple[int, int]  # (prompt tokens, the most the answer may generate)


def reservation(rt: Runtime, req: CompletionRequest, plan: Plan) -> Reserve:
    """The tokens a request may use: its prompts (the serving provider's tokenizer where the
    gateway has one, else 4 bytes a token) plus max_tokens for every generated choice."""
    leaf, target = plan.first()
    if leaf.overrides:
        req = apply_overrides(req, leaf.overrides, rt.config.server.limits)
    max_tokens = req.max_tokens
    default = target.defaults.get("max_tokens")  # validated with the config: an int
    if "max_tokens" not in req.fields and isinstance(default, int):
        max_tokens = default
    prompt = input_tokens(rt, target, req.prompts, req.prompt_is_tokens)
    return prompt, max_tokens * req.n_prompts * max(req.n, req.best_of or 1)


def chat_reservation(rt: Runtime, req: ChatRequest, plan: Plan) -> Reserve:
    """As `reservation`, for the chat's rendered prompt (the serving provider's count where the
    gateway has its tokenizer and template, else estimated from the messages' text)."""
    leaf, target = plan.first()
    if leaf.overrides:
        req = apply_chat_overrides(req, leaf.overrides, rt.config.server.limits)
    req = apply_chat_defaults(req, target.defaults)
    counted = rt.providers[target.provider].count_chat_tokens(req)
    prompt = counted if counted is not None else estimate_chat_tokens(req)
    return prompt, (req.max_tokens or UNBOUNDED_RESERVE) * req.n


def responses_reservation(rt: Runtime, req: ResponsesRequest, plan: Plan) -> Reserve:
    """As `chat_reservation`, for the chat the request means (its earlier turns included): a
    target that speaks Responses itself renders the same conversation."""
    leaf, target = plan.first()
    if leaf.overrides:
        req = apply_responses_overrides(req, leaf.overrides, rt.config.server.limits)
    req = apply_responses_defaults(req, target.defaults)
    chat = chat_request(req, target.label, drop=True).chat
    counted = rt.providers[target.provider].count_chat_tokens(chat)
    prompt = counted if counted is not None else estimate_chat_tokens(chat)
    return prompt, req.max_output_tokens or UNBOUNDED_RESERVE


def estimate_chat_tokens(req: ChatRequest) -> int:
    """4 bytes a token of each message's text, plus the role and separators."""
    size = sum(len(orjson.dumps(m.get("content"))) for m in req.messages)
    return -(-size // 4) + MESSAGE_OVERHEAD * len(req.messages)


def embedding_reservation(rt: Runtime, req: EmbeddingRequest, plan: Plan) -> Reserve:
    """The tokens an embeddings request uses: its inputs, counted as prompts are."""
    _, target = plan.first()
    return input_tokens(rt, target, req.inputs, req.input_is_tokens), 0


def input_tokens(
    rt: Runtime, target: Target, inputs: Sequence[str] | Sequence[list[int]], is_tokens: bool
) -> int:
    """Prompt or input tokens: token ids as they are, texts by the serving provider's
    tokenizer where the gateway has one, else 4 bytes a token."""
    if is_tokens:
        return sum(map(len, inputs))
    texts = cast("Sequence[str]", inputs)  # not token ids: texts
    counted = rt.providers[target.provider].count_tokens(texts)
    return sum(counted if counted is not None else [-(-len(t.encode()) // 4) for t in texts])
