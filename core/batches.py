"""The Batch API's requests and its `batch` object, as OpenAI defines them: `POST /v1/batches`
(an input file, the endpoint its lines call, the completion window, metadata), a listing's query,
and the checks of an input file's lines, each failure naming its line as OpenAI's `errors.data[]`
does. Whether a line's body is a valid request is the endpoint's to say when the line runs.

A batch id is the gateway's own (`new_batch_id`): an id of any other shape names no batch, so it
is a 404 without the store being asked (`is_batch_id`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import orjson

from core.checks import IdShape
from core.errors import InvalidRequest

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses")
WINDOWS = {"24h": 24 * 3600}
MAX_LINES = 50_000
MAX_METADATA_KEYS = 16  # OpenAI's: 16 pairs, keys up to 64 characters, values up to 512
LIST_LIMIT = (1, 100)
DEFAULT_LIST_LIMIT = 20
# A failed batch's object keeps this many of its line errors (the first); all of them are in its
# error file, and `errors.total` says how many there are. 10,000 errors made a 1 MB object.
MAX_ERRORS_SHOWN = 1_000
BATCH_IDS = IdShape("batch_")
LIMIT_DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII digits only (str.isdigit() takes "²")
STATUSES = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
)


class LineError(TypedDict):
    """One entry of a batch's `errors.data`."""

    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(TypedDict):
    """A failed batch's `errors`: OpenAI's list of line errors (the first ones), and `total`,
    this gateway's extension: how many there are. When the input file fails its checks, all of
    them are in the batch's error file (`error_file_id`)."""

    object: str  # "list"
    data: list[LineError]
    total: NotRequired[int]  # absent from a record stored before it was counted


class RequestCounts(TypedDict):
    total: int
    completed: int
    failed: int


class BatchObject(TypedDict):
    """OpenAI's `batch` object."""

    id: str
    object: str  # "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class CreateBatch:
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Line:
    """One request of an input file, checked; kept as its bytes (a file of many lines is held
    at its size, not parsed), its body read when it runs."""

    number: int  # 1-based, as OpenAI counts lines
    custom_id: str
    raw: bytes

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = orjson.loads(self.raw)["body"]
        return body


@dataclass(frozen=True, slots=True)
class ListQuery:
    limit: int
    after: str | None


@dataclass(slots=True)
class Checked:
    """An input file's lines, or the errors that fail the batch: the first MAX_ERRORS_SHOWN of
    them, and how many there are (a file of 50,000 bad lines is not held as 200,000 errors)."""

    lines: list[Line] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    error_count: int = 0
    model: str | None = None

    def add(self, errors: list[LineError]) -> None:
        room = MAX_ERRORS_SHOWN - len(self.errors)
        self.errors.extend(errors[: max(room, 0)])
        self.error_count += len(errors)


def create_batch(data: Any) -> CreateBatch:
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    file_id = _required(data, "input_file_id")
    endpoint = _required(data, "endpoint")
    if endpoint not in ENDPOINTS:
        raise _one_of("endpoint", endpoint, ENDPOINTS)
    window = _required(data, "completion_window")
    if window not in WINDOWS:
        raise _one_of("completion_window", window, tuple(WINDOWS))
    return CreateBatch(file_id, endpoint, window, _metadata(data.get("metadata")))


def new_batch_id() -> str:
    return BATCH_IDS.new()


def is_batch_id(value: str) -> bool:
    """Whether `value` has the shape of an id the gateway makes (IdShape)."""
    return BATCH_IDS.matches(value)


def list_query(params: Mapping[str, str]) -> ListQuery:
    """A listing's query. An `after` that is no batch's id (of any shape) starts an empty page,
    as an id that is not listed does: it is compared with the listed ids, never looked up."""
    lo, hi = LIST_LIMIT
    limit = params.get("limit", str(DEFAULT_LIST_LIMIT))
    if LIMIT_DIGITS.fullmatch(limit) is None or not lo <= int(limit) <= hi:
        raise InvalidRequest(
            f"Invalid 'limit': expected an integer from {lo} to {hi}, got '{limit[:40]}'.",
            param="limit",
        )
    return ListQuery(int(limit), params.get("after"))


def check_lines(raw_lines: Iterable[bytes], endpoint: str) -> Checked:
    """An input file's lines as OpenAI checks them before running any (LineCheck)."""
    check = LineCheck(endpoint)
    for raw in raw_lines:
        if not check.feed(raw):
            break
    return check.done()


