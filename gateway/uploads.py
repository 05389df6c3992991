"""A multipart/form-data upload read as it arrives: the `file` part's bytes are handed on piece
by piece (to the file store), the other fields are kept (small, bounded), and nothing is held
whole in memory. python-multipart's streaming parser does the parsing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from core.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from gateway.http import ClientGone, Receive

MAX_FIELD_BYTES = 64 * 1024  # all fields but the file, together
FILE_FIELD = "file"


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
        self._header += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
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

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == FILE_FIELD:
            self.pending.append(data[start:end])
            return
        self._field_bytes += end - start
        if self._field_bytes > MAX_FIELD_BYTES:
            raise PayloadTooLarge("The form's fields are too large.", param=self._name)
        self._value += data[start:end]

    def on_part_end(self) -> None:
        if self._name != FILE_FIELD:
            self.fields[self._name] = self._value.decode("utf-8", "replace")


def boundary(content_type: str | None) -> bytes:
    """The multipart boundary of an upload's Content-Type; a 415 for anything else."""
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise UnsupportedMediaType(
            f"Content-Type must be multipart/form-data, got '{(content_type or '')[:60]}'.",
            param="content-type",
        )
    return options[b"boundary"]


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
    except MultipartParseError as exc:
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
