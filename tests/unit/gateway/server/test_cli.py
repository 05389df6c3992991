"""The CLI's make-tiny-model: one real build (about 5 s), a skip, a forced rebuild, and its errors.

Each case runs `python -m gateway make-tiny-model` in a subprocess, as a user (and `make run`) does.
Then `gateway serve`'s flags for the listener's limits: each over its config key, and what they
make of uvicorn's Config.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from gateway.config import HEAD_BYTES, HEADERS, ServerConfig, ServerTimeouts
from gateway.server import cli
from gateway.server.protocol import ListenerLimits
from providers import tiny_model

ROOT = Path(__file__).resolve().parents[4]
HEAVY = ("torch", "transformers", "tokenizers", "vllm", "yaml", "aiohttp", "uvicorn")


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def gateway(*args: str, prelude: str = "") -> Run:
    """`python -m gateway ARGS`; `prelude` runs first in the same interpreter (to hide modules)."""
    cmd = [sys.executable, "-m", "gateway", *args]
    if prelude:
        main = "import sys\nfrom gateway.server.cli import main\nsys.exit(main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", f"{prelude}\n{main}", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The one real build of the module, into a directory that does not exist yet."""
    path = tmp_path_factory.mktemp("cli") / "models" / "tiny"
    return path, gateway("make-tiny-model", str(path))


def test_build_writes_the_model_and_its_stamp(built: tuple[Path, Run]) -> None:
    path, run = built
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"wrote the tiny model to {path} (")
    assert run.stdout.rstrip().endswith(" s")  # how long it took
    for name in tiny_model.REQUIRED_FILES:
        assert (path / name).is_file(), name
    stamp = json.loads((path / tiny_model.STAMP).read_text())
    assert stamp["recipe_version"] == tiny_model.RECIPE_VERSION
    assert stamp["vocab_size"] == tiny_model.VOCAB_SIZE
    assert stamp["head_dim"] == 32
    assert tiny_model.is_complete(path)
    assert [p.name for p in path.parent.iterdir()] == ["tiny"]  # no temporary directory left


def test_second_run_skips_fast(built: tuple[Path, Run]) -> None:
    path, _ = built
    weights = path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    run = gateway("make-tiny-model", str(path))
    assert run.returncode == 0, run.stderr
    assert "is current" in run.stdout and "--force" in run.stdout
    assert weights.stat().st_mtime_ns == before
    assert run.seconds < 5  # no torch import: interpreter start and a stamp read


def test_force_rebuilds_the_same_model(built: tuple[Path, Run]) -> None:
    path, _ = built
    weights = path / "model.safetensors"
    before, content = weights.stat().st_ino, weights.read_bytes()
    run = gateway("make-tiny-model", str(path), "--force")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"wrote the tiny model to {path} (")
    assert weights.stat().st_ino != before  # new files, renamed into place
    assert weights.read_bytes() == content  # seeded: the same build gives the same weights
    assert tiny_model.is_complete(path)
    assert [p.name for p in path.parent.iterdir()] == ["tiny"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "the following arguments are required: DIR"),
        (("a", "b"), "unrecognized arguments: b"),
        (("a", "--fast"), "unrecognized arguments: --fast"),
    ],
)
def test_argument_errors(args: tuple[str, ...], message: str) -> None:
    run = gateway("make-tiny-model", *args)
    assert run.returncode == 2
    assert message in run.stderr
    assert run.stderr.startswith("usage: gateway ")  # argparse: usage, then the error


def test_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    run = gateway("make-tiny-model", str(target))
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == f"error: make-tiny-model: {target} exists and is not a directory\n"
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("force", [False, True])
def test_refuses_a_directory_that_is_not_a_tiny_model(tmp_path: Path, force: bool) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    run = gateway("make-tiny-model", str(tmp_path), *(["--force"] if force else []))
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.count("\n") == 1
    assert "is not empty and holds no tiny model" in run.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_missing_engine_dependencies_say_how_to_install(tmp_path: Path) -> None:
    """With VLLM=none there is no torch/transformers/tokenizers: one line, exit 1, the fix."""
    hide = "import sys\nfor m in ('torch', 'transformers'): sys.modules[m] = None"
    run = gateway("make-tiny-model", str(tmp_path / "tiny"), prelude=hide)
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith("error: make-tiny-model needs torch and transformers, ")
    assert "make install" in run.stderr
    assert not (tmp_path / "tiny").exists()


