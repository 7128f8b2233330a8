"""Speculative pods that ran out of memory, read from pod status the way a kubelet reports it.

    out_of_memory(pods, since=speculation_since)
    # [OutOfMemory(pod="llama-7f9c-x2", container="engine", reason="Error", exit_code=1,
    #              finished_at="…", detail="torch.OutOfMemoryError: CUDA out of memory. …")]

A container killed by the kernel's OOM killer ends with reason OOMKilled. A CUDA out-of-memory error is
an ordinary crash (reason Error) whose last log lines say so; engine containers use
`terminationMessagePolicy: FallbackToLogsOnError`, so those lines are in `terminated.message`. Level-based:
only terminations after `since` (when speculation last turned on) count, so the same restart is found
again after an operator restart, and a rollback (which replaces the pods) ends it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specdeploy.judgment.evidence import parse_rfc3339

VARIANT_LABEL = "specdeploy.io/variant"
SPECULATIVE = "speculative"
OOM_KILLED = "OOMKilled"    # kubelet's ContainerStateTerminated.reason for a kernel OOM kill

# What engines print when GPU memory runs out, each from its source:
_CUDA_OUT_OF_MEMORY = re.compile(
    "|".join((
        r"CUDA out of memory",                          # torch's caching allocator (torch.OutOfMemoryError)
        r"OutOfMemoryError",                            # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
        r"CUDA error: out of memory",                   # CUDA runtime (cudaErrorMemoryAllocation)
        r"No available memory for the cache blocks",    # vLLM: vllm/v1/core/kv_cache_utils.py
        r"larger than the available KV cache memory",   # vLLM: the KV cache cannot hold one max_model_len request
        r"Not enough memory\. Please try to increase --mem-fraction-static",   # SGLang: model_runner / pool_configurator
    )),
    re.IGNORECASE,
)

_DETAIL_LIMIT = 240


def is_out_of_memory(reason: str | None, message: str | None) -> bool:
    """Whether a container termination (reason, message) was an out-of-memory death."""
    return reason == OOM_KILLED or bool(message and _CUDA_OUT_OF_MEMORY.search(message))


@dataclass(frozen=True)
class OutOfMemory:
    """One out-of-memory death of an engine container."""

    pod: str
    container: str
    reason: str
    exit_code: int | None
    finished_at: str | None
    detail: str

    def evidence(self) -> str:
        code = f", exit code {self.exit_code}" if self.exit_code is not None else ""
        when = f" at {self.finished_at}" if self.finished_at else ""
        said = f": {self.detail}" if self.detail else ""
        return f"pod {self.pod} container {self.container} ran out of memory ({self.reason}{code}){when}{said}"


def _detail(message: str) -> str:
    match = _CUDA_OUT_OF_MEMORY.search(message)
    if match is None:
        return ""
    line_start = message.rfind("\n", 0, match.start()) + 1
    line_end = message.find("\n", match.end())
    line = message[line_start:line_end if line_end >= 0 else len(message)].strip()
    return line if len(line) <= _DETAIL_LIMIT else line[:_DETAIL_LIMIT] + "…"


def _after(finished_at: Any, since: datetime | None) -> bool:
    if since is None:
        return True
    if not isinstance(finished_at, str):
        return True   # a termination without a time is recent (the kubelet has not filled it in yet)
    try:
        return parse_rfc3339(finished_at) >= since
    except ValueError:
        return True


def out_of_memory(pods: Iterable[Mapping[str, Any]], since: datetime | None = None) -> list[OutOfMemory]:
    """OOM deaths of speculative pods' containers (current or last state) that ended at or after `since`.

    `pods` are Pod objects as JSON (what the apiserver returns); pods of another variant are skipped.
    """
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (metadata.get("labels") or {}).get(VARIANT_LABEL) != SPECULATIVE:
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            for state_key in ("state", "lastState"):
                terminated = ((status.get(state_key) or {}).get("terminated")) or None
                if not terminated:
                    continue
                reason, text = terminated.get("reason"), terminated.get("message") or ""
                if not is_out_of_memory(reason, text) or not _after(terminated.get("finishedAt"), since):
                    continue
                exit_code = terminated.get("exitCode")
                found.append(OutOfMemory(
                    pod=str(metadata.get("name", "?")),
                    container=str(status.get("name", "?")),
                    reason=str(reason or "Error"),
                    exit_code=exit_code if isinstance(exit_code, int) else None,
                    finished_at=terminated.get("finishedAt"),
                    detail=_detail(text),
                ))
                break   # the current and the last state of one container are one story
    return found
