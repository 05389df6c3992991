"""TLS to an https upstream: the SSL context of its connections.

Verification is on unless a provider turns it off: the standard library's default context
(the system's store, and SSL_CERT_FILE / SSL_CERT_DIR when set, as OpenSSL reads them), with a
provider's own CA added to it (`ca_file`) and its client certificate (`cert_file`, and
`key_file` unless the key is in the same file). The files are read when the context is built,
which is when the config is checked: a file missing, unreadable or not loading is named then,
not at the first request.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

FILES = ("ca_file", "cert_file", "key_file")
KEYS = ("verify", *FILES)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class TlsConfigError(ValueError):
    """A TLS setting that cannot be used; `key` names it (one of KEYS)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """The context of an upstream's connections, its files read now. TlsConfigError names the
    setting that is wrong."""
    if files.key_file is not None and files.cert_file is None:
        raise TlsConfigError("key_file", "needs cert_file, the certificate it is the key of")
    if not files.verify and files.ca_file is not None:
        raise TlsConfigError("ca_file", "of no use with verify: false (nothing is verified)")
    for key in FILES:
        name = getattr(files, key)
        if name is not None:
            _readable(key, name)
    context = ssl.create_default_context()
    if files.ca_file is not None:
        try:
            context.load_verify_locations(cafile=files.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(
                "ca_file", f"{files.ca_file}: no CA certificate loads ({_said(exc)})"
            ) from None
    if files.cert_file is not None:
        try:  # a password callback: an encrypted key fails here, rather than prompting
            context.load_cert_chain(files.cert_file, files.key_file, password=_no_password)
        except (ssl.SSLError, OSError) as exc:
            pair = "cert_file and key_file" if files.key_file else "cert_file (certificate and key)"
            why = f"{pair} do not load as a certificate and its unencrypted key ({_said(exc)})"
            raise TlsConfigError("cert_file", why) from None
    if not files.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def verifies(context: ssl.SSLContext) -> bool:
    return context.verify_mode != ssl.CERT_NONE


def _readable(key: str, name: str) -> None:
    try:
        with open(name, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise TlsConfigError(key, f"cannot read {name}: {exc.strerror or exc}") from None


def _no_password() -> bytes:
    return b""


def _said(exc: Exception) -> str:
    """OpenSSL's reason ("KEY_VALUES_MISMATCH"), or the system's words."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
