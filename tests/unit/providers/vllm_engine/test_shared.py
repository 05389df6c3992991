"""The shared engine core's parts that need no engine: a worker's slot from its environment, the
status pipe's reading, and the config's rate limits that several workers cannot share."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest
import yaml

from core.errors import ConfigError
from core.provider import SLOTS_ENV
from gateway.config import parse
from providers.vllm_engine.shared import EngineCore, Slot, StatusPipe, slot_of


def test_a_lone_process_has_no_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOTS_ENV, raising=False)
    assert slot_of("engine", "providers.engine") is None


def test_a_worker_finds_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    core = EngineCore("engine", {"model": "m"}, 3)
    slot = {**core.slot(2), "status_fd": 7}
    monkeypatch.setenv(SLOTS_ENV, json.dumps({"engine": slot}))
    found = slot_of("engine", "providers.engine")
    assert found == Slot(2, 3, str(slot["input_address"]), str(slot["output_address"]), 7)
    assert found.input_address.startswith("ipc://") and found.input_address != found.output_address
    assert found.client_addresses() == {
        "input_address": found.input_address,
        "output_address": found.output_address,
    }


def test_an_engine_added_while_workers_run_needs_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOTS_ENV, json.dumps({}))
    with pytest.raises(ConfigError) as caught:
        slot_of("added", "providers.added")
    assert caught.value.path == "providers.added"
    assert "restart" in str(caught.value)


def test_each_worker_has_its_own_addresses() -> None:
    core = EngineCore("engine", {"model": "m"}, 2)
    first, second = core.slot(0), core.slot(1)
    assert first["input_address"] != second["input_address"]
    assert first["output_address"] != second["output_address"]
    assert (first["count"], second["index"]) == (2, 1)


async def test_the_status_pipe_reads_what_the_serving_process_says() -> None:
    read, write = multiprocessing.Pipe(duplex=False)
    pipe = StatusPipe(os.dup(read.fileno()))
    read.close()
    write.send(("ready", ""))
    assert await pipe.next() == ("ready", "")
    write.send(("dead", "its process exited"))
    assert await pipe.next() == ("dead", "its process exited")
    write.close()  # the serving process is gone
    status, detail = await pipe.next()
    assert status == "dead" and "serving process" in detail
    pipe.close()


BASE = """
auth: {keys: [{id: a, key: sk-a, models: ["*"]}]}
providers: {up: {type: openai, base_url: "http://127.0.0.1:9/v1", api_key: k}}
models: {m: {targets: [{provider: up, model: x}]}}
"""
MEMORY_LIMITED = [
    ("models: {m: {targets: [{provider: up, model: x}], limits: {tpm: 10}}}", "models.m.limits"),
    ("auth: {keys: [{id: a, key: sk-a, models: ['*'], limits: {rpm: 3}}]}", "auth.keys[0]"),
    (
        "auth: {keys: [{id: a, key: sk-a, model_limits: {'m*': {max_parallel: 2}}}]}",
        "auth.keys[0]",
    ),
]


@pytest.mark.parametrize(("extra", "where"), MEMORY_LIMITED)
def test_several_workers_refuse_a_limit_counted_in_memory(extra: str, where: str) -> None:
    raw = yaml.safe_load(BASE)
    raw.update(yaml.safe_load(extra))
    config = parse(yaml.safe_dump(raw))
    config.check_workers(1)  # one worker: one count
    with pytest.raises(ConfigError) as caught:
        config.check_workers(2)
    assert caught.value.path == where
    assert "rate_limit.backend: redis" in caught.value.message


@pytest.mark.parametrize(("extra", "where"), MEMORY_LIMITED)
def test_several_workers_share_limits_in_redis(extra: str, where: str) -> None:
    raw = yaml.safe_load(BASE)
    raw.update(yaml.safe_load(extra))
    raw["rate_limit"] = {"backend": "redis"}
    parse(yaml.safe_dump(raw)).check_workers(4)


def test_several_workers_without_limits_start_on_memory() -> None:
    parse(BASE).check_workers(4)
