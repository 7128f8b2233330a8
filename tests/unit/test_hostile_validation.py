"""Hostile manifests against the Python side: `parse_resource` refuses with a field path or accepts, and what
it accepts the operator can plan, render and report without an exception, within Kubernetes' size limits.
Parity with the CRD: whatever Python accepts passes the CRD's OpenAPI schema, and whatever Python refuses
is refused by that schema or by one of the CRD's CEL rules (whose Python twins gave the message). The
same manifests against the real apiserver: tests/e2e/test_hostile_input.py."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

from hostile_strategies import hostile_documents, named_cases
from hypothesis import HealthCheck, given, settings

from specdeploy.api.crd import crd
from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, parse_resource
from specdeploy.api.status import SpeculativeDeploymentStatus
from specdeploy.controller.reconciler import plan_resource
from specdeploy.judgment.speculation import step_speculation
from specdeploy.reconcile.children import PodMonitoring, desired_children
from specdeploy.reconcile.status import next_status

ROOT_SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
CONFIG_MAP_LIMIT = 2**20
ANNOTATIONS_LIMIT = 256 * 2**10
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
HOSTILE = settings(max_examples=150, derandomize=True, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _cel_messages(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        found |= {rule["message"] for rule in node.get("x-kubernetes-validations", [])}
        for value in node.values():
            found |= _cel_messages(value)
    elif isinstance(node, list):
        for value in node:
            found |= _cel_messages(value)
    return found


CEL_MESSAGES = _cel_messages(ROOT_SCHEMA)


def _type_problem(value: Any, node: dict[str, Any]) -> str | None:
    if node.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
        return None if ok else "must be an integer or a string"
    expected = node.get("type")
    checks = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return None if expected is None or checks[expected](value) else f"must be of type {expected}"


def schema_problems(value: Any, node: dict[str, Any], path: str) -> list[str]:
    """What the apiserver's OpenAPI validation (not CEL) says about `value`, with unknown fields strict."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)   # the apiserver's JSON decoding
    problem = _type_problem(value, node)
    if problem:
        return [f"{path}: {problem}"]
    problems = []
    if "enum" in node and value not in node["enum"]:
        problems.append(f"{path}: unsupported value")
    if isinstance(value, int | float):
        low, high = node.get("minimum"), node.get("maximum")
        if low is not None and (value < low or (node.get("exclusiveMinimum") and value == low)):
            problems.append(f"{path}: below minimum")
        if high is not None and (value > high or (node.get("exclusiveMaximum") and value == high)):
            problems.append(f"{path}: above maximum")
    if isinstance(value, str):
        if len(value) > node.get("maxLength", len(value)) or len(value) < node.get("minLength", 0):
            problems.append(f"{path}: length")
        if "pattern" in node and not re.search(node["pattern"], value):
            problems.append(f"{path}: pattern")
    if isinstance(value, list):
        if len(value) > node.get("maxItems", len(value)):
            problems.append(f"{path}: too many items")
        for index, item in enumerate(value):
            problems += schema_problems(item, node["items"], f"{path}[{index}]")
    if isinstance(value, dict) and len(value) > node.get("maxProperties", len(value)):
        problems.append(f"{path}: too many properties")
    if isinstance(value, dict) and "properties" in node:
        present = {k: v for k, v in value.items() if v is not None}   # nulls are pruned
        problems += [f"{path}.{k}: required" for k in node.get("required", []) if k not in present]
        for key, item in present.items():
            if key in node["properties"]:
                problems += schema_problems(item, node["properties"][key], f"{path}.{key}")
            elif not node.get("x-kubernetes-preserve-unknown-fields"):   # kept as they are, unvalidated
                problems.append(f"{path}.{key}: unknown field")
    return problems


def _parse(document: dict[str, Any]) -> tuple[SpeculativeDeployment | None, str]:
    try:
        return parse_resource(document), ""
    except InvalidResource as error:
        return None, str(error)


def _check(document: dict[str, Any]) -> None:
    problems = schema_problems({k: v for k, v in document.items() if k != "metadata"}, ROOT_SCHEMA, "")
    resource, message = _parse(document)
    if resource is not None:
        assert not problems, f"Python accepts what the CRD refuses: {problems}"
        _reconcile_offline(resource)
        return
    for line in message.splitlines():
        assert "`" in line or line.startswith("must be"), f"no field named: {line}"
        if not problems:
            assert any(cel in line for cel in CEL_MESSAGES), f"Python refuses what no CRD rule refuses: {line}"


def _reconcile_offline(resource: SpeculativeDeployment) -> None:
    """The reconciler's pure steps for a new SD: plan, speculation step, children, status."""
    planned = plan_resource(resource)
    now = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
    previous = SpeculativeDeploymentStatus()
    step = step_speculation(resource, None, None, planned.accepted, None, [], now)
    status = next_status(previous, resource.spec, 1, planned, [], "2025-01-01T00:00:00Z", step.speculation,
                         step.analysis)
    assert len(json.dumps(status.to_wire())) < ANNOTATIONS_LIMIT
    spec_size = len(json.dumps(resource.spec.to_wire(), ensure_ascii=False).encode())
    assert 2 * spec_size < ANNOTATIONS_LIMIT, "kopf's annotation and kubectl's would not fit"
    if planned.plan is None or not planned.accepted:
        return
    children = desired_children(resource.model_copy(update={"status": status}), planned.plan, pod_monitoring=PodMonitoring(render=True))
    for manifest in children.all():
        name = manifest["metadata"]["name"]
        assert DNS_1035_LABEL.fullmatch(name), name
        size = len(json.dumps(manifest, ensure_ascii=False).encode())
        assert size < CONFIG_MAP_LIMIT, f"{manifest['kind']} {name} is {size} bytes"
        for container in manifest.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            env = [variable["name"] for variable in container.get("env", [])]
            assert len(env) == len(set(env)), f"{name}: env names twice (server-side apply refuses): {env}"


@HOSTILE
@given(hostile_documents())
def test_hostile_documents(document: dict[str, Any]) -> None:
    """Refused with the field named, by a rule the CRD has too; or accepted by the CRD as well, and the
    operator plans, renders and reports it."""
    _check(document)


def test_named_cases() -> None:
    verdicts = {}
    for label, document in named_cases():
        _check(document)
        verdicts[label] = _parse(document)[0] is not None
    assert verdicts == {
        "valid": True, "zero GPUs": False, "zero GPU memory": False, "a million replicas": False,
        "the most replicas": True, "negative interval": False, "negative window": False, "unicode name": False,
        "253-character name": False, "longest name": True, "name with dots": False,
        "name with a leading digit": False, "1 MiB model name": False, "1 MiB extra argument": False,
        "256 KiB of environment": False, "unknown engine": False, "unknown model": True, "unicode model": True,
        "no speculation": False, "unknown field": False, "4 MiB request": False,
        "extra speculative config": True, "managed extra config key": False, "unknown extra config key": True,
        "65 extra config keys": False,
    }
