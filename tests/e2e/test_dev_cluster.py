"""The dev cluster is a real Kubernetes: scheduling on GPU nodes, GC, CEL, RBAC, tokens, monitoring."""

from __future__ import annotations

import ipaddress
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner
from loopback_exposition import expositions_on_loopback

from specdeploy.devcluster import DevCluster, processes, versions, wait_for
from specdeploy.devcluster.cli import dev_cluster as dev_cluster_cli
from specdeploy.devcluster.waiters import condition, get_json, wait_for_absent, wait_for_object, wait_for_pods

pytestmark = pytest.mark.e2e


def deployment(name: str, gpus: int, replicas: int = 1) -> str:
    return yaml.safe_dump({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "engine",
                    "image": "registry.invalid/engine:sim",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }]},
            },
        },
    })


def _pod_network(cluster: DevCluster) -> ipaddress.IPv4Network:
    """The `--cidr` the cluster's kwok hands pod IPs out of, from its command line."""
    [kwok] = [c for c in cluster.status().components if c.name == "kwok"]
    argv = Path(f"/proc/{kwok.pid}/cmdline").read_bytes().decode().split("\0")
    [cidr] = [a.removeprefix("--cidr=") for a in argv if a.startswith("--cidr=")]
    return ipaddress.IPv4Network(cidr)


def test_nodes_ready_with_eight_gpus_each(dev_cluster: DevCluster) -> None:
    nodes = get_json(dev_cluster, "nodes", "-l", "type=kwok")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(dev_cluster.node_names)
    assert len(nodes) == 4
    for node in nodes:
        assert (condition(node, "Ready") or {}).get("status") == "True"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node["metadata"]["labels"]["nvidia.com/gpu.memory"] == "81559"
    table = dev_cluster.kubectl("get", "nodes").stdout
    assert table.count(" Ready ") == 4, table
    version = json.loads(dev_cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == versions.KUBERNETES
    assert version["clientVersion"]["gitVersion"] == versions.KUBERNETES


def test_gpu_deployment_gets_running_ready_pods(dev_cluster: DevCluster, namespace: str) -> None:
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("one-gpu", gpus=1, replicas=2))
    pods = wait_for_pods(dev_cluster, namespace, "app=one-gpu", count=2, timeout=90)
    assert all(p["spec"]["nodeName"] in dev_cluster.node_names for p in pods)
    # Pod IPs are loopback addresses of this cluster's own pod network, one per pod: engines listen there.
    network = _pod_network(dev_cluster)
    assert network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")) and network.prefixlen == 16
    assert not network.overlaps(ipaddress.IPv4Network("127.0.0.0/16"))
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and all(ipaddress.IPv4Address(ip) in network for ip in ips)
    wait_for_object(dev_cluster, ["deployment", "one-gpu"], lambda d: d["status"].get("availableReplicas") == 2,
                    timeout=60, what="deployment one-gpu available", namespace=namespace)


