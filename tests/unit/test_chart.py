"""charts/specdeploy with the real helm (built by the dev-cluster harness): lint, render, RBAC, schema.

No cluster: `helm lint` and `helm template` only. The PrometheusRule's alerts and the dashboard's queries:
tests/unit/test_chart_rules.py.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.cli import run as run_command
from specdeploy.devcluster import build

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "specdeploy"
RELEASE, RELEASE_NAMESPACE = "sd", "specdeploy-system"
ALL_FEATURES = ("prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=true",
                "engineMonitoring.podMonitor.enabled=true")


@functools.cache
def _helm() -> str:
    found, _ = build.find_binaries(["helm"])
    if "helm" not in found:
        pytest.skip("helm is not built yet: run `make cluster-binaries` (`make test` does)")
    return str(found["helm"])


def _helm_run(*args: str, values: str | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        file.write(values or "{}")
        file.flush()
        return subprocess.run([_helm(), *args, "--values", file.name], capture_output=True, text=True, timeout=60)


@functools.cache
def _render(*sets: str, values: str | None = None, crds: bool = False) -> tuple[dict[str, Any], ...]:
    args = ["template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE]
    args += [arg for value in sets for arg in ("--set", value)]
    if crds:
        args.append("--include-crds")
    result = _helm_run(*args, values=values)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _kinds(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def _one(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    [doc] = _kinds(docs, kind)
    return doc


# --- lint and render ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sets", [(), ALL_FEATURES, ("watchNamespaces={team-a,team-b}", *ALL_FEATURES)],
                         ids=["defaults", "all-features", "namespaced"])
def test_helm_lint_is_clean(sets: tuple[str, ...]) -> None:
    result = subprocess.run([_helm(), "lint", "--strict", str(CHART), *[a for s in sets for a in ("--set", s)]],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


def test_defaults_render_the_operator_without_monitoring_crds() -> None:
    docs = _render()
    kinds = sorted({doc["kind"] for doc in docs})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "PodDisruptionBudget", "Role",
                     "RoleBinding", "Service", "ServiceAccount"]
    assert not any(doc["apiVersion"].startswith("monitoring.coreos.com") for doc in docs)


def test_every_feature_renders_its_monitoring_object() -> None:
    docs = _render(*ALL_FEATURES)
    assert {doc["kind"] for doc in docs} >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_chart_crd_is_the_committed_crd() -> None:
    chart_crd = CHART / "crds" / "specdeploy.io_speculativedeployments.yaml"
    committed = REPO / "crds" / "specdeploy.io_speculativedeployments.yaml"
    assert [p.name for p in (CHART / "crds").iterdir()] == [committed.name]
    assert chart_crd.read_bytes() == committed.read_bytes(), (
        "cp crds/specdeploy.io_speculativedeployments.yaml charts/specdeploy/crds/")
    crd = _one(_render(crds=True), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "speculativedeployments.specdeploy.io"


# --- the operator Deployment -------------------------------------------------------------------------

def _container(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [container] = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_one_operator_replica_is_recreated_locked_down_and_probed_on_healthz() -> None:
    deployment = _one(_render("replicas=1"), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert _kinds(_render("replicas=1"), "PodDisruptionBudget") == []
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == _one(_render(), "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(_render("replicas=1"))
    assert container["image"] == "ghcr.io/specdeploy/operator:0.1.0"
    security = container["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8081}
    [env] = [e for e in container["env"] if e["name"] == "POD_NAMESPACE"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_security_context_matches_the_operator_image() -> None:
    """operator/Dockerfile's numeric USER is what the chart runs as, and its entrypoint is the chart's command."""
    dockerfile = (REPO / "operator" / "Dockerfile").read_text()
    user, group = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)[-1]
    pod = _one(_render(), "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(user), int(group))
    entrypoint = json.loads(re.findall(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.MULTILINE)[-1])
    container = _container(_render())
    assert entrypoint == container["command"] + container["args"][:1]   # the chart's command replaces it


def _run_params(container: dict[str, Any]) -> dict[str, Any]:
    """The rendered args as `specdeploy run` parses them (an unknown flag fails here)."""
    assert container["command"] == ["specdeploy"] and container["args"][0] == "run"
    context = run_command.make_context("run", list(container["args"][1:]))
    return dict(context.params)


def test_values_become_specdeploy_run_flags() -> None:
    defaults = _run_params(_container(_render()))
    assert defaults["namespaces"] == () and defaults["liveness"] == "http://0.0.0.0:8080/healthz"
    assert defaults["metrics_port"] == 8081 and defaults["log_format"] == "json"
    assert defaults["prometheus_url"] is None and defaults["alertmanager_url"] is None
    params = _run_params(_container(_render(values="""
