"""Client input that must never be a 500, in the Files and Batch APIs, against the gateway as
users run it (no upstream: the batches here fail their input file's checks, which needs none).

Every string a caller sends that becomes a name in the store or a parser's input is bounded: a
multipart boundary past RFC 2046's 70 characters is a 400 naming it (python-multipart's own
error was a 500 past 256); a file or batch id not of the shape the gateway makes is a 404 before
the store is asked (a 500-character batch id was "file name too long" from the directory store,
as was a file id of 64 four-byte characters); a listing's `limit` that Python's `isdigit` takes
but `int` refuses is a 400. A failed batch of 10,000 bad lines shows 1,000 of its errors and
their count, its error file has all of them, and a listing's page stays well under a megabyte
however many such batches there are (each was a 1 MB object, returned whole by every listing).
The id probes run against a directory store and an in-memory one.
"""

from __future__ import annotations

import http.client
import io
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from tests.gateway_proc import GatewayProcess
from tests.odd_ids import WIDE_DIGIT, odd_ids

KEY, LISTER = "sk-bounds-one", "sk-bounds-lister"
SHOWN = 1_000  # line errors a failed batch's object keeps
PAGE_BYTES = 512 * 1024  # a batch listing's page, at most (and at least one batch)
DEADLINE_S = 30.0
STORES = ("directory", "memory:///")
# A digit to str.isalnum() (MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO), four bytes in UTF-8.
WELL_FORMED_FILE = "file-" + "0" * 24  # the shape of the gateway's ids, of no file
WELL_FORMED_BATCH = "batch_" + "0" * 24
ODD = [
    "..",
    "%2e%2e",
    "%2E%2E%2F%2E%2E%2Fx",
    "a/../../b",
    "\x00",
    "file-\x00",
    "batch_\x00",
    "file-" + "é" * 64,
    "file-" + WIDE_DIGIT * 64,  # 256 bytes: one name too long for a directory (a 500)
    "batch_" + WIDE_DIGIT * 64,
    "batch_" + "é" * 130,
    "file-" + "a" * 495,
    "batch_" + "a" * 494,  # 500 characters: "file name too long" (a 500)
    "x" * 10_000,
    WELL_FORMED_FILE.upper(),
    WELL_FORMED_BATCH + ".json",
    "\uff46\uff49\uff4c\uff45-\uff11\uff12\uff13"  # fullwidth "file-123",
    " ",
]


def config(store: str) -> str:
    return f"""
auth:
  keys:
    - {{id: one, key: {KEY}, models: ["*"]}}
    - {{id: lister, key: {LISTER}, models: ["*"]}}
providers: {{}}
models: {{}}
files: {{store: "{store}", max_bytes: 10000000}}
batches: {{poll_s: 0.05}}
"""


@pytest.fixture(scope="module", params=STORES)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("bounds")
    store = str(workdir / "store") if request.param == "directory" else request.param
    with GatewayProcess(config(store), workdir) as gw:
        # The key's file and batch are there: an id is looked for beside them (where the store
        # has no directory for the key, a name too long was only "not found").
        until_failed(gw, failed_batch(gw, 1))
        yield gw


@pytest.fixture(scope="module")
def directory_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("bounds-batches")
    with GatewayProcess(config(str(workdir / "store")), workdir) as gw:
        yield gw


