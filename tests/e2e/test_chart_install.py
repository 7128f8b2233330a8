"""The Helm chart on the dev cluster: install it, then run the operator as the chart's ServiceAccount.

The chart's own operator pod is not used (its image cannot be pulled here, and kwok would call it
Running anyway): `specdeploy run` runs locally with the arguments the chart rendered, the namespace the
downward API would give, and a TokenRequest token of the chart's ServiceAccount — not admin. If the
chart's RBAC misses anything the operator or kopf does, the operator logs a 403 and the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_resources import POD_MONITOR_CRD, SCENARIO_NAME, SCENARIO_SD

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.simadmin import sim_admin
from specdeploy.devcluster.waiters import condition, get_json, wait_established

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "specdeploy"
EXAMPLE = REPO / "examples" / "llama-8b-ngram.yaml"
SD_NAME = "llama-8b-ngram"
#: What the operator's log must never say: a missing RBAC rule shows as one of these (lightkube's ApiError,
#: an HTTP log line, kopf's fallback warnings).
DENIED = ("forbidden", "Forbidden", "Not enough permissions")



def _helm(cluster: DevCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(cluster.helm_path), f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def release(dev_cluster: DevCluster, crds: None, namespace: str) -> Iterator[str]:
    """A release name in the test's namespace; uninstalled afterwards (its ClusterRoles outlive the namespace)."""
    name = f"sd-{uuid.uuid4().hex[:6]}"
    yield name
    _helm(dev_cluster, "uninstall", name, "-n", namespace, "--ignore-not-found", check=False)


@pytest.fixture
def pod_monitor_crd(dev_cluster: DevCluster) -> Iterator[None]:
    dev_cluster.kubectl("apply", "-f", "-", input=POD_MONITOR_CRD)
    wait_established(dev_cluster, "podmonitors.monitoring.coreos.com")
    yield
    # Waits until it is gone: a later test that creates it again must not find it terminating.
    dev_cluster.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", "--ignore-not-found", check=False)


@pytest.fixture
def watched(dev_cluster: DevCluster, namespace: str) -> Iterator[str]:
    """A second namespace, for the SDs: the release namespace holds only the operator and its Lease."""
    name = f"{namespace[:50]}-sds"
    dev_cluster.kubectl("create", "namespace", name)
    yield name
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _manifest(cluster: DevCluster, release: str, namespace: str) -> list[dict[str, Any]]:
    text = _helm(cluster, "get", "manifest", release, "-n", namespace).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _can(cluster: DevCluster, account: str, verb: str, resource: str, namespace: str | None) -> bool:
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = cluster.kubectl("auth", "can-i", verb, resource, *scope, f"--as={account}", check=False)
    return proc.stdout.strip() == "yes"


class ChartOperator:
    """`specdeploy <the chart's args>` with the ServiceAccount's kubeconfig, in its own process group."""

    def __init__(self, args: list[str], kubeconfig: Path, pod_namespace: str, log: Path,
                 python_path: str | None = None) -> None:
        """`python_path`: where the operator's code is imported from (an earlier commit's); default this one's."""
        self.health_port, self.metrics_port = free_port(), free_port()
        args = [self._port(arg) for arg in args]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": pod_namespace}
        if python_path is not None:
            env["PYTHONPATH"] = python_path
        for key in [k for k in env if k.startswith("SPECDEPLOY_")]:
            del env[key]  # only the chart's arguments configure it
        self.log = log
        self._file = log.open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", *args], env=env, stdout=self._file,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def _port(self, arg: str) -> str:
        """The chart's fixed ports, moved to free ones: several tests share this machine."""
        if arg.startswith("--liveness="):
            return f"--liveness=http://127.0.0.1:{self.health_port}/healthz"
        if arg.startswith("--metrics-port="):
            return f"--metrics-port={self.metrics_port}"
        return arg

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def denials(self) -> list[str]:
        """Log lines that say the ServiceAccount was refused something."""
        return [line for line in self.output().splitlines() if any(word in line for word in DENIED)]

    def wait_sd(self, cluster: DevCluster, namespace: str, predicate: Callable[[dict[str, Any]], object],
                what: str, timeout: float = 120) -> dict[str, Any]:
        """Wait for the SD to satisfy `predicate`; a refusal in the log fails at once, naming the rule."""
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            nonlocal last
            assert not self.denials(), "the chart's RBAC refused the operator:\n" + "\n".join(self.denials()[:5])
            last = _sd(cluster, namespace)
            return last if predicate(last) else None

        return wait_for(check, timeout, f"{SD_NAME}: {what}", fatal=(AssertionError,),
                        describe=lambda: json.dumps(last.get("status"), indent=1)[:2000] + "\n" + self.output()[-2000:])

    def stop(self) -> int | None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._file.close()
        return self.process.returncode


