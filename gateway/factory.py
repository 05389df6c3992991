"""The uvicorn factory: every worker process builds its own app from the config file."""

from __future__ import annotations

import os

from gateway.app import GatewayApp, create_app
from gateway.config import load


def app_from_env() -> GatewayApp:
    return create_app(load(os.environ.get("GATEWAY_CONFIG", "config.yaml")), serving_process=True)
