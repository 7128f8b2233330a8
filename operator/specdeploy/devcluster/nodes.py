"""The fake GPU nodes and the kwok process that plays their kubelet.

Why kwok: the scheduler, the GPU accounting (`nvidia.com/gpu` allocatable) and the pod lifecycle
(Pending → Running/Ready → deleted) must be real, but there are no GPUs or kubelets here. kwok
watches the nodes we create and drives node and pod status through its published *stages*,
read from the Go module cache at run time.

Pod IPs are loopback addresses: kwok hands each pod an address of its `--cidr` (PodController.funcPodIPsWith in
kwok's pkg/kwok/controllers/pod_controller.go, from the one pool of that CIDR since our nodes have no
spec.podCIDR), and Linux routes all of 127.0.0.0/8 to lo ("local 127.0.0.0/8 dev lo" in `ip route show table
local`), so an engine process can listen on its pod's IP and anything on this machine reach it there, as in a
real cluster, with no setup.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.devcluster.errors import DevClusterError

#: The annotation kwok selects its nodes by (the convention of kwok's own docs).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

#: Stage files (relative to kwok's ``kustomize/stage``): nodes become Ready and keep a lease; pods
#: become Running/Ready, jobs complete, and terminating pods are really deleted.
STAGE_FILES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


#: Second octets of the pod networks 127.N.0.0/16 (65,534 pods each); 127.0.0.0/16 holds the components.
POD_NETWORK_OCTETS = range(1, 255)


@dataclass(frozen=True)
class GpuNodeShape:
    """What one fake node offers: an 8 x H100-80GB server by default."""

    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    cpu: str = "192"
    memory: str = "2000Gi"
    pods: str = "110"
    extra_labels: dict[str, str] = field(default_factory=dict)


def node_name(index: int) -> str:
    return f"gpu-node-{index}"


def node_manifest(name: str, shape: GpuNodeShape) -> dict[str, Any]:
    """A Node object with GPU capacity and GPU-feature-discovery style labels, owned by kwok."""
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": shape.pods,
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": str(shape.gpus),
    }
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node-role.kubernetes.io/gpu": "",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(shape.gpus),
        "nvidia.com/gpu.product": shape.gpu_product,
        "nvidia.com/gpu.memory": str(shape.gpu_memory_mib),
        **shape.extra_labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"allocatable": dict(resources), "capacity": dict(resources)},
    }


def pod_cidrs_in_use(proc: Path = Path("/proc")) -> set[str]:
    """The `--cidr` of every kwok running on this machine, whichever dev cluster it belongs to."""
    found: set[str] = set()
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"kwok"):
            found.update(a.split(b"=", 1)[1].decode() for a in argv if a.startswith(b"--cidr="))
    return found


def free_pod_cidr(in_use: set[str], choose: random.Random | None = None) -> str:
    """A pod network 127.N.0.0/16 that no running kwok hands out, picked at random among the free ones.

    Two clusters must not share one: kwok's pool counts up from the network address (ipPool.new in
    pkg/kwok/controllers/utils.go: index 1, 2, …), so their first pods would get the same IP and the same port.
    At random, so that two clusters starting at the same moment are unlikely to pick the same one.
    """
    free = [f"127.{octet}.0.0/16" for octet in POD_NETWORK_OCTETS if f"127.{octet}.0.0/16" not in in_use]
    if not free:
        raise DevClusterError(f"every pod network 127.N.0.0/16 is in use by a running kwok ({len(in_use)}); "
                              "stop a dev cluster first")
    return (choose or random.SystemRandom()).choice(free)


def kwok_argv(kwok: Path, kubeconfig: Path, stage_dir: Path, pod_cidr: str) -> list[str]:
    """kwok's command line: manage only our annotated nodes, with the stages above, pod IPs from `pod_cidr`."""
    argv = [
        str(kwok),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
        "--node-lease-duration-seconds=40",
        f"--cidr={pod_cidr}",
        "--node-ip=127.0.0.1",
    ]
    for stage in STAGE_FILES:
        argv.append(f"--config={stage_dir / stage}")
    return argv
