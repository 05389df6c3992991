"""A Responses request served by a target that speaks chat completions only, and its whole
answer made back into a response (a stream's events: `core.chat_events`).

The request becomes the chat request it means, field by field (`chat_request`): instructions
and the conversation's items become messages (as vLLM's server builds them: instructions as the
system message, a function call joined to the assistant message before it, a tool's output as
a tool message), function tools become chat tools, `text.format` the response format,
`max_output_tokens` the completion's bound, the logprobs asked for by `include` chat's logprobs.
What the gateway itself does (`store`, `metadata`, `previous_response_id`) is not sent. What a
chat cannot express (a hosted tool, a reasoning summary, `max_tool_calls`) is refused naming
the field, or dropped and reported when the target's policy is to drop. The chat request is then
checked and sent as any chat is, by the target's own rules; a refusal of one of its fields names
the Responses field it came from (`renamed`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from core.answers import ChatChoice, ChatCompletion, ResponseAnswer, Usage
from core.chat import ChatRequest, validate_chat
from core.checks import INT64_MAX
from core.completions import RequestLimits
from core.errors import GatewayError, InvalidRequest, UnsupportedParameter
from core.responses import ResponsesRequest
from core.wire import Json

# The chat request is bounded as the Responses one was (max_output_tokens, one choice).
UNBOUNDED = RequestLimits(max_n=1, max_tokens=INT64_MAX)
# Responses fields a chat request takes under the same name.
SAME_NAME = (
    "temperature", "top_p", "user", "safety_identifier", "prompt_cache_key", "service_tier",
    "seed", "frequency_penalty", "presence_penalty", "logit_bias", "stop",
    "context_length_exceeded_behavior", "ignore_eos", "mirostat_target", "mirostat_lr",
    "top_k", "repetition_penalty", "min_p", "min_tokens", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens", "structured_outputs", "vllm_xargs",
    "priority", "cache_salt",
)  # fmt: skip
# What the gateway does itself, or what means nothing to a chat (its default, or an option of
# the stream's encoding): never sent.
GATEWAY_OWN = frozenset(
    ("model", "input", "instructions", "store", "metadata", "previous_response_id", "stream",
     "stream_options", "background", "max_output_tokens", "tools", "tool_choice",
     "parallel_tool_calls", "text", "reasoning", "include", "top_logprobs", "truncation")
)  # fmt: skip
# A chat field's refusal, told in the words of the Responses field it was made from.
RESPONSES_NAME: Mapping[str, str] = MappingProxyType(
    {
        "max_completion_tokens": "max_output_tokens",
        "max_tokens": "max_output_tokens",
        "response_format": "text.format",
        "verbosity": "text.verbosity",
        "reasoning_effort": "reasoning.effort",
        "logprobs": "include",
        "messages": "input",
    }
)
LOGPROBS = "message.output_text.logprobs"
# `include` values a chat target can serve: the logprobs, and what concerns the request's own
# images (nothing to add to a chat's answer).
INCLUDE_SERVED = (LOGPROBS, "message.input_image.image_url")


@dataclass(frozen=True, slots=True)
class Bridged:
    """The chat request a Responses request became, and the Responses fields left out under
    the target's `drop` policy."""

    chat: ChatRequest
    dropped: tuple[str, ...]


def chat_request(req: ResponsesRequest, label: str, drop: bool) -> Bridged:
    """The chat request `req` means, for target `label`; `drop`: the target's policy drops
    what it cannot serve (else a 400 naming it)."""
    f = req.fields
    dropped: list[str] = []

    def unserved(name: str, why: str) -> None:
        if not drop:
            raise UnsupportedParameter(
                f"Parameter '{name}' is not supported by target '{label}' ({why}).", param=name
            )
        dropped.append(name)

    out: Json = {"model": req.model, "messages": messages(req)}
    for name in SAME_NAME:
        if name in f:
            out[name] = f[name]
    for name in req.unknown:
        out[name] = f[name]
    if req.max_output_tokens is not None:
        out["max_completion_tokens"] = req.max_output_tokens
    if req.stream:
        out["stream"], out["stream_options"] = True, {"include_usage": True}
    _tools(f, out, label)
    _text(f, out)
    _reasoning(f, out, unserved)
    _include(f, out, unserved)
    if f.get("truncation") == "auto" and "context_length_exceeded_behavior" not in f:
        out["context_length_exceeded_behavior"] = "truncate"  # the oldest tokens go first
    if "max_tool_calls" in f:
        unserved("max_tool_calls", "a chat completion cannot bound its tool calls")
    try:
        chat = validate_chat(out, UNBOUNDED)
    except InvalidRequest as exc:
        raise renamed(exc) from None
    return Bridged(chat, tuple(dropped))


