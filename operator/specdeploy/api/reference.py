"""The configuration reference (docs/configuration.md), generated from the CRD schema, which is
generated from the models: one source for `kubectl explain`, the CRD and the docs."""

from __future__ import annotations

from typing import Any

from specdeploy.api.crd import crd
from specdeploy.api.kube import UPSTREAM_DESCRIPTION


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


def _upstream(node: dict[str, Any]) -> bool:
    """A Kubernetes type (api/kube.py): `kubectl explain pod.spec` documents its fields, not this page."""
    return str(node.get("description", "")).startswith(UPSTREAM_DESCRIPTION)


def _rows(node: dict[str, Any], path: str, required: bool) -> list[str]:
    items = node.get("items", {})
    text = str(node.get("description", "")) + (f" (each a {items['description']})" if _upstream(items) else "")
    description = " ".join(text.split()).replace("|", "\\|")
    rows = [f"| `{path}` | {_type(node)} | {_default(node)} | {'yes' if required else ''} | {description} |"]
    if _upstream(node) or _upstream(items):
        return rows
    needed = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        rows += _rows(child, f"{path}.{name}", name in needed)
    for name, child in items.get("properties", {}).items():
        rows += _rows(child, f"{path}[].{name}", name in set(items.get("required", [])))
    return rows


MODEL_SOURCES = """
## Where a model's numbers come from

The target, the draft and an EAGLE head are each resolved in this order (an MTP head is the target's own
layers, read from the target's `num_nextn_predict_layers`):

1. `architecture` in the spec: the user's numbers win over every file.
2. A config.json the operator is given: the ConfigMap `configMapRef` (key `config.json`), else the file
   `configPath` in the engine's model volume. Named explicitly, so one that cannot be read is an error.
3. The Hugging Face Hub: `revision` (default `main`) is resolved to a commit sha and config.json is read
   at that sha; the rendered args pin the sha (TensorRT-LLM has no revision for a draft), so a branch that
   moves cannot change the pods. `HF_ENDPOINT` points at a mirror. A gated model needs a token, from the
   Secret `tokenSecretRef` (key `token`) or the operator's `HF_TOKEN`; it goes to the Hub client only,
   never to a message, a log line or status.
4. The built-in catalog, the offline fallback (`HF_HUB_OFFLINE=1`, or `specdeploy plan --offline`). It
   also stands in for a catalog model when the Hub is unreachable or refuses access (never for a model or
   revision the Hub says does not exist); the record then says `Catalog` and keeps the Hub's error.

**The cache.** Fetched config.json files are kept in `hub-configs/` under `$SPECDEPLOY_CACHE_DIR` (else
`$XDG_CACHE_HOME/specdeploy`, else `~/.cache/specdeploy`), one file per model and commit sha. A commit never
changes, so an entry never goes stale. At most 256 entries (least recently used evicted), none over 1 MiB.
The operator reuses a resolution for 5 minutes (1 minute when the catalog stood in for the Hub); then a
branch's commit is looked up again.

**The record.** `status.deployRecord` holds what runs: the target, the draft and the engine's kind and
image; each model with its source, the revision the spec asks for and the commit the args pin. While the
spec asks for the same revision, the operator stays at the recorded commit; a new `revision` rolls the pods.

**Pairing.** An EAGLE head is checked from its own config.json, never from its name. A head that names
its verifier (`speculators_config.verifier.name_or_path`) must name `spec.model.name`, else the Error
`EagleHeadTargetMismatch` names both models and the plan is rejected. For a head that names nothing, the
catalog's targets for it stand in; with none, the finding is the Warning `EagleHeadTargetUnknown`. Its
hidden size and vocabulary must fit the target's, and a draft of another vocabulary is refused from its
own config (`DraftVocabularyMismatch`).

The detail, each failure's condition and what each engine pins: [compatibility.md](compatibility.md).
"""


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
    return "\n".join(lines) + "\n" + MODEL_SOURCES
