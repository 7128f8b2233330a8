"""Waits on Kubernetes objects of a dev cluster, for e2e tests and the demo: every wait has a deadline.

Usage::

    pods = wait_for_pods(cluster, "ns", "app=web", count=2, ready=True, timeout=60)
    wait_for_absent(cluster, ["replicasets", "-l", "app=web"], namespace="ns", timeout=60)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specdeploy.devcluster.wait import wait_for

if TYPE_CHECKING:
    from specdeploy.devcluster.cluster import DevCluster


def get_json(cluster: DevCluster, *args: str, namespace: str | None = None) -> dict[str, Any]:
    """`kubectl get <args> -o json` as a dict (a List for selectors, the object for a name)."""
    ns = ["-n", namespace] if namespace else []
    return dict(json.loads(cluster.kubectl("get", *args, *ns, "-o", "json").stdout))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type `kind`, or None."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def pod_ready(pod: dict[str, Any]) -> bool:
    cond = condition(pod, "Ready")
    return pod.get("status", {}).get("phase") == "Running" and cond is not None and cond.get("status") == "True"


def wait_for_object(cluster: DevCluster, args: list[str], predicate: Callable[[dict[str, Any]], bool],
                    timeout: float, what: str, namespace: str | None = None) -> dict[str, Any]:
    """Poll `kubectl get <args>` until `predicate(obj)` holds; returns the object."""
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal last
        last = get_json(cluster, *args, namespace=namespace)
        return last if predicate(last) else None

    return wait_for(check, timeout, what, interval=0.25,
                    describe=lambda: "last seen: " + json.dumps(last.get("status", last), indent=1)[:3000])


def wait_for_pods(cluster: DevCluster, namespace: str, selector: str, count: int, timeout: float,
                  ready: bool = True) -> list[dict[str, Any]]:
    """Wait until exactly `count` pods match `selector` (and, with `ready`, all are Running and Ready)."""
    def good(listing: dict[str, Any]) -> bool:
        items = [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]
        return len(items) == count and (not ready or all(pod_ready(p) for p in items))

    what = f"{count} {'ready ' if ready else ''}pods with {selector} in {namespace}"
    listing = wait_for_object(cluster, ["pods", "-l", selector], good, timeout, what, namespace=namespace)
    return list(listing["items"])


def wait_for_absent(cluster: DevCluster, args: list[str], timeout: float, namespace: str | None = None) -> None:
    """Wait until `kubectl get <args>` lists nothing (or the named object is gone)."""
    def gone() -> bool:
        ns = ["-n", namespace] if namespace else []
        proc = cluster.kubectl("get", *args, *ns, "-o", "json", "--ignore-not-found", check=False)
        if proc.returncode != 0:
            return False
        if not proc.stdout.strip():
            return True
        data = json.loads(proc.stdout)
        return data.get("kind", "").endswith("List") and not data.get("items")

    wait_for(gone, timeout, f"{' '.join(args)} to be gone" + (f" in {namespace}" if namespace else ""))


def wait_established(cluster: DevCluster, crd: str, timeout: float = 30.0) -> None:
    """Wait until CRD `crd` is Established. Polled, not `kubectl wait`: that fails at once on a CRD whose
    status the apiserver has not written yet."""
    def established() -> bool:
        conditions = (get_json(cluster, "crd", crd).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout, f"CRD {crd} established")
