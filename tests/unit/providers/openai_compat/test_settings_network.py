"""A provider block's network keys (providers/openai_compat/settings.py): `tls`, `proxy` and
`idle_timeout_s`, read and checked as `gateway check-config` checks them, each error naming its
YAML path and never a proxy's credentials."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from core.errors import ConfigError
from providers.openai_compat.settings import Settings, parse_settings
from providers.transport.client import KEEPALIVE_S

PATH = "providers.internal"
HTTPS = "https://llm.internal:8443/v1"
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def no_environment_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("pems")
    ca = trustme.CA()
    client = ca.issue_cert("gateway@example")
    paths = {name: where / f"{name}.pem" for name in ("ca", "cert", "key", "stranger-key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    trustme.CA().issue_cert("x@example").private_key_pem.write_to_path(str(paths["stranger-key"]))
    return {name: str(path) for name, path in paths.items()}


def parsed(base_url: str = HTTPS, **block: Any) -> Settings:
    return parse_settings({"type": "openai-compatible", "base_url": base_url, **block}, PATH)


def refused(**block: Any) -> ConfigError:
    base_url = block.pop("base_url", HTTPS)
    with pytest.raises(ConfigError) as caught:
        parsed(base_url, **block)
    return caught.value


# ---------------------------------------------------------------- defaults


def test_the_defaults() -> None:
    settings = parsed()
    assert settings.tls is None  # the default context, built at start
    assert settings.proxy is None
    assert settings.idle_timeout_s == KEEPALIVE_S == 30.0


# ---------------------------------------------------------------- tls


def test_a_private_ca_and_a_client_certificate(pems: dict[str, str]) -> None:
    tls = {"ca_file": pems["ca"], "cert_file": pems["cert"], "key_file": pems["key"]}
    context = parsed(tls=tls).tls
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED


def test_verify_false() -> None:
    context = parsed(tls={"verify": False}).tls
    assert context is not None and context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("tls", "path", "says"),
    [
        ({"ca_file": "/etc/gateway/missing.pem"}, "tls.ca_file", "cannot read"),
        ({"ca_file": 3}, "tls.ca_file", "expected a file's path"),
        ({"ca_file": ""}, "tls.ca_file", "expected a file's path"),
        (
            {"cert_file": "cert", "key_file": "/etc/gateway/nokey.pem"},
            "tls.key_file",
            "cannot read",
        ),
        ({"cert_file": "cert", "key_file": "stranger-key"}, "tls.cert_file", "do not load"),
        ({"key_file": "key"}, "tls.key_file", "needs cert_file"),
        ({"verify": "no"}, "tls.verify", "true or false"),
        ({"verify": False, "ca_file": "ca"}, "tls.ca_file", "of no use"),
        ({"ca": "ca"}, "tls.ca", "unknown key"),
    ],
)
def test_tls_errors_name_their_path(
    pems: dict[str, str], tls: dict[str, Any], path: str, says: str
) -> None:
    given = {k: pems.get(v, v) if isinstance(v, str) else v for k, v in tls.items()}
    err = refused(tls=given)
    assert err.path == f"{PATH}.{path}" and says in err.message, err


def test_tls_is_for_https_upstreams_only() -> None:
    err = refused(base_url="http://llm.internal/v1", tls={"verify": False})
    assert err.path == f"{PATH}.tls" and "https" in err.message


def test_tls_must_be_a_mapping() -> None:
    assert refused(tls="on").path == f"{PATH}.tls"


def test_an_unreadable_file_is_named(pems: dict[str, str], tmp_path: Path) -> None:
    locked = tmp_path / "locked.pem"
    locked.write_bytes(Path(pems["ca"]).read_bytes())
    locked.chmod(0)
    try:
        with open(locked, "rb"):
            pytest.skip("root reads any file")
    except PermissionError:
        pass
    err = refused(tls={"ca_file": str(locked)})
    assert err.path == f"{PATH}.tls.ca_file" and "Permission denied" in err.message


# ---------------------------------------------------------------- proxy


def test_a_proxy_of_the_providers_own() -> None:
    proxy = parsed(proxy="http://user:p%40ss@proxy.corp:3128").proxy
    assert proxy is not None and proxy.shown == "http://proxy.corp:3128"
    assert proxy.authorization == "Basic " + base64.b64encode(b"user:p@ss").decode()


def test_the_environments_proxy_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://env.proxy:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain.proxy:8080")
    monkeypatch.setenv("NO_PROXY", "bypassed.internal")
    secure = parsed().proxy
    assert secure is not None and secure.shown == "http://env.proxy:3128"
    plain = parsed("http://llm.internal/v1").proxy
    assert plain is not None and plain.shown == "http://plain.proxy:8080"
    assert parsed("https://bypassed.internal/v1").proxy is None
    own = parsed(proxy="http://own.proxy:1").proxy
    assert own is not None and own.shown == "http://own.proxy:1"  # the config's wins


@pytest.mark.parametrize("none", ["none", "None", "NONE"])
def test_proxy_none_overrides_the_environment(monkeypatch: pytest.MonkeyPatch, none: str) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://env.proxy:3128")
    assert parsed(proxy=none).proxy is None


@pytest.mark.parametrize(
    ("proxy", "says"),
    [
        ("https://user:secret@proxy.corp:3128", "https:// proxies are not supported"),
        ("http://user:secret@proxy.corp:3128/x", "no path"),
        ("http://user:secret@proxy.corp:70000", "port"),
        ("", "expected a proxy's URL"),
        (3128, "expected a proxy's URL"),
    ],
)
def test_proxy_errors_name_their_path_and_never_the_password(proxy: Any, says: str) -> None:
    err = refused(proxy=proxy)
    assert err.path == f"{PATH}.proxy" and says in err.message, err
    assert "secret" not in str(err)


def test_a_bad_environment_proxy_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://user:secret@proxy.corp:1080")
    err = refused()
    assert err.path == f"{PATH}.proxy" and "https_proxy" in err.message
    assert "secret" not in str(err)
    assert parsed(proxy="none").proxy is None  # and the way out


def test_proxy_authorization_is_not_a_header_to_configure() -> None:
    err = refused(headers={"Proxy-Authorization": "Basic eDp5"})
    assert err.path == f"{PATH}.headers.Proxy-Authorization"


# ---------------------------------------------------------------- idle_timeout_s


def test_idle_timeout() -> None:
    assert parsed(idle_timeout_s=5).idle_timeout_s == 5.0
    assert parsed(idle_timeout_s=0.5).idle_timeout_s == 0.5


@pytest.mark.parametrize("value", [0, -1, 3600, "30", True])
def test_a_bad_idle_timeout_is_named(value: Any) -> None:
    err = refused(idle_timeout_s=value)
    assert err.path == f"{PATH}.idle_timeout_s" and "seconds" in err.message