def headers(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def raw(gw: GatewayProcess, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    """A request whose path is sent as written (no client normalizes its dots or slashes)."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        extra = {"content-type": "application/json"} if body else {}
        conn.request(method, path, body=body or None, headers={**headers(), **extra})
        resp = conn.getresponse()
        return resp.status, orjson.loads(resp.read())
    finally:
        conn.close()


def assert_openai_error(status: int, body: Any, expected: int, param: str) -> None:
    assert status == expected, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def encodings(odd: str) -> list[str]:
    """The id as a path segment: percent-encoded whole, and as written where it can be."""
    ways = [quote(odd, safe="")]
    if odd.isascii() and odd.isprintable() and " " not in odd:
        ways.append(odd)
    return ways


def upload(gw: GatewayProcess, content: bytes, key: str = KEY) -> str:
    files: dict[str, tuple[str | None, io.BytesIO | str]] = {
        "file": ("in.jsonl", io.BytesIO(content)),
        "purpose": (None, "batch"),
    }
    resp = httpx.post(gw.url + "/v1/files", files=files, headers=headers(key))
    assert resp.status_code == 200, resp.text
    file_id: str = resp.json()["id"]
    return file_id


def failed_batch(gw: GatewayProcess, bad_lines: int, key: str = KEY) -> str:
    """A batch whose every line is bad JSON: it fails validation with `bad_lines` errors."""
    file_id = upload(gw, b"{oops\n" * bad_lines, key)
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    resp = httpx.post(gw.url + "/v1/batches", json=body, headers=headers(key))
    assert resp.status_code == 200, resp.text
    batch_id: str = resp.json()["id"]
    return batch_id


def until_failed(gw: GatewayProcess, batch_id: str, key: str = KEY) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        batch: dict[str, Any] = httpx.get(
            f"{gw.url}/v1/batches/{batch_id}", headers=headers(key)
        ).json()
        if batch["status"] == "failed":
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch['status']}")


# ---------------------------------------------------------------- multipart


def test_a_long_boundary_is_a_400_naming_it(gateway: GatewayProcess) -> None:
    boundary = "b" * 300
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
        f"x\r\n--{boundary}--\r\n"
    ).encode()
    ctype = f"multipart/form-data; boundary={boundary}"
    resp = httpx.post(
        gateway.url + "/v1/files", content=body, headers={**headers(), "content-type": ctype}
    )
    assert_openai_error(resp.status_code, resp.json(), 400, "content-type.boundary")
    assert "boundary" in resp.json()["error"]["message"]


# ---------------------------------------------------------------- ids


def test_a_500_character_batch_id_is_a_404(gateway: GatewayProcess) -> None:
    long_id = "batch_" + "a" * 494
    assert len(long_id) == 500
    for method, path in (("GET", long_id), ("POST", long_id + "/cancel")):
        status, body = raw(gateway, method, "/v1/batches/" + path)
        assert_openai_error(status, body, 404, "batch_id")


def test_long_file_ids_are_404s(gateway: GatewayProcess) -> None:
    """500 characters; and 64 characters that str.isalnum() takes, four bytes each in UTF-8:
    one name too long for a directory (a 500)."""
    for long_id in ("file-" + "a" * 495, "file-" + WIDE_DIGIT * 64):
        for method, rest in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
            status, body = raw(gateway, method, "/v1/files/" + quote(long_id, safe="") + rest)
            assert_openai_error(status, body, 404, "id")


@pytest.mark.parametrize("odd", ODD, ids=lambda s: repr(s[:20]))
def test_odd_ids_are_404s(gateway: GatewayProcess, odd: str) -> None:
    """Files (retrieve, content, delete), batches (retrieve, cancel), and a batch's input file:
    a 404 whatever the id (the path's own 404 where the id has a slash in it)."""
    for segment in encodings(odd):
        for method, path in (
            ("GET", f"/v1/files/{segment}"),
            ("GET", f"/v1/files/{segment}/content"),
            ("DELETE", f"/v1/files/{segment}"),
            ("GET", f"/v1/batches/{segment}"),
            ("POST", f"/v1/batches/{segment}/cancel"),
        ):
            status, body = raw(gateway, method, path)
            assert status == 404, (method, path, body)
            assert body["error"]["type"] == "invalid_request_error"
    made = {"input_file_id": odd, "endpoint": "/v1/completions", "completion_window": "24h"}
    status, body = raw(gateway, "POST", "/v1/batches", orjson.dumps(made))
    assert_openai_error(status, body, 404, "input_file_id")


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(odd=odd_ids(300))
def test_any_id_is_a_404_never_a_500(gateway: GatewayProcess, odd: str) -> None:
    for method, path in (
        ("GET", f"/v1/files/{quote(odd, safe='')}"),
        ("GET", f"/v1/batches/{quote(odd, safe='')}"),
        ("POST", f"/v1/batches/{quote(odd, safe='')}/cancel"),
    ):
        status, body = raw(gateway, method, path)
        assert status == 404, (method, path, body)
    made = {"input_file_id": odd, "endpoint": "/v1/completions", "completion_window": "24h"}
    status, body = raw(gateway, "POST", "/v1/batches", orjson.dumps(made))
    assert_openai_error(status, body, 404, "input_file_id")


# ---------------------------------------------------------------- listings' queries


@pytest.mark.parametrize("limit", ["²", "--5", "9" * 5000, "٣"])
@pytest.mark.parametrize("listing", ["/v1/files", "/v1/batches"])
def test_an_odd_limit_is_a_400_naming_it(gateway: GatewayProcess, listing: str, limit: str) -> None:
    """`str.isdigit()` takes "²", and 5,000 digits; `int()` refuses both (a 500)."""
    resp = httpx.get(gateway.url + listing, params={"limit": limit}, headers=headers())
    assert_openai_error(resp.status_code, resp.json(), 400, "limit")


# ---------------------------------------------------------------- a batch of many bad lines


def test_a_failed_batch_shows_1000_errors_its_count_and_its_error_file_has_all(
    directory_gateway: GatewayProcess,
) -> None:
    gw = directory_gateway
    batch = until_failed(gw, failed_batch(gw, 10_000))
    errors = batch["errors"]
    assert errors["object"] == "list" and errors["total"] == 10_000
    assert len(errors["data"]) == SHOWN
    assert [e["line"] for e in errors["data"]] == list(range(1, SHOWN + 1))
    assert {e["code"] for e in errors["data"]} == {"invalid_json_line"}
    assert batch["error_file_id"] is not None and batch["output_file_id"] is None
    content = httpx.get(f"{gw.url}/v1/files/{batch['error_file_id']}/content", headers=headers())
    assert content.status_code == 200
    lines = [orjson.loads(x) for x in content.content.splitlines()]
    assert [x["error"]["line"] for x in lines] == list(range(1, 10_001))
    assert {(x["error"]["code"], x["response"]) for x in lines} == {("invalid_json_line", None)}


def test_a_listing_of_failed_batches_is_not_megabytes(directory_gateway: GatewayProcess) -> None:
    """Five batches of 2,000 bad lines each (about 200 KB apiece with every error shown): the
    page stops short of PAGE_BYTES and leads on to the rest."""
    gw = directory_gateway
    made = [failed_batch(gw, 2_000, LISTER) for _ in range(5)]
    for batch_id in made:
        until_failed(gw, batch_id, LISTER)
    seen: list[str] = []
    after: dict[str, str] = {}
    while True:
        resp = httpx.get(
            gw.url + "/v1/batches", params={"limit": 100, **after}, headers=headers(LISTER)
        )
        assert resp.status_code == 200 and len(resp.content) <= PAGE_BYTES + 1024
        page = resp.json()
        assert page["data"], page
        seen += [b["id"] for b in page["data"]]
        for batch in page["data"]:
            assert len(batch["errors"]["data"]) <= SHOWN and batch["errors"]["total"] == 2_000
        if not page["has_more"]:
            break
        after = {"after": page["last_id"]}
    assert seen == sorted(made, reverse=True)
