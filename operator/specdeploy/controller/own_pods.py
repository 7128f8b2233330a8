"""`OwnPods`: the engine pods the operator observed as each SD's, per variant, with when it last saw each — so
that the analysis uses only series its own pods wrote (docs/security.md "Series from other pods").

    own = OwnPods()
    own.record("prod", "llama", pods_from_the_apiserver, now)
    own.foreign("prod", "llama", {"speculative": {("llama-spec-7d9-x2", "prod/llama")}})   # what is not its own

Pods are read from the apiserver (the SD's engine pods, by its label) only when a series names a pod not seen yet,
so a steady SD costs no list. A pod is remembered for an hour (KEEP_SECONDS) after it was last listed: one deleted during
the window (a rollout, a rollback) still counts as the SD's for the series it wrote while it ran. Kept in memory,
not in status; so that a restarted operator still knows a pod deleted before it started, the SD's ReplicaSets are
listed with its pods: a Deployment keeps its old ReplicaSets (revisionHistoryLimit), and a pod of one is named
`<ReplicaSet>-<5 characters>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specdeploy.reconcile.children import LABEL_VARIANT

KEEP_SECONDS = 3600.0
"""How long a pod is remembered after it was last listed, at least: twice the SD's window when that is longer, so
that a pod deleted during a window is still known for the series it wrote."""

POD_SUFFIX_LENGTH = 5
"""A ReplicaSet's pod is named `<ReplicaSet>-` and 5 random characters (the apiserver's generateName suffix)."""

Reported = Mapping[str, Iterable[tuple[str, str]]]
"""Per variant, the (pod, job) labels of the series labelled as one SD's (clients/prometheus.py series_pods)."""


@dataclass
class OwnPods:
    """Per (namespace, SD, variant): pod name → the Unix time it was last listed as that SD's; per SD, how long its
    pods are kept."""

    _seen: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)
    _replica_sets: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)
    _keep: dict[tuple[str, str], float] = field(default_factory=dict)

    def record(self, namespace: str, name: str, pods: Iterable[Mapping[str, Any]], now: float,
               window_seconds: float = 0.0, replica_sets: Iterable[Mapping[str, Any]] = ()) -> None:
        """The SD's engine pods and ReplicaSets as the apiserver listed them (JSON), at `now`; each is kept
        KEEP_SECONDS after (twice `window_seconds` when longer)."""
        self._keep[(namespace, name)] = max(KEEP_SECONDS, 2 * window_seconds)
        for listed, into in ((pods, self._seen), (replica_sets, self._replica_sets)):
            for item in listed:
                metadata = item.get("metadata") or {}
                variant = (metadata.get("labels") or {}).get(LABEL_VARIANT)
                if variant and metadata.get("name"):
                    into.setdefault((namespace, name, variant), {})[metadata["name"]] = now
        self.prune(now)

    def prune(self, now: float) -> None:
        """Forget the pods and ReplicaSets listed longer ago than their SD's keep (a deleted SD's go with it)."""
        for seen in (self._seen, self._replica_sets):
            for key in list(seen):
                keep = self._keep.get(key[:2], KEEP_SECONDS)
                kept = {item: at for item, at in seen[key].items() if now - at <= keep}
                if kept:
                    seen[key] = kept
                else:
                    del seen[key]
        for sd in set(self._keep) - {key[:2] for key in (*self._seen, *self._replica_sets)}:
            del self._keep[sd]

    def pods(self, namespace: str, name: str) -> set[str]:
        """Every pod of the SD listed, both variants."""
        return {pod for (ns, sd, _), pods in self._seen.items() if (ns, sd) == (namespace, name) for pod in pods}

    def foreign(self, namespace: str, name: str, reported: Reported) -> set[tuple[str, str, str]]:
        """The (variant, pod, job) of the series labelled as this SD's whose pod is not one of that variant's: neither
        listed nor named as a pod of one of that variant's ReplicaSets."""
        found = set()
        for variant, pairs in reported.items():
            key = (namespace, name, variant)
            sets = self._replica_sets.get(key, {})
            for pod, job in pairs:
                owner, _, suffix = pod.rpartition("-")
                if pod not in self._seen.get(key, {}) and not (owner in sets and len(suffix) == POD_SUFFIX_LENGTH):
                    found.add((variant, pod, job))
        return found