watchNamespaces: [team-a, team-b]
prometheusUrl: http://prom.monitoring:9090
alertmanagerUrl: http://am.monitoring:9093
logFormat: plain
resyncSeconds: 12.5
analysisTickSeconds: 2
metricsPort: 9100
healthPort: 9200
verbose: true
extraArgs: [--verbose]
""")))
    assert params == {**params, "namespaces": ("team-a", "team-b"), "prometheus_url": "http://prom.monitoring:9090",
                      "alertmanager_url": "http://am.monitoring:9093", "log_format": "plain",
                      "resync_seconds": 12.5, "analysis_tick_seconds": 2.0, "metrics_port": 9100,
                      "liveness": "http://0.0.0.0:9200/healthz", "verbose": True}


def test_operator_headers_secrets_are_mounted_where_the_flags_point() -> None:
    assert "prometheus_headers_dir" not in {k for k, v in _run_params(_container(_render())).items() if v}
    docs = _render("prometheusHeadersSecret=prom-auth", "alertmanagerHeadersSecret=am-auth")
    container = _container(docs)
    params = _run_params(container)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    for which, secret in (("prometheus", "prom-auth"), ("alertmanager", "am-auth")):
        mount = mounts[f"{which}-headers"]
        assert str(params[f"{which}_headers_dir"]) == mount["mountPath"] and mount["readOnly"] is True
        assert volumes[f"{which}-headers"]["secret"]["secretName"] == secret


def test_two_replicas_by_default_roll_one_at_a_time_on_other_nodes_with_a_budget_and_probes_on_metrics() -> None:
    """The one waiting for the Lease serves no /healthz (kopf serves it once the pod leads): every probe reads
    /metrics, so both pods are Ready and the budget lets a drain of the active pod's node through."""
    docs = _render()
    spec = _one(docs, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    [term] = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert _container(docs)[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    budget = _one(docs, "PodDisruptionBudget")["spec"]
    assert budget == {"maxUnavailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
    assert _kinds(_render("podDisruptionBudget.enabled=false"), "PodDisruptionBudget") == []
    failed = _helm_run("template", RELEASE, str(CHART), "--set", "metricsPort=0")
    assert failed.returncode != 0 and "replicas above 1 needs a metricsPort other than 0" in failed.stderr


def test_metrics_port_zero_drops_the_port_and_the_service() -> None:
    docs = _render("metricsPort=0", "replicas=1")
    assert _kinds(docs, "Service") == []
    assert [p["name"] for p in _container(docs)["ports"]] == ["health"]
    failed = _helm_run("template", RELEASE, str(CHART), "--set", "metricsPort=0", "--set", "replicas=1",
                       "--set", "metrics.serviceMonitor.enabled=true")
    assert failed.returncode != 0 and "metrics.serviceMonitor.enabled needs" in failed.stderr


# --- RBAC --------------------------------------------------------------------------------------------

RBAC_KINDS = ("ClusterRole", "Role")
MODES = {
    "cluster-wide": (*ALL_FEATURES,),
    "namespaced": ("watchNamespaces={team-a,team-b}", *ALL_FEATURES),
}

#: Every API call of operator/specdeploy/reconcile and of kopf for it: (group, resource, verb).
OPERATOR_CALLS = {
    ("specdeploy.io", "speculativedeployments", verb) for verb in ("get", "list", "watch", "patch")
} | {
    ("specdeploy.io", "speculativedeployments/status", "patch"),
    ("apps", "deployments", "get"), ("apps", "deployments", "list"),
    ("apps", "deployments", "watch"), ("apps", "deployments", "create"),
    ("apps", "deployments", "patch"), ("apps", "deployments", "delete"), ("apps", "replicasets", "list"),
    ("", "configmaps", "create"), ("", "configmaps", "patch"), ("", "configmaps", "get"),
    ("", "services", "create"), ("", "services", "patch"), ("", "services", "get"),
    ("", "pods", "list"), ("", "pods", "watch"),
    ("", "events", "create"),
    ("", "secrets", "get"),
    ("monitoring.coreos.com", "podmonitors", "get"), ("monitoring.coreos.com", "podmonitors", "list"),
    ("monitoring.coreos.com", "podmonitors", "create"),
    ("monitoring.coreos.com", "podmonitors", "patch"), ("monitoring.coreos.com", "podmonitors", "delete"),
}
#: Granted only with rbac.leaderWorkerSets (SDs whose layout spans nodes): read by name, watch, apply, prune.
LEADER_WORKER_SET_CALLS = {("leaderworkerset.x-k8s.io", "leaderworkersets", v)
                           for v in ("get", "list", "watch", "create", "patch", "delete")}
CLUSTER_READS = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")}
LEASE_CALLS = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role.get("rules") or []
            for group in rule.get("apiGroups", []) for resource in rule.get("resources", [])
            for verb in rule["verbs"]}


def _operator_roles(docs: tuple[dict[str, Any], ...]) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    """Roles and ClusterRoles bound to the operator's ServiceAccount, by (kind, name, namespace)."""
    account = _one(docs, "ServiceAccount")["metadata"]
    bound = set()
    for binding in _kinds(docs, "RoleBinding") + _kinds(docs, "ClusterRoleBinding"):
        subjects = {(s["kind"], s["name"], s.get("namespace")) for s in binding["subjects"]}
        if ("ServiceAccount", account["name"], account["namespace"]) in subjects:
            ref = binding["roleRef"]
            bound.add((ref["kind"], ref["name"], binding["metadata"].get("namespace") if ref["kind"] == "Role" else None))
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d
             for d in docs if d["kind"] in RBAC_KINDS}
    assert bound <= set(roles), f"bindings to roles the chart does not define: {bound - set(roles)}"
    return {key: roles[key] for key in bound}


@pytest.mark.parametrize("mode", MODES)
def test_no_wildcard_in_any_rule(mode: str) -> None:
    docs = _render(*MODES[mode], "rbac.aggregateToDefaultRoles=true")
    roles = [d for d in docs if d["kind"] in RBAC_KINDS]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)