class LineCheck:
    """An input file's lines checked as they are read: JSON objects, a `custom_id` unique in
    the file, `method` POST, `url` the batch's endpoint, a `body` object, one model for the
    whole file, at most MAX_LINES lines. Blank lines are skipped. After each `feed` (and
    `done`), `fresh` holds that step's errors and `custom_id` its line's, if it has one: what a
    reader of the whole list (the batch's error file) takes as it goes."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.checked = Checked()
        self.seen: set[str] = set()
        self.number = 0  # lines read, blank ones included
        self.count = 0  # requests
        self.fresh: list[LineError] = []
        self.custom_id: str | None = None

    def feed(self, raw: bytes) -> bool:
        """The next line; False once the file has too many (the rest need not be read)."""
        self.number += 1
        self.fresh, self.custom_id = [], None
        if not raw.strip():
            return True
        self.count += 1
        if self.count > MAX_LINES:
            message = f"A batch may have at most {MAX_LINES} requests."
            self._noted([_error("too_many_lines", message, self.number)])
            return False
        line = self._line(raw)
        if line is not None:
            self.checked.lines.append(line)
        return True

    def done(self) -> Checked:
        self.fresh, self.custom_id = [], None
        if self.count == 0:
            self._noted([_error("empty_file", "The input file has no requests.", None)])
        return self.checked

    def _line(self, raw: bytes) -> Line | None:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            message = "This line is not parseable as valid JSON."
            self._noted([_error("invalid_json_line", message, self.number)])
            return None
        custom_id = data.get("custom_id")
        self.custom_id = custom_id if isinstance(custom_id, str) else None
        problems = _problems(data, self.endpoint, self.seen, self.checked)
        if problems:
            for problem in problems:
                problem["line"] = self.number
            self._noted(problems)
            return None
        self.seen.add(data["custom_id"])
        return Line(self.number, data["custom_id"], raw)

    def _noted(self, errors: list[LineError]) -> None:
        self.fresh = errors
        self.checked.add(errors)


def _problems(
    data: Mapping[str, Any], endpoint: str, seen: set[str], checked: Checked
) -> list[LineError]:
    custom_id, body = data.get("custom_id"), data.get("body")
    found: list[LineError] = []
    if not isinstance(custom_id, str) or not custom_id:
        found.append(_error("missing_required_parameter", "Each line needs a custom_id.", None))
    elif custom_id in seen:
        message = f"The custom_id '{custom_id[:64]}' is used by an earlier line."
        found.append(_error("duplicate_custom_id", message, None, "custom_id"))
    if data.get("method") != "POST":
        found.append(_error("invalid_method", "The method must be POST.", None, "method"))
    if data.get("url") != endpoint:
        message = f"The url must be the batch's endpoint, {endpoint}."
        found.append(_error("mismatched_endpoint", message, None, "url"))
    if not isinstance(body, dict):
        found.append(_error("invalid_body", "The body must be a JSON object.", None, "body"))
    else:
        found.extend(_one_model(body, checked))
    return found


def _one_model(body: Mapping[str, Any], checked: Checked) -> list[LineError]:
    model = body.get("model")
    if not isinstance(model, str):
        return [_error("missing_required_parameter", "The body needs a model.", None, "body.model")]
    if checked.model is None:
        checked.model = model
    elif model != checked.model:
        message = (
            f"All lines must use one model: this one asks for '{model[:64]}', an earlier one "
            f"for '{checked.model[:64]}'."
        )
        return [_error("mismatched_model", message, None, "body.model")]
    return []


def _error(code: str, message: str, line: int | None, param: str | None = None) -> LineError:
    return {"code": code, "message": message, "param": param, "line": line}


def _required(data: Mapping[str, Any], name: str) -> str:
    value = data.get(name)
    if value is None:
        raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
    if not isinstance(value, str):
        raise InvalidRequest(f"Invalid type for '{name}': expected a string.", param=name)
    return value


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS:
        raise InvalidRequest(
            f"Invalid 'metadata': expected an object of at most {MAX_METADATA_KEYS} pairs.",
            param="metadata",
        )
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise InvalidRequest(
                "Invalid 'metadata': keys of at most 64 characters, string values of at most 512.",
                param=f"metadata.{key[:64]}",
            )
    return value


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> InvalidRequest:
    listed = ", ".join(f"'{a}'" for a in allowed)
    return InvalidRequest(
        f"Invalid value for '{name}': expected one of {listed}, got '{value[:60]}'.", param=name
    )
