"""The operator against a real apiserver: apply, edit, scale, break, delete, kill and double it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_resources import POD_MONITOR_CRD

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.waiters import (
    condition,
    get_json,
    wait_established,
    wait_for_absent,
    wait_for_object,
    wait_for_pods,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
REJECTED_EXAMPLE = EXAMPLES / "llama-70b-bf16-h100-rejected.yaml"
ACCEPTED_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.yaml") if p != REJECTED_EXAMPLE)


def _name(path: Path) -> str:
    return str(yaml.safe_load(path.read_text())["metadata"]["name"])


def _apply(cluster: DevCluster, namespace: str, path_or_text: Path | str) -> subprocess.CompletedProcess[str]:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text, check=False)


def _sd(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    return get_json(cluster, "sd", name, namespace=namespace)


def _wait_sd(cluster: DevCluster, namespace: str, name: str, predicate: Callable[[dict[str, Any]], bool],
             what: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for_object(cluster, ["sd", name], predicate, timeout, f"{name}: {what}", namespace=namespace)


def _is(kind: str, status: str) -> Callable[[dict[str, Any]], bool]:
    def check(obj: dict[str, Any]) -> bool:
        found = condition(obj, kind)
        observed = obj.get("status", {}).get("observedGeneration")
        return found is not None and found["status"] == status and observed == obj["metadata"]["generation"]
    return check


def _deployments(cluster: DevCluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    listing = get_json(cluster, "deployments", "-l", f"specdeploy.io/name={name}", namespace=namespace)
    return {d["metadata"]["name"]: d for d in listing["items"]}


def _pod_uids(cluster: DevCluster, namespace: str, name: str) -> set[str]:
    listing = get_json(cluster, "pods", "-l", f"specdeploy.io/name={name}", namespace=namespace)
    return {p["metadata"]["uid"] for p in listing["items"] if not p["metadata"].get("deletionTimestamp")}


def _events(cluster: DevCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    listing = get_json(cluster, "events", "--field-selector", f"involvedObject.name={name}", namespace=namespace)
    return list(listing["items"])


def _rendered(path: Path) -> dict[str, dict[str, Any]]:
    """What `specdeploy render` prints for `path`: Deployments by name."""
    output = subprocess.run([sys.executable, "-m", "specdeploy.cli", "render", str(path)],
                            capture_output=True, text=True, check=True).stdout
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(output) if d["kind"] == "Deployment"}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_examples_run_with_the_rendered_engine_args(dev_cluster: DevCluster, operator: None, namespace: str) -> None:
    for path in [*ACCEPTED_EXAMPLES, REJECTED_EXAMPLE]:
        assert _apply(dev_cluster, namespace, path).returncode == 0
    for path in ACCEPTED_EXAMPLES:
        name = _name(path)
        _wait_sd(dev_cluster, namespace, name, _is("Ready", "True"), "Ready", timeout=90)
        running = _deployments(dev_cluster, namespace, name)
        rendered = _rendered(path)
        assert running.keys() == rendered.keys()
        for deployment_name, deployment in running.items():
            live, expected = _container(deployment), _container(rendered[deployment_name])
            assert live["command"] + live["args"] == expected["command"] + expected["args"], deployment_name
            pods = wait_for_pods(dev_cluster, namespace, f"specdeploy.io/variant={deployment['spec']['selector']['matchLabels']['specdeploy.io/variant']},specdeploy.io/name={name}",
                                 count=deployment["spec"]["replicas"], timeout=60)
            assert all(p["spec"]["nodeName"].startswith(dev_cluster.node_names[0].rsplit("-", 1)[0]) for p in pods)
        status = _sd(dev_cluster, namespace, name)["status"]
        assert status["phase"] == "Measuring"
        assert status["speculation"]["active"] is True
        assert status["memoryPlan"]["fits"] is True
    table = dev_cluster.kubectl("get", "sd", "-n", namespace).stdout
    assert {"PHASE", "METHOD", "SPECULATING", "FITS"} <= set(table.split())
    assert "Measuring" in table and "Rejected" in table
    described = dev_cluster.kubectl("describe", "sd", "llama-70b-fp8", "-n", namespace).stdout
    for text in ("MemoryFits", "Compatible", "Ready", "SpeculationHealthy", "RolledBack", "DeploymentCreated"):
        assert text in described


def test_rejected_resource_gets_reasons_and_suggestions_and_no_deployment(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    assert _apply(dev_cluster, namespace, REJECTED_EXAMPLE).returncode == 0
    name = _name(REJECTED_EXAMPLE)
    obj = _wait_sd(dev_cluster, namespace, name, _is("MemoryFits", "False"), "MemoryFits False")
    status = obj["status"]
    assert status["phase"] == "Rejected"
    assert status["memoryPlan"]["reasons"] and status["memoryPlan"]["suggestions"]
    assert condition(obj, "MemoryFits")["reason"] == "WeightsDoNotFit"  # type: ignore[index]
    assert "What would fit" in condition(obj, "MemoryFits")["message"]  # type: ignore[index]
    wait_for(lambda: any(e["reason"] == "MemoryPlanRejected" and e["type"] == "Warning"
                         for e in _events(dev_cluster, namespace, name)), 30, "a MemoryPlanRejected Event")
    assert _deployments(dev_cluster, namespace, name) == {}


@pytest.mark.parametrize(
    ("spec_yaml", "messages"),
    [
        ("model: {name: x}\n  speculation: {method: eagle3}",
         ["`spec.speculation.draft` is required when `spec.speculation.method` is"]),
        ("model: {name: x}\n  speculation: {method: ngram, numSpeculativeTokens: 40}\n  resources: {gpuMemoryUtilization: 1.5}",
         ["`spec.speculation.numSpeculativeTokens` must be at least 1 and at most 16",
          "`spec.resources.gpuMemoryUtilization` must be greater than 0 and at most 1"]),
        ("model: {name: x}\n  speculation: {method: ngram}\n  engine: {kind: tgi}", ["spec.engine.kind", "tgi"]),
        ("model: {name: x}\n  speculation: {method: ngram_gpu}\n  engine: {kind: sglang}",
         ["`spec.speculation.method` suffix or ngram_gpu is supported by vllm only"]),
        ("model: {name: x}\n  speculation: {method: dflash, draft: {name: d}}\n  engine: {kind: trtllm}",
         ["`spec.speculation.method` dflash and dspark are not supported by trtllm"]),
        ("model: {name: x}\n  speculation: {numSpeculativeTokens: 3}",
         ["`spec.speculation.method` is required while `spec.speculation.enabled` is true"]),
        ("model: {name: x}\n  speculation: {method: ngram, numSpeculativeTokens: 3, schedule: {mode: Table, table: "
         "[{minBatch: 1, maxBatch: 8, k: 4}, {minBatch: 10, maxBatch: 64, k: 0}]}}",
         ["must list its ranges in ascending order without gaps or overlaps",
          "`spec.speculation.schedule.table[].k` must not be greater than `spec.speculation.numSpeculativeTokens`"]),
        ("model: {name: x}\n  speculation: {method: ngram, schedule: {mode: Auto, table: [{minBatch: 1, maxBatch: 8, k: 2}]}}",
         ["`spec.speculation.schedule.table` must not be set unless `spec.speculation.schedule.mode` is Table"]),
    ],
)
def test_malformed_resources_are_refused_at_apply(
    dev_cluster: DevCluster, crds: None, namespace: str, spec_yaml: str, messages: list[str]
) -> None:
    text = f"apiVersion: specdeploy.io/v1alpha1\nkind: SpeculativeDeployment\nmetadata: {{name: bad}}\nspec:\n  {spec_yaml}\n"
    result = _apply(dev_cluster, namespace, text)
    assert result.returncode != 0
    for message in messages:
        assert message in result.stderr


@pytest.mark.parametrize("speculation", [
    "{enabled: false}",
    "{method: ngram, numSpeculativeTokens: 4, schedule: {mode: Table, table: [{minBatch: 1, maxBatch: 8, k: 4}, "
    "{minBatch: 9, maxBatch: 32, k: 2}, {minBatch: 33, maxBatch: 256, k: 0}]}}",
    "{method: ngram, schedule: {mode: Auto}}",
])
def test_what_the_schema_allows_is_accepted_at_apply(
    dev_cluster: DevCluster, crds: None, namespace: str, speculation: str
) -> None:
    """Speculation off needs no method; a contiguous schedule table and mode Auto pass every CEL rule."""
    text = ("apiVersion: specdeploy.io/v1alpha1\nkind: SpeculativeDeployment\nmetadata: {name: plain}\n"
            f"spec:\n  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}\n  speculation: {speculation}\n")
    result = dev_cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text, check=False)
    assert result.returncode == 0, result.stderr


def _ready_ngram(dev_cluster: DevCluster, namespace: str) -> str:
    path = EXAMPLES / "llama-8b-ngram.yaml"
    assert _apply(dev_cluster, namespace, path).returncode == 0
    name = _name(path)
    _wait_sd(dev_cluster, namespace, name, _is("Ready", "True"), "Ready", timeout=90)
    return name


def _patch(dev_cluster: DevCluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    dev_cluster.kubectl("patch", "sd", name, "-n", namespace, "--type", "merge", "-p", json.dumps(patch))


def test_update_that_does_not_fit_keeps_the_old_pods_serving(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    name = _ready_ngram(dev_cluster, namespace)
    uids = _pod_uids(dev_cluster, namespace, name)
    generations = {n: d["metadata"]["generation"] for n, d in _deployments(dev_cluster, namespace, name).items()}
    _patch(dev_cluster, namespace, name, {"spec": {"model": {"name": "meta-llama/Llama-3.1-405B-Instruct"}}})
    obj = _wait_sd(dev_cluster, namespace, name, _is("MemoryFits", "False"), "the update rejected")
    assert obj["status"]["phase"] == "Rejected"
    ready = condition(obj, "Ready")
    assert ready is not None and ready["status"] == "True" and "keep serving" in ready["message"]
    assert _pod_uids(dev_cluster, namespace, name) == uids
    assert {n: d["metadata"]["generation"] for n, d in _deployments(dev_cluster, namespace, name).items()} == generations
    wait_for(lambda: any(e["reason"] == "MemoryPlanRejected" for e in _events(dev_cluster, namespace, name)), 30,
             "a MemoryPlanRejected Event")
    # fixing the spec resumes
    _patch(dev_cluster, namespace, name, {"spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}})
    obj = _wait_sd(dev_cluster, namespace, name, _is("MemoryFits", "True"), "the fix accepted")
    _wait_sd(dev_cluster, namespace, name, _is("Ready", "True"), "Ready again")
    assert _pod_uids(dev_cluster, namespace, name) == uids, "the same spec as before restarts nothing"


def test_replicas_change_only_replicas_and_metadata_changes_restart_nothing(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    name = _ready_ngram(dev_cluster, namespace)
    uids = _pod_uids(dev_cluster, namespace, name)
    before = _deployments(dev_cluster, namespace, name)[name]
    _patch(dev_cluster, namespace, name, {"spec": {"replicas": 3}})
    after = wait_for_object(dev_cluster, ["deployment", name], lambda d: d["spec"]["replicas"] == 3, 30,
                            "replicas 3", namespace=namespace)
    assert after["spec"]["template"] == before["spec"]["template"]
    wait_for_pods(dev_cluster, namespace, f"specdeploy.io/name={name},specdeploy.io/variant=speculative", 3, 60)
    assert uids <= _pod_uids(dev_cluster, namespace, name), "scaling up kept every pod"
    # An unrelated label and annotation restart nothing, and a spec change after them is handled as usual;
    # the operator writes nothing to the SD but its status (kopf's record of the handled spec is in memory).
    uids = _pod_uids(dev_cluster, namespace, name)
    template = _deployments(dev_cluster, namespace, name)[name]["spec"]["template"]
    dev_cluster.kubectl("label", "sd", name, "-n", namespace, "team=inference")
    dev_cluster.kubectl("annotate", "sd", name, "-n", namespace, "owner=platform")
    _patch(dev_cluster, namespace, name, {"spec": {"replicas": 2}})
    wait_for_object(dev_cluster, ["deployment", name], lambda d: d["spec"]["replicas"] == 2, 30, "replicas 2",
                    namespace=namespace)
    metadata = json.loads(dev_cluster.kubectl("get", "sd", name, "-n", namespace, "-o", "json",
                                              "--show-managed-fields").stdout)["metadata"]
    assert {k for k in metadata.get("annotations", {}) if k.startswith("specdeploy.io/")} == set()
    assert "finalizers" not in metadata
    assert [f["manager"] for f in metadata["managedFields"]
            if not f["manager"].startswith("kubectl") and f.get("subresource") != "status"] == []
    assert _deployments(dev_cluster, namespace, name)[name]["spec"]["template"] == template
    wait_for_pods(dev_cluster, namespace, f"specdeploy.io/name={name},specdeploy.io/variant=speculative", 2, 60)
    assert _pod_uids(dev_cluster, namespace, name) <= uids, "scaling down restarted no pod"


def test_speculation_off_and_on_is_one_rollout_each(dev_cluster: DevCluster, operator: None, namespace: str) -> None:
    name = _ready_ngram(dev_cluster, namespace)
    generation = _deployments(dev_cluster, namespace, name)[name]["metadata"]["generation"]
    _patch(dev_cluster, namespace, name, {"spec": {"speculation": {"enabled": False}}})
    obj = _wait_sd(dev_cluster, namespace, name, lambda o: _is("Ready", "True")(o) and o["status"]["phase"] == "Serving",
                   "serving without speculation")
    assert obj["status"]["speculation"]["active"] is False
    deployments = _deployments(dev_cluster, namespace, name)
    assert list(deployments) == [name], "no Control without speculation to compare with"
    assert "--speculative-config" not in _container(deployments[name])["args"]
    assert deployments[name]["metadata"]["generation"] == generation + 1
    _patch(dev_cluster, namespace, name, {"spec": {"speculation": {"enabled": True}}})
    _wait_sd(dev_cluster, namespace, name, lambda o: _is("Ready", "True")(o) and o["status"]["phase"] == "Measuring",
             "speculating again")
    deployments = _deployments(dev_cluster, namespace, name)
    assert "--speculative-config" in _container(deployments[name])["args"]
    assert deployments[name]["metadata"]["generation"] == generation + 2


def test_deleting_the_resource_garbage_collects_every_child(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    name = _ready_ngram(dev_cluster, namespace)
    dev_cluster.kubectl("delete", "sd", name, "-n", namespace, "--wait=true", "--timeout=30s")
    for kind in ("deployments", "replicasets", "pods", "services", "configmaps"):
        wait_for_absent(dev_cluster, [kind, "-l", f"specdeploy.io/name={name}"], timeout=60, namespace=namespace)


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[[str], Any]
) -> None:
    first = operator_processes("first")
    for path in ACCEPTED_EXAMPLES:
        assert _apply(dev_cluster, namespace, path).returncode == 0
    # kill it as soon as it has started creating children, while it is still working through the rest
    wait_for(lambda: get_json(dev_cluster, "deployments", namespace=namespace)["items"], 60,
             "the first Deployment", describe=first.output)
    first.kill()
    second = operator_processes("second")
    for path in ACCEPTED_EXAMPLES:
        _wait_sd(dev_cluster, namespace, _name(path), _is("Ready", "True"), "Ready after the restart", timeout=120)
    for path in ACCEPTED_EXAMPLES:
        name = _name(path)
        assert _deployments(dev_cluster, namespace, name).keys() == _rendered(path).keys()
        replica_sets = get_json(dev_cluster, "replicasets", "-l", f"specdeploy.io/name={name}", namespace=namespace)
        owners = [rs["metadata"]["ownerReferences"][0]["name"] for rs in replica_sets["items"]]
        assert sorted(owners) == sorted(set(owners)), f"one ReplicaSet per Deployment of {name}"
    assert "acquired lease" in second.output()


def test_a_second_operator_waits_and_takes_over(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[[str], Any]
) -> None:
    first = operator_processes("first")
    wait_for(lambda: "acquired lease" in first.output(), 60, "the first operator's lease", describe=first.output)
    second = operator_processes("second")
    wait_for(lambda: "waiting for lease" in second.output(), 60, "the second operator waiting",
             describe=second.output)
    name = _ready_ngram(dev_cluster, namespace)
    assert "DeploymentCreated" in first.output()
    assert "DeploymentCreated" not in second.output() and "acquired lease" not in second.output()
    first.kill()
    wait_for(lambda: "acquired lease" in second.output(), 60, "the second operator taking over",
             describe=second.output)
    _patch(dev_cluster, namespace, name, {"spec": {"replicas": 3}})
    wait_for_object(dev_cluster, ["deployment", name], lambda d: d["spec"]["replicas"] == 3, 30,
                    "replicas 3 applied by the second operator", namespace=namespace)




@pytest.fixture
def pod_monitor_crd(dev_cluster: DevCluster) -> Any:
    """A stand-in for prometheus-operator's PodMonitor CRD (the operator looks for it at start-up)."""
    dev_cluster.kubectl("apply", "-f", "-", input=POD_MONITOR_CRD)
    wait_established(dev_cluster, "podmonitors.monitoring.coreos.com")
    yield
    dev_cluster.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", "--wait=false", check=False)


