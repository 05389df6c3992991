"""Client contexts for the test CAs (trustme) of the TLS suites."""

from __future__ import annotations

import ssl

import trustme


def trusting(ca: trustme.CA, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    """A client context that trusts `ca`, and presents `cert` (a client certificate) if given."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if cert is not None:
        cert.configure_cert(context)
    return context