def test_cluster_wide_mode_grants_the_operator_calls_everywhere() -> None:
    roles = _operator_roles(_render(*MODES["cluster-wide"]))
    cluster = set().union(*(_grants(r) for (kind, _, _), r in roles.items() if kind == "ClusterRole"))
    assert cluster == OPERATOR_CALLS | CLUSTER_READS | {("specdeploy.io", "speculativedeployments/finalizers", "update")}
    [lease] = [r for (kind, _, ns), r in roles.items() if kind == "Role"]
    assert lease["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert _grants(lease) == LEASE_CALLS
    named = [rule for rule in lease["rules"] if "resourceNames" in rule]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["specdeploy-operator"], "verbs": ["get", "update"]}]


def test_namespaced_mode_grants_only_cluster_reads_cluster_wide() -> None:
    roles = _operator_roles(_render(*MODES["namespaced"]))
    cluster = set().union(*(_grants(r) for (kind, _, _), r in roles.items() if kind == "ClusterRole"))
    assert cluster == CLUSTER_READS | {("", "namespaces", "list"), ("", "namespaces", "watch")}
    per_namespace = {ns: _grants(r) for (kind, name, ns), r in roles.items() if kind == "Role" and not name.endswith("-lease")}
    assert set(per_namespace) == {"team-a", "team-b"}
    for grants in per_namespace.values():
        assert grants == OPERATOR_CALLS | {("specdeploy.io", "speculativedeployments/finalizers", "update")}
    [lease] = [r for (kind, name, _), r in roles.items() if name.endswith("-lease")]
    assert lease["metadata"]["namespace"] == RELEASE_NAMESPACE and _grants(lease) == LEASE_CALLS