def _operator_args(manifest: list[dict[str, Any]]) -> list[str]:
    [deployment] = [d for d in manifest if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["specdeploy"]
    return list(container["args"])


def _sd(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "sd", SD_NAME, namespace=namespace)


def _events(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    listing = get_json(cluster, "events", "--field-selector", f"involvedObject.name={SD_NAME}", namespace=namespace)
    return list(listing["items"])


def test_install_then_reconcile_and_roll_back_as_the_charts_service_account(
        dev_cluster: DevCluster, namespace: str, watched: str, release: str, pod_monitor_crd: None,
        tmp_path: Path) -> None:
    installed = _helm(dev_cluster, "install", release, str(CHART), "-n", namespace,
                      "--set", f"watchNamespaces={{{watched}}}",
                      "--set", f"prometheusUrl={dev_cluster.prometheus_url}",
                      "--set", f"alertmanagerUrl={dev_cluster.alertmanager_url}",
                      "--set", "resyncSeconds=3", "--set", "logFormat=plain")
    assert "STATUS: deployed" in installed.stdout
    assert f"kubectl get sd -n {watched} -w" in installed.stdout      # NOTES.txt: what to do next
    manifest = _manifest(dev_cluster, release, namespace)
    [account] = [d["metadata"]["name"] for d in manifest if d["kind"] == "ServiceAccount"]
    identity = f"system:serviceaccount:{namespace}:{account}"

    # What the identity may and may not do, as the apiserver's authorizer answers.
    assert _can(dev_cluster, identity, "patch", "deployments.apps", watched)
    assert _can(dev_cluster, identity, "patch", "speculativedeployments.specdeploy.io/status", watched)
    assert _can(dev_cluster, identity, "get", "secrets", watched)
    assert _can(dev_cluster, identity, "update", "leases.coordination.k8s.io/specdeploy-operator", namespace)
    assert not _can(dev_cluster, identity, "update", "leases.coordination.k8s.io/someone-elses", namespace)
    assert not _can(dev_cluster, identity, "get", "secrets", namespace)
    assert not _can(dev_cluster, identity, "patch", "deployments.apps", "default")
    assert not _can(dev_cluster, identity, "list", "speculativedeployments.specdeploy.io", None)
    assert not _can(dev_cluster, identity, "create", "clusterrolebindings.rbac.authorization.k8s.io", None)
    assert _can(dev_cluster, identity, "get", "customresourcedefinitions.apiextensions.k8s.io", None)

    # Prometheus headers from a Secret: the analysis loop reads it every cycle.
    dev_cluster.kubectl("create", "secret", "generic", "prometheus-headers", "-n", watched,
                        "--from-literal=X-Scope-OrgID=team-a")
    dev_cluster.kubectl("label", "secret", "prometheus-headers", "-n", watched, "specdeploy.io/headers=true")
    resource = yaml.safe_load(EXAMPLE.read_text())
    resource["spec"]["replicas"] = 1
    resource["spec"]["analysis"].setdefault("prometheus", {})["headersSecretRef"] = "prometheus-headers"

    kubeconfig = dev_cluster.service_account_kubeconfig(namespace, account, tmp_path / "operator.kubeconfig")
    operator = ChartOperator(_operator_args(manifest), kubeconfig, namespace, tmp_path / "operator.log")
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=2).status_code == 200,
                 60, "the operator's liveness endpoint", describe=lambda: operator.output()[-3000:])
        lease = get_json(dev_cluster, "lease", "specdeploy-operator", namespace=namespace)
        assert lease["spec"]["holderIdentity"]

        dev_cluster.kubectl("apply", "-n", watched, "-f", "-", input=yaml.safe_dump(resource))
        ready = operator.wait_sd(
            dev_cluster, watched,
            lambda o: (condition(o, "Ready") or {}).get("status") == "True"
            and o.get("status", {}).get("observedGeneration") == o["metadata"]["generation"],
            "Ready as the chart's ServiceAccount")
        assert ready["metadata"]["generation"] == 1       # the operator wrote no spec on its way to Ready
        assert ready["status"]["phase"] in ("Measuring", "Speculating")
        reasons = {e["reason"] for e in _events(dev_cluster, watched)}
        assert "DeploymentCreated" in reasons
        monitor = get_json(dev_cluster, "podmonitor", SD_NAME, namespace=watched)
        assert monitor["spec"]["podTargetLabels"] == ["specdeploy.io/name", "specdeploy.io/variant"]
        metrics = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
        assert "specdeploy_speculation_active" in metrics
        # One analysis cycle: Prometheus queried with the headers read from the Secret.
        operator.wait_sd(dev_cluster, watched, lambda o: (o["status"].get("analysis") or {}).get("lastSampleAt"),
                         "an analysis sample", timeout=60)

        # A CUDA OOM in the speculative pod: the operator rolls speculation back at once (rollbackOnOOM).
        wait_for(lambda: dev_cluster.simulators(namespace=watched, sd=SD_NAME, variant="speculative"), 90,
                 "the speculative simulator")
        sim_admin(dev_cluster, f"{watched}/{SD_NAME}", "speculative", {"oom": True})
        rolled = operator.wait_sd(dev_cluster, watched, lambda o: o.get("status", {}).get("phase") == "RolledBack",
                                  "RolledBack as the chart's ServiceAccount")
        assert rolled["status"]["speculation"]["active"] is False
        assert rolled["status"]["speculation"]["lastRollback"]["reason"] == "SpeculativePodOutOfMemory"
        wait_for(lambda: "SpeculationRolledBack" in {e["reason"] for e in _events(dev_cluster, watched)}, 30,
                 "the SpeculationRolledBack Event")
        # Git's view is untouched: the same generation and the same spec, the rollback lives in status.
        assert rolled["metadata"]["generation"] == 1
        assert rolled["spec"] == ready["spec"]
        annotations = rolled["metadata"].get("annotations") or {}
        assert all(k.startswith("specdeploy.io/") or k == "kubectl.kubernetes.io/last-applied-configuration"
                   for k in annotations), annotations
    finally:
        code = operator.stop()
    log = operator.output()
    assert not operator.denials(), "\n".join(operator.denials())
    assert "cannot read Secret" not in log
    assert code == 0, log[-3000:]
    released = get_json(dev_cluster, "lease", "specdeploy-operator", namespace=namespace)
    assert not released["spec"].get("holderIdentity")     # a clean stop hands the Lease on at once