def renamed(exc: GatewayError) -> GatewayError:
    """`exc`, naming the Responses field where it names the chat field made from it."""
    param = exc.param
    if not param:
        return exc
    head, sep, rest = param.partition(".")
    base = head.partition("[")[0]
    name = RESPONSES_NAME.get(base)
    if name is None:
        return exc
    # A message's index is not its item's (instructions, joined items): the input is named.
    new = name if base == "messages" else name + sep + rest
    exc.message = exc.message.replace(f"'{param}'", f"'{new}'").replace(f"'{base}'", f"'{name}'")
    exc.param = new
    return exc


# ---------------------------------------------------------------- the conversation


def messages(req: ResponsesRequest) -> list[Json]:
    """The chat's messages: the instructions, then the conversation's items, then this turn's."""
    out: list[Json] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    for i, item in enumerate(req.history):
        _add(out, item, f"previous_response_id[{i}]")
    for i, item in enumerate(req.input):
        _add(out, item, f"input[{i}]")
    return out


def _add(out: list[Json], item: Mapping[str, Any], where: str) -> None:
    kind = item.get("type", "message")
    made = ITEMS.get(kind)
    if made is None:
        raise InvalidRequest(
            f"Invalid value for '{where}.type': input items of type '{kind}' are not "
            "supported by this gateway.",
            param=f"{where}.type",
        )
    made(out, item, where)


def _message(out: list[Json], item: Mapping[str, Any], where: str) -> None:
    role, content = item["role"], item["content"]
    if role != "assistant":
        out.append({"role": role, "content": _parts(content, f"{where}.content")})
        return
    text = content if type(content) is str else _text_of(content)
    last = _assistant(out)
    if last is not None and last.get("content") is None:
        last["content"] = text  # after its reasoning, as one message (vLLM's joining)
    else:
        out.append({"role": "assistant", "content": text})


def _function_call(out: list[Json], item: Mapping[str, Any], where: str) -> None:
    call = {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }
    last = _assistant(out)
    if last is not None:
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _function_output(out: list[Json], item: Mapping[str, Any], where: str) -> None:
    output = item["output"]
    content = output if type(output) is str else _parts(output, f"{where}.output")
    out.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})


def _reasoning_item(out: list[Json], item: Mapping[str, Any], where: str) -> None:
    """A model's reasoning sent back: a chat has no place for it (its answer is what counts)."""


def _assistant(out: list[Json]) -> Json | None:
    return out[-1] if out and out[-1].get("role") == "assistant" else None


ITEMS: Mapping[str, Callable[[list[Json], Mapping[str, Any], str], None]] = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _function_output,
    "reasoning": _reasoning_item,
}


def _text_of(parts: Sequence[Mapping[str, Any]]) -> str:
    return "".join(p.get("text") or p.get("refusal") or "" for p in parts)


def _parts(content: Any, where: str) -> Any:
    """A message's content as a chat's: a string as it is, parts as chat's parts."""
    if type(content) is str:
        return content
    return [_part(p, f"{where}[{j}]") for j, p in enumerate(content)]


def _part(part: Mapping[str, Any], where: str) -> Json:
    kind = part["type"]
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal":
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image" and part.get("image_url"):
        image: Json = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file" and (part.get("file_data") or part.get("file_id")):
        keys = ("file_data", "file_id", "filename")
        return {"type": "file", "file": {k: part[k] for k in keys if part.get(k)}}
    raise InvalidRequest(
        f"Invalid value for '{where}': a part of type '{kind}' given by URL or file id is "
        "not supported by this gateway for targets that speak chat completions.",
        param=where,
    )


# ---------------------------------------------------------------- tools, text, reasoning


def _tools(f: Mapping[str, Any], out: Json, label: str) -> None:
    tools = f.get("tools") or []
    for i, tool in enumerate(tools):
        if tool["type"] != "function":
            raise InvalidRequest(
                f"Invalid value for 'tools[{i}].type': target '{label}' cannot run the "
                f"hosted tool '{tool['type']}'; only function tools are served.",
                param=f"tools[{i}].type",
            )
    choice = f.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        allowed = {t.get("name") for t in choice.get("tools", ()) if t.get("type") == "function"}
        tools = [t for t in tools if t["name"] in allowed]
        choice = choice.get("mode", "auto")
    if tools:
        out["tools"] = [_tool(t) for t in tools]
        if "parallel_tool_calls" in f:
            out["parallel_tool_calls"] = f["parallel_tool_calls"]
    if choice is not None and (tools or choice == "none"):
        out["tool_choice"] = _tool_choice(choice, label)


def _tool(tool: Mapping[str, Any]) -> Json:
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, label: str) -> Any:
    if type(choice) is str:
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequest(
        f"Invalid value for 'tool_choice.type': target '{label}' cannot run the hosted tool "
        f"'{choice.get('type')}'.",
        param="tool_choice.type",
    )


def _text(f: Mapping[str, Any], out: Json) -> None:
    text = f.get("text") or {}
    form = text.get("format")
    if form is not None and form["type"] != "text":
        if form["type"] == "json_schema":
            keys = ("name", "schema", "strict", "description")
            schema = {k: form[k] for k in keys if form.get(k) is not None}
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        else:
            out["response_format"] = {"type": form["type"]}
    if text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]


