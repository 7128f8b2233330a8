"""Kubeconfig files: client-certificate ones for the components, token ones for ServiceAccounts.

Why files: every consumer (kubectl, kopf, lightkube, helm, the controller-manager) reads a kubeconfig,
so the harness hands out paths, never in-memory credentials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CLUSTER_NAME = "specdeploy-dev"


def _document(server: str, ca_cert: Path, user_name: str, user: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": CLUSTER_NAME,
                      "context": {"cluster": CLUSTER_NAME, "user": user_name, "namespace": namespace}}],
        "current-context": CLUSTER_NAME,
    }


def _write(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(document, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def write_cert_kubeconfig(path: Path, server: str, ca_cert: Path, client_cert: Path, client_key: Path,
                          user_name: str = "admin", namespace: str = "default") -> Path:
    """A kubeconfig that authenticates with a client certificate (admin, controller-manager, scheduler)."""
    user = {"client-certificate": str(client_cert), "client-key": str(client_key)}
    return _write(path, _document(server, ca_cert, user_name, user, namespace))


def write_token_kubeconfig(path: Path, server: str, ca_cert: Path, token: str, user_name: str,
                           namespace: str = "default") -> Path:
    """A kubeconfig that authenticates with a bearer token, e.g. from a ServiceAccount TokenRequest."""
    return _write(path, _document(server, ca_cert, user_name, {"token": token}, namespace))
