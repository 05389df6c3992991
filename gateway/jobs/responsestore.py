"""Where the Responses API's stored responses live (`store: true`, OpenAI's default): in the file
store's object store (gateway.jobs.filestore: a directory, or an object store when scaled out),
under `responses/<owner>/<id>.json`, apart from the files.

A response is one object, written in one put, so that a response that can be read is whole: the
`response` object as its caller got it, this turn's input items as `input_items` lists them (each
with its id and status), and the conversation a next turn continues from (`previous_response_id`:
the items before this turn, this turn's input items, the response's output items; OpenAI does
not carry a response's instructions over, so neither does the gateway).

A response belongs to its key's team, or to the key when it has none (`owner`): to any other
caller it does not exist (404). It is gone `responses.ttl_days` after its `created_at`: reading
it then is a 404, and deletes it. An id a caller sends becomes a name in the store only if it has
the shape of the gateway's response ids (`is_response_id`): any other is a 404 before the store
is asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, NotRequired, TypedDict

import obstore
import orjson

from core.answers import Upstream
from core.errors import NotFound
from core.response_items import LIST_DEFAULT, LIST_LIMIT, ORDERS
from gateway.auth import Principal
from gateway.jobs.filestore import FileStore, owner_of

ROOT = "responses"
DAY_S = 86_400
# The gateway's response ids: `resp_` and up to 100 letters, digits, `_` or `-` (no path
# character, dot or NUL can reach a name in the store).
RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9_-]{1,100}")
SHOWN_ID = 100  # of an id that names nothing, the characters an error repeats

# An input item's id when it came without one (OpenAI's prefixes), and whether OpenAI's item of
# that type has a `status` (then listed as "completed" when it came without one).
ITEM_KINDS: Mapping[str, tuple[str, bool]] = MappingProxyType(
    {
        "message": ("msg_", True),
        "function_call": ("fc_", True),
        "function_call_output": ("fco_", True),
        "custom_tool_call": ("ctc_", True),
        "custom_tool_call_output": ("ctco_", True),
        "computer_call_output": ("cuo_", True),
        "reasoning": ("rs_", False),
    }
)
OTHER_KIND = ("item_", False)
# A message's string content as OpenAI lists it: one text part, an output text for what the
# assistant said, an input text for any other role.
TEXT_PARTS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {"assistant": MappingProxyType({"type": "output_text", "annotations": ()})}
)
INPUT_TEXT: Mapping[str, Any] = MappingProxyType({"type": "input_text"})

Item = dict[str, Any]
Clock = Callable[[], float]


class Record(TypedDict):
    """What is stored of one response."""

    response: dict[str, Any]  # OpenAI's `response` object, as its caller got it
    created_at: int  # the response's, or when it was kept: when its time to live began
    input_items: list[Item]  # this turn's, as `GET …/input_items` lists them
    conversation: list[Item]  # what a next turn continues from
    # The upstream that answered, when it keeps responses itself (its id of this one).
    upstream: NotRequired[Upstream | None]


class Recalled(NamedTuple):
    """What a turn continues from: the conversation's items, and the upstream's id of the turn
    before when the upstream keeps responses itself."""

    items: list[Item]
    upstream: Upstream | None


def owner(principal: Principal) -> str:
    """The namespace of a caller's responses: its team's when it has one, else its key's. The
    two kinds are apart, so that no team (whatever its name) shares a key's."""
    if principal.team is not None:
        return f"team/{hashlib.sha256(principal.team.encode()).hexdigest()[:32]}"
    return f"key/{owner_of(principal.key_id)}"


def is_response_id(value: str) -> bool:
    """Whether `value` has the shape of the gateway's response ids (RESPONSE_ID)."""
    return RESPONSE_ID.fullmatch(value) is not None


def not_found(response_id: str) -> NotFound:
    """OpenAI's answer for a response that does not exist, or that is another owner's."""
    return NotFound(f"Response with id '{response_id[:SHOWN_ID]}' not found.")


