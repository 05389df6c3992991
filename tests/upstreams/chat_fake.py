"""The fake model behind the scripted chat upstreams (`…/chat/completions`), over fakegen's.

* The prompt is the messages' text contents joined with "\\n" (`chat_prompt`): a string content,
  or each `text` part of an array; other parts (images, audio) and tool calls add nothing. Its
  tokens are its words, as for completions, so `fakegen.expected_text(chat_prompt(messages),
  candidate, max_tokens, seed)` is a text answer's content.
* Tool calls: the arguments are a JSON object built from the function's `parameters` schema
  (`fake_value`): every property, by type — string: a word of the fake model (`"alpha"` …),
  integer 0 to 99, number 0.0 to 99.9, boolean, array (one item, or `minItems`), nested objects,
  `enum`/`const` their first value, `anyOf`/`oneOf` the first non-null option, `$ref` to
  `$defs`/`definitions` resolved — each a function of the property's path, so the same schema
  always gives the same arguments. Written as compact JSON (`separators=(",", ":")`).
* Structured content (tool-call arguments, `json_object`/`json_schema` answers) is generated in
  pieces of 8 characters (`pieces`): one piece is one completion token, and one stream delta.
* `json_object` without a schema answers `{"answer": "<the candidate's first word>"}`
  (`fake_json_object`); with a schema (Fireworks' `{"type": "json_object", "schema": …}`, or
  `json_schema`) a document valid for it (`fake_value`).
"""

from __future__ import annotations

import json
import secrets
import string
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from .fakegen import WORDS, start_word

PIECE_CHARS = 8
_ALNUM = string.ascii_letters + string.digits
Json = dict[str, Any]


# ---------------------------------------------------------------- the prompt


def content_texts(content: Any) -> list[str]:
    """The text pieces of one message's content (a string, or an array of parts)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
    return []


def message_texts(body: Any) -> list[str]:
    """Every text piece of a raw chat body's messages, in order (for markers too), whatever
    else is wrong with the body."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return []
    out: list[str] = []
    for m in messages:
        if isinstance(m, dict):
            out += content_texts(m.get("content"))
    return out


def chat_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """What the fake model reads: the messages' texts joined with newlines."""
    return "\n".join(message_texts({"messages": list(messages)}))


def last_user_text(messages: Sequence[Any]) -> str:
    """The text of the conversation's last message if the user sent it, else "" (after a
    tool's answer the model is not asked again by the user's markers)."""
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "user":
        return "\n".join(content_texts(last.get("content")))
    return ""


# ---------------------------------------------------------------- JSON from a schema


def _crc(path: str) -> int:
    return zlib.crc32(path.encode())


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    seen = 0
    while isinstance(schema.get("$ref"), str) and seen < 32:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = defs.get(name, {})
        seen += 1
    return schema


def _first_option(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            real = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            return real[0] if real else options[0]
    return None


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _bounded(value: float, schema: Mapping[str, Any]) -> float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(high, int | float) and value > high:
        value = high
    return value


def fake_value(schema: Any, path: str = "$", defs: Mapping[str, Any] | None = None) -> Any:
    """A deterministic JSON value valid for a (simple) JSON schema; see the module docstring."""
    if not isinstance(schema, dict):
        return WORDS[_crc(path) % len(WORDS)].strip()
    if defs is None:
        defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    schema = _resolve(schema, defs)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    option = _first_option(schema)
    if option is not None:
        return fake_value(option, path, defs)
    kind = _type_of(schema)
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: fake_value(sub, f"{path}.{name}", defs) for name, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        items = schema.get("items") or {}
        return [fake_value(items, f"{path}[{i}]", defs) for i in range(count)]
    if kind == "integer":
        return int(_bounded(_crc(path) % 100, schema))
    if kind == "number":
        return _bounded((_crc(path) % 1000) / 10, schema)
    if kind == "boolean":
        return _crc(path) % 2 == 0
    if kind == "null":
        return None
    return WORDS[_crc(path) % len(WORDS)].strip()


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def fake_arguments(parameters: Any) -> str:
    """A tool call's `arguments` for a function with these `parameters`."""
    return compact(fake_value(parameters if parameters is not None else {"type": "object"}))


def fake_json_object(prompt: str, candidate: int = 0, seed: int | None = None) -> str:
    """`response_format: json_object` without a schema: the candidate's first word."""
    word = WORDS[start_word(prompt, candidate, seed)].strip()
    return compact({"answer": word})


def fake_document(
    response_format: Mapping[str, Any], prompt: str, candidate: int, seed: Any
) -> str:
    """The content a JSON response format gets (json_object, json_object+schema, json_schema)."""
    kind = response_format.get("type")
    schema = response_format.get("schema")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        schema = schema if schema is not None else {"type": "object"}
    if schema is None:
        return fake_json_object(prompt, candidate, seed)
    return compact(fake_value(schema))


def pieces(text: str) -> list[str]:
    """Structured output in tokens: pieces of PIECE_CHARS characters."""
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))
