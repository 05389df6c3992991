"""The store of runtime keys and teams, on both storages (a real redis-server; the files store in
a directory): two `Accounts` on one storage stand for two replicas (or worker processes). A
change made by one is seen by the other at its next read or poll; creations of one id race
and exactly one wins; changes decided on a stale set are decided again; a storage that cannot
answer keeps the last set in use; records read back as they were written; the YAML beside it."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError, Conflict, ServiceUnavailable
from gateway.config import Config, KeyConfig, parse
from gateway.config.accounts import Rotated
from gateway.governance import edits, file_storage, records
from gateway.governance.budgets import Budget
from gateway.governance.file_storage import FileStorage
from gateway.governance.redis_storage import RedisStorage
from gateway.governance.storage import Storage
from gateway.governance.store import Accounts, AccountSet, clash, storage_settings
from gateway.ratelimit import KeyLimits, Limits, RateLimitConfig
from tests.redis_proc import RedisServer

Make = Callable[[], Storage]


def config(**sections: Any) -> Config:
    doc: dict[str, Any] = {
        "auth": {"keys": [{"id": "yaml-key", "key": "sk-yaml"}]},
        "providers": {"up": {"type": "openai", "base_url": "http://up.invalid/v1"}},
        "teams": {"yaml-team": {"models": ["*"]}},
        **sections,
    }
    return parse(yaml.safe_dump(doc))


CONFIG = config()


def redis_config(redis: RedisServer) -> RateLimitConfig:
    return RateLimitConfig(backend="redis", redis_url=redis.url)


@pytest.fixture(params=["redis", "files"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    """New storages on one place, as each replica opens its own."""
    if request.param == "redis":
        cfg = redis_config(request.getfixturevalue("redis"))
        return lambda: RedisStorage(cfg)
    return lambda: FileStorage(str(tmp_path / "store"))


@pytest.fixture
async def replicas(make: Make) -> AsyncIterator[tuple[Accounts, Accounts]]:
    a, b = Accounts(make()), Accounts(make())
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def create(key_id: str, **fields: Any) -> edits.Decide[edits.Issued]:
    return edits.create_key(CONFIG, {"id": key_id, **fields})


# ---------------------------------------------------------------- replicas


async def test_a_change_made_on_one_replica_is_read_by_the_other(
    replicas: tuple[Accounts, Accounts],
) -> None:
    a, b = replicas
    issued = await a.change(create("k1", limits={"rpm": 5}))
    assert a.current.keys["k1"] == issued.key  # the replica that made it, at once
    assert (await b.sync()).keys["k1"] == issued.key
    await a.change(edits.delete_key(CONFIG, "k1"))
    assert "k1" not in (await b.sync()).keys


async def test_the_poll_tells_the_listener(replicas: tuple[Accounts, Accounts]) -> None:
    a, b = replicas
    seen: asyncio.Queue[AccountSet] = asyncio.Queue()
    b.listen(seen.put_nowait)
    await a.change(create("polled"))
    while "polled" not in (await asyncio.wait_for(seen.get(), 10)).keys:
        pass


async def test_one_id_created_at_once_on_two_replicas_is_made_once(
    replicas: tuple[Accounts, Accounts],
) -> None:
    a, b = replicas
    results = await asyncio.gather(
        a.change(create("same")), b.change(create("same")), return_exceptions=True
    )
    made = [r for r in results if isinstance(r, edits.Issued)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert len(made) == len(refused) == 1 and refused[0].param == "id"
    assert (await a.sync()).keys["same"].sha256 == made[0].key.sha256
    assert (await b.sync()).keys["same"].sha256 == made[0].key.sha256


async def test_changes_decided_on_a_stale_set_are_decided_again(
    replicas: tuple[Accounts, Accounts],
) -> None:
    a, b = replicas
    made = [r.change(create(f"k{i}-{n}")) for n, r in enumerate((a, b)) for i in range(10)]
    await asyncio.gather(*made)
    assert (
        set((await a.sync()).keys)
        == set((await b.sync()).keys)
        == {f"k{i}-{n}" for n in range(2) for i in range(10)}
    )


async def test_a_team_is_not_deleted_under_a_key_made_elsewhere(
    replicas: tuple[Accounts, Accounts],
) -> None:
    a, b = replicas
    await a.change(edits.create_team(CONFIG, {"id": "t"}))
    await b.sync()
    await a.change(create("member", team="t"))
    with pytest.raises(Conflict) as refused:
        await b.change(edits.delete_team(CONFIG, "t"))  # b's set was read before the key
    assert "member" in refused.value.message


# ---------------------------------------------------------------- storage failing


async def test_redis_down_keeps_the_last_set_and_refuses_changes(redis: RedisServer) -> None:
    accounts = Accounts(RedisStorage(redis_config(redis)))
    await accounts.start()
    try:
        await accounts.change(create("kept"))
        redis.kill()
        with pytest.raises(ServiceUnavailable):
            await accounts.change(create("new"))
        with pytest.raises(ServiceUnavailable):
            await accounts.sync()
        assert set(accounts.current.keys) == {"kept"}
        redis.start()  # empty: what it held is gone, and the replicas follow it
        assert (await accounts.sync()).keys == {}
        await accounts.change(create("after"))
        assert set(accounts.current.keys) == {"after"}
    finally:
        await accounts.aclose()


async def test_a_store_that_cannot_answer_at_start_is_read_later(redis: RedisServer) -> None:
    cfg = redis_config(redis)
    writer = Accounts(RedisStorage(cfg))
    await writer.change(create("early"))
    await writer.aclose()
    redis.pause()
    late = Accounts(RedisStorage(cfg))
    try:
        await late.start()  # no answer: nothing read yet, and no error
        assert late.current.keys == {}
        redis.resume()
        assert set((await late.sync()).keys) == {"early"}
    finally:
        redis.resume()
        await late.aclose()


async def test_a_record_that_cannot_be_read_is_left_out(redis: RedisServer) -> None:
    accounts = Accounts(RedisStorage(redis_config(redis)))
    try:
        await accounts.change(create("good"))
        redis.command("HSET", "{llmgw}:accounts:keys", "bad", "[1]")
        redis.command("HSET", "{llmgw}:accounts:keys", "worse", "{not-json")
        redis.command("SET", "{llmgw}:accounts:version", "x:99")
        assert set((await accounts.sync()).keys) == {"good"}
    finally:
        await accounts.aclose()


# ---------------------------------------------------------------- the files store


async def test_the_files_store_keeps_the_set_across_a_restart(tmp_path: Path) -> None:
    where = str(tmp_path / "store")
    first = Accounts(FileStorage(where))
    issued = await first.change(create("kept", budget={"usd": "1.5", "period": "day"}))
    await first.aclose()
    again = Accounts(FileStorage(where))
    await again.start()
    try:
        assert again.current.keys["kept"] == issued.key
    finally:
        await again.aclose()


async def test_files_store_never_holds_a_secret(tmp_path: Path) -> None:
    accounts = Accounts(FileStorage(str(tmp_path)))
    issued = await accounts.change(create("k"))
    stored = b"".join(p.read_bytes() for p in await asyncio.to_thread(_json_files, tmp_path))
    assert issued.secret.encode() not in stored
    assert hashlib.sha256(issued.secret.encode()).hexdigest().encode() in stored
    await accounts.aclose()


def _json_files(root: Path) -> list[Path]:
    return list(root.rglob("*.json"))


async def test_a_store_that_does_not_exist_is_not_made_by_reading(tmp_path: Path) -> None:
    accounts = Accounts(FileStorage(str(tmp_path / "never")))
    await accounts.start()
    await accounts.sync()
    await accounts.aclose()
    assert not (tmp_path / "never").exists()


async def test_old_versions_are_pruned_and_a_process_far_behind_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_storage, "KEEP", 3)
    where = str(tmp_path)
    writer, behind = Accounts(FileStorage(where)), Accounts(FileStorage(where))
    await behind.sync()
    await writer.change(create("k0"))
    assert set((await behind.sync()).keys) == {"k0"}
    for i in range(1, 8):
        await writer.change(create(f"k{i}"))
    assert len(list((tmp_path / "_gateway" / "accounts").iterdir())) == 3
    monkeypatch.setattr(file_storage, "RELIST_EVERY", 1)  # its next poll lists
    assert set((await behind.sync()).keys) == {f"k{i}" for i in range(8)}


# ---------------------------------------------------------------- records and the YAML


def test_a_record_reads_back_as_the_key_it_was() -> None:
    k = KeyConfig(
        id="k",
        sha256=b"\x01" * 32,
        models=("llama-*",),
        providers=("up",),
        limits=KeyLimits(Limits(rpm=5), (("gpt-*", Limits(tpm=100, max_parallel=2)),)),
        team="t",
        budget=Budget(1_500_000_000_000, "month"),
        model_budgets=(("gpt-*", Budget(10**11, "day")),),
        expires_at=1_900_000_000.5,
        rotated=(Rotated(b"\x02" * 32, 1_800_000_000.25),),
        runtime=True,
        created_at=1_700_000_000,
    )
    assert records.key_from_record("k", records.key_record(k)) == k
    team = edits.create_team(CONFIG, {"id": "t", "providers": ["up"], "limits": {"rpm": 3}})
    t = team(AccountSet()).result
    assert records.team_from_record("t", records.team_record(t)) == t


def test_an_id_in_the_yaml_and_the_store_is_refused_naming_its_yaml_path() -> None:
    # made before the YAML named it
    key = edits.create_key(config(auth={}), {"id": "yaml-key"})(AccountSet()).result.key
    held = AccountSet("1", {"yaml-key": key})
    two = config(auth={"keys": [{"id": "a", "key": "x"}, {"id": "yaml-key", "key": "y"}]})
    with pytest.raises(ConfigError) as refused:
        clash(two, held)
    assert refused.value.path == "auth.keys[1].id"
    team = edits.create_team(config(teams={}), {"id": "yaml-team"})(AccountSet()).result
    with pytest.raises(ConfigError) as refused:
        clash(CONFIG, AccountSet("1", teams={"yaml-team": team}))
    assert refused.value.path == "teams.yaml-team"


def test_a_yaml_team_that_runtime_keys_belong_to_stays() -> None:
    member = create("m", team="yaml-team")(AccountSet()).result.key
    with pytest.raises(ConfigError) as refused:
        clash(config(teams={}), AccountSet("1", {"m": member}))
    assert refused.value.path == "teams.yaml-team" and "'m'" in refused.value.message
    clash(CONFIG, AccountSet("1", {"m": member}))


def test_the_store_follows_the_limits_backend() -> None:
    redis = config(rate_limit={"backend": "redis", "redis_url": "redis://r:6379/0"})
    assert storage_settings(redis) == ("redis", "redis://r:6379/0", False, "llmgw")
    assert storage_settings(config(files={"store": "/x"})) == ("files", "/x")
    assert isinstance(Accounts.for_config(config()).storage, FileStorage)
