"""The Grafana dashboard (deploy/grafana) and the alert rules (deploy/prometheus), checked
against the real thing: promtool parses every rule and every dashboard query, and runs the
rules' unit tests (alerts_test.yaml); each metric and label the queries use must be one
gateway/metrics.py declares; then a real gateway serves traffic of every kind (streams,
rate-limit refusals, upstream 5xx, an unreachable provider, an open circuit, a dead Redis, a
batch of an uploaded file, priced and unpriced answers of keys with and without a team), a real
Prometheus scrapes it and evaluates the rules, and each metric and label the queries use must
be one /metrics exports, each dashboard query must return data, and the alerts for what went
wrong must fire."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram

from gateway.metrics import METRICS
from tests.deploy.promql import used
from tests.e2e.metrics_text import scrape
from tests.e2e.support import scripted_providers
from tests.gateway_proc import GatewayProcess
from tests.redis_proc import RedisServer
from tests.upstreams.procs import (
    OPENAI_TEST_KEY,
    REPO_ROOT,
    ScriptedUpstream,
    ServerProcess,
    free_port,
    start_on_free_port,
    start_scripted,
)

ALERTS = REPO_ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ALERTS.with_name("alerts_test.yaml")
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboard.json"
GENERATOR = REPO_ROOT / "deploy" / "grafana" / "dashboard.py"
# Grafana's variables, as a query with every value selected reads them.
VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$job": ".*", "$model": ".*"}
TARGET_LABELS = {"job", "instance"}  # added by Prometheus to every scraped series
JOB = "completions-gateway"
FULL_KEY, LIMITED_KEY = "sk-monitoring-full", "sk-monitoring-limited"
TEAM = "research"  # the full key's; the limited key has none
POLL_S = 60.0
# What went wrong in the traffic below, and the alerts that must fire (pending: their `for`).
EXPECTED_ALERTS = {
    "GatewayHighErrorRate", "GatewayUpstreamErrors", "GatewayCircuitOpen",
    "GatewayRateLimitBackendErrors", "GatewayRateLimiterFallback", "GatewayRateLimitBackendDown",
}  # fmt: skip


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `apt-get install prometheus` (make chart-check does)")
    return found


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL as Grafana sends it with every value selected)."""
    out = []
    for p in dashboard()["panels"]:
        for t in p.get("targets", []):
            out.append((f"{p['title']} [{t['refId']}]", substitute(t["expr"])))
    return out


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown variable in {expr}"
    return expr


def all_queries() -> list[tuple[str, str]]:
    alerts = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    return dashboard_queries() + alerts


# ---------------------------------------------------------------- static checks


def test_the_alert_rules_pass_promtool() -> None:
    run = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in run.stdout


def test_every_dashboard_query_passes_promtool(tmp_path: Path) -> None:
    """Each query as a recording rule: promtool parses it as Prometheus would."""
    rules = [{"record": f"dashboard:query_{i}", "expr": q} for i, (_, q) in
             enumerate(dashboard_queries())]  # fmt: skip
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rules)} rules found" in run.stdout


