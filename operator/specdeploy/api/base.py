"""The base of every resource model: camelCase on the wire, snake_case in Python, cross-field rules.

A cross-field rule is written once, as a `CelRule`: its CEL text goes into the CRD's
`x-kubernetes-validations` (so `kubectl apply` refuses a bad object), and its Python predicate runs
when the model is validated (so `specdeploy plan` refuses the same object with the same message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


def wire_name(field_name: str) -> str:
    """camelCase wire name of a snake_case field; `_gib` becomes `GiB` (budgetGiB, memoryGiB)."""
    camel = to_camel(field_name)
    return camel[:-3] + "GiB" if camel.endswith("Gib") else camel


class CelRule(NamedTuple):
    """One `x-kubernetes-validations` entry and the same check in Python."""

    rule: str
    message: str
    holds: Callable[[Any], bool]

    def as_crd(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


class WireModel(BaseModel):
    """A part of the resource: camelCase aliases, unknown fields refused, CEL rules checked."""

    model_config = ConfigDict(
        alias_generator=wire_name,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_enum_values=False,
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        if cls.cel_rules:
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [rule.as_crd() for rule in cls.cel_rules]
        return schema

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in self.cel_rules:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self

    def to_wire(self) -> dict[str, Any]:
        """The object as it is written in YAML or sent to the apiserver (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