def test_nine_gpus_stay_pending_with_the_schedulers_reason(dev_cluster: DevCluster, namespace: str) -> None:
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("nine-gpus", gpus=9))

    def unschedulable(listing: dict) -> bool:
        pods = listing["items"]
        cond = condition(pods[0], "PodScheduled") if pods else None
        return bool(cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable")

    listing = wait_for_object(dev_cluster, ["pods", "-l", "app=nine-gpus"], unschedulable, timeout=60,
                              what="pod nine-gpus unschedulable", namespace=namespace)
    pod = listing["items"][0]
    assert pod["status"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in (condition(pod, "PodScheduled") or {}).get("message", "")
    events = wait_for_object(
        dev_cluster, ["events", "--field-selector", f"involvedObject.name={pod['metadata']['name']}"],
        lambda e: any(i["reason"] == "FailedScheduling" for i in e["items"]), timeout=30,
        what="a FailedScheduling event", namespace=namespace)
    assert any("Insufficient nvidia.com/gpu" in i["message"] for i in events["items"])


def test_deleting_a_deployment_collects_replicasets_and_pods(dev_cluster: DevCluster, namespace: str) -> None:
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("doomed", gpus=1, replicas=2))
    wait_for_pods(dev_cluster, namespace, "app=doomed", count=2, timeout=90)
    assert get_json(dev_cluster, "replicasets", "-l", "app=doomed", namespace=namespace)["items"]
    dev_cluster.kubectl("delete", "deployment", "doomed", "-n", namespace, "--wait=false")
    wait_for_absent(dev_cluster, ["replicasets", "-l", "app=doomed"], timeout=60, namespace=namespace)
    wait_for_absent(dev_cluster, ["pods", "-l", "app=doomed"], timeout=60, namespace=namespace)


def crd(group: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "properties": {"replicas": {"type": "integer"}, "maxReplicas": {"type": "integer"}},
                        "x-kubernetes-validations": [{
                            "rule": "self.replicas <= self.maxReplicas",
                            "message": "`spec.replicas` must not exceed `spec.maxReplicas`",
                        }],
                    }},
                }},
            }],
        },
    })


def test_crd_cel_rule_refuses_a_bad_object(dev_cluster: DevCluster, namespace: str) -> None:
    group = f"e2e-{uuid.uuid4().hex[:8]}.specdeploy.io"
    dev_cluster.kubectl("apply", "-f", "-", input=crd(group))
    try:
        wait_for_object(dev_cluster, ["crd", f"widgets.{group}"],
                        lambda c: (condition(c, "Established") or {}).get("status") == "True",
                        timeout=30, what="CRD established")

        def widget(name: str, replicas: int) -> str:
            return yaml.safe_dump({"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name},
                                   "spec": {"replicas": replicas, "maxReplicas": 3}})

        # The CRD's REST mapping reaches kubectl's discovery cache a moment after Established.
        wait_for(lambda: dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("good", 2),
                                             check=False).returncode == 0, timeout=30, what="good widget accepted")
        bad = dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("bad", 5), check=False)
        assert bad.returncode != 0
        assert "`spec.replicas` must not exceed `spec.maxReplicas`" in bad.stderr
        assert "Invalid" in bad.stderr
    finally:
        dev_cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


def test_service_account_without_rights_is_denied(dev_cluster: DevCluster, namespace: str, tmp_path: Path) -> None:
    dev_cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = dev_cluster.service_account_kubeconfig(namespace, "nobody", tmp_path / "nobody.kubeconfig")
    denied = dev_cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    assert f"system:serviceaccount:{namespace}:nobody" in denied.stderr


