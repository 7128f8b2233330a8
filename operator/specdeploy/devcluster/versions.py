"""Pinned versions of everything the dev cluster builds or runs: the one place they live.

Kubernetes and kwok move together (kwok v0.8 is built against the v0.36 client libraries);
etcd follows the release line Kubernetes itself requires (go.etcd.io/etcd/* v3.6.x in its go.mod).
Changing a version here changes the cache key, so the next `dev-cluster build` rebuilds.
"""

from __future__ import annotations

#: k8s.io/kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl.
KUBERNETES = "v1.36.3"
#: go.etcd.io/etcd/server/v3 (its root package is the etcd main package).
ETCD = "v3.6.16"
#: sigs.k8s.io/kwok: plays the kubelet of the fake GPU nodes; v0.8 matches Kubernetes 1.36.
KWOK = "v0.8.0"
#: helm.sh/helm/v3: for the chart tests and the demo.
HELM = "v3.22.0"
#: sigs.k8s.io/lws: the LeaderWorkerSet controller, for SDs laid out across nodes (v0.7 serves the v1 API the
#: operator writes and builds against the same client libraries line as Kubernetes 1.36's).
LWS = "v0.7.0"

#: The Go language version written into the generated wrapper modules (the installed Go is 1.26).
GO_LANGUAGE = "1.26.0"


def staging_version(kubernetes: str = KUBERNETES) -> str:
    """The staging-module version that belongs to a Kubernetes release: v1.36.3 -> v0.36.3."""
    major, minor, patch = kubernetes.lstrip("v").split(".")
    if major != "1":
        raise ValueError(f"expected a Kubernetes 1.x version such as 'v1.36.3', got {kubernetes!r}")
    return f"v0.{minor}.{patch}"
