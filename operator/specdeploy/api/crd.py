"""The CustomResourceDefinition, generated from the pydantic models (their one source).

Pydantic writes JSON Schema with `$ref`s, `anyOf` for optionals and numeric `exclusiveMinimum`; the
apiserver wants a structural OpenAPI v3 schema: everything inlined, one type per node, boolean
`exclusiveMinimum`. `structural()` does that translation; `crd()` adds names, printer columns, the
status subresource and the rules that need `metadata`.

Maps: a model (extra="forbid") has `additionalProperties: false`, which the apiserver's own pruning of
unknown fields already means, so it is left out. A `dict[str, JsonValue]` (or `dict[str, Any]`) field,
whose values are any JSON, becomes `type: object` with `x-kubernetes-preserve-unknown-fields: true`: without
it the apiserver would prune every key. CEL sees only the declared `properties` of such an object (none of
its other keys or values), so a rule about particular keys needs them declared (`json_schema_extra`). A
`dict[str, X]` keeps `additionalProperties` with X's structural schema: a map CEL can range over.
"""

from __future__ import annotations

import typing
from typing import Any

import yaml
from pydantic import BaseModel

from specdeploy.api.base import WireModel
from specdeploy.api.names import DNS_1035_LABEL, MAX_NAME_LENGTH, name_pattern_message, name_rule_message
from specdeploy.api.resource import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import SpeculativeDeploymentStatus
from specdeploy.api.units import DURATION_PATTERN, format_duration

_DROPPED_KEYS = {"title", "$defs"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready",
     "description": "Ready pods ÷ wanted pods, speculative and control together"},
    {"name": "Method", "type": "string", "jsonPath": ".spec.speculation.method"},
    {"name": "Speculating", "type": "boolean", "jsonPath": ".status.speculation.active"},
    {"name": "Acceptance", "type": "number", "jsonPath": ".status.analysis.acceptanceRate"},
    {"name": "Speedup", "type": "number", "jsonPath": ".status.analysis.speedup.value",
     "description": "Baseline ÷ speculative mean per-token latency (above 1: speculation helps)"},
    {"name": "TPOT", "type": "string", "jsonPath": ".status.analysis.perTokenLatency", "priority": 1,
     "description": "Mean per-token latency, speculative vs baseline"},
    {"name": "Fits", "type": "string", "jsonPath": ".status.memoryPlan.verdict"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}
"""`kubectl scale sd`, an HPA and a KEDA ScaledObject write spec.replicas (the speculative pods) through this, and
read the speculative pods' count and selector from status (docs/operator.md "Scaling")."""


def _resolve(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, definitions)
    return {key: _resolve(value, definitions) for key, value in node.items()}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    options = node.get("anyOf")
    if options is not None and not node.get("x-kubernetes-int-or-string"):
        # Optional[X] is anyOf [X, null]: a missing field; nulls are pruned by the apiserver.
        present = [option for option in options if option.get("type") != "null"]
        if len(present) != 1:
            raise ValueError(f"cannot express {options!r} in a structural schema")
        del node["anyOf"]
        node = {**present[0], **node}
    if node.get("x-kubernetes-int-or-string"):
        node.pop("anyOf", None)
        node.pop("type", None)
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(node.get(key), int | float) and not isinstance(node.get(key), bool):
            node["minimum" if key == "exclusiveMinimum" else "maximum"] = node[key]
            node[key] = True
    if "default" in node and node["default"] is None:
        del node["default"]
    _map_values(node)
    if node.get("pattern") == DURATION_PATTERN and isinstance(node.get("default"), int | float):
        node["default"] = format_duration(node["default"])
    node = {key: value for key, value in node.items() if key not in _DROPPED_KEYS}
    if "properties" in node:
        node["properties"] = {name: _structural(schema) for name, schema in node["properties"].items()}
    if "items" in node:
        node["items"] = _structural(node["items"])
    return node


def _map_values(node: dict[str, Any]) -> None:
    """`additionalProperties` in the apiserver's terms (see the module docstring), in place."""
    if "additionalProperties" not in node:
        return
    values = node.pop("additionalProperties")
    if values is False:
        return
    if values is True or values == {}:
        node["x-kubernetes-preserve-unknown-fields"] = True
        return
    if "properties" in node:
        raise ValueError(f"a structural schema cannot have both properties and a typed map: {node!r}")
    node["additionalProperties"] = _structural(values)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _factory_defaults(model: type[BaseModel], node: dict[str, Any]) -> None:
    """Write the defaults of `default_factory` fields into the schema, fully populated.

    Pydantic leaves them out of its JSON Schema; the apiserver needs them to fill in an omitted
    sub-object (so CEL rules find its keys), and validates each default against the schema, so an
    empty `{}` would not do.
    """
    properties = node.get("properties", {})
    for name, field in model.model_fields.items():
        wire = field.alias or name
        child = properties.get(wire)
        if child is None:
            continue
        if field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
            child["default"] = default.to_wire() if isinstance(default, WireModel) else default
        nested = _nested_model(field.annotation)
        if nested is not None:
            _factory_defaults(nested, child)


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model, as the apiserver accepts it."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    definitions = schema.pop("$defs", {})
    result: dict[str, Any] = _structural(_resolve(schema, definitions))
    _factory_defaults(model, result)
    return result


def _mark_condition_list(status_schema: dict[str, Any]) -> None:
    conditions = status_schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]


def crd() -> dict[str, Any]:
    """The SpeculativeDeployment CustomResourceDefinition as a plain manifest."""
    spec_schema = structural(SpeculativeDeploymentSpec)
    status_schema = structural(SpeculativeDeploymentStatus)
    _mark_condition_list(status_schema)
    root = {
        "type": "object",
        "description": "A target model served with speculative decoding, planned to fit in GPU memory and "
        "rolled back when Prometheus shows speculation hurts.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [
            {"rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}", "message": name_rule_message()},
            {"rule": f"self.metadata.name.matches('{DNS_1035_LABEL}')", "message": name_pattern_message()},
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "specdeploy"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as YAML, exactly as committed in crds/specdeploy.io_speculativedeployments.yaml."""
    header = "# Generated by `specdeploy crd` from operator/specdeploy/api; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120, allow_unicode=True)
