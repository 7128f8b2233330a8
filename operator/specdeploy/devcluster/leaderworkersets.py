"""The LeaderWorkerSet controller on the dev cluster: its CRD, its webhooks on loopback, its process.

    files = LwsFiles.from_module()                   # the CRD and webhook manifests of sigs.k8s.io/lws@LWS
    argv = controller_argv(binary, config_path)      # with write_config(...) beside it
    webhooks = webhook_configurations(files, "https://127.0.0.1:PORT", ca_pem)

Why rewritten: the controller serves four webhooks (mutate and validate LeaderWorkerSets; mutate pods, which
sets LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX and the group labels; validate pods), all
`failurePolicy: Fail`, and its own certificate manager issues a certificate for an in-cluster Service that this
apiserver cannot reach (there is no pod network). So the controller runs with `internalCertManagement` off and
serves on 127.0.0.1 with a certificate the dev cluster's CA signed, and its published webhook configurations
(config/webhook/manifests.yaml) are applied with `clientConfig.url` instead of `clientConfig.service`. The pod
webhooks keep to the pods of LeaderWorkerSets (the objectSelector of LWS's own Helm chart), so no other test's
pod waits on this controller. Read in v0.7.0: cmd/main.go, api/config/v1alpha1, pkg/webhooks.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specdeploy.devcluster import build, versions

MODULE = "sigs.k8s.io/lws"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
#: The pods of a LeaderWorkerSet carry this label (its chart's pod-webhook objectSelector).
GROUP_LABEL = "leaderworkerset.sigs.k8s.io/name"


@dataclass(frozen=True)
class LwsFiles:
    """The manifests sigs.k8s.io/lws publishes beside its code, in the Go module cache."""

    crd: Path
    webhooks: Path

    @classmethod
    def from_module(cls, version: str = versions.LWS) -> LwsFiles:
        root = build.module_dir(MODULE, version) / "config"
        return cls(root / "crd" / "bases" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
                   root / "webhook" / "manifests.yaml")


def crd_manifest(files: LwsFiles) -> dict[str, Any]:
    return dict(yaml.safe_load(files.crd.read_text()))


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    yield from (doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def webhook_configurations(files: LwsFiles, base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The Mutating- and ValidatingWebhookConfiguration of the module, each webhook sent to `base_url` + its path
    with `ca_pem` as the CA bundle, the pod webhooks narrowed to LeaderWorkerSets' pods."""
    bundle = base64.b64encode(ca_pem).decode()
    result = []
    for document in _documents(files.webhooks):
        config = copy.deepcopy(document)
        config["metadata"] = {"name": f"specdeploy-dev-lws-{config['metadata']['name']}"}
        for webhook in config["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"{base_url}{path}", "caBundle": bundle}
            if any("pods" in rule.get("resources", []) for rule in webhook.get("rules", [])):
                webhook["objectSelector"] = {"matchExpressions": [{"key": GROUP_LABEL, "operator": "Exists"}]}
        result.append(config)
    return result


def write_config(path: Path, webhook_port: int, health_port: int, cert_dir: Path) -> Path:
    """The controller's Configuration: one replica (no leader election), its own certificates off, webhooks on
    127.0.0.1:`webhook_port` with `cert_dir`'s tls.crt/tls.key, no metrics server ("0"), health on loopback."""
    config = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def controller_argv(binary: Path, config: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"]


def probe_manifest(namespace: str) -> dict[str, Any]:
    """A LeaderWorkerSet a server-side dry run creates once the controller's webhooks answer (both run on it)."""
    container = {"name": "c", "image": "specdeploy.invalid/probe:0", "command": ["true"]}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "specdeploy-dev-probe", "namespace": namespace},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {
            "spec": {"containers": [container]}}}},
    }
