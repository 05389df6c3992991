"""The Helm chart (deploy/helm/completions-gateway), rendered by Helm's own library for each of
its ci/*-values.yaml: it lints; every object validates strictly against the Kubernetes schemas
(the oldest and newest release the chart supports; the Prometheus Operator's for its CRDs); the
config it renders passes `gateway check-config` with the environment the pod would have; and
the pieces fit together (probes, ports, selectors, grace period, Redis wiring, the file store,
checksums)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART_DIR,
    FULLNAME,
    NAMESPACE,
    VALUES_FILES,
    Objects,
    container,
    gateway_config,
    load,
    notes,
    render,
    sha256,
    values_of,
)
from tests.deploy.crds import SCHEMAS
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import REPO_ROOT, free_port

KUBE_VERSIONS = ("1.25.0", "1.37.0")  # Chart.yaml's kubeVersion floor, and the newest schemas
REDIS_NAME = f"{FULLNAME}-redis"
# What the operator's own Secrets hold in existing-secret-values.yaml (the chart cannot see them).
EXISTING_SECRETS = {
    "gateway-credentials": {"GATEWAY_API_KEY": "sk-team-a", "OPENAI_API_KEY": "sk-oa",
                            "FIREWORKS_API_KEY": "fw-key"},
    "redis-credentials": {"url": "redis://:pw@redis.cache:6379/0"},
    "gateway-s3": {"AWS_ACCESS_KEY_ID": "AKIA0", "AWS_SECRET_ACCESS_KEY": "s3-secret",
                   "AWS_REGION": "eu-west-1"},
}  # fmt: skip


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return load()


@pytest.fixture(scope="module")
def rendered(chart: helm.Chart) -> dict[str, Objects]:
    return {name: render(chart, values_of(name)) for name in VALUES_FILES}


def test_the_values_files_cover_the_deployments_the_chart_supports() -> None:
    wanted = {"default", "autoscaling", "external-redis", "in-cluster-redis", "existing-secret",
              "object-store"}  # fmt: skip
    assert wanted <= set(VALUES_FILES)


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_lint_finds_nothing_above_info(name: str) -> None:
    report = helm.lint(str(CHART_DIR), values_of(name), strict=True)
    problems = [m for m in report["messages"] if m["severity"] > 1]
    assert not problems and not report["errors"], report


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_every_object_validates_strictly(rendered: dict[str, Objects], name: str) -> None:
    for (kind, obj_name), obj in rendered[name].items():
        if kind in SCHEMAS:
            jsonschema.validate(obj, SCHEMAS[kind])
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{kind}/{obj_name} on Kubernetes {version}: {exc.message}")


def test_strict_validation_catches_a_misspelled_field(rendered: dict[str, Objects]) -> None:
    """The validation above can fail: a typo in a container field is refused."""
    deployment = json.loads(json.dumps(rendered["default"][("Deployment", FULLNAME)]))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicie"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicie"):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)


# ---------------------------------------------------------------- the config


def pod_env(objs: Objects) -> dict[str, str]:
    """The environment the gateway container gets: the chart's Secret (or the operator's),
    then `env` (a secretKeyRef read from EXISTING_SECRETS)."""
    c = container(objs)
    env: dict[str, str] = {}
    for source in c["envFrom"]:
        name = source["secretRef"]["name"]
        own = objs.get(("Secret", name))
        if own is not None:
            env.update({k: base64.b64decode(v).decode() for k, v in own["data"].items()})
        else:
            env.update(EXISTING_SECRETS[name])
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = EXISTING_SECRETS[ref["name"]][ref["key"]]
    return env


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_the_configmap_passes_check_config(
    rendered: dict[str, Objects], name: str, tmp_path: Path
) -> None:
    objs = rendered[name]
    path = tmp_path / "config.yaml"
    path.write_text(gateway_config(objs))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **pod_env(objs)}
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert ": ok (" in run.stdout


def test_check_config_refuses_a_config_whose_variable_the_pod_lacks(
    rendered: dict[str, Objects], tmp_path: Path
) -> None:
    """Without the Secret's GATEWAY_API_KEY the config is refused, naming the YAML path."""
    path = tmp_path / "config.yaml"
    path.write_text(gateway_config(rendered["default"]))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1
    assert "auth.keys[0].key" in run.stderr and "GATEWAY_API_KEY" in run.stderr


