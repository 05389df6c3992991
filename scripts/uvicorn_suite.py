"""Fetch uvicorn's own HTTP protocol tests, which tests/protocol_suite runs against the gateway's
protocol (gateway/server/protocol.py).

They come from uvicorn's source distribution on PyPI (pip download: CI reaches PyPI and nothing
else), at the installed version (pyproject.toml keeps it below the next minor): the tests drive
the installed uvicorn's Config and ServerState. Once per version, into
.venv/uvicorn-tests/<version>/ (git-ignored with the venv, kept out of `make lint`): the protocol
tests as uvicorn_test_http.py, the helper they import (response.py) and uvicorn's licence. Prints
that directory.

    python scripts/uvicorn_suite.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".venv" / "uvicorn-tests"
# The sdist's files the harness needs, and their names in the cache.
MEMBERS = {
    "tests/protocols/test_http.py": "uvicorn_test_http.py",
    "tests/response.py": "response.py",
    "LICENSE.md": "LICENSE.md",
}


def installed_version() -> str:
    """The installed uvicorn's version (pyproject.toml keeps it below the next minor, whose
    internals gateway/server/protocol.py may not match): its own tests are the ones to run."""
    return metadata.version("uvicorn")


def download(release: str, into: Path) -> Path:
    """uvicorn's sdist at `release`, through pip (which checks the index's hash)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--no-deps", "--no-binary", ":all:", f"uvicorn=={release}", "-d", str(into)]
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"pip could not download uvicorn {release}'s sdist (above: why)")
    (sdist,) = into.glob(f"uvicorn-{release}.tar.gz")
    return sdist


def unpack(sdist: Path, release: str, into: Path) -> None:
    with tarfile.open(sdist) as archive:
        for member, name in MEMBERS.items():
            try:
                source = archive.extractfile(f"uvicorn-{release}/{member}")
            except KeyError:
                source = None
            if source is None:
                raise SystemExit(f"{sdist.name} has no file {member}")
            (into / name).write_bytes(source.read())


def complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MEMBERS.values())


def fetch(release: str) -> Path:
    """The cache directory of `release`, filled first if it is not: staged, then renamed into
    place, so that it is whole or absent (a run beside this one may have filled it meanwhile)."""
    target = CACHE / release
    if complete(target):
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        staged = Path(work) / "suite"
        staged.mkdir()
        unpack(download(release, Path(work)), release, staged)
        if not complete(target):
            shutil.rmtree(target, ignore_errors=True)
            staged.rename(target)
    return target


def main() -> None:
    print(fetch(installed_version()))


if __name__ == "__main__":
    main()