def _reasoning(f: Mapping[str, Any], out: Json, unserved: Callable[[str, str], None]) -> None:
    reasoning = f.get("reasoning") or {}
    if reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) is not None:
            unserved(f"reasoning.{key}", "a chat completion has no reasoning summary")


def _include(f: Mapping[str, Any], out: Json, unserved: Callable[[str, str], None]) -> None:
    include = f.get("include") or ()
    for value in include:
        if value not in INCLUDE_SERVED:
            unserved("include", f"a chat completion cannot include '{value}'")
    if LOGPROBS in include:
        out["logprobs"] = True
        if f.get("top_logprobs"):
            out["top_logprobs"] = f["top_logprobs"]


# ---------------------------------------------------------------- the answer


def item_id(prefix: str) -> str:
    """An output item's id, in OpenAI's form (`msg_…`, `fc_…`, `rs_…`)."""
    return f"{prefix}_{os.urandom(16).hex()}"


def echo(req: ResponsesRequest) -> Json:
    """The request's fields a response object repeats, with OpenAI's defaults where unset."""
    f = req.fields
    text = f.get("text") or {}
    reasoning = f.get("reasoning") or {}
    return {
        "background": False,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": f.get("max_tool_calls"),
        "parallel_tool_calls": f.get("parallel_tool_calls", True),
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": f.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": f.get("safety_identifier"),
        "service_tier": f.get("service_tier", "default"),
        "store": req.store,
        "temperature": f.get("temperature", 1.0),
        "text": {
            "format": text.get("format") or {"type": "text"},
            "verbosity": text.get("verbosity", "medium"),
        },
        "tool_choice": f.get("tool_choice", "auto"),
        "tools": f.get("tools", []),
        "top_logprobs": f.get("top_logprobs", 0),
        "top_p": f.get("top_p", 1.0),
        "truncation": f.get("truncation", "disabled"),
        "user": f.get("user"),
        "metadata": f.get("metadata", {}),
    }


# A chat's finish reason → the response's status and why it is incomplete.
ENDINGS: Mapping[str | None, tuple[str, str | None]] = {
    "stop": ("completed", None),
    "tool_calls": ("completed", None),
    "function_call": ("completed", None),
    None: ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


def ending(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    status, reason = ENDINGS.get(finish_reason, ("completed", None))
    return status, None if reason is None else {"reason": reason}


def response_of(chat: ChatCompletion, req: ResponsesRequest) -> ResponseAnswer:
    """A whole chat answer as the response it answers for `req`."""
    choice = chat["choices"][0] if chat["choices"] else None
    status, incomplete = ending(choice["finish_reason"] if choice else None)
    return {
        "status": status,
        "output": output_items(choice) if choice else [],
        "usage": usage_of(chat["usage"]),
        "incomplete_details": incomplete,
        "error": None,
        "echo": echo(req),
    }


def usage_of(chat: Usage | None) -> Usage | None:
    """A chat's usage with the details a response has (cached and reasoning tokens), not a
    chat's others (audio, predictions)."""
    if chat is None:
        return None
    made: Usage = {
        "prompt_tokens": chat["prompt_tokens"],
        "completion_tokens": chat["completion_tokens"],
        "total_tokens": chat["total_tokens"],
    }
    prompt, completion = chat.get("prompt_tokens_details"), chat.get("completion_tokens_details")
    if prompt and prompt.get("cached_tokens") is not None:
        made["prompt_tokens_details"] = {"cached_tokens": prompt["cached_tokens"]}
    if completion and completion.get("reasoning_tokens") is not None:
        made["completion_tokens_details"] = {"reasoning_tokens": completion["reasoning_tokens"]}
    return made


def output_items(choice: ChatChoice) -> list[Json]:
    message = choice["message"]
    items: list[Json] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        items.append(reasoning_item(reasoning))
    parts: list[Json] = []
    if message.get("content"):
        logprobs = choice["logprobs"]
        tokens = (logprobs["content"] if logprobs is not None else None) or []
        parts.append(output_text(message["content"] or "", list(tokens)))
    if message.get("refusal"):
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        # A message cut short (max_output_tokens, a content filter) is incomplete, as OpenAI's.
        cut = ending(choice["finish_reason"])[0] == "incomplete"
        items.append(output_message(item_id("msg"), parts, "incomplete" if cut else "completed"))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        items.append(
            function_call(item_id("fc"), call["id"], function["name"], function["arguments"])
        )
    return items


def reasoning_item(text: str) -> Json:
    return {
        "id": item_id("rs"),
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def output_text(text: str, logprobs: list[Any]) -> Json:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def output_message(mid: str, parts: list[Json], status: str) -> Json:
    return {"id": mid, "type": "message", "status": status, "role": "assistant", "content": parts}


def function_call(
    fid: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> Json:
    return {
        "id": fid,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }
