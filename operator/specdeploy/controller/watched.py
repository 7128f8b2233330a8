"""`Watched`: the SDs and child Deployments as the operator's own watches last delivered them.

Why: with a thousand SDs an analysis cycle read every SD and its Deployment from the apiserver (two gets and
the status patch per SD, ~11 ms of apiserver CPU each on two cores: docs/performance.md), though kopf's
watches had delivered both already. A sample decides on the watched copy when nothing has changed it since
the operator's own last read or write of that object — the copy's resourceVersion is the one that read or
write returned (`confirm`). Anything else (a user's edit, a rollout's status, an event not yet delivered)
makes the versions differ, and the pass reads the object from the apiserver as before. So a watched copy
is never older than what the operator itself last saw, and the watch lag is no worse than a get's.
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
    """Bodies by kind, namespace and name as the watches delivered them (never to be changed by a reader),
    and the resourceVersion of each object that the operator's own last read or write returned."""

    _bodies: dict[Key, Mapping[str, Any]] = field(default_factory=dict)
    _confirmed: dict[Key, str] = field(default_factory=dict)

    def seen(self, kind: str, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        self._bodies[(kind, metadata.get("namespace") or "", metadata.get("name") or "")] = body

    def gone(self, kind: str, namespace: str, name: str) -> None:
        self._bodies.pop((kind, namespace, name), None)
        self._confirmed.pop((kind, namespace, name), None)

    def confirm(self, kind: str, namespace: str, name: str, version: str | None) -> None:
        """The operator read or wrote the object and got `version` back (None: it is not there)."""
        if version is None:
            self._confirmed.pop((kind, namespace, name), None)
        else:
            self._confirmed[(kind, namespace, name)] = version

    def unchanged(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The watched body when it is the version the operator's own last read or write returned;
        None when there is none or something changed it since (the caller reads it then)."""
        key = (kind, namespace, name)
        body = self._bodies.get(key)
        version = self._confirmed.get(key)
        if body is None or version is None or resource_version(body) != version:
            return None
        return body

    def bodies(self, kind: str, namespaces: Iterable[str]) -> list[Mapping[str, Any]]:
        """Every watched object of `kind` in `namespaces` (lightkube's ALL_NS: every namespace)."""
        wanted = set(namespaces)
        return [body for (of, namespace, _), body in self._bodies.items()
                if of == kind and (ALL_NS in wanted or namespace in wanted)]
