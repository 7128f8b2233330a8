"""Derive the schemas of the Kubernetes core/v1 types `spec.podTemplate` takes from lightkube-models, into
specdeploy/api/kube_types.json (which the resource's models read, so they load no client):

    python -m specdeploy.clients.kube_types      # after a lightkube-models upgrade; a unit test fails until then
"""

from __future__ import annotations

import json
import typing
from typing import Any

from lightkube.models import core_v1

from specdeploy.api.kube import SCHEMAS

KUBE_TYPES = ("Toleration", "Affinity", "LocalObjectReference", "Volume", "EnvVar", "VolumeMount",
              "ResourceRequirements")
_INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}
_QUANTITY_MAPS = {"limits", "requests"}
"""Untyped maps of lightkube whose values are quantities (ResourceRequirements); every other is map[string]string."""
_QUANTITIES = {"sizeLimit"}
"""Quantity fields outside those maps (EmptyDirVolumeSource): lightkube types a Quantity as str, Kubernetes takes
2 or "2Gi"."""


def _schema(annotation: Any, name: str = "") -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        present = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _schema(present[0], name) if len(present) == 1 else dict(_INT_OR_STRING)   # IntOrString
    if origin is list:
        return {"type": "array", "items": _schema(typing.get_args(annotation)[0])}
    if annotation is dict or origin is dict:
        values = dict(_INT_OR_STRING) if name in _QUANTITY_MAPS else {"type": "string"}
        return {"type": "object", "additionalProperties": values}
    if name in _QUANTITIES:
        return dict(_INT_OR_STRING)
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in simple:
        return {"type": simple[annotation]}
    hints = typing.get_type_hints(annotation)
    schema: dict[str, Any] = {"type": "object",
                              "properties": {field: _schema(hint, field) for field, hint in hints.items()}}
    required = [field for field, hint in hints.items() if typing.get_origin(hint) is not typing.Union]
    if required:
        schema["required"] = required
    return schema


def derive() -> dict[str, dict[str, Any]]:
    """Each of KUBE_TYPES' OpenAPI schema as lightkube-models types it."""
    return {name: _schema(getattr(core_v1, name)) for name in KUBE_TYPES}


def main() -> None:
    SCHEMAS.write_text(json.dumps(derive(), indent=1) + "\n")


if __name__ == "__main__":
    main()