def previous_not_found(response_id: str) -> NotFound:
    """OpenAI's answer for a `previous_response_id` that names no response of the caller's."""
    return NotFound(
        f"Previous response with id '{response_id[:SHOWN_ID]}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


class ResponseStore:
    """The stored responses of every owner, in the file store's object store."""

    def __init__(self, files: FileStore, ttl_days: int, clock: Clock = time.time) -> None:
        self.files = files
        self.ttl_s = ttl_days * DAY_S
        self._clock = clock

    async def keep(
        self,
        owner: str,
        response: Mapping[str, Any],
        input_items: Sequence[Mapping[str, Any]],
        history: Sequence[Mapping[str, Any]],
        upstream: Upstream | None = None,
    ) -> None:
        """Store an answered response (its `id` one the gateway made: ValueError otherwise);
        `upstream`: the upstream's own id of it, when the upstream keeps responses."""
        response_id = str(response.get("id", ""))
        if not is_response_id(response_id):
            raise ValueError(f"not a response id of the gateway's: {response_id[:SHOWN_ID]!r}")
        record: Record = {
            "response": dict(response),
            "created_at": _created_at(response.get("created_at"), self._clock()),
            "input_items": [_listed(item) for item in input_items],
            "conversation": [*map(dict, history), *map(dict, input_items), *_output(response)],
            "upstream": upstream,
        }
        body = orjson.dumps(record, default=_plain)
        await obstore.put_async(self.files.store, _path(owner, response_id), body)

    async def get(self, owner: str, response_id: str) -> dict[str, Any]:
        """The response object; a 404 for an id of no response of the owner's."""
        return (await self._load(owner, response_id, not_found))["response"]

    async def conversation(self, owner: str, response_id: str) -> list[dict[str, Any]]:
        """What a turn with `previous_response_id` continues from; a 404 naming that field for
        an id of no response of the owner's."""
        return (await self._load(owner, response_id, previous_not_found))["conversation"]

    async def recall(self, owner: str, response_id: str) -> Recalled:
        """As `conversation`, with the upstream's own id of the response, if it has one."""
        record = await self._load(owner, response_id, previous_not_found)
        return Recalled(record["conversation"], record.get("upstream"))

    async def delete(self, owner: str, response_id: str) -> dict[str, Any]:
        """Delete the response; OpenAI's answer. A second delete is a 404."""
        await self._load(owner, response_id, not_found)
        try:
            await obstore.delete_async(self.files.store, _path(owner, response_id))
        except FileNotFoundError:  # deleted meanwhile (a local store says so; others do not)
            raise not_found(response_id) from None
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(
        self,
        owner: str,
        response_id: str,
        *,
        limit: int = LIST_DEFAULT,
        order: str = "desc",
        after: str | None = None,
    ) -> dict[str, Any]:
        """A page of the response's input items, as OpenAI lists them. An `after` that is no
        listed item's id starts an empty page (it is compared, never looked up)."""
        if order not in ORDERS or not LIST_LIMIT[0] <= limit <= LIST_LIMIT[1]:
            raise ValueError(f"order {order!r} or limit {limit} out of range")
        items = (await self._load(owner, response_id, not_found))["input_items"]
        ordered = items if order == "asc" else items[::-1]
        if after is not None:
            ids = [item.get("id") for item in ordered]
            ordered = ordered[ids.index(after) + 1 :] if after in ids else []
        page = ordered[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(ordered) > limit,
        }

    async def _load(
        self, owner: str, response_id: str, missing: Callable[[str], NotFound]
    ) -> Record:
        """The response's record; `missing(response_id)` raised for an id of no response of the
        owner's (an expired one is deleted on the way)."""
        if not is_response_id(response_id) or not self.files.present():
            raise missing(response_id)  # no such response: the store is not asked (or made)
        path = _path(owner, response_id)
        try:
            found = await obstore.get_async(self.files.store, path)
            raw = await found.bytes_async()
        except FileNotFoundError:
            raise missing(response_id) from None
        record: Record = orjson.loads(bytes(raw))
        if record["created_at"] + self.ttl_s <= self._clock():
            with contextlib.suppress(FileNotFoundError):
                await obstore.delete_async(self.files.store, path)
            raise missing(response_id)
        return record


def _listed(item: Mapping[str, Any]) -> Item:
    """An input item as OpenAI lists it: with an id (its own, or one made), a message's string
    content as one text part, and "completed" where OpenAI's item of its type has a status."""
    kind = str(item.get("type", "message"))
    prefix, has_status = ITEM_KINDS.get(kind, OTHER_KIND)
    out: Item = {**item, "type": kind, "id": item.get("id") or f"{prefix}{secrets.token_hex(16)}"}
    content = out.get("content")
    if kind == "message" and isinstance(content, str):
        part = TEXT_PARTS.get(str(out.get("role")), INPUT_TEXT)
        out["content"] = [{**part, "text": content}]
    if has_status:
        out.setdefault("status", "completed")
    return out


def _output(response: Mapping[str, Any]) -> list[Item]:
    output = response.get("output")
    return [dict(item) for item in output] if isinstance(output, list) else []


def _path(owner: str, response_id: str) -> str:
    return f"{ROOT}/{owner}/{response_id}.json"


def _created_at(value: Any, now: float) -> int:
    """The response's `created_at` (seconds), or now when it has none."""
    return int(value) if type(value) in (int, float) else int(now)


def _plain(value: Any) -> Any:
    """What orjson writes of a mapping or sequence that is not a dict or list."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
