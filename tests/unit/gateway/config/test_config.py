"""Config loading: typed result, ${ENV} substitution, and errors that name the YAML path."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from gateway import config
from gateway.routing.trees import Group
from gateway.server.cli import is_loopback

ROOT = Path(__file__).resolve().parents[4]

GOOD = """
server: {host: 127.0.0.1, port: 9000}
auth:
  keys:
    - {id: a, key: sk-a, models: ["llama-*"], providers: [fw]}
    - {id: b, key_sha256: SHA_OF_SK_B}
providers:
  fw: {type: fireworks, base_url: "https://fw.example/inference/v1", api_key: "${FW_KEY}"}
  vl: {type: vllm-server, base_url: "http://vllm:8000/v1"}
models:
  llama-8b:
    strategy: fallback
    targets:
      - {provider: vl, model: meta-llama/Llama-3.1-8B, weight: 3}
      - {provider: fw, model: accounts/fireworks/models/llama-v3p1-8b-instruct}
    timeout_s: 30
    defaults: {context_length_exceeded_behavior: truncate}
    unsupported_params: drop
""".replace("SHA_OF_SK_B", hashlib.sha256(b"sk-b").hexdigest())


def test_good_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_KEY", "secret")
    cfg = config.parse(GOOD)
    assert cfg.server.port == 9000
    assert [k.id for k in cfg.keys] == ["a", "b"]
    assert cfg.keys[0].sha256 == hashlib.sha256(b"sk-a").digest()
    model = cfg.models["llama-8b"]
    assert isinstance(model.tree, Group) and model.tree.mode == "fallback"
    assert [t.label for t in model.targets] == [
        "vl/meta-llama/Llama-3.1-8B",
        "fw/accounts/fireworks/models/llama-v3p1-8b-instruct",
    ]
    assert model.tree.weights == (3.0, 1.0)
    assert model.targets[0].unsupported_params == "drop"
    assert model.targets[0].timeout_s == 30
    assert model.targets[0].defaults == {"context_length_exceeded_behavior": "truncate"}
    assert not cfg.has_dev_key()


BROKEN = [
    ("providers:\n  x: {type: fireworx, base_url: 'http://a'}\n", "providers.x.type"),
    ("models:\n  m: {targets: [{provider: nope}]}\n", "models.m.targets[0].provider"),
    ("models:\n  m: {targets: []}\n", "models.m.targets"),
    ("models:\n  m: {strategy: random, targets: [{provider: p}]}\n", "models.m.strategy"),
    (
        "models:\n  m: {targets: [{provider: p}], defaults: {temperature: 9}}\n",
        "models.m.defaults.temperature",
    ),
    (
        "models:\n  m: {targets: [{provider: p}], defaults: {prompt: x}}\n",
        "models.m.defaults.prompt",
    ),
    (
        "models:\n  m: {targets: [{provider: p}], unsupported_params: ignore}\n",
        "models.m.unsupported_params",
    ),
    ("models:\n  m: {targets: [{provider: p, colour: red}]}\n", "models.m.targets[0].colour"),
    ("auth:\n  keys: [{id: a}]\n", "auth.keys[0]"),
    ("auth:\n  keys: [{id: a, key_sha256: abc}]\n", "auth.keys[0].key_sha256"),
    ("auth:\n  keys: [{id: a, key: k}, {id: a, key: j}]\n", "auth.keys[1].id"),
    ("auth:\n  keys: [{id: a, key: k, providers: [zzz]}]\n", "auth.keys[0].providers[0]"),
    ("auth:\n  keys: [{id: a, key: '${NO_SUCH_VAR_X}'}]\n", "auth.keys[0].key"),
    ("server: {port: 99999}\n", "server.port"),
    ("server: {limits: {max_n: 0}}\n", "server.limits.max_n"),
    ("server: {max_head_bytes: 1023}\n", "server.max_head_bytes"),
    ("server: {max_head_bytes: 2097152}\n", "server.max_head_bytes"),
    ("server: {max_headers: 0}\n", "server.max_headers"),
    ("server: {max_connections: 0}\n", "server.max_connections"),
    ("server: {max_connections: many}\n", "server.max_connections"),
    ("server: {timeouts: 5}\n", "server.timeouts"),
    ("server: {timeouts: {head_s: 0}}\n", "server.timeouts.head_s"),
    ("server: {timeouts: {body_s: soon}}\n", "server.timeouts.body_s"),
    ("server: {timeouts: {keep_alive_s: .inf}}\n", "server.timeouts.keep_alive_s"),
    ("server: {timeouts: {keep_alive_s: -1}}\n", "server.timeouts.keep_alive_s"),
    ("server: {timeouts: {idle_s: 5}}\n", "server.timeouts.idle_s"),
    ("surprise: 1\n", "surprise"),
]
PROVIDER = "providers:\n  p: {type: openai-compatible, base_url: 'http://127.0.0.1:1/v1'}\n"


@pytest.mark.parametrize(("text", "path"), BROKEN, ids=[b[1] for b in BROKEN])
def test_errors_name_the_yaml_path(text: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.parse(text if text.startswith("providers") else PROVIDER + text)
    assert info.value.path == path


def test_listener_limits_default_safely() -> None:
    server = config.parse(PROVIDER).server
    assert (server.max_head_bytes, server.max_headers, server.max_connections) == (65536, 100, 2048)
    assert server.timeouts == config.ServerTimeouts(head_s=10, body_s=30, keep_alive_s=5)


def test_listener_limits_are_read() -> None:
    server = config.parse(
        PROVIDER + "server:\n  max_head_bytes: 8192\n  max_headers: 20\n  max_connections: 3\n"
        "  timeouts: {head_s: 0.5, body_s: 2, keep_alive_s: 1.5}\n"
    ).server
    assert (server.max_head_bytes, server.max_headers, server.max_connections) == (8192, 20, 3)
    assert server.timeouts == config.ServerTimeouts(head_s=0.5, body_s=2.0, keep_alive_s=1.5)
    partial = config.parse(PROVIDER + "server: {timeouts: {body_s: 60}}\n").server.timeouts
    assert partial == config.ServerTimeouts(body_s=60)  # the others at their defaults


def test_env_default_syntax(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNSET_URL", raising=False)
    cfg = config.parse(
        "providers:\n  p: {type: vllm-server, base_url: '${UNSET_URL:-http://h:1/v1}'}\n"
    )
    assert "p" in cfg.providers


def test_default_config_is_valid_and_uses_the_dev_key() -> None:
    cfg = config.load(ROOT / "config.yaml")
    assert cfg.has_dev_key()
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8080
    # the listener's keys, written out there with their defaults
    defaults = config.ServerConfig()
    assert (cfg.server.max_head_bytes, cfg.server.max_headers, cfg.server.max_connections) == (
        defaults.max_head_bytes,
        defaults.max_headers,
        defaults.max_connections,
    )
    assert cfg.server.timeouts == defaults.timeouts


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_check_config_names_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "providers:\n  vl: {type: vllm-server, base_url: 'http://v:1/v1'}\n"
        "models:\n  llama-8b:\n    targets:\n      - {provider: vl}\n      - {provider: fireworx}\n"
    )
    out = _cli("check-config", str(bad))
    assert out.returncode == 1
    assert "models.llama-8b.targets[1].provider: unknown provider 'fireworx'" in out.stderr
    assert _cli("check-config", str(ROOT / "config.yaml")).returncode == 0


def test_cli_hash_key() -> None:
    out = _cli("hash-key", "sk-local-dev")
    assert out.stdout.strip() == hashlib.sha256(b"sk-local-dev").hexdigest()


def test_cli_refuses_dev_key_beyond_loopback() -> None:
    out = _cli("serve", "--config", str(ROOT / "config.yaml"), "--host", "0.0.0.0", "--port", "1")
    assert out.returncode == 2
    assert "sk-local-dev" in out.stderr