def test_the_chart_decides_address_port_and_keeps_the_rest(rendered: dict[str, Objects]) -> None:
    cfg = yaml.safe_load(gateway_config(rendered["default"]))
    assert cfg["server"] == {"host": "0.0.0.0", "port": 8080}
    assert cfg["metrics"] == {"enabled": True, "listen": "0.0.0.0:9464"}  # not on the API port
    defaults = values_of_chart()["config"]
    assert cfg["models"] == defaults["models"] and cfg["providers"] == defaults["providers"]
    assert cfg["rate_limit"] == {"on_backend_error": "local"}  # no Redis: counted per pod


def values_of_chart() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART_DIR / "values.yaml").read_text()))


# ---------------------------------------------------------------- the pods


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_the_deployment_runs_the_gateway_safely(rendered: dict[str, Objects], name: str) -> None:
    objs = rendered[name]
    pod = objs[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    c = container(objs)
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] > 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert not pod["automountServiceAccountToken"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--port={ports['http']}" in c["args"]
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"] == {"path": "/livez", "port": "http"}
    assert probes["readinessProbe"] == probes["startupProbe"] == {"path": "/readyz", "port": "http"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/gateway"]]["configMap"]["name"] == FULLNAME
    assert "--config=/etc/gateway/config.yaml" in c["args"]
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the one writable place
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_stopping_pods_finish_their_longest_requests(
    rendered: dict[str, Objects], name: str
) -> None:
    """SIGTERM comes after the preStop wait; the gateway then lets requests in progress run
    for --shutdown-timeout, which is the longest a request may take, and the grace period
    covers both before the SIGKILL."""
    objs = rendered[name]
    pod = objs[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    c = container(objs)
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    shutdown = float(flag(c["args"], "--shutdown-timeout"))
    longest = max_total_timeout(yaml.safe_load(gateway_config(objs)))
    assert pre_stop >= 5
    assert longest is None or shutdown >= longest
    assert pod["terminationGracePeriodSeconds"] > pre_stop + shutdown


def flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))


def max_total_timeout(cfg: dict[str, Any]) -> float | None:
    totals = [m.get("timeout", {}).get("total_s") for m in cfg["models"].values()]
    known = [t for t in totals if t is not None]
    return max(known) if known else None


def test_a_config_change_rolls_the_pods(chart: helm.Chart) -> None:
    def annotations(values: dict[str, Any]) -> dict[str, str]:
        objs = render(chart, values)
        meta = objs[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]
        return dict(meta["annotations"])

    base = annotations({})
    again = annotations({})
    changed = values_of_chart()["config"]
    changed["models"]["default"]["targets"][0]["model"] = "another/model"
    other = annotations({"config": changed})
    assert base["checksum/config"] == again["checksum/config"]
    assert re.fullmatch(r"[0-9a-f]{64}", base["checksum/config"])
    assert other["checksum/config"] != base["checksum/config"]
    objs = render(chart, {"config": changed})
    assert other["checksum/config"] == sha256(gateway_config(objs).rstrip("\n"))
    secret = annotations({"secret": {"env": {"OPENAI_API_KEY": "sk-new"}}})
    assert secret["checksum/secret"] != base["checksum/secret"]


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_service_and_budget_select_the_gateway_pods(
    rendered: dict[str, Objects], name: str
) -> None:
    objs = rendered[name]
    deployment = objs[("Deployment", FULLNAME)]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = objs[("Service", FULLNAME)]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pods = (
        deployment["spec"].get("replicas")
        or objs[("HorizontalPodAutoscaler", FULLNAME)]["spec"]["minReplicas"]
    )
    pdb = objs.get(("PodDisruptionBudget", FULLNAME))
    assert (pdb is not None) == (pods > 1)
    if pdb is not None:
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_autoscaling(rendered: dict[str, Objects]) -> None:
    objs = rendered["autoscaling"]
    hpa = objs[("HorizontalPodAutoscaler", FULLNAME)]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME,
    }  # fmt: skip
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["target"]["averageUtilization"] == 60
    assert metrics["Pods"]["pods"]["metric"]["name"] == "gateway_inflight_requests"
    assert "replicas" not in objs[("Deployment", FULLNAME)]["spec"]  # the HPA owns it
    # Redis down: each pod enforces limit / the most pods there can be, never more in total.
    assert yaml.safe_load(gateway_config(objs))["rate_limit"]["replicas"] == 12
    assert ("HorizontalPodAutoscaler", FULLNAME) not in rendered["default"]


# ---------------------------------------------------------------- Redis and secrets


def redis_url(objs: Objects) -> dict[str, Any]:
    (item,) = [e for e in container(objs).get("env", []) if e["name"] == "GATEWAY_REDIS_URL"]
    return dict(item)


