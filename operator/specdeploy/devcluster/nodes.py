"""The fake GPU nodes and the kwok process that plays their kubelet.

Why kwok: the scheduler, the GPU accounting (`nvidia.com/gpu` allocatable) and the pod lifecycle
(Pending → Running/Ready → deleted) must be real, but there are no GPUs or kubelets here. kwok
watches the nodes we create and drives node and pod status through its published *stages*,
read from the Go module cache at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def kwok_argv(kwok: Path, kubeconfig: Path, stage_dir: Path) -> list[str]:
    """kwok's command line: manage only our annotated nodes, with the stages above."""
    argv = [
        str(kwok),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.0/16",
        "--node-ip=127.0.0.1",
    ]
    for stage in STAGE_FILES:
        argv.append(f"--config={stage_dir / stage}")
    return argv
