"""The Batch API's request and the checks of an input file's lines, as OpenAI makes them: each
bad line named in `errors.data` with a code, a message, the field and the line number."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.batches import (
    MAX_ERRORS_SHOWN,
    MAX_LINES,
    CreateBatch,
    LineCheck,
    check_lines,
    create_batch,
    is_batch_id,
    list_query,
    new_batch_id,
)
from core.errors import InvalidRequest

URL = "/v1/chat/completions"
BATCH_ID = "batch_0000000000000001deadbeef"  # of the shape the gateway makes (new_batch_id)
# A digit to str.isalnum() (MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO), four bytes in UTF-8.
WIDE_DIGIT = "\U0001d7d8"


def line(custom_id: str = "a", **over: Any) -> bytes:
    data = {
        "custom_id": custom_id,
        "method": "POST",
        "url": URL,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    return orjson.dumps({**data, **over})


def test_create_batch() -> None:
    body = {"input_file_id": "file-1", "endpoint": URL, "completion_window": "24h"}
    assert create_batch(body) == CreateBatch("file-1", URL, "24h", None)
    assert create_batch({**body, "metadata": {"team": "eval"}}).metadata == {"team": "eval"}


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"input_file_id": None}, "input_file_id"),
        ({"input_file_id": 3}, "input_file_id"),
        ({"endpoint": "/v1/images"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {str(i): "x" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata.k"),
    ],
)
def test_bad_batches_are_400s_naming_the_field(over: dict[str, Any], param: str) -> None:
    body = {"input_file_id": "file-1", "endpoint": URL, "completion_window": "24h", **over}
    with pytest.raises(InvalidRequest) as exc:
        create_batch({k: v for k, v in body.items() if v is not None})
    assert exc.value.param == param


def test_good_lines() -> None:
    checked = check_lines([line("a"), b"", b"  \n", line("b")], URL)
    assert checked.errors == []
    assert [(x.number, x.custom_id) for x in checked.lines] == [(1, "a"), (4, "b")]
    assert checked.model == "m"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"{not json", "invalid_json_line", None),
        (b"[1, 2]", "invalid_json_line", None),
        (line("a"), "duplicate_custom_id", "custom_id"),
        (line("b", method="GET"), "invalid_method", "method"),
        (line("b", url="/v1/embeddings"), "mismatched_endpoint", "url"),
        (line("b", body="text"), "invalid_body", "body"),
        (line("b", body={"messages": []}), "missing_required_parameter", "body.model"),
        (line("b", body={"model": "other"}), "mismatched_model", "body.model"),
        (line(""), "missing_required_parameter", None),
    ],
)
def test_each_bad_line_is_named(raw: bytes, code: str, param: str | None) -> None:
    checked = check_lines([line("a"), raw, line("c")], URL)
    assert [(e["code"], e["param"], e["line"]) for e in checked.errors] == [(code, param, 2)]
    assert [x.custom_id for x in checked.lines] == ["a", "c"]


def test_several_problems_of_one_line() -> None:
    checked = check_lines([line("a", method="PUT", url="/x")], URL)
    assert [(e["code"], e["line"]) for e in checked.errors] == [
        ("invalid_method", 1),
        ("mismatched_endpoint", 1),
    ]


def test_an_empty_file_and_too_many_lines() -> None:
    assert [e["code"] for e in check_lines([b"", b"\n"], URL).errors] == ["empty_file"]
    many = (line(str(i)) for i in range(MAX_LINES + 1))
    checked = check_lines(many, URL)
    assert [(e["code"], e["line"]) for e in checked.errors] == [("too_many_lines", MAX_LINES + 1)]


def test_a_file_of_many_bad_lines_keeps_the_first_errors_and_counts_them() -> None:
    """10,000 errors held and shown whole made a 1 MB batch object."""
    n = 3 * MAX_ERRORS_SHOWN
    checked = check_lines([b"{oops"] * n + [line("a", method="GET", url="/x")], URL)
    assert len(checked.errors) == MAX_ERRORS_SHOWN and checked.error_count == n + 2
    assert [e["line"] for e in checked.errors] == list(range(1, MAX_ERRORS_SHOWN + 1))


def test_each_lines_errors_are_there_as_it_is_read() -> None:
    check = LineCheck(URL)
    steps = []
    for raw in (line("a"), b"{oops", line("b", method="GET", url="/x"), b""):
        check.feed(raw)
        steps.append(([e["code"] for e in check.fresh], check.custom_id))
    assert steps == [
        ([], "a"),
        (["invalid_json_line"], None),
        (["invalid_method", "mismatched_endpoint"], "b"),
        ([], None),
    ]
    check.done()
    assert check.fresh == []
    empty = LineCheck(URL)
    empty.done()
    assert [e["code"] for e in empty.fresh] == ["empty_file"]


def test_batch_ids_have_the_shape_the_gateway_makes() -> None:
    assert is_batch_id(new_batch_id())
    wide = "batch_" + WIDE_DIGIT * 24
    for odd in ("batch_" + "a" * 500, wide, "batch_..", "", new_batch_id() + "\x00"):
        assert not is_batch_id(odd), odd


@pytest.mark.parametrize("limit", ["0", "101", "²", "٣", "-1", "9" * 5000, "", " 5"])
def test_a_bad_listing_limit_is_a_400_naming_it(limit: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        list_query({"limit": limit})
    assert exc.value.param == "limit"


def test_listing_query() -> None:
    assert (list_query({}).limit, list_query({}).after) == (20, None)
    assert list_query({"limit": "100", "after": "x" * 10_000}).limit == 100
