"""Writes dashboard.json, the gateway's Grafana dashboard, from the panel table below.

    python deploy/grafana/dashboard.py            # rewrite dashboard.json
    python deploy/grafana/dashboard.py --check    # exit 1 if dashboard.json is not current

Edit the table, not the JSON: `make chart-check` fails when they differ, runs every query
through promtool, and evaluates each one on a real Prometheus scraping a gateway under traffic.
Variables: $datasource (Prometheus), $job (the scrape job), $model (aliases; All by default),
$traces (the traces' datasource: Tempo; set its plugin type to jaeger for Jaeger).
New rows go last: a panel's id is its place, and links to a panel (viewPanel=<id>) keep working.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("dashboard.json")
UID = "completions-gateway"
SEL = 'job=~"$job"'  # every query is limited to the chosen scrape jobs
MODEL = f'{SEL}, model=~"$model"'
GENAI_MODEL = f'{SEL}, gen_ai_request_model=~"$model"'
RI = "$__rate_interval"
RANGE = "$__range"  # the dashboard's time range
PER_HOUR = "* 3600"  # a rate per second as one per hour: spend reads in dollars an hour
REQUEST_TIME = "Request time"
TTFT = "Time to first token (streams)"
SPEND_BY_TEAM = "Spend by team (USD/h)"
SPEND_BY_MODEL = "Spend by model (USD/h)"
STACKED = frozenset([SPEND_BY_TEAM, SPEND_BY_MODEL])  # parts of one total: stacked, they add up


def quantiles(
    metric: str, selector: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99)
) -> list[tuple[str, str]]:
    """histogram_quantile targets, one per quantile: (expr, legend)."""
    group = f"le, {by}" if by else "le"
    prefix = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) "
            f"(rate({metric}_bucket{{{selector}}}[{RI}])))",
            f"{prefix}p{round(q * 100)}",
        )
        for q in qs
    ]


# Rows of panels: (title, kind, unit, width, [(expr, legend), ...]); kind is a Grafana panel
# type. Widths are in Grafana's 24-column grid; a row's panels are 8 units high.
ROWS: list[tuple[str, list[tuple[str, str, str, int, list[tuple[str, str]]]]]] = [
    ("Overview", [
        ("Requests/s", "stat", "reqps", 6,
         [(f"sum(rate(gateway_requests_total{{{MODEL}}}[{RI}]))", "requests/s")]),
        ("5xx share", "stat", "percentunit", 6,
         [(f'sum(rate(gateway_requests_total{{{MODEL}, status=~"5.."}}[{RI}])) '
           f"/ sum(rate(gateway_requests_total{{{MODEL}}}[{RI}]))", "5xx")]),
        ("Requests in progress", "stat", "short", 6,
         [(f"sum(gateway_inflight_requests{{{SEL}}})", "in flight")]),
        ("Tokens/s", "stat", "short", 6,
         [(f"sum(rate(gateway_tokens_total{{{MODEL}}}[{RI}]))", "tokens/s")]),
    ]),
    ("Traffic", [
        ("Requests/s by model and status", "timeseries", "reqps", 12,
         [(f"sum by (model, status) (rate(gateway_requests_total{{{MODEL}}}[{RI}]))",
           "{{model}} {{status}}")]),
        ("Error share by model (4xx, 5xx)", "timeseries", "percentunit", 12,
         [(f'sum by (model) (rate(gateway_requests_total{{{MODEL}, status=~"5.."}}[{RI}])) '
           f"/ sum by (model) (rate(gateway_requests_total{{{MODEL}}}[{RI}]))", "{{model}} 5xx"),
          (f'sum by (model) (rate(gateway_requests_total{{{MODEL}, status=~"4.."}}[{RI}])) '
           f"/ sum by (model) (rate(gateway_requests_total{{{MODEL}}}[{RI}]))", "{{model}} 4xx")]),
        ("Requests in progress by pod", "timeseries", "short", 12,
         [(f"sum by (instance) (gateway_inflight_requests{{{SEL}}})", "{{instance}}")]),
        ("Requests/s by operation, streams vs whole answers", "timeseries", "reqps", 12,
         [(f"sum by (operation, stream) (rate(gateway_requests_total{{{MODEL}}}[{RI}]))",
           "{{operation}} stream={{stream}}")]),
    ]),
    ("Latency", [
        (REQUEST_TIME, "timeseries", "s", 12,
         quantiles("gateway_request_duration_seconds", MODEL)),
        (TTFT, "timeseries", "s", 12,
         quantiles("gen_ai_server_time_to_first_token_seconds", GENAI_MODEL)),
        ("Time per output token (streams)", "timeseries", "s", 8,
         quantiles("gen_ai_server_time_per_output_token_seconds", GENAI_MODEL, qs=(0.5, 0.95))),
        ("Gateway overhead (time not waiting on providers)", "timeseries", "s", 8,
         quantiles("gateway_overhead_seconds", MODEL)),
        ("Provider time p95 by provider", "timeseries", "s", 8,
         quantiles("gen_ai_client_operation_duration_seconds", GENAI_MODEL,
                   by="gen_ai_provider_name", qs=(0.95,))),
    ]),
    ("Tokens", [
        ("Tokens/s by model and type", "timeseries", "short", 12,
         [(f"sum by (model, type) (rate(gateway_tokens_total{{{MODEL}}}[{RI}]))",
           "{{model}} {{type}}")]),
        ("Output tokens per request (p50, p95)", "timeseries", "short", 12,
         quantiles("gen_ai_client_token_usage", f'{GENAI_MODEL}, gen_ai_token_type="output"',
                   qs=(0.5, 0.95))),
    ]),
    ("Rate limits", [
        ("Rate-limit refusals/s by limit", "timeseries", "reqps", 12,
         [(f'sum by (model, result, limit) (rate(gateway_ratelimit_decisions_total{{{MODEL}, '
           f'result!="allowed"}}[{RI}]))', "{{model}} {{result}} {{limit}}")]),
        ("Decisions/s by backend (local, none: Redis unavailable)", "timeseries", "reqps", 12,
         [(f"sum by (backend) (rate(gateway_ratelimit_decisions_total{{{MODEL}}}[{RI}]))",
           "{{backend}}")]),
        ("Redis errors/s", "timeseries", "short", 12,
         [(f"sum by (mode) (rate(gateway_ratelimit_backend_errors_total{{{SEL}}}[{RI}]))",
           "on_backend_error={{mode}}")]),
        ("Redis in use (1) by pod", "timeseries", "short", 12,
         [(f"min by (instance) (gateway_ratelimit_backend_up{{{SEL}}})", "{{instance}}")]),
    ]),
    ("Upstreams", [
        ("Provider errors/s by kind", "timeseries", "short", 12,
         [(f"sum by (provider, kind) (rate(gateway_upstream_errors_total{{{SEL}}}[{RI}]))",
           "{{provider}} {{kind}}")]),
        ("Provider calls/s by outcome", "timeseries", "short", 12,
         [(f"sum by (provider, outcome) (rate(gateway_upstream_attempts_total{{{SEL}}}[{RI}]))",
           "{{provider}} {{outcome}}")]),
        ("Circuit state (0 closed, 1 half-open, 2 open)", "state-timeline", "short", 12,
         [(f"max by (provider, upstream_model) (gateway_circuit_state{{{SEL}}})",
           "{{provider}}/{{upstream_model}}")]),
        ("Circuit changes", "timeseries", "short", 12,
         [(f"sum by (provider, upstream_model, state) "
           f"(increase(gateway_circuit_transitions_total{{{SEL}}}[{RI}]))",
           "{{provider}}/{{upstream_model}} → {{state}}")]),
    ]),
    ("Files and batches", [
        ("Files stored/s by purpose, deleted/s", "timeseries", "short", 12,
         [(f"sum by (purpose) (rate(gateway_files_stored_total{{{SEL}}}[{RI}]))", "{{purpose}}"),
          (f"sum(rate(gateway_files_deleted_total{{{SEL}}}[{RI}]))", "deleted")]),
        ("Bytes stored/s by purpose", "timeseries", "Bps", 12,
         [(f"sum by (purpose) (rate(gateway_file_bytes_stored_total{{{SEL}}}[{RI}]))",
           "{{purpose}}")]),
        # Over the dashboard's range: batches are few and long, a rate of them says little.
        ("Batches entering each status (time range)", "stat", "short", 8,
         [(f"sum by (status) (increase(gateway_batches_total{{{SEL}}}[{RANGE}]))",
           "{{status}}")]),
        ("Batch lines/s by operation and outcome", "timeseries", "short", 8,
         [(f"sum by (operation, outcome) (rate(gateway_batch_lines_total{{{SEL}}}[{RI}]))",
           "{{operation}} {{outcome}}")]),
        ("Batch lines in flight, batches running by pod", "timeseries", "short", 8,
         [(f"sum by (instance) (gateway_batch_lines_in_flight{{{SEL}}})",
           "{{instance}} lines"),
          (f"sum by (instance) (gateway_batches_running{{{SEL}}})", "{{instance}} batches")]),
    ]),
    ("Process", [
        ("CPU (cores) by pod", "timeseries", "short", 8,
         [(f"sum by (instance) (rate(process_cpu_seconds_total{{{SEL}}}[{RI}]))",
           "{{instance}}")]),
        ("Memory by pod", "timeseries", "bytes", 8,
         [(f"sum by (instance) (process_resident_memory_bytes{{{SEL}}})", "{{instance}}")]),
        ("Event-loop tasks by pod", "timeseries", "short", 8,
         [(f"sum by (instance) (gateway_event_loop_tasks{{{SEL}}})", "{{instance}}")]),
        ("Config reloads", "timeseries", "short", 12,
         [(f"sum by (result) (increase(gateway_config_reloads_total{{{SEL}}}[{RI}]))",
           "{{result}}")]),
        ("Last reload succeeded (1) by pod", "timeseries", "short", 12,
         [(f"min by (instance) (gateway_config_last_reload_success{{{SEL}}})",
           "{{instance}}")]),
    ]),
    ("Spend and budgets", [
        (SPEND_BY_TEAM, "timeseries", "currencyUSD", 8,
         [(f"sum by (team) (rate(gateway_spend_usd_total{{{MODEL}}}[{RI}])) {PER_HOUR}",
           "{{team}}")]),
        (SPEND_BY_MODEL, "timeseries", "currencyUSD", 8,
         [(f"sum by (model) (rate(gateway_spend_usd_total{{{MODEL}}}[{RI}])) {PER_HOUR}",
           "{{model}}")]),
        ("Spend by team (time range)", "stat", "currencyUSD", 8,
         [(f"sum by (team) (increase(gateway_spend_usd_total{{{MODEL}}}[{RANGE}]))",
           "{{team}}")]),
        # Unpriced targets cost 0: their traffic is missing from the spend above.
        ("Unpriced requests/s by model and provider", "timeseries", "reqps", 12,
         [(f"sum by (model, provider) (rate(gateway_unpriced_requests_total{{{MODEL}}}[{RI}]))",
           "{{model}} ({{provider}})")]),
        # Each pod reports what it saw last: the highest is the nearest to the truth.
        ("Budgets near their end (share spent or reserved)", "bargauge", "percentunit", 12,
         [(f"sort_desc(max by (scope, team) (gateway_budget_used_ratio{{{SEL}}}))",
           "{{team}} ({{scope}} budget)")]),
    ]),
    ("Response cache", [
        ("Cache hit ratio by model", "timeseries", "percentunit", 8,
         [(f'sum by (model) (rate(gateway_cache_requests_total{{{MODEL}, result="hit"}}[{RI}])) '
           f"/ sum by (model) (rate(gateway_cache_requests_total{{{MODEL}}}[{RI}]))",
           "{{model}}")]),
        ("Cache requests/s by status", "timeseries", "reqps", 8,
         [(f"sum by (model, result) (rate(gateway_cache_requests_total{{{MODEL}}}[{RI}]))",
           "{{model}} {{result}}")]),
        # Memory: each process holds its own (summed); Redis: one shared count (each reports it).
        ("Cache entries", "timeseries", "short", 8,
         [(f'sum(gateway_cache_entries{{{SEL}, backend="memory"}}) or '
           f'max(gateway_cache_entries{{{SEL}, backend="redis"}})', "entries")]),
        ("Cache backend errors/s (served uncached)", "timeseries", "short", 12,
         [(f"sum by (operation) (rate(gateway_cache_backend_errors_total{{{SEL}}}[{RI}]))",
           "{{operation}}")]),
    ]),
]  # fmt: skip

CIRCUIT_MAPPINGS = [
    {"type": "value", "options": {
        "0": {"text": "closed", "color": "green"},
        "1": {"text": "half-open", "color": "yellow"},
        "2": {"text": "open", "color": "red"},
    }},
]  # fmt: skip
STACKING = {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 25}
# The bar gauge shows budgets: a share of each, full at 1 (past it, requests are refused),
# warning from 75%, as the alerts do from 90%.
SHARE_THRESHOLDS = {"mode": "absolute", "steps": [
    {"color": "green", "value": None},
    {"color": "yellow", "value": 0.75},
    {"color": "orange", "value": 0.9},
    {"color": "red", "value": 1},
]}  # fmt: skip
BARGAUGE_DEFAULTS = {"min": 0, "max": 1, "thresholds": SHARE_THRESHOLDS,
                     "color": {"mode": "thresholds"}}  # fmt: skip
BARGAUGE_OPTIONS = {
    "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
}  # fmt: skip
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Panels whose histograms carry a traced request's trace id as an exemplar (the gateway's
# OpenMetrics /metrics): their queries ask for exemplars, and an exemplar links to its trace.
EXEMPLARS = frozenset([REQUEST_TIME, TTFT])
# Explore on the $traces datasource, the trace id as its query: Tempo reads it as a TraceQL
# query (a trace id is one), Jaeger as a trace's lookup. On the exemplars' trace_id field only
# (an override by name): the series' points have no trace to link to.
TRACE_PANES = {"trace": {
    "datasource": "${traces}",
    "queries": [{"refId": "A", "datasource": {"uid": "${traces}"}, "query": "${__value.raw}"}],
    "range": {"from": "${__from}", "to": "${__to}"},
}}  # fmt: skip
TRACE_LINK = {
    "title": "Trace ${__value.raw}",
    "url": "/explore?schemaVersion=1&panes=" + json.dumps(TRACE_PANES, separators=(",", ":")),
    "targetBlank": True,
}
TRACE_OVERRIDE = {
    "matcher": {"id": "byName", "options": "trace_id"},
    "properties": [{"id": "links", "value": [TRACE_LINK]}],
}
EXEMPLAR_HELP = (
    "The dots are exemplars: for each bucket, the latest traced request that fell in it, its "
    "trace id as trace_id. Hover one and follow its trace_id link to the trace in the $traces "
    "datasource (the dashboard's description says how to make the link the Prometheus "
    "datasource's own)."
)


def panel(pid: int, title: str, kind: str, unit: str, grid: dict[str, int],
          queries: list[tuple[str, str]]) -> dict[str, Any]:  # fmt: skip
    defaults: dict[str, Any] = {"unit": unit}
    options: dict[str, Any] = {"legend": {"displayMode": "list", "placement": "bottom"}}
    if kind == "state-timeline":
        defaults["mappings"] = CIRCUIT_MAPPINGS
    if title in STACKED:
        defaults["custom"] = STACKING
    if kind == "bargauge":
        defaults |= BARGAUGE_DEFAULTS
        options |= BARGAUGE_OPTIONS
    exemplar = title in EXEMPLARS
    # A bar gauge shows each series' latest value: asked as of now, its bars keep the order
    # of the query's answer (sort_desc), which a range query's answer does not have.
    instant = kind == "bargauge"
    out = {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": [TRACE_OVERRIDE] if exemplar else []},
        "options": options,
        "targets": [target(i, expr, legend, instant, exemplar)
                    for i, (expr, legend) in enumerate(queries)],
    }  # fmt: skip
    if exemplar:
        out["description"] = EXEMPLAR_HELP
    return out


def target(
    i: int, expr: str, legend: str, instant: bool = False, exemplar: bool = False
) -> dict[str, Any]:
    ref = chr(ord("A") + i)
    out: dict[str, Any] = {
        "refId": ref, "datasource": DATASOURCE, "expr": expr, "legendFormat": legend
    }  # fmt: skip
    if instant:
        out |= {"instant": True, "range": False}
    if exemplar:
        out["exemplar"] = True
    return out


def panels() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    y = 0
    for row_title, row in ROWS:
        out.append({"id": len(out) + 1, "type": "row", "title": row_title, "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        y += 1
        x = 0
        for title, kind, unit, width, queries in row:
            if x + width > 24:
                x, y = 0, y + 8
            grid = {"h": 8, "w": width, "x": x, "y": y}
            out.append(panel(len(out) + 1, title, kind, unit, grid, queries))
            x += width
        y += 8
    return out


def variable(name: str, label: str, query: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
        "includeAll": True, "multi": True, "allValue": ".*", "sort": 1,
        "current": {"text": "All", "value": "$__all"}, **extra,
    }  # fmt: skip


# A datasource variable lists the datasources of one plugin type: Tempo here.
TRACES_HELP = (
    "Where the exemplars' trace links open: a Tempo datasource. For Jaeger, edit this "
    "variable (Dashboard settings, Variables, traces) and set its data source type to Jaeger."
)
VARIABLES = [
    {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
    {
        "name": "traces",
        "label": "Traces",
        "type": "datasource",
        "query": "tempo",
        "description": TRACES_HELP,
    },
    variable("job", "Job", "label_values(gateway_requests_total, job)"),
    variable("model", "Model", 'label_values(gateway_requests_total{job=~"$job"}, model)'),
]


DESCRIPTION = (
    "Traffic, latency, tokens, rate limits, upstream health, files and batches, spend and "
    "budgets of the OpenAI-compatible completions gateway (deploy/grafana/dashboard.py). "
    "Request time and time to first token show exemplars, each a traced request's trace id "
    "(trace_id), when Prometheus keeps them (--enable-feature=exemplar-storage; it scrapes "
    "OpenMetrics, which /metrics serves when asked) and the gateway runs one worker (with "
    "--workers N > 1, none are kept). Each links to its trace in the Traces variable's "
    "datasource (Tempo; or Jaeger, see the variable). To have Grafana's own exemplar button "
    "too, in Explore as well, set on the Prometheus datasource "
    "jsonData.exemplarTraceIdDestinations: [{name: trace_id, datasourceUid: <the traces "
    "datasource's uid>}] (or in its settings: Exemplars, Internal link, Label name trace_id)."
)


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "Completions gateway",
        "description": DESCRIPTION,
        "tags": ["completions-gateway", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": VARIABLES},
        "annotations": {"list": []},
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if OUT.read_text() != text:
            print(f"{OUT} is not current: run python {__file__}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
