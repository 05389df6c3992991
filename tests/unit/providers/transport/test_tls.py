"""An https upstream's TLS context (providers/transport/tls.py): verification by default, a CA
added, a client certificate loaded, and every file that cannot be used named by its key."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from providers.transport.tls import TlsConfigError, TlsFiles, client_context, verifies


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a client certificate and its key apart, the two together, another key, junk."""
    where = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    client = ca.issue_cert("client@example")
    other = trustme.CA().issue_cert("other@example")
    paths = {
        "ca": where / "ca.pem",
        "cert": where / "cert.pem",
        "key": where / "key.pem",
        "both": where / "both.pem",
        "other-key": where / "other-key.pem",
        "junk": where / "junk.pem",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    client.private_key_and_cert_chain_pem.write_to_path(str(paths["both"]))
    other.private_key_pem.write_to_path(str(paths["other-key"]))
    paths["junk"].write_text("not a certificate\n")
    return {name: str(path) for name, path in paths.items()}


def test_the_default_context_verifies() -> None:
    context = client_context(TlsFiles())
    assert verifies(context) and context.check_hostname


def test_a_ca_and_a_client_certificate(files: dict[str, str]) -> None:
    given = TlsFiles(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"])
    context = client_context(given)
    assert verifies(context)
    assert any("trustme" in str(cert["subject"]) for cert in context.get_ca_certs())
    client_context(TlsFiles(cert_file=files["both"]))  # the key in the certificate's file


def test_verify_false_turns_verification_off() -> None:
    context = client_context(TlsFiles(verify=False))
    assert not verifies(context) and not context.check_hostname
    assert context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("given", "key", "says"),
    [
        ({"ca_file": "/nonexistent/ca.pem"}, "ca_file", "cannot read /nonexistent/ca.pem"),
        ({"ca_file": "/"}, "ca_file", "cannot read /: Is a directory"),
        ({"ca_file": "junk"}, "ca_file", "no CA certificate loads"),
        ({"cert_file": "cert", "key_file": "/nonexistent/k"}, "key_file", "cannot read"),
        ({"cert_file": "cert", "key_file": "other-key"}, "cert_file", "do not load"),
        ({"cert_file": "cert"}, "cert_file", "do not load"),  # no key anywhere
        ({"cert_file": "junk", "key_file": "key"}, "cert_file", "do not load"),
        ({"key_file": "key"}, "key_file", "needs cert_file"),
        ({"verify": False, "ca_file": "ca"}, "ca_file", "of no use"),
    ],
)
def test_what_cannot_be_used_is_named(
    files: dict[str, str], given: dict[str, object], key: str, says: str
) -> None:
    named = {k: files.get(v, v) if isinstance(v, str) else v for k, v in given.items()}
    with pytest.raises(TlsConfigError, match=says) as caught:
        client_context(TlsFiles(**named))  # type: ignore[arg-type]
    assert caught.value.key == key


def test_an_encrypted_key_fails_rather_than_prompting(
    files: dict[str, str], tmp_path: Path
) -> None:
    key = serialization.load_pem_private_key(Path(files["key"]).read_bytes(), None)
    locked = tmp_path / "locked.pem"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass"),
        )
    )
    with pytest.raises(TlsConfigError, match="unencrypted key") as caught:
        client_context(TlsFiles(cert_file=files["cert"], key_file=str(locked)))
    assert caught.value.key == "cert_file"
