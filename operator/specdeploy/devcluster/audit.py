"""The dev cluster's audit log: what the apiserver was asked to write, so tests count the operator's
writes (status patches, Events, children) from the apiserver's own record rather than from a client.

The policy records only writes, and only of what the operator writes: SpeculativeDeployment status and
Events with their request bodies, Deployments, ConfigMaps and Services without. Reads are not recorded,
so the log stays small and cheap on a two-core machine — except the start of each watch of pods and
Deployments (its URL: which label selector the watcher asked the apiserver to apply).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create, update, patch, delete]
  resources:
  - {group: specdeploy.io, resources: [speculativedeployments/status]}
  - {group: "", resources: [events]}
- level: Metadata
  verbs: [create, update, patch, delete]
  resources:
  - {group: apps, resources: [deployments]}
  - {group: "", resources: [configmaps, services]}
- level: Metadata
  verbs: [watch]
  omitStages: [ResponseComplete]
  resources:
  - {group: "", resources: [pods]}
  - {group: apps, resources: [deployments]}
- level: None
"""


def apiserver_flags(policy_file: Path, log_file: Path) -> list[str]:
    """kube-apiserver flags for the log, in JSON lines, bounded to 100 MB and one backup."""
    return [f"--audit-policy-file={policy_file}", f"--audit-log-path={log_file}", "--audit-log-format=json",
            "--audit-log-maxsize=100", "--audit-log-maxbackup=1"]


def audit_entries(log_file: Path, since: float = 0.0) -> Iterator[dict[str, Any]]:
    """The log's entries for requests received at or after `since` (seconds since the epoch)."""
    if not log_file.exists():
        return
    with log_file.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            entry = json.loads(line)
            received = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if received.timestamp() >= since:
                yield entry


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as the apiserver applies a JSON merge patch (RFC 7386, section 2)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def statuses_written(status_patches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The status after each of an object's status merge patches (audit entries, oldest first), replayed
    from the first: the operator patches what changed, so a patch alone is not the status it wrote."""
    status: dict[str, Any] = {}
    written = []
    for entry in status_patches:
        status = apply_merge_patch(status, entry["requestObject"].get("status") or {})
        written.append(status)
    return written