def test_promtool_refuses_a_broken_query(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    rule = {"record": "x:y", "expr": "sum(rate(gateway_requests_total[1m])"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    run = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode != 0 and "unclosed left parenthesis" in run.stdout + run.stderr


def test_the_alert_rules_pass_their_unit_tests() -> None:
    run = promtool_test(ALERT_TESTS)
    assert run.returncode == 0, run.stdout + run.stderr
    tested = {t["alertname"] for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for t in test["alert_rule_test"]}  # fmt: skip
    assert {"GatewayTeamBudgetNearlySpent", "GatewayTeamBudgetSpent"} <= tested


def test_the_alert_unit_tests_pin_the_budget_thresholds(tmp_path: Path) -> None:
    """The unit tests fail when a budget alert's threshold moves: they test the rules."""
    for old, new in (("> 0.9", "> 0.95"), (">= 1", ">= 1.05")):
        text, rule = ALERTS.read_text(), f'{{scope="team"}}) {old}'
        assert text.count(rule) == 1, rule
        (tmp_path / "alerts.yaml").write_text(text.replace(rule, f'{{scope="team"}}) {new}'))
        (tmp_path / "alerts_test.yaml").write_text(ALERT_TESTS.read_text())
        run = promtool_test(tmp_path / "alerts_test.yaml")
        assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr, (old, run.stdout)


def promtool_test(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


# The samples a metric of each kind exports (prometheus_client's names), and their own labels.
SAMPLES: dict[type[Any], tuple[tuple[str, frozenset[str]], ...]] = {
    Counter: (("_total", frozenset()), ("_created", frozenset())),
    Gauge: (("", frozenset()),),
    Histogram: (("_bucket", frozenset({"le"})), ("_count", frozenset()), ("_sum", frozenset()),
                ("_created", frozenset())),
}  # fmt: skip
# Exported beside the table: prometheus_client's process collector, the event loop's tasks.
UNDECLARED = {"process_cpu_seconds_total", "process_resident_memory_bytes",
              "gateway_event_loop_tasks"}  # fmt: skip


def declared() -> dict[str, set[str]]:
    """Sample name -> its labels, as gateway/metrics.py's METRICS declares them."""
    out: dict[str, set[str]] = {name: set() for name in UNDECLARED}
    for kind, name, _, labels, _ in METRICS.values():
        base = name.removesuffix("_total") if kind is Counter else name
        for suffix, extra in SAMPLES[kind]:
            out[base + suffix] = set(labels) | extra
    return out


def test_every_metric_and_label_the_queries_use_is_declared() -> None:
    """Without a gateway: the new and the unused alike, each query reads what the table has."""
    table = declared()
    wrong = {}
    for title, expr in all_queries():
        u = used(expr)
        metrics = u.metrics - table.keys()
        labels = u.labels - TARGET_LABELS
        labels -= set().union(*(table.get(m, set()) for m in u.metrics))
        if metrics or labels:
            wrong[title] = (sorted(metrics), sorted(labels))
    assert wrong == {}


def test_the_dashboard_is_generated_from_its_table() -> None:
    run = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_the_dashboard_layout() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}  # fmt: skip
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
    names = {v["name"] for v in d["templating"]["list"]}
    assert names == {"datasource", "traces", "job", "model"}


def test_the_latency_panels_link_their_exemplars_to_traces() -> None:
    """The two histograms that carry trace ids ask for exemplars, and an exemplar's trace_id
    (only: the series' points have no trace) links to Explore on the $traces datasource."""
    (traces,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "traces"]
    assert (traces["type"], traces["query"]) == ("datasource", "tempo") and traces["description"]
    linked = {}
    for p in row("Latency"):
        exemplars = [t.get("exemplar", False) for t in p["targets"]]
        assert len(set(exemplars)) == 1, p["title"]
        if exemplars[0]:
            (override,) = p["fieldConfig"]["overrides"]
            assert override["matcher"] == {"id": "byName", "options": "trace_id"}
            (links,) = override["properties"]
            (link,) = links["value"]
            assert "${traces}" in link["url"] and "${__value.raw}" in link["url"]
            linked[p["title"]] = {m for t in p["targets"] for m in used(t["expr"]).metrics}
    assert linked == {
        "Request time": {"gateway_request_duration_seconds_bucket"},
        "Time to first token (streams)": {"gen_ai_server_time_to_first_token_seconds_bucket"},
    }
    assert "exemplarTraceIdDestinations" in dashboard()["description"]


def row(title: str) -> list[dict[str, Any]]:
    """The panels under the row titled `title`, up to the next row."""
    out: list[dict[str, Any]] = []
    inside = False
    for p in dashboard()["panels"]:
        if p["type"] == "row":
            inside = p["title"] == title
        elif inside:
            out.append(p)
    return out


def test_the_spend_and_budgets_row() -> None:
    """Spend stacks (the teams' and the models' add up to the total), and budgets show as
    bars, highest first, coloured at the shares the alerts watch (0.9, 1)."""
    panels = row("Spend and budgets")
    stacked = [p["title"] for p in panels
               if p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode")
               == "normal"]  # fmt: skip
    assert stacked == ["Spend by team (USD/h)", "Spend by model (USD/h)"]
    (gauge,) = [p for p in panels if p["type"] == "bargauge"]
    defaults = gauge["fieldConfig"]["defaults"]
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None, 0.75, 0.9, 1]
    assert (defaults["min"], defaults["max"], defaults["unit"]) == (0, 1, "percentunit")
    (t,) = gauge["targets"]
    assert t["instant"] and t["expr"].startswith("sort_desc(")
    assert {"scope", "team"} <= used(t["expr"]).labels
    by_team = next(p for p in panels if p["title"] == "Spend by team (USD/h)")
    assert {"team"} <= used(by_team["targets"][0]["expr"]).labels


# What the dashboard and the alerts must show, by the metrics that carry it.
DASHBOARD_TOPICS = {
    "traffic by model and status": "gateway_requests_total",
    "latency percentiles": "gateway_request_duration_seconds_bucket",
    "time to first token": "gen_ai_server_time_to_first_token_seconds_bucket",
    "tokens per second": "gateway_tokens_total",
    "gateway overhead": "gateway_overhead_seconds_bucket",
    "rate-limit rejections": "gateway_ratelimit_decisions_total",
    "upstream errors": "gateway_upstream_errors_total",
    "circuit states": "gateway_circuit_state",
    "in flight": "gateway_inflight_requests",
    "files stored": "gateway_files_stored_total",
    "bytes stored": "gateway_file_bytes_stored_total",
    "batches by status": "gateway_batches_total",
    "batch lines by outcome": "gateway_batch_lines_total",
    "batch lines in flight": "gateway_batch_lines_in_flight",
    "batches running": "gateway_batches_running",
    "spend": "gateway_spend_usd_total",
    "unpriced requests": "gateway_unpriced_requests_total",
    "budgets used": "gateway_budget_used_ratio",
}
ALERT_TOPICS = {
    "error rate": "gateway_requests_total",
    "latency": "gateway_request_duration_seconds_bucket",
    "redis errors": "gateway_ratelimit_backend_errors_total",
    "limiter fallbacks": "gateway_ratelimit_decisions_total",
    "team budgets": "gateway_budget_used_ratio",
}


def test_the_dashboard_and_alerts_cover_what_operators_watch() -> None:
    shown = set().union(*(used(q).metrics for _, q in dashboard_queries()))
    assert {t: m for t, m in DASHBOARD_TOPICS.items() if m not in shown} == {}
    alerted = set().union(*(used(r["expr"]).metrics for r in alert_rules()))
    assert {t: m for t, m in ALERT_TOPICS.items() if m not in alerted} == {}
    requests = next(q for t, q in dashboard_queries() if t.startswith("Requests/s by model"))
    assert {"model", "status"} <= used(requests).labels


def test_the_query_reader() -> None:
    """The metric and label extraction the checks below rely on."""
    u = used(
        'histogram_quantile(0.95, sum by (le, model) (rate(x_bucket{job=~"a|b", stream="false"}'
        "[5m]))) / ignoring(k) sum without (q) (y_total offset 5m) > 0.5 and on (m) max(z)"
    )
    assert u.metrics == {"x_bucket", "y_total", "z"}
    assert u.labels == {"le", "model", "job", "stream", "k", "q", "m"}


# ---------------------------------------------------------------- against the real thing


@dataclass
class Observed:
    """What /metrics exported after the traffic, and a Prometheus that scraped it."""

    labels_of: dict[str, set[str]]  # sample name -> label names seen on it
    prometheus: httpx.Client


def gateway_config(
    upstream: ScriptedUpstream, redis_url: str, store: Path, metrics_port: int
) -> str:
    """Metrics on a listener of their own, as the chart runs the gateway. Budgets too large to
    refuse anything; m-ok priced, m-free not (its answers are counted as unpriced)."""
    oai = scripted_providers(upstream.url, "http://127.0.0.1:1/v1")["oai"]
    oai["pricing"] = {"m-ok": {"input": 1, "output": 2}}
    budget = {"usd": 1000, "period": "month"}
    return yaml.safe_dump({
        "teams": {TEAM: {"budget": budget}},
        "auth": {"keys": [
            {"id": "full", "key": FULL_KEY, "limits": {"rpm": 100000}, "team": TEAM,
             "budget": budget},
            {"id": "limited", "key": LIMITED_KEY, "limits": {"rpm": 2}},
        ]},
        "providers": {
            "oai": oai,
            "dead": {"type": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1",
                     "api_key": OPENAI_TEST_KEY},
        },
        "models": {
            "ok": {"targets": [{"provider": "oai", "model": "m-ok"}]},
            "free": {"targets": [{"provider": "oai", "model": "m-free"}]},
            "failing": {"targets": [{"provider": "oai", "model": "m-failing"}]},
            "unreachable": {"targets": [{"provider": "dead", "model": "m-dead"}]},
            "cached": {"targets": [{"provider": "oai", "model": "m-ok"}],
                       "cache": {"ttl_s": 600}},
        },
        "cache": {"backend": "redis"},  # the limits' Redis: killed, the cache counts errors
        "circuit_breaker": {"failures": 2, "cooldown_s": 3600},
        "rate_limit": {"backend": "redis", "redis_url": redis_url, "on_backend_error": "local",
                       "timeout_ms": 200, "breaker": {"failures": 1, "cooldown_s": 3600}},
        "files": {"store": str(store)},
        "batches": {"poll_s": 0.05},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
    })  # fmt: skip


def traffic(gw: GatewayProcess) -> None:
    """One round of every kind of request; errors are expected and counted, not raised."""
    full = openai.OpenAI(base_url=gw.url + "/v1", api_key=FULL_KEY, max_retries=0)
    limited = openai.OpenAI(base_url=gw.url + "/v1", api_key=LIMITED_KEY, max_retries=0)
    calls: list[tuple[openai.OpenAI, dict[str, Any]]] = [
        *[(full, {"model": "ok", "prompt": "hello", "max_tokens": 8})] * 3,
        *[(full, {"model": "ok", "prompt": "hello", "max_tokens": 8, "stream": True})] * 3,
        (full, {"model": "free", "prompt": "hello", "max_tokens": 8}),
        *[(limited, {"model": "ok", "prompt": "hi", "max_tokens": 4})] * 3,
        *[(full, {"model": "failing", "prompt": "__status_500__"})] * 3,
        (full, {"model": "unreachable", "prompt": "hello"}),
        *[(full, {"model": "cached", "prompt": "hello again", "max_tokens": 8})] * 3,
    ]
    with full, limited:
        for client, kw in calls:
            try:
                out = client.completions.create(**kw)
                if kw.get("stream"):
                    list(out)
            except openai.APIError:
                pass


def batch_traffic(gw: GatewayProcess) -> None:
    """A file uploaded, a batch of it run to its end (a line that completes, one refused),
    the input file deleted: every files and batches metric has its series."""
    lines = [
        {"custom_id": "ok", "method": "POST", "url": "/v1/completions",
         "body": {"model": "ok", "prompt": "hello", "max_tokens": 8}},
        {"custom_id": "refused", "method": "POST", "url": "/v1/completions",
         "body": {"model": "ok", "prompt": "hello", "temperature": 5}},
    ]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=FULL_KEY, max_retries=0) as client:
        made = client.files.create(file=("in.jsonl", content), purpose="batch")
        batch = client.batches.create(
            input_file_id=made.id, endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + POLL_S
        while batch.status in ("validating", "in_progress", "finalizing"):
            assert time.monotonic() < deadline, f"batch {batch.id} still {batch.status}"
            time.sleep(0.1)
            batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed", batch.errors
        client.files.delete(made.id)


def start_prometheus(workdir: Path, gateway_port: int) -> ServerProcess:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: `apt-get install prometheus` (make chart-check does)")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": JOB,
                            "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}]}],
    }))  # fmt: skip
    return start_on_free_port(
        lambda port: [
            binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ],
        ready_path="/-/ready",
    )  # fmt: skip


