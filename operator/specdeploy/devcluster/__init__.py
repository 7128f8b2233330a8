"""The dev cluster: a real local control plane (etcd, kube-apiserver, controller-manager, scheduler)
with kwok GPU nodes and optionally Prometheus + Alertmanager, built from pinned Go modules.

Usage::

    from specdeploy.devcluster import DevCluster
    cluster = DevCluster(state_dir, nodes=4, monitoring=True).up()
"""

from specdeploy.devcluster.cluster import ClusterStatus, ComponentStatus, DevCluster
from specdeploy.devcluster.errors import (
    BuildError,
    ClusterNotRunning,
    DevClusterError,
    KubectlError,
    ProcessFailed,
)
from specdeploy.devcluster.simregistry import SimulatorEndpoint
from specdeploy.devcluster.wait import WaitTimeout, wait_for

__all__ = [
    "BuildError",
    "ClusterNotRunning",
    "ClusterStatus",
    "ComponentStatus",
    "DevCluster",
    "DevClusterError",
    "KubectlError",
    "ProcessFailed",
    "SimulatorEndpoint",
    "WaitTimeout",
    "wait_for",
]