def test_in_cluster_redis(rendered: dict[str, Objects]) -> None:
    objs = rendered["in-cluster-redis"]
    sts = objs[("StatefulSet", REDIS_NAME)]
    (redis,) = sts["spec"]["template"]["spec"]["containers"]
    assert redis["image"].startswith("docker.io/library/redis:")  # the official image
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == REDIS_NAME
    assert "--maxmemory" in redis["args"] and "32mb" in redis["args"]
    assert redis["securityContext"]["readOnlyRootFilesystem"]
    # Runtime keys, budgets and spend: an append-only file on a claim, never evicted.
    args = redis["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "volatile-ttl"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and "volumes" not in sts["spec"]["template"]["spec"]
    service = objs[("Service", REDIS_NAME)]
    redis_pods = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= redis_pods.items()
    gateway_pods = objs[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= gateway_pods.items()
    assert redis_url(objs)["value"] == f"redis://{REDIS_NAME}:6379/0"
    # Redis down: each of the 3 pods' 2 workers enforces limit / 6 on its own.
    assert flag(container(objs)["args"], "--workers") == "2"
    limits = yaml.safe_load(gateway_config(objs))["rate_limit"]
    assert limits == {
        "backend": "redis", "redis_url": "${GATEWAY_REDIS_URL}", "replicas": 6,
        "on_backend_error": "local",
    }  # fmt: skip
    policy = objs[("NetworkPolicy", REDIS_NAME)]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_pods.items()
    allowed = policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= gateway_pods.items()
    assert not any(kind == "StatefulSet" for kind, _ in rendered["default"])


def test_external_redis(rendered: dict[str, Objects]) -> None:
    objs = rendered["external-redis"]
    assert redis_url(objs)["value"] == "redis://redis-master.cache.svc.cluster.local:6379/2"
    limits = yaml.safe_load(gateway_config(objs))["rate_limit"]
    assert limits["backend"] == "redis" and limits["on_backend_error"] == "closed"
    assert limits["breaker"] == {"failures": 3, "cooldown_s": 5}
    assert not any(kind == "StatefulSet" for kind, _ in objs)


def test_existing_secrets(rendered: dict[str, Objects]) -> None:
    objs = rendered["existing-secret"]
    assert not any(kind == "Secret" for kind, _ in objs)  # the operator's, not the chart's
    assert container(objs)["envFrom"][0] == {"secretRef": {"name": "gateway-credentials"}}
    assert redis_url(objs)["valueFrom"] == {
        "secretKeyRef": {"name": "redis-credentials", "key": "url"}
    }


def test_the_chart_secret_generates_a_key_unless_given(chart: helm.Chart) -> None:
    generated = render(chart, {})[("Secret", FULLNAME)]["data"]
    key = base64.b64decode(generated["GATEWAY_API_KEY"]).decode()
    assert re.fullmatch(r"sk-[A-Za-z0-9]{40}", key)
    given = render(chart, {"secret": {"env": {"GATEWAY_API_KEY": "sk-mine", "X_TOKEN": 7}}})
    data = given[("Secret", FULLNAME)]["data"]
    assert {k: base64.b64decode(v).decode() for k, v in data.items()} == {
        "GATEWAY_API_KEY": "sk-mine", "X_TOKEN": "7",
    }  # fmt: skip
    assert key not in gateway_config(render(chart, {}))  # only in the Secret


# ---------------------------------------------------------------- files and batches


def files_volume(objs: Objects) -> tuple[str | None, dict[str, Any] | None]:
    """Where the gateway container mounts the `files` volume, and that volume."""
    pod = objs[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    mounts = [m["mountPath"] for m in container(objs)["volumeMounts"] if m["name"] == "files"]
    volumes = [v for v in pod["volumes"] if v["name"] == "files"]
    assert len(mounts) == len(volumes) <= 1
    return (mounts[0], volumes[0]) if mounts else (None, None)


def strategy(objs: Objects) -> str:
    return str(objs[("Deployment", FULLNAME)]["spec"]["strategy"]["type"])


def test_the_default_store_is_a_directory_on_a_volume_claim(
    chart: helm.Chart, rendered: dict[str, Objects]
) -> None:
    objs = rendered["default"]
    cfg = yaml.safe_load(gateway_config(objs))
    mount, volume = files_volume(objs)
    assert mount is not None and volume is not None
    assert Path(cfg["files"]["store"]).is_relative_to(mount)  # the gateway writes on the volume
    claim = volume["persistentVolumeClaim"]["claimName"]
    pvc = objs[("PersistentVolumeClaim", claim)]["spec"]
    assert pvc["accessModes"] == ["ReadWriteOnce"] and pvc["resources"]["requests"]["storage"]
    assert "storageClassName" not in pvc  # the cluster's default class
    assert strategy(objs) == "Recreate"  # the volume attaches to one node
    assert cfg["files"]["max_bytes"] == 209715200
    assert cfg["batches"] == {
        "max_concurrency": 16,
        "live_concurrency": 1,
        "poll_s": 0.5,
        "lease_s": 30,
    }
    # Someone else's claim: mounted, none made; no persistence: an emptyDir, rolled as before.
    nfs = {"existingClaim": "files-nfs", "accessModes": ["ReadWriteMany"]}
    objs = render(chart, {"files": {"persistence": nfs}})
    claimed = {"name": "files", "persistentVolumeClaim": {"claimName": "files-nfs"}}
    assert files_volume(objs)[1] == claimed
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in objs)
    assert strategy(objs) == "RollingUpdate"
    objs = render(chart, {"files": {"persistence": {"enabled": False}}})
    assert files_volume(objs)[1] == {"name": "files", "emptyDir": {}}
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in objs)
    assert strategy(objs) == "RollingUpdate"


def test_several_pods_share_an_object_store(rendered: dict[str, Objects]) -> None:
    objs = rendered["object-store"]
    assert {"secretRef": {"name": "gateway-s3"}} in container(objs)["envFrom"]
    assert pod_env(objs)["AWS_SECRET_ACCESS_KEY"] == "s3-secret"
    assert files_volume(objs) == (None, None)
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in objs)
    assert strategy(objs) == "RollingUpdate"
    cfg = yaml.safe_load(gateway_config(objs))
    assert cfg["files"] == {"store": "s3://gateway-files/llm", "max_bytes": 104857600}
    assert cfg["batches"] == {
        "max_concurrency": 32,
        "live_concurrency": 1,
        "poll_s": 0.5,
        "lease_s": 60,
    }
    assert cfg["rate_limit"]["backend"] == "redis" and cfg["rate_limit"]["replicas"] == 3
    for name in ("in-cluster-redis", "autoscaling"):  # the other multi-pod values: gs://, az://
        assert "://" in yaml.safe_load(gateway_config(rendered[name]))["files"]["store"]
        assert files_volume(rendered[name]) == (None, None)


