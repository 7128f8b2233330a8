"""The whole SpeculativeDeployment object (apiVersion, kind, metadata, spec, status) and its loading.

Loading turns YAML and validation errors into `InvalidResource` with the field path and a hint, so the
CLI prints a sentence, never a traceback. It reads values as the apiserver does (a boolean or a string
is not a number, 2.0 is the integer 2, a null field is absent), so a file `specdeploy plan` accepts is one
the CRD accepts.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specdeploy.api.names import name_problems
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import SpeculativeDeploymentStatus

GROUP = "specdeploy.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SpeculativeDeployment"
PLURAL = "speculativedeployments"
SINGULAR = "speculativedeployment"
SHORT_NAMES = ("sd",)


class InvalidResource(ValueError):
    """The resource cannot be read: bad YAML, a wrong kind, or a field that fails validation."""


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = "unnamed"
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class SpeculativeDeployment(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["specdeploy.io/v1alpha1"] = Field("specdeploy.io/v1alpha1", alias="apiVersion")
    kind: Literal["SpeculativeDeployment"] = "SpeculativeDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SpeculativeDeploymentSpec
    status: SpeculativeDeploymentStatus | None = None

    @model_validator(mode="after")
    def _check_name(self) -> Self:
        problems = name_problems(self.metadata.name)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _field_path(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith(("function-", "model-")) and part not in {"str", "int", "float"}:
            path += f".{part}" if path else str(part)
    return path


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem: `field.path`: what is wrong (and, for unknown fields, what to do)."""
    lines = []
    for problem in error.errors(include_url=False):
        path = _field_path(problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field; check its spelling against `specdeploy crd` or `kubectl explain sd.spec`"
        elif problem["type"] == "missing":
            message = "required field is missing"
        lines.append(f"`{path}`: {message}" if path else message)
    return "\n".join(lines)


def _as_decoded(value: Any) -> Any:
    """`value` as the apiserver stores it: a null field is dropped (its default applies), a float with no
    fraction is an integer."""
    if isinstance(value, dict):
        return {key: _as_decoded(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_as_decoded(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_resource(document: dict[str, Any]) -> SpeculativeDeployment:
    """A validated SpeculativeDeployment from a decoded YAML/JSON document."""
    if not isinstance(document, dict):
        raise InvalidResource(f"expected a YAML mapping with apiVersion, kind and spec, got {type(document).__name__}")
    if document.get("kind") != KIND:
        raise InvalidResource(f"expected kind {KIND}, got {document.get('kind')!r}")
    try:
        return SpeculativeDeployment.model_validate_json(json.dumps(_as_decoded(document), default=str), strict=True)
    except ValidationError as error:
        raise InvalidResource(describe_validation_error(error)) from error


def load_resource(text: str) -> SpeculativeDeployment:
    """The first SpeculativeDeployment in a YAML text (other documents are skipped)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InvalidResource(f"not valid YAML: {error}") from error
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            return parse_resource(document)
    raise InvalidResource(f"no document of kind {KIND} found")
