"""`torch`'s CUDA memory queries for a machine without a GPU: the dev cluster's stand-in for the engine image's
torch when the pod runner runs a pod's GPU preflight (init container), importable as `torch` from this directory.

It answers only what specdeploy_engine/preflight.py `read_gpus_with_torch` asks, from the pod runner's environment:
SPECDEPLOY_DEV_GPUS visible GPUs of SPECDEPLOY_DEV_GPU_TOTAL_MIB each, of which SPECDEPLOY_DEV_GPU_HELD_MIB are
held by another process (the pod's knob, docs/dev-cluster.md).
"""

from __future__ import annotations

import os

MIB = 1024**2


def _count() -> int:
    return int(os.environ.get("SPECDEPLOY_DEV_GPUS", "0"))


class cuda:  # noqa: N801 - the name torch gives it
    @staticmethod
    def is_available() -> bool:
        return _count() > 0

    @staticmethod
    def device_count() -> int:
        return _count()

    @staticmethod
    def mem_get_info(index: int) -> tuple[int, int]:
        total = int(os.environ["SPECDEPLOY_DEV_GPU_TOTAL_MIB"]) * MIB
        held = int(os.environ.get("SPECDEPLOY_DEV_GPU_HELD_MIB", "0")) * MIB
        return max(total - held, 0), total

    @staticmethod
    def get_device_name(index: int) -> str:
        return os.environ.get("SPECDEPLOY_DEV_GPU_NAME", "simulated GPU")
