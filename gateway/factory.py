"""The uvicorn factory: every worker process builds its own app from the config file, and
reloads it on SIGHUP and when it changes."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.app import GatewayApp, create_app
from gateway.reload import parse_snapshot, read


def app_from_env() -> GatewayApp:
    snapshot = read(Path(os.environ.get("GATEWAY_CONFIG", "config.yaml")))
    return create_app(parse_snapshot(snapshot), serving_process=True, watch=snapshot)