def test_service_account_token_works_as_kubeconfig(dev_cluster: DevCluster, namespace: str,
                                                   tmp_path: Path) -> None:
    dev_cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    dev_cluster.kubectl("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", namespace)
    dev_cluster.kubectl("create", "rolebinding", "reader", "--role=pod-reader",
                        f"--serviceaccount={namespace}:reader", "-n", namespace)
    kubeconfig = dev_cluster.service_account_kubeconfig(namespace, "reader", tmp_path / "reader.kubeconfig")
    whoami = json.loads(dev_cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:reader"
    wait_for(lambda: dev_cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig,
                                         check=False).returncode == 0, timeout=30, what="RBAC grant to apply")
    still_denied = dev_cluster.kubectl("get", "secrets", "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert still_denied.returncode != 0 and "Forbidden" in still_denied.stderr


PROBE_EXPOSITION = "# TYPE specdeploy_e2e_probe gauge\nspecdeploy_e2e_probe{color=\"blue\"} 42\n"


@pytest.fixture
def metrics_server() -> Iterator[str]:
    """A loopback HTTP server serving a fixed /metrics; yields host:port."""
    with expositions_on_loopback({"/metrics": lambda: PROBE_EXPOSITION}) as address:
        yield address


def _query(prometheus_url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    return list(response.json()["data"]["result"])


def test_prometheus_scrapes_a_registered_target(dev_cluster: DevCluster, metrics_server: str) -> None:
    name = f"probe-{uuid.uuid4().hex[:6]}"
    dev_cluster.add_scrape_target(name, metrics_server, {"team": "e2e", "probe": name})
    try:
        result = wait_for(lambda: _query(dev_cluster.prometheus_url, f'specdeploy_e2e_probe{{probe="{name}"}}'),
                          timeout=60, what=f"Prometheus to scrape {metrics_server}")
        assert result[0]["metric"]["team"] == "e2e"
        assert result[0]["metric"]["color"] == "blue"
        assert float(result[0]["value"][1]) == 42.0
        summed = _query(dev_cluster.prometheus_url, f'sum by (team) (specdeploy_e2e_probe{{probe="{name}"}} * 2)')
        assert float(summed[0]["value"][1]) == 84.0
    finally:
        assert dev_cluster.remove_scrape_target(name)

    def dropped() -> bool:
        targets = httpx.get(f"{dev_cluster.prometheus_url}/api/v1/targets", timeout=5).json()["data"]
        return not any(t["labels"].get("probe") == name for t in targets["activeTargets"])

    wait_for(dropped, timeout=30, what=f"target {name} to be dropped")


def test_alertmanager_accepts_and_lists_an_alert(dev_cluster: DevCluster) -> None:
    marker = uuid.uuid4().hex[:8]
    alert = {
        "labels": {"alertname": "SpecdeployE2E", "marker": marker, "severity": "warning"},
        "annotations": {"summary": "speculation rolled back (e2e)"},
        "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 600)),
    }
    response = httpx.post(f"{dev_cluster.alertmanager_url}/api/v2/alerts", json=[alert], timeout=5)
    assert response.status_code == 200, response.text

    def listed() -> list[dict]:
        got = httpx.get(f"{dev_cluster.alertmanager_url}/api/v2/alerts",
                        params={"filter": f'marker="{marker}"'}, timeout=5).json()
        return list(got)

    alerts = wait_for(listed, timeout=30, what="the alert to be listed")
    assert alerts[0]["labels"]["alertname"] == "SpecdeployE2E"
    assert alerts[0]["annotations"]["summary"] == "speculation rolled back (e2e)"


def test_cli_status_and_env(dev_cluster: DevCluster) -> None:
    runner = CliRunner()
    env = runner.invoke(dev_cluster_cli, ["env", "--state-dir", str(dev_cluster.state_dir)])
    assert env.exit_code == 0, env.output
    assert f"export KUBECONFIG={dev_cluster.kubeconfig}" in env.output
    assert f"export PROMETHEUS_URL={dev_cluster.prometheus_url}" in env.output
    assert f"export ALERTMANAGER_URL={dev_cluster.alertmanager_url}" in env.output
    status = runner.invoke(dev_cluster_cli, ["status", "--state-dir", str(dev_cluster.state_dir), "-o", "json"])
    assert status.exit_code == 0, status.output
    data = json.loads(status.output)
    assert data["running"] is True
    assert {c["name"] for c in data["components"]} == {
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "lws-controller", "prometheus",
        "alertmanager", "pod-runner"}


def test_down_leaves_no_process_behind_and_up_works_again(dev_cluster: DevCluster, tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "second", nodes=1, monitoring=True)
    try:
        for _ in range(2):
            began = time.monotonic()
            cluster.up()
            print(f"warm up: {time.monotonic() - began:.1f}s")
            assert cluster.kubectl("get", "node", "gpu-node-0").returncode == 0
            pids = [c.pid for c in cluster.status().components]
            assert len(pids) == 8 and all(processes.alive(pid) for pid in pids)
            assert _pod_network(cluster) != _pod_network(dev_cluster)   # no two clusters give out the same pod IP
            cluster.down()
            assert not any(processes.alive(pid) for pid in pids)
            assert not any(processes.group_members(pid) for pid in pids)
            assert not cluster.state_dir.exists()
    finally:
        cluster.down()