def test_cluster_wide_install_grants_every_namespace_and_no_more(
        dev_cluster: DevCluster, namespace: str, release: str) -> None:
    _helm(dev_cluster, "install", release, str(CHART), "-n", namespace, "--set", "rbac.readSecrets=false")
    manifest = _manifest(dev_cluster, release, namespace)
    [account] = [d["metadata"]["name"] for d in manifest if d["kind"] == "ServiceAccount"]
    identity = f"system:serviceaccount:{namespace}:{account}"
    for ns in ("default", namespace):
        assert _can(dev_cluster, identity, "patch", "deployments.apps", ns)
        assert _can(dev_cluster, identity, "watch", "pods", ns)
        assert not _can(dev_cluster, identity, "get", "secrets", ns)
        assert not _can(dev_cluster, identity, "delete", "pods", ns)
    assert _can(dev_cluster, identity, "list", "speculativedeployments.specdeploy.io", None)
    assert not _can(dev_cluster, identity, "list", "namespaces", None)   # kopf needs it only with --namespace
    assert not _can(dev_cluster, identity, "create", "leases.coordination.k8s.io", "default")
    # Namespace users get SD rights through the aggregated default roles.
    assert _can(dev_cluster, f"system:serviceaccount:{namespace}:default", "get", "speculativedeployments.specdeploy.io",
                namespace) is False
    dev_cluster.kubectl("create", "rolebinding", "editor", "--clusterrole=edit",
                        f"--serviceaccount={namespace}:default", "-n", namespace)
    assert wait_for(lambda: _can(dev_cluster, f"system:serviceaccount:{namespace}:default", "patch",
                                 "speculativedeployments.specdeploy.io", namespace), 30, "edit to aggregate SDs")


