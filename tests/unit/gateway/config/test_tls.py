"""`server.tls`: the block (its keys, cert_file and key_file together) and the SSL context its
files make, each error naming its YAML path: a file missing, unreadable, without a PEM
certificate or key, a key not the certificate's, an encrypted key, a CA file that is not one."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from core.errors import ConfigError
from gateway import config
from gateway.config.tls import TlsConfig, server_context

BASE = "auth: {keys: [{id: a, key: sk-a}]}\nproviders: {}\nmodels: {}\n"


@dataclass(frozen=True)
class Files:
    cert: str  # the server's certificate for 127.0.0.1, signed by ca
    key: str
    ca: str
    other_key: str  # a key of another certificate
    tmp: Path

    def write(self, name: str, data: bytes | str) -> str:
        path = self.tmp / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    served = ca.issue_cert("127.0.0.1")
    served.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    served.private_key_pem.write_to_path(str(tmp / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    trustme.CA().issue_cert("x").private_key_pem.write_to_path(str(tmp / "other.key"))
    names = ("cert.pem", "key.pem", "ca.pem", "other.key")
    cert, key, ca_file, other = (str(tmp / n) for n in names)
    return Files(cert, key, ca_file, other, tmp)


def server_block(**tls: str) -> str:
    pairs = ", ".join(f"{k}: {v!r}" for k, v in tls.items())
    return f"server: {{tls: {{{pairs}}}}}\n" + BASE


# ---------------------------------------------------------------- the block


def test_no_block_is_plain_http() -> None:
    assert config.parse(BASE).server.tls is None
    assert config.parse("server: {tls: {}}\n" + BASE).server.tls is None


def test_the_block_is_kept_as_written() -> None:
    got = config.parse(server_block(cert_file="c.pem", key_file="k.pem", ca_file="ca.pem"))
    assert got.server.tls == TlsConfig("c.pem", "k.pem", "ca.pem")
    assert config.parse(server_block(cert_file="c", key_file="k")).server.tls == TlsConfig("c", "k")


@pytest.mark.parametrize(
    ("server", "path"),
    [
        ("tls: {cert_file: c, key_file: k, password: p}", "server.tls.password"),
        ("tls: {cert_file: c}", "server.tls.key_file"),
        ("tls: {key_file: k}", "server.tls.cert_file"),
        ("tls: {ca_file: ca}", "server.tls.cert_file"),
        ("tls: {cert_file: 5, key_file: k}", "server.tls.cert_file"),
        ("tls: {cert_file: c, key_file: ''}", "server.tls.key_file"),
        ("tls: {cert_file: c, key_file: k, ca_file: [a]}", "server.tls.ca_file"),
        ("tls: on", "server.tls"),
    ],
)
def test_a_wrong_block_names_its_path(server: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.parse(f"server: {{{server}}}\n" + BASE)
    assert info.value.path == path


def test_parsing_reads_no_file() -> None:
    """The files are read by server_context (serve, check-config, each serving process)."""
    tls = config.parse(server_block(cert_file="/nonexistent/c", key_file="/nonexistent/k"))
    assert tls.server.tls == TlsConfig("/nonexistent/c", "/nonexistent/k")


# ---------------------------------------------------------------- the files


def test_a_good_pair_serves_without_asking_clients(files: Files) -> None:
    context = server_context(TlsConfig(files.cert, files.key))
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_RENEGOTIATION


def test_a_ca_file_requires_client_certificates(files: Files) -> None:
    context = server_context(TlsConfig(files.cert, files.key, files.ca))
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1


def fault(tls: TlsConfig) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        server_context(tls)
    return info.value


def test_a_missing_file_is_named(files: Files) -> None:
    err = fault(TlsConfig(files.cert, str(files.tmp / "gone.pem")))
    assert err.path == "server.tls.key_file"
    assert "cannot read" in err.message and "gone.pem" in err.message
    assert fault(TlsConfig("/nonexistent/cert.pem", files.key)).path == "server.tls.cert_file"
    assert fault(TlsConfig(files.cert, files.key, "/nonexistent/ca")).path == "server.tls.ca_file"


def test_an_unreadable_file_is_named(files: Files) -> None:
    """A directory where the file should be (read permissions do not bind root)."""
    err = fault(TlsConfig(str(files.tmp), files.key))
    assert err.path == "server.tls.cert_file" and "cannot read" in err.message


def test_files_swapped_are_named(files: Files) -> None:
    assert fault(TlsConfig(files.key, files.cert)).path == "server.tls.cert_file"
    err = fault(TlsConfig(files.cert, files.cert))
    assert (err.path, "no PEM private key" in err.message) == ("server.tls.key_file", True)


def test_a_key_of_another_certificate_is_named(files: Files) -> None:
    err = fault(TlsConfig(files.cert, files.other_key))
    assert err.path == "server.tls.key_file"
    assert "is not the key of cert_file" in err.message


def test_a_broken_certificate_is_named(files: Files) -> None:
    pem = Path(files.cert).read_text()
    lines = pem.splitlines()
    lines[3] = "A" * len(lines[3])  # its body no longer DER
    err = fault(TlsConfig(files.write("broken.pem", "\n".join(lines) + "\n"), files.key))
    assert err.path == "server.tls.cert_file"
    assert fault(TlsConfig(files.cert, files.key, files.key)).path == "server.tls.ca_file"


def test_an_encrypted_key_is_refused_without_asking_for_its_password(files: Files) -> None:
    key = serialization.load_pem_private_key(Path(files.key).read_bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    err = fault(TlsConfig(files.cert, files.write("encrypted.pem", encrypted)))
    assert err.path == "server.tls.key_file" and "encrypted" in err.message


def test_text_around_the_pem_blocks_is_ignored(files: Files) -> None:
    """As `openssl pkcs12` writes them: bag attributes (a name may be anything) first."""
    pem = "Bag Attributes\n    friendlyName: sérvér\n" + Path(files.cert).read_text()
    assert server_context(TlsConfig(files.write("bagged.pem", pem), files.key))
