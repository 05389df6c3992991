"""JSON schemas for the Prometheus Operator objects the chart renders (ServiceMonitor,
PrometheusRule; monitoring.coreos.com/v1). kubernetes-validate has no schemas for CRDs, so
these follow the operator's CRDs for the fields the chart uses, strictly: an unknown or
misspelled field fails as it would at `kubectl apply` with server-side validation."""

from __future__ import annotations

from typing import Any

DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                   "labels": LABELS, "annotations": LABELS},
    "additionalProperties": False,
}  # fmt: skip


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": META,
            "spec": spec,
        },
        "additionalProperties": False,
    }


SERVICE_MONITOR = _object("ServiceMonitor", {
    "type": "object",
    "required": ["selector", "endpoints"],
    "properties": {
        "jobLabel": {"type": "string"},
        "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
            "any": {"type": "boolean"},
            "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "selector": {"type": "object", "additionalProperties": False, "properties": {
            "matchLabels": LABELS, "matchExpressions": {"type": "array"}}},
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "properties": {
                "port": {"type": "string"}, "targetPort": {}, "path": {"type": "string"},
                "scheme": {"enum": ["http", "https"]}, "interval": DURATION,
                "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
                "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"}}}},
    },
    "additionalProperties": False,
})  # fmt: skip

RULE = {
    "type": "object",
    "required": ["expr"],
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string"}, "record": {"type": "string"},
        "expr": {"type": ["string", "integer"]}, "for": DURATION, "keep_firing_for": DURATION,
        "labels": LABELS, "annotations": LABELS,
    },
    "additionalProperties": False,
}  # fmt: skip

PROMETHEUS_RULE = _object("PrometheusRule", {
    "type": "object",
    "required": ["groups"],
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["name", "rules"], "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "interval": DURATION,
                       "limit": {"type": "integer"},
                       "partial_response_strategy": {"type": "string"},
                       "rules": {"type": "array", "items": RULE}}}}},
    "additionalProperties": False,
})  # fmt: skip

SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}
