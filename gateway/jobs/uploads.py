"""A multipart/form-data upload read as it arrives: the `file` part's bytes are handed on piece
by piece (to the file store), the other fields are kept (small, bounded), and nothing is held
whole in memory. python-multipart's streaming parser does the parsing.

Everything of the form but the file's bytes is bounded, each excess a 400 or 413 naming the
field: the boundary (RFC 2046's 70 characters), the parts' headers and the other fields' values
together (MAX_FIELD_BYTES), the file's name (MAX_FILENAME_CHARS)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from core.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from gateway.asgi import ClientGone, Receive

MAX_FIELD_BYTES = 64 * 1024  # all fields but the file, and every part's headers, together
MAX_BOUNDARY_CHARS = 70  # RFC 2046 (python-multipart's own limit, 256, was a 500)
MAX_FILENAME_CHARS = 255  # what a file system takes as one name
FILE_FIELD = "file"
BOUNDARY_PARAM = "content-type.boundary"


@dataclass(slots=True)
class Form:
    """What the parser found so far: the fields, and the file's name and pending bytes."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    seen_file: bool = False
    pending: list[bytes] = field(default_factory=list)  # file bytes not handed on yet
    _name: str = ""
    _header: bytes = b""
    _headers: dict[bytes, bytes] = field(default_factory=dict)
    _value: bytearray = field(default_factory=bytearray)
    _field_bytes: int = 0

    # python-multipart's callbacks
    def on_part_begin(self) -> None:
        self._headers, self._value, self._name = {}, bytearray(), ""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count(end - start, FILE_FIELD)
        self._header += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count(end - start, FILE_FIELD)
        self._headers[self._header.lower()] = (
            self._headers.get(self._header.lower(), b"") + (data[start:end])
        )

    def on_header_end(self) -> None:
        self._header = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name == FILE_FIELD:
            if self.seen_file:
                raise InvalidRequest("Only one 'file' may be uploaded.", param=FILE_FIELD)
            self.seen_file = True
            self.filename = options.get(b"filename", b"upload").decode("utf-8", "replace")
            if len(self.filename) > MAX_FILENAME_CHARS:
                raise InvalidRequest(
                    f"The file's name is longer than {MAX_FILENAME_CHARS} characters.",
                    param=FILE_FIELD,
                )

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == FILE_FIELD:
            self.pending.append(data[start:end])
            return
        self._count(end - start, self._name)
        self._value += data[start:end]

    def _count(self, size: int, name: str) -> None:
        """Bytes of the form that are not the file's, against MAX_FIELD_BYTES; `name`: the
        field they belong to (`file` for a part's headers: the part's name is not known until
        they end). python-multipart bounds one part's headers, not how many parts there are."""
        self._field_bytes += size
        if self._field_bytes > MAX_FIELD_BYTES:
            raise PayloadTooLarge("The form's fields are too large.", param=name[:64])

    def on_part_end(self) -> None:
        if self._name != FILE_FIELD:
            self.fields[self._name] = self._value.decode("utf-8", "replace")


def boundary(content_type: str | None) -> bytes:
    """The multipart boundary of an upload's Content-Type; a 415 for anything else, a 400 for a
    boundary longer than RFC 2046 allows."""
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise UnsupportedMediaType(
            f"Content-Type must be multipart/form-data, got '{(content_type or '')[:60]}'.",
            param="content-type",
        )
    found = options[b"boundary"]
    if len(found) > MAX_BOUNDARY_CHARS:
        raise InvalidRequest(
            f"Invalid 'boundary' of the Content-Type: expected at most {MAX_BOUNDARY_CHARS} "
            f"characters (RFC 2046), got {len(found)}.",
            param=BOUNDARY_PARAM,
        )
    return found


async def file_bytes(receive: Receive, parser: MultipartParser, form: Form) -> AsyncIterator[bytes]:
    """The body read to its end: the file part's bytes as they come (the form's other fields
    land in `form`)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        _parsed(parser.write, message.get("body", b""))
        if form.pending:
            chunk = b"".join(form.pending)
            form.pending.clear()
            yield chunk
        if not message.get("more_body", False):
            _parsed(parser.finalize)
            return


def _parsed(step: Callable[..., object], *args: bytes) -> None:
    """A step of the parser; a body that is not multipart as its header says is a 400."""
    try:
        step(*args)
    except FormParserError as exc:
        raise InvalidRequest(
            f"The multipart/form-data body cannot be parsed ({exc}).", param=FILE_FIELD
        ) from None


def parser_for(content_type: str | None, form: Form) -> MultipartParser:
    callbacks = {
        name: getattr(form, name)
        for name in (
            "on_part_begin",
            "on_header_field",
            "on_header_value",
            "on_header_end",
            "on_headers_finished",
            "on_part_data",
            "on_part_end",
        )
    }
    return MultipartParser(boundary(content_type), callbacks)  # type: ignore[arg-type]