def query(prom: httpx.Client, expr: str) -> list[dict[str, Any]]:
    r = prom.get("/api/v1/query", params={"query": expr})
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def wait_for_scrapes(prom: httpx.Client, n: int) -> None:
    """Until Prometheus holds n more scrapes of the gateway than now (a readiness poll)."""
    expr = f'count_over_time(up{{job="{JOB}"}}[10m])'

    def count() -> int:
        result = query(prom, expr)
        return int(float(result[0]["value"][1])) if result else 0

    target = count() + n
    deadline = time.monotonic() + POLL_S
    while count() < target:
        assert time.monotonic() < deadline, f"Prometheus did not scrape {n} times"
        time.sleep(0.2)


def alerts(prom: httpx.Client) -> set[str]:
    data = prom.get("/api/v1/alerts").json()["data"]["alerts"]
    return {a["labels"]["alertname"] for a in data if a["state"] in ("pending", "firing")}


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    workdir = tmp_path_factory.mktemp("monitoring")
    metrics_port = free_port()
    with (
        start_scripted("openai", api_key=OPENAI_TEST_KEY) as upstream,
        RedisServer() as redis,
        GatewayProcess(
            gateway_config(upstream, redis.url, workdir / "files", metrics_port), workdir
        ) as gw,
    ):
        traffic(gw)  # Redis up: limits shared, refusals decided in Redis
        batch_traffic(gw)
        with (
            start_prometheus(workdir, metrics_port) as prometheus,
            httpx.Client(base_url=prometheus.url, timeout=10.0, trust_env=False) as prom,
        ):
            wait_for_scrapes(prom, 2)
            redis.kill()  # the limiter falls back to local limits
            # Traffic across scrapes, as in production: a rate sees a series' increases, and
            # series that appear now (local decisions) increase after their first scrape.
            traffic(gw)
            wait_for_scrapes(prom, 1)
            traffic(gw)
            wait_for_scrapes(prom, 2)
            labels_of: dict[str, set[str]] = {}
            for sample in scrape(f"http://127.0.0.1:{metrics_port}").samples:
                labels_of.setdefault(sample.name, set()).update(sample.labels)
            yield Observed(labels_of, prom)


