"""The memory backend's money in the files store: a restart loses nothing, two processes on one
directory add up, and a gateway with nothing to keep makes no directory."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from gateway.governance.keeper import OBJECT, Keeper
from gateway.jobs.filestore import FileStore
from gateway.ratelimit.memory import MemoryBackend


def keeper(backend: MemoryBackend, where: Path) -> Keeper:
    return Keeper(backend, FileStore(str(where), 1 << 20))


async def test_a_restart_finds_the_budgets_and_the_ledger(tmp_path: Path) -> None:
    first = MemoryBackend()
    kept = keeper(first, tmp_path)
    await kept.start()
    first.spend(("s:20261128", ("k:a", "t:t"), 5))
    first.spent["b:k:a:all"] = 10**18 + 7  # past what a double holds: kept exactly
    first.expiry["b:k:a:all"] = float("inf")
    await kept.aclose()

    again = MemoryBackend()
    restarted = keeper(again, tmp_path)
    await restarted.start()
    assert again.ledger == {("s:20261128", "k:a"): 5, ("s:20261128", "t:t"): 5}
    assert again.spent == {"b:k:a:all": 10**18 + 7}
    await restarted.aclose()


async def test_two_processes_on_one_directory_add_up(tmp_path: Path) -> None:
    a, b = MemoryBackend(), MemoryBackend()
    ka, kb = keeper(a, tmp_path), keeper(b, tmp_path)
    await ka.start()
    await kb.start()
    a.spend(("s:20261128", ("k:x",), 5))
    b.spend(("s:20261128", ("k:x",), 7))
    await ka.flush()
    await kb.flush()
    await ka.flush()  # takes b's in
    assert a.ledger == b.ledger == {("s:20261128", "k:x"): 12}
    await ka.aclose()
    await kb.aclose()
    held = orjson.loads((tmp_path / OBJECT).read_bytes())
    assert held["ledger"] == {"s:20261128": {"k:x": 12}}


async def test_periods_gone_and_days_past_400_are_dropped(tmp_path: Path) -> None:
    backend = MemoryBackend()
    kept = keeper(backend, tmp_path)
    await kept.start()
    backend.spent.update({"b:k:a:d20200101": 3, "b:k:a:all": 4})
    backend.expiry.update({"b:k:a:d20200101": time.time() - 1, "b:k:a:all": float("inf")})
    backend.spend(("s:20200101", ("k:a",), 3))
    backend.spend(("s:29991231", ("k:a",), 4))
    await kept.flush()
    assert backend.spent == {"b:k:a:all": 4}
    assert backend.ledger == {("s:29991231", "k:a"): 4}
    await kept.aclose()


async def test_nothing_to_keep_makes_no_directory(tmp_path: Path) -> None:
    where = tmp_path / "files"
    kept = keeper(MemoryBackend(), where)
    await kept.start()
    await kept.aclose()
    assert not where.exists()
