"""The uvicorn factory: every worker process builds its own app from the config file, and
reloads it on SIGHUP and when it changes."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.api.app import GatewayApp, create_app
from gateway.reload import parse_snapshot, read
from gateway.server import process


def app_from_env() -> GatewayApp:
    """The config file and the number of worker processes come from `gateway serve`."""
    snapshot = read(Path(os.environ.get("GATEWAY_CONFIG", "config.yaml")))
    workers = int(os.environ.get("GATEWAY_WORKERS", "1"))
    return create_app(
        parse_snapshot(snapshot),
        serving_process=True,
        watch=snapshot,
        workers=workers,
        started=process.settle,
    )
