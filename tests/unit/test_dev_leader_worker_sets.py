"""The dev cluster's LeaderWorkerSet pieces as pure functions: how a group's pods are read (the kubelet's `$(VAR)`
expansion, leader or worker), and the controller's webhooks rewritten onto loopback."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from specdeploy.api.resource import load_resource
from specdeploy.devcluster.enginepod import engine_pod, expand
from specdeploy.devcluster.leaderworkersets import GROUP_LABEL, LwsFiles, webhook_configurations, write_config
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, desired_children

SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: big, namespace: demo}
spec:
  model: {name: meta-llama/Llama-3.1-405B-Instruct}
  speculation: {method: draft_model, numSpeculativeTokens: 4, draft: {name: meta-llama/Llama-3.1-8B-Instruct}}
  resources: {gpu: {product: H100-80GB}, tensorParallelSize: 8, pipelineParallelSize: 2}
  serving: {maxModelLen: 8192, maxNumSeqs: 32}
"""


def test_variables_expand_as_the_kubelet_does() -> None:
    env = {"LWS_LEADER_ADDRESS": "big-0.big-0.demo", "LWS_WORKER_INDEX": "1"}
    assert expand("$(LWS_LEADER_ADDRESS):20000", env) == "big-0.big-0.demo:20000"
    assert expand("--node-rank=$(LWS_WORKER_INDEX)", env) == "--node-rank=1"
    assert expand("$$(LWS_WORKER_INDEX)", env) == "$(LWS_WORKER_INDEX)"   # escaped
    assert expand("$(UNDEFINED) and $HOME", env) == "$(UNDEFINED) and $HOME"   # left as written


def _group_pod(role_template: str, env: dict[str, str]) -> dict[str, Any]:
    """A pod of the speculative group as LeaderWorkerSet creates it: its template, and the variables its pod
    webhook adds to every container."""
    resource = load_resource(SD)
    lws = desired_children(resource, make_plan(resource.spec)).deployments[Variant.SPECULATIVE]
    template = copy.deepcopy(lws["spec"]["leaderWorkerTemplate"][role_template])
    for container in template["spec"]["containers"]:
        container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in env.items())]
    return {"metadata": {"name": "big-0-1", "namespace": "demo", "uid": "u1", "labels": template["metadata"]["labels"]},
            "spec": template["spec"], "status": {"phase": "Running", "podIP": "127.80.0.7"}}


def test_a_worker_serves_nothing_and_its_flags_name_its_leader() -> None:
    worker = engine_pod(_group_pod("workerTemplate", {"LWS_LEADER_ADDRESS": "big-0.big-0.demo",
                                                      "LWS_WORKER_INDEX": "1"}))
    assert worker is not None and worker.role == "worker" and not worker.serves and worker.port is None
    assert worker.argv[worker.argv.index("--node-rank") + 1] == "1"
    assert worker.argv[worker.argv.index("--master-addr") + 1] == "big-0.big-0.demo"
    leader = engine_pod(_group_pod("leaderTemplate", {"LWS_LEADER_ADDRESS": "big-0.big-0.demo",
                                                      "LWS_WORKER_INDEX": "0"}))
    assert leader is not None and leader.role == "leader" and leader.serves and leader.port == 8000


MANIFESTS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mleaderworkerset.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset}}
  rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE], resources: [leaderworkersets]}]
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}]
"""


def test_the_webhooks_are_sent_to_loopback_and_pods_of_other_workloads_skip_them(tmp_path: Path) -> None:
    (tmp_path / "manifests.yaml").write_text(MANIFESTS)
    files = LwsFiles(crd=tmp_path / "crd.yaml", webhooks=tmp_path / "manifests.yaml")
    mutating, validating = webhook_configurations(files, "https://127.0.0.1:9443", b"CA PEM")
    lws_hook, pod_hook = mutating["webhooks"]
    assert lws_hook["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                                        "caBundle": base64.b64encode(b"CA PEM").decode()}
    assert "objectSelector" not in lws_hook
    for hook in (pod_hook, *validating["webhooks"]):
        assert hook["objectSelector"] == {"matchExpressions": [{"key": GROUP_LABEL, "operator": "Exists"}]}
        assert "service" not in hook["clientConfig"]
    assert mutating["metadata"]["name"].startswith("specdeploy-dev-lws-")


def test_the_controller_runs_alone_on_loopback_with_the_dev_certificates(tmp_path: Path) -> None:
    config = yaml.safe_load(write_config(tmp_path / "config.yaml", 9443, 8081, tmp_path / "certs").read_text())
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path / "certs")}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