def test_pod_monitor_when_prometheus_operator_is_installed(
    dev_cluster: DevCluster, pod_monitor_crd: None, operator: None, namespace: str
) -> None:
    name = _ready_ngram(dev_cluster, namespace)
    monitor = wait_for_object(dev_cluster, ["podmonitors", name], lambda m: bool(m.get("spec")), 30,
                              "the PodMonitor", namespace=namespace)
    assert monitor["spec"]["podTargetLabels"] == ["specdeploy.io/name", "specdeploy.io/variant"]
    assert monitor["spec"]["selector"] == {"matchLabels": {"specdeploy.io/name": name}}
    assert monitor["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"


def test_a_child_deleted_or_edited_by_hand_is_restored(dev_cluster: DevCluster, operator: None, namespace: str) -> None:
    name = _ready_ngram(dev_cluster, namespace)
    expected = _container(_deployments(dev_cluster, namespace, name)[name])["args"]
    dev_cluster.kubectl("delete", "deployment", f"{name}-control", "-n", namespace)
    wait_for(lambda: f"{name}-control" in _deployments(dev_cluster, namespace, name), 30, "the Control Deployment back")
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["--edited-by-hand"]}]
    dev_cluster.kubectl("patch", "deployment", name, "-n", namespace, "--type", "json", "-p", json.dumps(patch))
    wait_for(lambda: _container(_deployments(dev_cluster, namespace, name)[name])["args"] == expected, 30,
             "the engine args restored")
    _wait_sd(dev_cluster, namespace, name, _is("Ready", "True"), "Ready again")