def test_every_metric_and_label_the_queries_use_is_exported(observed: Observed) -> None:
    missing = {}
    for title, expr in all_queries():
        u = used(expr)
        metrics = u.metrics - observed.labels_of.keys()
        labels = u.labels - TARGET_LABELS
        labels -= set().union(*(observed.labels_of.get(m, set()) for m in u.metrics))
        if metrics or labels:
            missing[title] = (sorted(metrics), sorted(labels))
    assert missing == {}


def test_every_dashboard_query_returns_data(observed: Observed) -> None:
    empty = [title for title, expr in dashboard_queries()
             if not query(observed.prometheus, expr)]  # fmt: skip
    assert empty == []


def test_spend_is_counted_by_team_and_unpriced_answers_apart(observed: Observed) -> None:
    """What the spend row shows, as Prometheus holds it: the team's key and the key without
    one spent on the priced model; the unpriced model's answers are counted, and cost 0."""
    prom = observed.prometheus
    spend = {r["metric"]["team"]: float(r["value"][1])
             for r in query(prom, "sum by (team) (gateway_spend_usd_total)")}  # fmt: skip
    assert spend.keys() == {TEAM, "none"} and min(spend.values()) > 0, spend
    by_model = query(prom, "sum by (model) (gateway_spend_usd_total > 0)")
    assert sorted(r["metric"]["model"] for r in by_model) == ["cached", "ok"]
    unpriced = query(prom, "sum by (model, provider) (gateway_unpriced_requests_total)")
    assert [r["metric"] for r in unpriced] == [{"model": "free", "provider": "oai"}]


def test_the_alert_rules_load_evaluate_and_fire(observed: Observed) -> None:
    prom = observed.prometheus
    deadline = time.monotonic() + POLL_S
    while not alerts(prom) >= EXPECTED_ALERTS:
        assert time.monotonic() < deadline, f"active: {sorted(alerts(prom))}"
        time.sleep(0.2)
    groups = prom.get("/api/v1/rules").json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(alert_rules())
    assert [r["name"] for r in rules if r["health"] != "ok"] == []
    assert "GatewayConfigReloadFailed" not in alerts(prom)  # nothing went wrong there