def test_secrets_and_pod_monitors_can_be_left_out() -> None:
    roles = _operator_roles(_render("rbac.readSecrets=false", "rbac.podMonitors=false"))
    grants = set().union(*(_grants(r) for r in roles.values()))
    assert not {g for g in grants if g[1] in ("secrets", "podmonitors")}
    assert ("apps", "deployments", "patch") in grants


@pytest.mark.parametrize("mode", MODES)
def test_leader_worker_sets_are_granted_only_when_switched_on(mode: str) -> None:
    def granted(*sets: str) -> set[tuple[str, str, str]]:
        roles = _operator_roles(_render(*MODES[mode], *sets))
        return set().union(*(_grants(r) for r in roles.values()))

    assert not {g for g in granted() if g[1] == "leaderworkersets"}
    with_groups = granted("rbac.leaderWorkerSets=true")
    assert {g for g in with_groups if g[1] == "leaderworkersets"} == LEADER_WORKER_SET_CALLS
    assert with_groups - LEADER_WORKER_SET_CALLS == granted()


def test_users_get_sd_rights_through_the_aggregated_default_roles() -> None:
    docs = _render()
    aggregated = {d["metadata"]["name"]: d for d in _kinds(docs, "ClusterRole")
                  if any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in d["metadata"]["labels"])}
    view, edit = aggregated[f"{RELEASE}-specdeploy-view"], aggregated[f"{RELEASE}-specdeploy-edit"]
    assert ("specdeploy.io", "speculativedeployments", "list") in _grants(view)
    assert ("specdeploy.io", "speculativedeployments", "patch") in _grants(edit)
    assert ("specdeploy.io", "speculativedeployments/scale", "get") in _grants(view)
    assert ("specdeploy.io", "speculativedeployments/scale", "update") in _grants(edit)   # kubectl scale sd
    assert "rbac.authorization.k8s.io/aggregate-to-admin" in edit["metadata"]["labels"]
    plain = _kinds(_render("rbac.aggregateToDefaultRoles=false"), "ClusterRole")
    assert plain and not any("aggregate-to" in key for role in plain for key in role["metadata"]["labels"])
    assert not _kinds(_render("rbac.create=false"), "ClusterRole")


# --- values.schema.json ------------------------------------------------------------------------------

