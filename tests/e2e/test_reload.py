"""Hot reload of the config file in a gateway process: a change to the file (watched every
0.2 s) or a SIGHUP applies to new requests; streams under way finish on the config they began
with; an invalid file is refused (the log names its YAML path, the metrics count it) and the
running config stays; the memory rate limiter's counts carry over.

One gateway for the module; each test writes the whole config, with a marker alias `v<N>` that
shows (in /v1/models) when that version is in effect."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from openai import NotFoundError, OpenAI, RateLimitError

from core.errors import ConfigError
from gateway.config import parse
from tests.e2e.metrics_text import Scrape, scrape
from tests.e2e.support import POLL_DEADLINE_S, POLL_INTERVAL_S
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream

KEY, TIGHT_KEY = "sk-reload", "sk-reload-tight"
MODEL = "gpt-test"
WATCH_S = 0.2


def config(upstream: str, version: int, **changes: Any) -> dict[str, Any]:
    """The module's config: alias `stay` always; `changes` replace top-level sections or add
    to them (`models`, `providers`: merged; `server`: merged)."""
    provider = {"type": "openai", "base_url": upstream, "api_key": OPENAI_TEST_KEY}
    target = [{"provider": "up", "model": MODEL}]
    cfg: dict[str, Any] = {
        "server": {"watch_config_s": WATCH_S},
        "auth": {
            "keys": [
                {"id": "main", "key": KEY},
                {"id": "tight", "key": TIGHT_KEY, "limits": {"rpm": 2}},
            ]
        },
        "providers": {"up": provider},
        "models": {"stay": {"targets": target}, f"v{version}": {"targets": target}},
    }
    for section in ("server", "providers", "models"):
        cfg[section].update(changes.pop(section, {}))
    cfg.update(changes)
    return cfg


@dataclass
class Gateway:
    proc: GatewayProcess
    upstream: ScriptedUpstream
    http: httpx.Client
    versions: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def path(self) -> Path:
        return self.proc.config

    def sdk(self, key: str = KEY) -> OpenAI:
        return OpenAI(base_url=self.proc.url + "/v1", api_key=key, max_retries=0)

    def write(self, cfg: dict[str, Any] | str) -> str:
        """Replaces the file as an editor or a ConfigMap update does (a new inode)."""
        text = cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        return text

    def next_config(self, **changes: Any) -> tuple[int, dict[str, Any]]:
        version = next(self.versions)
        return version, config(self.upstream.url, version, **changes)

    def apply(self, sighup: bool = False, **changes: Any) -> int:
        """Writes a new version and waits until it is in effect."""
        version, cfg = self.next_config(**changes)
        self.write(cfg)
        if sighup:
            self.proc.send_signal(signal.SIGHUP)
        self.wait_for(lambda: f"v{version}" in self.aliases(), f"version {version} in effect")
        return version

    def aliases(self) -> set[str]:
        r = self.http.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
        return {m["id"] for m in r.json()["data"]}

    def metrics(self) -> Scrape:
        return scrape(self.proc.url)

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        """A deadline on waiting, not a timing assertion."""
        deadline = time.monotonic() + POLL_DEADLINE_S
        while not done():
            assert time.monotonic() < deadline, f"never happened: {what}\n{self.proc.logs()}"
            time.sleep(POLL_INTERVAL_S)


@pytest.fixture(scope="module")
def gw(
    scripted_openai_server: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    text = yaml.safe_dump(config(scripted_openai_server.url, 0))
    with (
        GatewayProcess(text, tmp_path_factory.mktemp("reload")) as proc,
        httpx.Client(base_url=proc.url, timeout=10.0, trust_env=False) as http,
    ):
        yield Gateway(proc, scripted_openai_server, http)


@pytest.fixture
def g(gw: Gateway) -> Gateway:
    gw.upstream.reset()
    return gw


def complete(sdk: OpenAI, model: str) -> str:
    return sdk.completions.create(model=model, prompt="a b", max_tokens=2).choices[0].text


def test_a_changed_file_adds_an_alias(g: Gateway) -> None:
    g.apply(models={"added": {"targets": [{"provider": "up", "model": MODEL}]}})
    with g.sdk() as sdk:
        assert complete(sdk, "added")
        assert complete(sdk, "stay")


def test_sighup_applies_a_change_while_polling_is_off(g: Gateway) -> None:
    g.apply(server={"watch_config_s": 0})  # seen by polling, which it then turns off
    version, cfg = g.next_config(server={"watch_config_s": 0})
    g.write(cfg)
    time.sleep(3 * WATCH_S)  # what polling would have needed to see it
    assert f"v{version}" not in g.aliases()
    g.proc.send_signal(signal.SIGHUP)
    g.wait_for(lambda: f"v{version}" in g.aliases(), "the SIGHUP reload")
    g.apply(sighup=True)  # polling on again, for the other tests


def test_an_invalid_file_is_refused_and_the_running_config_stays(g: Gateway) -> None:
    kept = g.apply()
    before = g.metrics()
    bad = {"targets": [{"provider": "nope", "model": MODEL}]}
    text = g.write(config(g.upstream.url, 999, models={"bad": bad}))
    with pytest.raises(ConfigError) as refused:
        parse(text, source=str(g.path))
    line = f"config reload refused: {refused.value}; keeping the running config"
    assert "models.bad" in line and "'nope'" in line
    g.wait_for(lambda: line in g.proc.logs(), "the refusal's log line")
    after = g.metrics()
    assert after.delta(before, "gateway_config_reloads_total", result="error") == 1
    assert after.value("gateway_config_last_reload_success") == 0
    assert g.aliases() >= {"stay", f"v{kept}"}
    with g.sdk() as sdk:
        assert complete(sdk, "stay")
    g.apply()  # fixed: accepted
    fixed = g.metrics()
    assert fixed.delta(after, "gateway_config_reloads_total", result="ok") == 1
    assert fixed.value("gateway_config_last_reload_success") == 1
    assert fixed.value("gateway_config_loaded_timestamp_seconds") >= time.time() - 60


def test_a_stream_under_way_finishes_after_a_reload_removes_its_alias(g: Gateway) -> None:
    own = {"type": "openai", "base_url": g.upstream.url, "api_key": OPENAI_TEST_KEY}
    going = {"targets": [{"provider": "going-p", "model": MODEL}]}
    g.apply(providers={"going-p": own}, models={"going": going})
    g.upstream.script({"stall_after": 2, "stall_ms": 1000})
    body = {"model": "going", "prompt": "a b", "max_tokens": 6, "stream": True}
    auth = {"authorization": f"Bearer {KEY}"}
    with g.http.stream("POST", "/v1/completions", json=body, headers=auth) as resp:
        assert resp.status_code == 200
        events = (line[len("data: ") :] for line in resp.iter_lines() if line)
        got = [next(events)]
        g.apply(sighup=True)  # removes the alias and its provider
        with g.sdk() as sdk, pytest.raises(NotFoundError):
            complete(sdk, "going")
        assert g.upstream.stats()["completed_streams"] == 0  # still under way
        got += list(events)
    assert got[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in got[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert len(text.split()) == 6
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert g.upstream.stats()["completed_streams"] == 1


def test_the_memory_rate_limiters_counts_carry_over(g: Gateway) -> None:
    with g.sdk(TIGHT_KEY) as sdk:
        complete(sdk, "stay")
        complete(sdk, "stay")
        g.apply(models={"unrelated": {"targets": [{"provider": "up", "model": "x"}]}})
        with pytest.raises(RateLimitError):
            complete(sdk, "stay")
