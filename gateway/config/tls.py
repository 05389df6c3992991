"""The listener's TLS (`server.tls`): its block, and the SSL context its files make. Every error
names its YAML path: a key not known, a file missing or unreadable, one that holds no PEM
certificate or key, a key that does not belong to the certificate.

Parsing reads no file (the config stays plain data); `server_context` reads them, for
`gateway serve` and `gateway check-config` before serving, and in each serving process.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from gateway.config.values import known, text

PATH = "server.tls"
KEYS = ("cert_file", "key_file", "ca_file")
ALPN = ["http/1.1"]  # what the gateway speaks: a client offering h2 agrees on HTTP/1.1
# What a file's text must hold, before OpenSSL is asked (its own errors rarely say which file).
CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?(?:ENCRYPTED )?PRIVATE KEY-----")
_SOURCE = re.compile(r"\s*\(_ssl\.c:\d+\)$")  # OpenSSL's reason without CPython's line


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files; a relative path is taken from the working directory, as uvicorn's are."""

    cert_file: str  # the server's certificate, and the chain up to its CA after it
    key_file: str  # its private key, not encrypted
    ca_file: str | None = None  # set: clients must present a certificate this CA signed

    def files(self) -> tuple[str, ...]:
        """What it reads: a change to any of them is a change of certificate."""
        return (self.cert_file, self.key_file, *([] if self.ca_file is None else [self.ca_file]))


def parse(block: Mapping[str, Any]) -> TlsConfig | None:
    """None when the block is empty: cert_file and key_file together turn TLS on."""
    known(block, PATH, KEYS)
    if not block:
        return None
    for key in ("cert_file", "key_file"):
        if key not in block:
            raise ConfigError(f"{PATH}.{key}", "required: cert_file and key_file turn TLS on")
    ca = _file(block, "ca_file") if "ca_file" in block else None
    return TlsConfig(_file(block, "cert_file"), _file(block, "key_file"), ca)


def _file(block: Mapping[str, Any], key: str) -> str:
    path = f"{PATH}.{key}"
    value = text(block[key], path)
    if not value.strip():
        raise ConfigError(path, "expected a file path")
    return value


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """The context the listener serves with: TLS 1.2 at least, HTTP/1.1 by ALPN, no
    renegotiation (a client could make the server redo the handshake's work at will), and with
    `ca_file` a client certificate required. Reads the files: a ConfigError names the one at
    fault."""
    _certificates(f"{PATH}.cert_file", tls.cert_file)
    if PRIVATE_KEY.search(_read(f"{PATH}.key_file", tls.key_file)) is None:
        raise ConfigError(f"{PATH}.key_file", f"{tls.key_file} holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(ALPN)
    _load_pair(context, tls)
    if tls.ca_file is not None:
        context.load_verify_locations(cadata=_certificates(f"{PATH}.ca_file", tls.ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _read(path: str, file: str) -> bytes:
    try:
        return Path(file).read_bytes()
    except OSError as exc:
        raise ConfigError(path, f"cannot read {file} ({exc.strerror or exc})") from None


def _certificates(path: str, file: str) -> str:
    """The file's PEM certificates, each parsed (OpenSSL's own error for the pair would not
    say which of the two files is wrong)."""
    data = _read(path, file)
    if CERTIFICATE not in data:
        raise ConfigError(path, f"{file} holds no PEM certificate")
    pem = data.decode("ascii", errors="ignore")  # text around the PEM blocks may be anything
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem)
    except ssl.SSLError as exc:
        raise ConfigError(path, f"{file}: {_reason(exc)}") from None
    return pem


class _Encrypted(Exception):
    """Raised by the password callback: without it OpenSSL would ask for the password on the
    terminal, and the server would wait there."""


def _no_password() -> str:
    raise _Encrypted


def _load_pair(context: ssl.SSLContext, tls: TlsConfig) -> None:
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, _no_password)
    except _Encrypted:
        raise ConfigError(
            f"{PATH}.key_file", f"{tls.key_file} is encrypted; give the key without a password"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            message = f"{tls.key_file} is not the key of cert_file {tls.cert_file}"
        else:
            message = f"{tls.key_file} does not load with cert_file {tls.cert_file}: {_reason(exc)}"
        raise ConfigError(f"{PATH}.key_file", message) from None
    except OSError as exc:  # a file gone since it was read
        raise ConfigError(PATH, f"cannot read the certificate or key ({exc})") from None


def _reason(exc: ssl.SSLError) -> str:
    return _SOURCE.sub("", str(exc))
