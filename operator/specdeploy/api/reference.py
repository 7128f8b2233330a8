"""The configuration reference (docs/configuration.md), generated from the CRD schema, which is
generated from the models: one source for `kubectl explain`, the CRD and the docs."""

from __future__ import annotations

from typing import Any

from specdeploy.api.crd import crd


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "number or quantity"
    kind = str(node.get("type", ""))
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if node.get("pattern", "").startswith("^([0-9]+"):
        return "duration"
    return kind


def _default(node: dict[str, Any]) -> str:
    if "default" not in node or isinstance(node["default"], dict) or node["default"] in ([], ""):
        return ""
    value = node["default"]
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _rows(node: dict[str, Any], path: str, required: bool) -> list[str]:
    description = " ".join(str(node.get("description", "")).split()).replace("|", "\\|")
    rows = [f"| `{path}` | {_type(node)} | {_default(node)} | {'yes' if required else ''} | {description} |"]
    needed = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        rows += _rows(child, f"{path}.{name}", name in needed)
    items = node.get("items", {})
    for name, child in items.get("properties", {}).items():
        rows += _rows(child, f"{path}[].{name}", name in set(items.get("required", [])))
    return rows


def reference_markdown() -> str:
    """docs/configuration.md: every spec field with its type, default and description."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    lines = [
        "# Configuration reference",
        "",
        "Generated from the models by `specdeploy reference` (a test fails when this file drifts). The same",
        "descriptions are in the CRD: `kubectl explain sd.spec.<field>`.",
        "",
        "| field | type | default | required | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    needed = set(schema.get("required", []))
    for name, child in schema["properties"].items():
        lines += _rows(child, f"spec.{name}", name in needed)
    return "\n".join(lines) + "\n"
