"""The CLI's make-tiny-model: one real build (about 5 s), a skip, a forced rebuild, and its errors.

Each case runs `python -m gateway make-tiny-model` in a subprocess, as a user (and `make run`) does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from providers import tiny_model

ROOT = Path(__file__).resolve().parents[2]
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
        main = "import sys\nfrom gateway.__main__ import main\nsys.exit(main(sys.argv[1:]))"
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
    code = f"import sys, gateway.__main__; print([m for m in {HEAVY!r} if m in sys.modules])"
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