def test_importing_the_cli_stays_cheap() -> None:
    code = f"import sys, gateway.server.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_help_lists_the_command() -> None:
    run = gateway("--help")
    assert run.returncode == 0
    assert "make-tiny-model" in run.stdout


def test_check_config_reads_gateway_config_without_a_path(tmp_path: Path) -> None:
    """As in the image: `gateway check-config` checks the file the server would read."""
    path = tmp_path / "mounted.yaml"
    path.write_text("providers: {}\nmodels: {}\n")
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_CONFIG": str(path)}
    run = subprocess.run([sys.executable, "-m", "gateway", "check-config"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith(f"{path}: ok"), run.stderr


def test_check_config_checks_the_file_store(tmp_path: Path) -> None:
    """The store is checked as the server would use it, without storing anything; where the
    batches' leases are is said."""
    path = tmp_path / "gateway.yaml"
    store = tmp_path / "files"
    path.write_text(
        f"providers: {{}}\nmodels: {{}}\nfiles: {{store: {store}}}\n"
        "rate_limit: {backend: redis}\n"
    )
    run = gateway("check-config", str(path))
    assert run.returncode == 0, run.stderr
    assert f"files and batches in the directory {store} (made when" in run.stdout
    assert "batch leases in Redis" in run.stdout and not store.exists()
    path.write_text("providers: {}\nmodels: {}\nfiles: {store: 'az://'}\n")
    run = gateway("check-config", str(path))
    assert run.returncode == 1 and "config error: files.store: not a usable store" in run.stderr


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_shutdown_timeout_must_be_seconds(value: str) -> None:
    run = gateway("serve", "--shutdown-timeout", value)
    assert run.returncode == 2
    assert f"--shutdown-timeout: expected seconds >= 0, got '{value}'" in run.stderr


# ---------------------------------------------------------------- serve's listener flags


def _key(server: ServerConfig, key: str) -> object:
    value: object = server
    for part in key.split("."):
        value = getattr(value, part)
    return value


def test_listener_flags_name_their_key_and_its_default() -> None:
    defaults = ServerConfig()
    helped = " ".join(gateway("serve", "--help").stdout.split())
    for flag, key, default, *_ in cli.LISTENER_FLAGS:
        assert float(default) == _key(defaults, key), flag
        assert f"{flag} " in helped and f"overrides server.{key} (default {default})" in helped
    assert (cli.HEAD_BYTES, cli.HEADERS) == (HEAD_BYTES, HEADERS)


def test_listener_flags_override_the_config() -> None:
    args = cli._parser().parse_args(
        ["serve", "--max-head-bytes", "2048", "--head-timeout", "0.5", "--max-connections", "7"]
    )
    server = cli._overridden(ServerConfig(max_headers=20, timeouts=ServerTimeouts(body_s=9)), args)
    assert (server.max_head_bytes, server.max_headers, server.max_connections) == (2048, 20, 7)
    assert server.timeouts == ServerTimeouts(head_s=0.5, body_s=9)


def test_the_listener_limits_reach_uvicorns_config() -> None:
    """The keep-alive and the cap on connections as uvicorn's own settings (which answer 503 when
    the open connections, the new one among them, reach limit_concurrency); the rest for the
    gateway's protocol."""
    args = cli._parser().parse_args(["serve", "--keep-alive", "2.5", "--max-headers", "9"])
    server = cli._overridden(ServerConfig(max_connections=10), args)
    config = cli._uvicorn_config(uvicorn, args, "127.0.0.1", 8080, server)
    assert config.timeout_keep_alive == 2.5 and config.limit_concurrency == 11
    assert config.listener == ListenerLimits(max_headers=9)


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--max-head-bytes", "100", "a whole number from 1024 to 1048576"),
        ("--max-headers", "0", "a whole number from 1 to 10000"),
        ("--max-connections", "x", "a whole number >= 1"),
        ("--head-timeout", "0", "seconds > 0"),
        ("--body-timeout", "soon", "seconds > 0"),
        ("--keep-alive", "inf", "seconds > 0"),
    ],
)
def test_listener_flags_are_checked(
    flag: str, value: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli._parser().parse_args(["serve", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: expected {expected}, got '{value}'" in capsys.readouterr().err