# ---------------------------------------------------------------- monitoring objects


def test_monitoring_objects(rendered: dict[str, Objects]) -> None:
    """The ServiceMonitor scrapes the metrics Service (ClusterIP), whose port is the pods' metrics
    port, where the gateway's metrics.listen listens; the API's Service carries no metrics."""
    objs = rendered["monitoring"]
    api, service = objs[("Service", FULLNAME)], objs[("Service", f"{FULLNAME}-metrics")]
    monitor = objs[("ServiceMonitor", FULLNAME)]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"].items()
    assert selector <= service["metadata"]["labels"].items()
    assert not selector <= api["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == api["spec"]["selector"]  # the gateway's pods
    ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
    listen = yaml.safe_load(gateway_config(objs))["metrics"]["listen"]
    assert port["targetPort"] == "metrics" and listen == f"0.0.0.0:{ports['metrics']}"
    assert [p["name"] for p in api["spec"]["ports"]] == ["http"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    rules = objs[("PrometheusRule", FULLNAME)]["spec"]
    alerts = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    assert rules == alerts  # the file as is: its {{ $labels }} untouched by Helm
    dashboard = objs[("ConfigMap", f"{FULLNAME}-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((REPO_ROOT / "deploy" / "grafana" / "dashboard.json").read_text())
    assert json.loads(dashboard["data"]["completions-gateway.json"]) == shipped
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert not any(k == kind for k, _ in rendered["default"])


def test_without_metrics_no_listener_port_or_service(chart: helm.Chart) -> None:
    config = values_of_chart()["config"] | {"metrics": {"enabled": False}}
    objs = render(chart, {"config": config})
    assert yaml.safe_load(gateway_config(objs))["metrics"] == {"enabled": False}
    assert [p["name"] for p in container(objs)["ports"]] == ["http"]
    assert ("Service", f"{FULLNAME}-metrics") not in objs
    assert "Metrics: off" in notes(chart, {"config": config})


# ---------------------------------------------------------------- refused values


# What several pods need: a shared store, and Redis to lease batches through.
SHARED = {"files": {"store": "s3://b/p"}, "redis": {"enabled": True}}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"replicas": 2}, "'replicas' not allowed"),
        ({"gateway": {"maxRequestSeconds": 0}}, "/gateway/maxRequestSeconds"),
        ({"service": {"type": "Ingress"}}, "/service/type"),
        ({"externalRedis": {"url": "http://redis:6379"}}, "/externalRedis/url"),
        ({"config": {"models": None}}, "/config"),
        ({"secret": {"env": {"BAD-NAME": "x"}}}, "/secret/env"),
        ({"redis": {"enabled": True}, "externalRedis": {"url": "redis://r:6379"}}, "exclusive"),
        ({"autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 2}, **SHARED},
         "minReplicas"),
        ({"gateway": {"maxRequestSeconds": 300}}, "config.models.default: its total timeout"),
        ({"config": {"models": {"x": {"targets": [{"provider": "vllm"}], "timeout_s": 900}}}},
         "config.models.x: its total timeout (900 s) is above gateway.maxRequestSeconds (600 s)"),
        ({"autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": None}}, **SHARED},
         "resources.requests.cpu"),
        ({"files": {"store": "data/files"}}, "/files/store"),
        ({"batches": {"pollSeconds": 0}}, "/batches/pollSeconds"),
        ({"config": {"batches": {"poll_s": 1}}}, "config.batches: set the chart's batches values"),
        ({"replicaCount": 2}, "files.store /var/lib/gateway/files is a directory, one pod's own: "
         "with replicaCount 2, use an object-store URL (s3://, gs://, az://) and the redis "
         "rate-limit backend"),
        ({"autoscaling": {"enabled": True}}, "with autoscaling (up to 10 pods), use an "
         "object-store URL"),
        ({"replicaCount": 2, "files": {"store": "s3://b/p"}},
         "with replicaCount 2, batches are leased through Redis"),
        ({"gateway": {"workers": 0}}, "/gateway/workers"),
        ({"metrics": {"port": 0}}, "/metrics/port"),
        ({"serviceMonitor": {"enabled": True}, "config": {"metrics": {"enabled": False},
          "models": {}}}, "serviceMonitor.enabled: config.metrics.enabled is false"),
        ({"gateway": {"workers": 2}}, "config.auth.keys[0] sets rate limits: with "
         "gateway.workers 2, use the redis rate-limit backend"),
        ({"gateway": {"workers": 2}, "config": {"auth": {"keys": [{"id": "a", "key": "k"}]},
          "models": {"m": {"targets": [{"provider": "vllm"}], "limits": {"rpm": 5}}}}},
         "config.models.m.limits: with gateway.workers 2"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_them(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError) as caught:
        render(chart, values)
    assert message in str(caught.value)


def test_notes_say_how_to_connect(chart: helm.Chart) -> None:
    text = notes(chart, {})
    assert f"port-forward svc/{FULLNAME}" in text
    assert "GATEWAY_API_KEY" in text and "base_url=" in text
    assert "counted by each pod alone" in text
    assert f"/var/lib/gateway/files (PersistentVolumeClaim {FULLNAME}-files)" in text
    shared = notes(chart, values_of("autoscaling"))
    assert "shared by all pods through Redis" in shared and "limit / 12" in shared


def test_the_rendered_config_serves_and_the_helm_test_pod_checks_it(
    rendered: dict[str, Objects], tmp_path: Path
) -> None:
    """The default render's config boots a real gateway with the pod's environment, and the
    `helm test` Pod's script passes against it (and fails with a wrong key)."""
    objs = rendered["default"]
    pod = objs[("Pod", f"{FULLNAME}-test")]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (check,) = pod["spec"]["containers"]
    assert check["envFrom"] == container(objs)["envFrom"]
    script = check["command"][-1]
    env = pod_env(objs)
    cfg = yaml.safe_load(gateway_config(objs))
    metrics_port = free_port()  # the pod's 0.0.0.0:9464, here on loopback
    cfg["metrics"]["listen"] = f"127.0.0.1:{metrics_port}"
    with GatewayProcess(yaml.safe_dump(cfg), tmp_path, env=env) as gw:
        good, wrong = (run_script(script, gw.url, key) for key in (env["GATEWAY_API_KEY"], "sk-x"))
        assert httpx.get(f"{gw.url}/metrics").status_code == 404
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert good.returncode == 0 and "models: default" in good.stdout, good.stderr
    assert wrong.returncode == 1 and "HTTP Error 401" in wrong.stderr
    assert scraped.status_code == 200 and "gateway_requests_total" in scraped.text


def run_script(script: str, url: str, key: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_URL": url, "GATEWAY_API_KEY": key}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