def test_a_child_the_apiserver_refuses_is_ready_false_with_its_reason_until_fixed(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    """A quota that allows no Service: the apiserver answers 403 for the Service on every try, so the status
    says so (Ready False, ApplyRefused, the apiserver's words) instead of a retry loop that writes nothing."""
    dev_cluster.kubectl("create", "quota", "no-services", "--hard=services=0", "-n", namespace)
    example = EXAMPLES / "llama-8b-ngram.yaml"
    name = _name(example)
    assert _apply(dev_cluster, namespace, example).returncode == 0

    def refused(obj: dict[str, Any]) -> bool:
        ready = condition(obj, "Ready")
        return ready is not None and ready["reason"] == "ApplyRefused"

    obj = _wait_sd(dev_cluster, namespace, name, refused, "Ready False ApplyRefused")
    ready = condition(obj, "Ready")
    assert ready is not None and ready["status"] == "False" and "exceeded quota" in ready["message"]
    assert obj["status"]["phase"] == "Rejected" and obj["status"]["observedGeneration"] == 1
    wait_for(lambda: [e for e in _events(dev_cluster, namespace, name)
                      if e["reason"] == "ApplyRefused" and e["type"] == "Warning"], 30, "an ApplyRefused Event")
    dev_cluster.kubectl("delete", "quota", "no-services", "-n", namespace)
    obj = _wait_sd(dev_cluster, namespace, name, lambda o: not refused(o) and o["status"]["phase"] != "Rejected",
                   "converged once the quota is gone")
    assert get_json(dev_cluster, "service", name, namespace=namespace)["metadata"]["name"] == name
    assert len([e for e in _events(dev_cluster, namespace, name) if e["reason"] == "ApplyRefused"]) == 1


def test_a_metrics_port_in_use_stops_the_operator_before_it_takes_the_lease(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any]
) -> None:
    """A port in use stays in use: the operator exits at once saying which, instead of kopf retrying its
    start-up beside tasks (and a lease) of the first attempt."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        operator = operator_processes("port-taken", "--metrics-port", str(port))
        wait_for(lambda: operator.process.poll() is not None, 60, "the operator to exit", describe=operator.output)
    assert operator.process.returncode != 0
    assert f"cannot serve /metrics on port {port}" in operator.output()
    assert "acquired" not in operator.output().lower()


def _policy_refusing_status_writes(namespace: str, name: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and its binding) that refuses every status write of SD `name`: a status
    that can no longer be written, as after a cluster admin's policy, for one SD among healthy ones."""
    policy = f"{namespace}-refuse-{name}-status"[:63]
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": ["specdeploy.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
                      "resources": ["speculativedeployments/status"]}]},
                  "validations": [{"expression": f"object.metadata.name != '{name}'",
                                   "message": f"status writes of {name} are refused by a test policy"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": policy},
         "spec": {"policyName": policy, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]


def test_the_resync_goes_on_past_an_sd_whose_reconcile_fails(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any]
) -> None:
    """Three SDs in name order; the middle one's status cannot be written, so each of its reconciles raises.
    The resync (every 3 s) still restores a Service deleted by hand of the SDs on either side of it: a
    Service change is seen by no watch of the operator, only by the resync."""
    dev_cluster.kubectl("create", "quota", "no-pods", "--hard=pods=0", "-n", namespace)   # children, no pods
    policy = _policy_refusing_status_writes(namespace, "broken")
    dev_cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in policy))
    try:
        base = yaml.safe_load((EXAMPLES / "llama-8b-ngram.yaml").read_text())
        names = ("alpha", "broken", "zulu")
        for name in names:
            assert _apply(dev_cluster, namespace, json.dumps({**base, "metadata": {"name": name}})).returncode == 0
        operator = operator_processes("resync")
        healthy = [n for n in names if n != "broken"]
        for name in healthy:
            _wait_sd(dev_cluster, namespace, name, lambda o: o.get("status", {}).get("observedGeneration") == 1,
                     "status written", timeout=60)
        wait_for(lambda: "periodic resync of " + f"{namespace}/broken failed" in operator.output(), 30,
                 "the resync to log the broken SD by name")
        assert "status" not in _sd(dev_cluster, namespace, "broken")

        for name in healthy:
            dev_cluster.kubectl("delete", "service", name, "-n", namespace)
        def restored(name: str) -> bool:
            return bool(dev_cluster.kubectl("get", "service", name, "-n", namespace, "--ignore-not-found",
                                            "-o", "name").stdout.strip())

        for name in healthy:
            wait_for(lambda name=name: restored(name), 30, f"{name}: the Service restored by the resync")
    finally:
        for document in reversed(policy):
            dev_cluster.kubectl("delete", document["kind"], document["metadata"]["name"], "--ignore-not-found")
