"""Checks of the completions request's structured fields (prompt, stop, logit_bias,
response_format, vLLM's structured_outputs, …), as OpenAI and vLLM check them: each returns the
value or raises a 400 naming the field, or the item of it, that is wrong."""

from __future__ import annotations

from typing import Any

import orjson

from core.checks import Validator, bad, batch, boolean, choice, obj, string, token_ids
from core.errors import InvalidRequest

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


def prompt(v: Any, name: str) -> Any:
    if type(v) is str:
        return v
    if type(v) is not list or not v:
        raise bad(name, "a string, an array of strings, or a non-empty array of token ids", v)
    batch(v, name, empty_strings=True)
    return v


def stop(v: Any, name: str) -> Any:
    if type(v) is str:
        if not v:
            raise bad(name, "a non-empty string", v)
        return v
    if type(v) is not list or not 1 <= len(v) <= 4:
        raise bad(name, "a string or an array of 1 to 4 strings", v)
    for i, s in enumerate(v):
        if type(s) is not str or not s:
            raise bad(f"{name}[{i}]", "a non-empty string", s)
    return v


MAX_NAMED_KEYS = 20  # the bad keys an error lists; more are counted


def logit_bias(v: Any, name: str) -> dict[str, Any]:
    """Token ids (as string keys) → a bias in [-100, 100]. Every key that is not a token id is
    named, as vLLM names them."""
    obj(v, name)
    wrong = [key for key in v if not (key.isascii() and key.isdigit())]
    if wrong:
        raise _not_token_ids(wrong, name)
    for key, bias in v.items():
        if type(bias) not in (int, float) or not -100 <= bias <= 100:
            raise bad(f"{name}.{key}", "a number between -100 and 100", bias)
    return v  # type: ignore[no-any-return]


def _not_token_ids(keys: list[str], name: str) -> InvalidRequest:
    if len(keys) == 1:
        return bad(f"{name}.{keys[0]}", "a token id as a string key", keys[0])
    shown = ", ".join(orjson.dumps(k[:40]).decode() for k in keys[:MAX_NAMED_KEYS])
    more = f" and {len(keys) - MAX_NAMED_KEYS} more" if len(keys) > MAX_NAMED_KEYS else ""
    return InvalidRequest(
        f"Invalid value for '{name}': its keys must be token ids as strings; {len(keys)} are "
        f"not: {shown}{more}.",
        param=name,
    )


def chat_response_format(v: Any, name: str) -> dict[str, Any]:
    """OpenAI's three formats, and the `grammar` format (a GBNF grammar) that Fireworks serves
    and vLLM serves as a structured output; targets without it refuse it."""
    if type(v) is dict and v.get("type") == "grammar":
        string(v.get("grammar"), f"{name}.grammar")
        return v
    return response_format(v, name)


def response_format(v: Any, name: str) -> dict[str, Any]:
    obj(v, name)
    kind = choice(*RESPONSE_FORMAT_TYPES)(v.get("type"), f"{name}.type")
    if kind == "json_object" and v.get("schema") is not None:
        obj(v["schema"], f"{name}.schema")
    if kind == "json_schema":
        spec = obj(v.get("json_schema"), f"{name}.json_schema")
        obj(spec.get("schema"), f"{name}.json_schema.schema")
        if spec.get("name") is not None:
            string(spec["name"], f"{name}.json_schema.name")
        if spec.get("strict") is not None:
            boolean(spec["strict"], f"{name}.json_schema.strict")
    return v  # type: ignore[no-any-return]


def token_id_list(v: Any, name: str) -> list[int]:
    if type(v) is not list:
        raise bad(name, "an array of token ids", v)
    token_ids(v, name)
    return v


def strings(v: Any, name: str) -> list[str]:
    if type(v) is not list:
        raise bad(name, "an array of strings", v)
    for i, item in enumerate(v):
        string(item, f"{name}[{i}]")
    return v


def documents(v: Any, name: str) -> list[dict[str, str]]:
    """vLLM's `documents` (for a chat template's RAG): objects of string values."""
    if type(v) is not list:
        raise bad(name, "an array of documents", v)
    for i, doc in enumerate(v):
        obj(doc, f"{name}[{i}]")
        for key, value in doc.items():
            string(value, f"{name}[{i}].{key}")
    return v


def _fail(name: str, what: str, value: Any) -> Any:
    raise bad(name, what, value)


# structured_outputs: vLLM's StructuredOutputsParams fields; one constraint at most.
STRUCTURED_KINDS: dict[str, Validator] = {
    "json": lambda v, n: v if type(v) in (dict, str) else _fail(n, "a JSON schema (object)", v),
    "regex": string,
    "choice": lambda v, n: strings(v, n) if v else _fail(n, "a non-empty array of strings", v),
    "grammar": string,
    "json_object": boolean,
    "structural_tag": string,
}
STRUCTURED_OPTIONS: dict[str, Validator] = {
    "disable_fallback": boolean,
    "disable_any_whitespace": boolean,
    "disable_additional_properties": boolean,
    "whitespace_pattern": string,
}


def structured_outputs(v: Any, name: str) -> dict[str, Any]:
    obj(v, name)
    known = STRUCTURED_KINDS | STRUCTURED_OPTIONS
    for key, value in v.items():
        check = known.get(key)
        if check is None:
            raise bad(f"{name}.{key}", "one of " + ", ".join(known), key)
        if value is not None:
            check(value, f"{name}.{key}")
    kinds = [k for k in STRUCTURED_KINDS if v.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise InvalidRequest(
            f"'{name}' takes exactly one constraint of {', '.join(STRUCTURED_KINDS)}; "
            f"got {len(kinds)}{': ' + ', '.join(kinds) if kinds else ''}.",
            param=name,
        )
    return v  # type: ignore[no-any-return]


def xargs(v: Any, name: str) -> dict[str, Any]:
    """vllm_xargs: str → str | int | float | a list of those (vLLM's type)."""
    obj(v, name)
    scalar = (str, int, float)
    for key, value in v.items():
        items = value if type(value) is list else [value]
        if any(type(x) not in scalar for x in items):
            raise bad(f"{name}.{key}", "a string, a number or an array of them", value)
    return v  # type: ignore[no-any-return]
