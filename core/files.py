"""The Files API's requests and its `file` object, as OpenAI defines them: an upload's form
fields (`purpose`, `expires_after`), a listing's query (`purpose`, `limit`, `order`, `after`),
and the object the gateway answers with. Each bad field is a 400 naming it.

A file id is the gateway's own (`new_file_id`): an id of any other shape names no file, so it is
a 404 without the store being asked (`is_file_id`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from core.checks import IdShape
from core.errors import InvalidRequest, NotFound

# What a caller may upload a file for, and what the gateway writes itself.
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
BATCH_OUTPUT = "batch_output"
LIST_LIMIT = (1, 10_000)  # OpenAI's range, and its default is the top of it
ORDERS = ("asc", "desc")
EXPIRES_ANCHOR = "created_at"
EXPIRES_SECONDS = (3600, 30 * 24 * 3600)  # one hour to thirty days
FILE_IDS = IdShape("file-")
MAX_PURPOSE_CHARS = 64  # a listing's `purpose` filter: longer than any purpose
# An integer field's digits: an optional minus and at most 18 digits (int() of a longer string
# is slow, and past 4,300 digits a ValueError); ASCII only (str.isdigit() takes "²", which
# int() refuses: a 500).
INTEGER = re.compile(r"-?[0-9]{1,18}")


class FileObject(TypedDict):
    """OpenAI's `file` object."""

    id: str
    object: str  # "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: str  # "processed" once stored (a deprecated field the SDK still reads)


@dataclass(frozen=True, slots=True)
class Upload:
    """An upload's form fields, checked."""

    purpose: str
    expires_after: int | None  # seconds after creation, or None: kept until deleted


@dataclass(frozen=True, slots=True)
class ListQuery:
    purpose: str | None
    limit: int
    order: str
    after: str | None


def upload(fields: Mapping[str, str]) -> Upload:
    """The form fields of `POST /v1/files` besides `file` (`expires_after` in the form encoding
    the SDK sends: `expires_after[anchor]`, `expires_after[seconds]`)."""
    purpose = fields.get("purpose")
    if purpose is None:
        raise InvalidRequest("Missing required parameter: 'purpose'.", param="purpose")
    if purpose not in PURPOSES:
        raise _one_of("purpose", purpose, PURPOSES)
    anchor = fields.get("expires_after[anchor]")
    seconds = fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return Upload(purpose, None)
    if anchor != EXPIRES_ANCHOR:
        raise _one_of("expires_after.anchor", anchor, (EXPIRES_ANCHOR,))
    return Upload(purpose, _integer(seconds, "expires_after.seconds", *EXPIRES_SECONDS))


def new_file_id() -> str:
    # Ids sort as the files were made (a listing's order within one second of created_at).
    return FILE_IDS.new()


def is_file_id(value: str) -> bool:
    """Whether `value` has the shape of an id the gateway makes (IdShape)."""
    return FILE_IDS.matches(value)


def list_query(params: Mapping[str, str]) -> ListQuery:
    """A listing's query. An `after` that is no file's id (of any shape) starts an empty page,
    as an id that is not listed does: it is compared with the listed ids, never stored or
    looked up."""
    purpose = params.get("purpose")
    if purpose is not None and len(purpose) > MAX_PURPOSE_CHARS:
        raise InvalidRequest(
            f"Invalid 'purpose': expected at most {MAX_PURPOSE_CHARS} characters.", param="purpose"
        )
    order = params.get("order", "desc")
    if order not in ORDERS:
        raise _one_of("order", order, ORDERS)
    limit = _integer(params.get("limit", str(LIST_LIMIT[1])), "limit", *LIST_LIMIT)
    return ListQuery(purpose, limit, order, params.get("after"))


def not_found(file_id: str) -> NotFound:
    """OpenAI's answer for a file that does not exist, or that is another key's."""
    return NotFound(f"No such File object: {file_id[:100]}", param="id")


def _integer(value: str | None, name: str, lo: int, hi: int) -> int:
    if value is None:
        raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
    if INTEGER.fullmatch(value) is None or not lo <= int(value) <= hi:
        raise InvalidRequest(
            f"Invalid '{name}': expected an integer from {lo} to {hi}, got '{value[:40]}'.",
            param=name,
        )
    return int(value)


def _one_of(name: str, value: str | None, allowed: tuple[str, ...]) -> InvalidRequest:
    listed = ", ".join(f"'{a}'" for a in allowed)
    return InvalidRequest(
        f"Invalid value for '{name}': expected one of {listed}, got '{str(value)[:40]}'.",
        param=name,
    )