BAD_VALUES = [
    ("logFormat: xml", "at '/logFormat': value must be one of 'json', 'plain'"),
    ("resyncSeconds: 0", "at '/resyncSeconds'"),
    ("watchNamespaces: [Team_A]", "at '/watchNamespaces/0': 'Team_A' does not match pattern"),
    ("prometheusUrl: prometheus:9090", "at '/prometheusUrl': 'prometheus:9090' does not match pattern"),
    ("metricsPort: 70000", "at '/metricsPort': maximum"),
    ("prometheusUrI: http://prometheus:9090", "additional properties 'prometheusUrI' not allowed"),
    ("image: {repository: ''}", "at '/image/repository'"),
    ("dashboard: {labels: {grafana_dashboard: 1}}", "at '/dashboard/labels/grafana_dashboard': got number, want string"),
    ("prometheusRule: {acceptanceBelowFloor: {threshold: 0.5}}", "at '/prometheusRule/acceptanceBelowFloor'"),
    ("prometheusRule: {speculationRolledBack: {window: 10 minutes}}", "at '/prometheusRule/speculationRolledBack/window'"),
    ("prometheusRule: {speculationInconclusive: {for: 30 minutes}}", "at '/prometheusRule/speculationInconclusive/for'"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[v for v, _ in BAD_VALUES])
def test_schema_refuses_bad_values_with_its_message(values: str, message: str) -> None:
    result = _helm_run("template", RELEASE, str(CHART), values=values)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_schema_accepts_a_full_production_values_file() -> None:
    values = """
watchNamespaces: [inference, inference-canary]
prometheusUrl: http://kube-prometheus-stack-prometheus.monitoring.svc:9090
alertmanagerUrl: http://kube-prometheus-stack-alertmanager.monitoring.svc:9093
image: {repository: registry.example.com/specdeploy/operator, tag: 0.1.0, pullPolicy: Always}
imagePullSecrets: [{name: registry}]
resources: {requests: {cpu: 200m, memory: 512Mi}, limits: {memory: 1Gi}}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: platform, effect: NoSchedule}]
priorityClassName: system-cluster-critical
extraEnv: [{name: TZ, value: UTC}]
metrics: {serviceMonitor: {enabled: true, interval: 15s, labels: {release: prom}}}
engineMonitoring: {podMonitor: {enabled: true, labels: {release: prom}}}
prometheusRule: {enabled: true, labels: {release: prom}, speculationInconclusive: {for: 1h}}
dashboard: {namespace: monitoring, annotations: {grafana_folder: LLM}}
"""
    docs = _render(values=values)
    assert _one(docs, "ConfigMap")["metadata"]["namespace"] == "monitoring"
    assert _one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "prom"


# --- monitoring objects ------------------------------------------------------------------------------

def test_service_monitor_keeps_the_sd_namespace_label() -> None:
    docs = _render(*ALL_FEATURES)
    monitor, service = _one(docs, "ServiceMonitor"), _one(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("mode", MODES)
def test_engine_pod_monitor_selects_operator_pods_with_the_analysis_labels(mode: str) -> None:
    monitor = _one(_render(*MODES[mode]), "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "specdeploy"
    assert monitor["podTargetLabels"] == ["specdeploy.io/name", "specdeploy.io/variant"]
    assert monitor["podMetricsEndpoints"][0]["port"] == "http"
    expected = {"any": True} if mode == "cluster-wide" else {"matchNames": ["team-a", "team-b"]}
    assert monitor["namespaceSelector"] == expected


def test_engine_pod_monitor_matches_the_pods_the_operator_renders() -> None:
    from specdeploy.api.resource import load_resource
    from specdeploy.planning.plan import make_plan
    from specdeploy.reconcile.children import desired_children

    resource = load_resource((REPO / "examples" / "llama-8b-ngram.yaml").read_text())
    children = desired_children(resource, make_plan(resource.spec))
    monitor = _one(_render("engineMonitoring.podMonitor.enabled=true"), "PodMonitor")["spec"]
    for deployment in children.deployments.values():
        pod = deployment["spec"]["template"]
        assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert all(label in pod["metadata"]["labels"] for label in monitor["podTargetLabels"])
        assert "http" in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]


# --- the GitOps examples -----------------------------------------------------------------------------

def _example_values() -> dict[str, str]:
    examples = REPO / "examples"
    [release] = [d for d in yaml.safe_load_all((examples / "flux" / "specdeploy.yaml").read_text())
                 if d["kind"] == "HelmRelease"]
    [application] = list(yaml.safe_load_all((examples / "argocd" / "application.yaml").read_text()))
    assert release["spec"]["chart"]["spec"]["chart"] == "./charts/specdeploy"
    assert application["spec"]["source"]["path"] == "charts/specdeploy"
    return {"flux": yaml.safe_dump(release["spec"]["values"]), "argocd": application["spec"]["source"]["helm"]["values"]}


@pytest.mark.parametrize("tool", ["flux", "argocd"])
def test_gitops_examples_values_pass_the_schema(tool: str) -> None:
    docs = _render(values=_example_values()[tool])
    assert _run_params(_container(docs))["namespaces"] == ("inference",)
    assert _kinds(docs, "ServiceMonitor") and _kinds(docs, "PrometheusRule")
