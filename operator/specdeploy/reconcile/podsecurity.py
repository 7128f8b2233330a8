"""How engine pods are locked down: not root, no privilege escalation, no capabilities, the runtime's
seccomp profile, a read-only root filesystem — and the writable directories engines need despite it.

The Kubernetes "restricted" Pod Security Standard asks for runAsNonRoot, allowPrivilegeEscalation false,
capabilities drop ALL and seccompProfile RuntimeDefault; engine pods meet it. What the engines write,
and where it goes instead of the (read-only) image:

- The default images (vllm/vllm-openai, lmsysorg/sglang, nvcr.io tensorrt-llm) run as root with HOME
  `/` and no user for other ids (vllm-project/vllm#10185, #9118). So the pod names a numeric user
  (runAsNonRoot needs one when the image's USER is root) and sets HOME to an emptyDir.
- Under HOME go every cache that follows it: Hugging Face downloads (`HF_HOME`, ~/.cache/huggingface),
  vLLM's compile cache (~/.cache/vllm), Triton (~/.triton), FlashInfer JIT kernels (~/.cache/flashinfer),
  numba, outlines and xgrammar caches, torch extensions.
- TorchInductor writes /tmp/torchinductor_$USER and asks getpass.getuser(), which fails for a uid
  without a passwd entry unless USER is set: /tmp is an emptyDir and USER is set. OpenMPI (TensorRT-LLM
  with tensor parallelism) keeps its session directory in /tmp too.
- NCCL needs a large /dev/shm: an in-memory emptyDir (children.py).

GPUs need no privilege: the NVIDIA container toolkit gives the container its /dev/nvidia* device nodes
(mode 0666), usable by any user.
"""

from __future__ import annotations

from typing import Any

ENGINE_USER_ID = 65532
"""The uid and gid engine containers run as (the one the operator image uses; any non-zero id works)."""

HOME_PATH = "/home/engine"
TMP_PATH = "/tmp"
_HOME_VOLUME, _TMP_VOLUME = "home", "tmp"

WRITABLE_ENV: tuple[tuple[str, str], ...] = (
    ("HOME", HOME_PATH),
    ("USER", "engine"),
    ("XDG_CACHE_HOME", f"{HOME_PATH}/.cache"),
    ("XDG_CONFIG_HOME", f"{HOME_PATH}/.config"),
    ("HF_HOME", f"{HOME_PATH}/.cache/huggingface"),
)
"""Where engines and their libraries write; spec.engine.env may set any of them differently."""


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": ENGINE_USER_ID,
        "runAsGroup": ENGINE_USER_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def writable_env(engine_env: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """The container's env: WRITABLE_ENV except what `engine_env` (the engine's, with spec.engine.env) sets,
    then `engine_env` — one entry per name, so the user's value wins."""
    named = {name for name, _ in engine_env}
    return [{"name": k, "value": v} for k, v in (*[(k, v) for k, v in WRITABLE_ENV if k not in named], *engine_env)]


def writable_mounts() -> list[dict[str, Any]]:
    return [{"name": _HOME_VOLUME, "mountPath": HOME_PATH}, {"name": _TMP_VOLUME, "mountPath": TMP_PATH}]


def writable_volumes() -> list[dict[str, Any]]:
    """emptyDirs on the node's disk: HOME holds compile and JIT caches (the weights go to the weight cache,
    children.py), without a size limit."""
    return [{"name": _HOME_VOLUME, "emptyDir": {}}, {"name": _TMP_VOLUME, "emptyDir": {}}]
