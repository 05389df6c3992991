"""`gateway serve --workers 2` with the in-process engine: one engine core that both workers
use, on vLLM's multi-front-end machinery, seen from outside as an operator sees it.

* One EngineCore process for the pod, both workers serving from it (each worker's metrics file
  counts completions), the same greedy text from either.
* SIGHUP reaches every worker (each reloads its config) and the engine core goes on.
* SIGTERM: the workers drain (a stream in progress finishes) before the core stops, and nothing
  is left running.
* The core's death: every worker answers /readyz 503 and its models 503 `engine_dead`, as one
  worker does with its own engine; /livez stays up.
* Rate limits on the memory backend with more than one worker are refused at start.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.mmap_dict import MmapedDict

from tests.gateway_proc import GatewayProcess
from tests.vllm_proc import VLLM_ENV, engine_config, require_vllm

require_vllm()

KEY = "sk-workers"
NEW_KEY = "sk-workers-added"
WORKERS = 2
ENGINE_ARGS = {"max_model_len": 1024, "kv_cache_memory_bytes": 1 << 28}
START_S = 600.0  # two workers and a core loading on a busy 2-core machine
PROBE_S = 120.0
BODY: dict[str, Any] = {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0}


@dataclass
class Pod:
    gw: GatewayProcess
    metrics_dir: Path
    config_text: str

    def post(self, body: dict[str, Any], key: str = KEY) -> httpx.Response:
        """A fresh connection each time: the kernel hands it to either worker."""
        headers = {"Authorization": f"Bearer {key}"}
        url = self.gw.url + "/v1/completions"
        return httpx.post(url, json=body, headers=headers, timeout=120, trust_env=False)


def start_pod(workdir: Path) -> Pod:
    metrics_dir = workdir / "metrics"
    metrics_dir.mkdir()
    text = engine_config(KEY, ENGINE_ARGS, {"tiny": {}})
    env = {**VLLM_ENV, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    gw = GatewayProcess(text, workdir, env=env, log_level="info", workers=WORKERS, timeout=START_S)
    pod = Pod(gw, metrics_dir, text)
    until(lambda: gw.logs().count("vLLM engine ready") == WORKERS, START_S, gw)
    return pod


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    pod = start_pod(tmp_path_factory.mktemp("workers"))
    with pod.gw:
        yield pod


def until(condition: Callable[[], bool], timeout_s: float, gw: GatewayProcess) -> None:
    """A probe of state that has no event to wait on; fails naming the gateway's output."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, gw.logs()[-4000:]
        time.sleep(0.05)


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`: pid → command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        found[child] = cmdline.replace(b"\0", b" ").decode(errors="replace")
        todo += children.get(child, [])
    return found


def engine_cores(gw: GatewayProcess) -> list[int]:
    return [pid for pid, cmd in descendants(gw.pid).items() if "EngineCore" in cmd]


def completions_by_pid(metrics_dir: Path) -> dict[int, float]:
    """Each worker's own count of completions answered, from its multiprocess metrics file
    (keys: JSON of the metric, the sample's name, its labels and help)."""
    counts: dict[int, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.split("_")[-1])
        values = MmapedDict.read_all_values_from_file(str(path))  # type: ignore[no-untyped-call]
        for key, value, _, _ in values:
            _, sample, labels, _ = json.loads(key)
            if sample == "gateway_requests_total" and labels["operation"] == "text_completion":
                counts[pid] = counts.get(pid, 0.0) + value
    return counts


def test_one_engine_core_for_both_workers(pod: Pod) -> None:
    processes = descendants(pod.gw.pid)
    assert len(engine_cores(pod.gw)) == 1, processes
    workers = [pid for pid, cmd in processes.items() if "multiprocessing.spawn" in cmd]
    assert len(workers) == WORKERS, processes


def test_both_workers_serve_from_the_one_core(pod: Pod) -> None:
    texts: set[str] = set()

    def one(_: int) -> None:
        resp = pod.post(BODY)
        assert resp.status_code == 200, resp.text
        texts.add(resp.json()["choices"][0]["text"])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(25):  # rounds of 8 concurrent, until both workers have served
            list(pool.map(one, range(8)))
            if len([n for n in completions_by_pid(pod.metrics_dir).values() if n]) == WORKERS:
                break
    served = completions_by_pid(pod.metrics_dir)
    assert len([n for n in served.values() if n]) == WORKERS, served
    assert len(texts) == 1  # greedy: the same text whichever worker asked


def test_sighup_reloads_every_worker_and_the_core_goes_on(pod: Pod) -> None:
    core = engine_cores(pod.gw)
    config = yaml.safe_load(pod.config_text)
    config["auth"]["keys"].append({"id": "added", "key": NEW_KEY, "models": ["*"]})
    pod.gw.config.write_text(yaml.safe_dump(config, sort_keys=False))
    pod.gw.send_signal(signal.SIGHUP)
    until(lambda: pod.gw.logs().count("config reloaded") >= WORKERS, PROBE_S, pod.gw)
    for _ in range(8):
        resp = pod.post(BODY, key=NEW_KEY)
        assert resp.status_code == 200, resp.text
    assert engine_cores(pod.gw) == core


def test_sigterm_drains_the_workers_before_the_core_stops(pod: Pod) -> None:
    """The last test on the module's pod: it stops it."""
    long = {
        **BODY,
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    left = descendants(pod.gw.pid)
    began = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(stream_events, pod, long, began)
        until(began.is_set, PROBE_S, pod.gw)
        pod.gw.send_signal(signal.SIGTERM)
        try:
            events = future.result(timeout=300)
        except httpx.HTTPError as exc:
            raise AssertionError(f"{exc!r}\n{pod.gw.logs()[-6000:]}") from exc
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 300  # every token, after the signal
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert pod.gw.stop() == 0
    # Helpers such as multiprocessing's resource tracker end when they read their pipe's end,
    # a moment after the processes that held it.
    deadline = time.monotonic() + PROBE_S
    while still := {pid: cmd for pid, cmd in left.items() if running(pid)}:
        assert time.monotonic() < deadline, still
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Alive, and not a zombie (an exited child that nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stream_events(pod: Pod, body: dict[str, Any], began: threading.Event) -> list[str]:
    """The stream's events' data, in order; `began` is set at the first."""
    headers = {"Authorization": f"Bearer {KEY}"}
    out: list[str] = []
    url = pod.gw.url + "/v1/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.append(line.removeprefix("data: "))
                began.set()
    return out


def test_the_cores_death_is_every_workers(tmp_path: Path) -> None:
    pod = start_pod(tmp_path)
    with pod.gw:
        (core,) = engine_cores(pod.gw)
        os.kill(core, signal.SIGKILL)

        def every_probe_down() -> bool:
            codes = [readyz(pod) for _ in range(10)]
            return all(code == 503 for code in codes)

        until(every_probe_down, PROBE_S, pod.gw)
        for _ in range(6):
            resp = pod.post(BODY)
            assert resp.status_code == 503, resp.text
            assert resp.json()["error"]["code"] == "engine_dead"
        live = httpx.get(pod.gw.url + "/livez", timeout=5, trust_env=False)
        assert live.status_code == 200


def readyz(pod: Pod) -> int:
    return httpx.get(pod.gw.url + "/readyz", timeout=5, trust_env=False).status_code


def test_memory_limits_with_several_workers_are_refused(tmp_path: Path) -> None:
    config = yaml.safe_load(engine_config(KEY, ENGINE_ARGS, {"tiny": {"limits": {"rpm": 5}}}))
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "models.tiny.limits" in done.stderr
    assert "rate_limit.backend: redis" in done.stderr
