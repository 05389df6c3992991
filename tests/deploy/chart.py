"""The Helm chart rendered as Helm does it (helm-python-sdk: Helm's Go library), in-process.

chart = load()                               # once per module (loading is the slow part)
objs = render(chart, values)                 # {(kind, name): object}
VALUES_FILES                                 # the chart's ci/*-values.yaml, by short name
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.upstreams.procs import REPO_ROOT

CHART_DIR = REPO_ROOT / "deploy" / "helm" / "completions-gateway"
RELEASE, NAMESPACE = "gw", "llm"
FULLNAME = f"{RELEASE}-completions-gateway"
VALUES_FILES: dict[str, Path] = {
    p.name.removesuffix("-values.yaml"): p for p in sorted((CHART_DIR / "ci").glob("*-values.yaml"))
}

Objects = dict[tuple[str, str], dict[str, Any]]


def load() -> helm.Chart:
    helm.disable_logging()  # the INFO lines about the files/ symlinks
    return helm.Chart.load(str(CHART_DIR))


def values_of(name: str) -> dict[str, Any]:
    data = yaml.safe_load(VALUES_FILES[name].read_text())
    return dict(data or {})


def render(chart: helm.Chart, values: Mapping[str, Any]) -> Objects:
    out: Objects = {}
    for path, text in chart.render(dict(values), name=RELEASE, namespace=NAMESPACE).items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in out, f"{key} rendered twice"
                out[key] = doc
    return out


def notes(chart: helm.Chart, values: Mapping[str, Any]) -> str:
    rendered = chart.render(dict(values), name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def container(objs: Objects) -> dict[str, Any]:
    pod = objs[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return dict(c)


def gateway_config(objs: Objects) -> str:
    return str(objs[("ConfigMap", FULLNAME)]["data"]["config.yaml"])


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