def test_install_refuses_values_the_schema_rejects(dev_cluster: DevCluster, namespace: str, release: str,
                                                   tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("logFormat: xml\nwatchNamespaces: [Not_A_Namespace]\n")
    failed = _helm(dev_cluster, "install", release, str(CHART), "-n", namespace, "-f", str(values), check=False)
    assert failed.returncode != 0
    assert "at '/logFormat': value must be one of 'json', 'plain'" in failed.stderr
    assert "at '/watchNamespaces/0': 'Not_A_Namespace' does not match pattern" in failed.stderr
    assert _helm(dev_cluster, "status", release, "-n", namespace, check=False).returncode != 0   # nothing installed




def test_without_pod_monitor_rights_an_sd_runs_and_says_so_and_with_them_its_monitor_is_labelled(
        dev_cluster: DevCluster, namespace: str, watched: str, release: str, pod_monitor_crd: None,
        tmp_path: Path) -> None:
    """rbac.podMonitors=false on a cluster with the PodMonitor CRD: the operator (asking the apiserver what it may
    do) renders none, the SD runs to Ready, and its status says once what must scrape it. With the rights back,
    the SD's PodMonitor carries the labels of the chart's engineMonitoring.sdPodMonitors.labels."""
    values = tmp_path / "values.yaml"

    def install(command: str, pod_monitors: bool) -> ChartOperator:
        values.write_text(yaml.safe_dump({
            "watchNamespaces": [watched], "resyncSeconds": 3, "logFormat": "plain",
            "rbac": {"podMonitors": pod_monitors},
            "engineMonitoring": {"sdPodMonitors": {"labels": {"release": "kube-prometheus-stack", "team": "ml"}}}}))
        _helm(dev_cluster, command, release, str(CHART), "-n", namespace, "-f", str(values))
        manifest = _manifest(dev_cluster, release, namespace)
        [account] = [d["metadata"]["name"] for d in manifest if d["kind"] == "ServiceAccount"]
        kubeconfig = dev_cluster.service_account_kubeconfig(namespace, account, tmp_path / f"{command}.kubeconfig")
        return ChartOperator(_operator_args(manifest), kubeconfig, namespace, tmp_path / f"operator-{command}.log")

    def ready(obj: dict[str, Any]) -> bool:
        return ((condition(obj, "Ready") or {}).get("status") == "True"
                and obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"])

    resource = yaml.safe_load(EXAMPLE.read_text())
    resource["spec"]["replicas"] = 1
    operator = install("install", pod_monitors=False)
    try:
        dev_cluster.kubectl("apply", "-n", watched, "-f", "-", input=yaml.safe_dump(resource))
        obj = operator.wait_sd(dev_cluster, watched, ready, "Ready without PodMonitor rights")
        assert "rbac.podMonitors is false" in obj["status"]["monitoring"]
        assert "engineMonitoring.podMonitor" in obj["status"]["monitoring"]
        assert get_json(dev_cluster, "podmonitors", namespace=watched)["items"] == []
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    assert not operator.denials(), "\n".join(operator.denials())

    operator = install("upgrade", pod_monitors=True)
    try:
        obj = operator.wait_sd(dev_cluster, watched, lambda o: ready(o) and "monitoring" not in o["status"],
                               "Ready with its PodMonitor")
        monitor = get_json(dev_cluster, "podmonitor", SD_NAME, namespace=watched)
        labels = monitor["metadata"]["labels"]
        assert (labels["release"], labels["team"], labels["specdeploy.io/name"]) == (
            "kube-prometheus-stack", "ml", SD_NAME)
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    assert not operator.denials(), "\n".join(operator.denials())


def test_acceptance_collapse_rolls_back_as_the_charts_service_account(
        dev_cluster: DevCluster, namespace: str, chart_identity: dict[str, str],
        operator_processes: Callable[..., Any]) -> None:
    """The analysis-driven rollback (Prometheus verdicts, status, Event, Alertmanager) with the chart's RBAC."""
    from specdeploy.devcluster.simadmin import endpoints
    from specdeploy.devcluster.traffic import Traffic

    operator = operator_processes("chart-identity", "--prometheus-url", dev_cluster.prometheus_url,
                                  "--alertmanager-url", dev_cluster.alertmanager_url, "--analysis-tick-seconds", "1",
                                  env=chart_identity)
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SCENARIO_SD)
    serving = f"{namespace}/{SCENARIO_NAME}"
    wait_for(lambda: endpoints(dev_cluster, serving, "speculative") and endpoints(dev_cluster, serving, "control"),
             90, "both variants' simulators", describe=lambda: operator.output()[-3000:])
    assert all(result.ok for result in sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.8}))
    traffic = Traffic(dev_cluster, serving, qps=4, duration=240).start()
    try:
        def sd() -> dict[str, Any]:
            refused = [line for line in operator.output().splitlines() if any(word in line for word in DENIED)]
            assert not refused, "the chart's RBAC refused the operator:\n" + "\n".join(refused[:5])
            return get_json(dev_cluster, "sd", SCENARIO_NAME, namespace=namespace)

        wait_for(lambda: (sd()["status"].get("analysis") or {}).get("verdict") == "Healthy", 90,
                 "a healthy sample", fatal=(AssertionError,), describe=lambda: operator.output()[-3000:])
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})
        def rolled_back() -> dict[str, Any] | None:
            obj = sd()
            return obj if (obj["status"].get("speculation") or {}).get("active") is False else None

        rolled = wait_for(rolled_back, 90, "the rollback", fatal=(AssertionError,),
                          describe=lambda: operator.output()[-3000:])
    finally:
        traffic.stop()
    assert rolled["status"]["speculation"]["lastRollback"]["reason"] == "AcceptanceBelowMinimum"
    assert rolled["metadata"]["generation"] == 1
    wait_for(lambda: [e for e in get_json(dev_cluster, "events", "--field-selector", f"involvedObject.name={SCENARIO_NAME}",
                                          namespace=namespace)["items"] if e["reason"] == "SpeculationRolledBack"],
             30, "the SpeculationRolledBack Event")

    def alerted() -> bool:
        response = httpx.get(f"{dev_cluster.alertmanager_url}/api/v2/alerts",
                             params={"filter": f'namespace="{namespace}"'}, timeout=5)
        return any(a["labels"].get("alertname") == "SpeculationRolledBack" for a in response.json())

    wait_for(alerted, 30, "the Alertmanager alert")
    refused = [line for line in operator.output().splitlines() if any(word in line for word in DENIED)]
    assert not refused, "\n".join(refused)
