"""Whether the children as they are differ from what the operator would apply: a pure comparison, so
that a pass that would change nothing writes nothing.

What the operator sets must be there with the same value; what the apiserver or others added (defaults,
status, a user's own annotation) is not drift. A field the operator no longer sets changes the children's
fingerprint, which is compared first (reconcile/decide.py), so it needs no comparison here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from specdeploy.reconcile.children import Children


def difference(desired: Any, live: Any, path: str = "") -> str | None:
    """The first path at which `live` lacks or differs from `desired`, or None when `desired` ⊆ `live`."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return path or "."
        for key, value in desired.items():
            if key not in live:
                return f"{path}.{key}"
            found = difference(value, live[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return path
        for index, (wanted, there) in enumerate(zip(desired, live, strict=True)):
            found = difference(wanted, there, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return None if desired == live else path


def drift(children: Children, live: Mapping[tuple[str, str], Mapping[str, Any]], kinds: Collection[str]) -> str | None:
    """What differs between `children` and `live` (kind and name → the object as read, for every child of
    `kinds`), in words; None when every child of those kinds is there as the operator would apply it."""
    manifests = [children.config_map, *children.deployments.values(), children.service]
    if children.pod_monitor is not None:
        manifests.append(children.pod_monitor)
    for manifest in manifests:
        if manifest["kind"] not in kinds:
            continue
        key = (manifest["kind"], manifest["metadata"]["name"])
        there = live.get(key)
        if there is None:
            return f"{key[0]} {key[1]} is missing"
        found = difference({k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}, there)
        if found is not None:
            return f"{key[0]} {key[1]} differs at {found}"
    return None
