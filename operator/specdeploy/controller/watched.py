"""`Watched`: the SDs, child Deployments and (where the operator runs them) child LeaderWorkerSets as the
operator's own watches last delivered them, each under its kind, and the status of each SD that the operator
decided but has not written yet. A pass reads LeaderWorkerSets from the apiserver (clients/kube.py
`apply_children`); the probe loop starts from the watched ones.

Why: with a thousand SDs every pass read the SD and its Deployments from the apiserver (a get each, ~11 ms of
apiserver CPU on two cores: docs/performance.md), though kopf's watches had delivered both already. A pass
decides on the watched copy when the watch has caught up with the operator's own last read or write of that
object (`confirm`): the copy is then the newest version the operator knows of, at most a watch's lag behind
a get. While the watch has not yet delivered the version a read or write returned, or has never delivered
the object, the pass reads it from the apiserver as before.

The unwritten status (`hold`): an analysis sample that changes nothing a user reads but `lastSampleAt` and
the inconclusive count is not written at once (reconcile/status.py `deferrable_sample_write`); the next pass
decides on what it held, as long as the SD is still at the version the status was decided on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import ALL_NS

SD = "SpeculativeDeployment"
DEPLOYMENT = "Deployment"

Key = tuple[str, str, str]   # kind, namespace, name


def resource_version(body: Mapping[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("resourceVersion")


@dataclass
class Watched:
    """Bodies by kind, namespace and name as the watches delivered them (never to be changed by a reader);
    the version of each object the operator read or wrote that the watch has not delivered yet; and the
    statuses held unwritten, by the SD version they were decided on."""

    _bodies: dict[Key, Mapping[str, Any]] = field(default_factory=dict)
    _awaited: dict[Key, str] = field(default_factory=dict)
    _held: dict[Key, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)

    def seen(self, kind: str, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        key = (kind, metadata.get("namespace") or "", metadata.get("name") or "")
        self._bodies[key] = body
        if key in self._awaited and self._awaited[key] == resource_version(body):
            del self._awaited[key]

    def gone(self, kind: str, namespace: str, name: str) -> None:
        key = (kind, namespace, name)
        self._bodies.pop(key, None)
        self._awaited.pop(key, None)
        self._held.pop(key, None)

    def confirm(self, kind: str, namespace: str, name: str, version: str | None) -> None:
        """The operator read or wrote the object and got `version` back (None: it is not there). The
        watched copy is used again once the watch delivers that version, or its deletion; until then (and
        after a re-list that skipped it) the object is read, and a read that returns what the watch holds
        settles it."""
        key = (kind, namespace, name)
        body = self._bodies.get(key)
        if (resource_version(body) if body is not None else None) == version:
            self._awaited.pop(key, None)
        else:
            self._awaited[key] = version or ""   # "": read as missing while the watch still holds it

    def current(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The watched body when the watch has delivered every version the operator's own reads and writes
        returned; None when there is none or the watch lags behind them (the caller reads it then)."""
        key = (kind, namespace, name)
        if key in self._awaited:
            return None
        return self._bodies.get(key)

    def bodies(self, kind: str, namespaces: Iterable[str]) -> list[Mapping[str, Any]]:
        """Every watched object of `kind` in `namespaces` (lightkube's ALL_NS: every namespace)."""
        wanted = set(namespaces)
        return [body for (of, namespace, _), body in self._bodies.items()
                if of == kind and (ALL_NS in wanted or namespace in wanted)]

    def hold(self, namespace: str, name: str, version: str | None, status: Mapping[str, Any]) -> None:
        """Keep `status` (wire form), decided on version `version` of the SD and not written."""
        if version is not None:
            self._held[(SD, namespace, name)] = (version, status)

    def release(self, namespace: str, name: str) -> None:
        """The held status was written, or is no longer wanted."""
        self._held.pop((SD, namespace, name), None)

    def held(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The status held for this SD, when it was decided on this version of it."""
        metadata = body.get("metadata") or {}
        found = self._held.get((SD, metadata.get("namespace") or "", metadata.get("name") or ""))
        if found is None or found[0] != resource_version(body):
            return None
        return found[1]
