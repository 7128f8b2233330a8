"""Names of the children of a SpeculativeDeployment, and the longest SD name they allow.

Every child name is the SD name plus at most `LONGEST_SUFFIX`; Services must be DNS-1035 labels of at
most 63 characters, so the SD name is limited up front (CEL rules, and the same checks in Python) rather
than failing at a child: the apiserver itself lets an SD be named `a.b`, whose Service it then refuses.
"""

from __future__ import annotations

import re

DNS_LABEL_LENGTH = 63
SPECULATIVE_SUFFIX = ""
CONTROL_SUFFIX = "-control"
CONFIG_SUFFIX = "-engine"
LONGEST_SUFFIX = max(len(s) for s in (SPECULATIVE_SUFFIX, CONTROL_SUFFIX, CONFIG_SUFFIX))
MAX_NAME_LENGTH = DNS_LABEL_LENGTH - LONGEST_SUFFIX
DNS_1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


def name_rule_message() -> str:
    return (
        f"`metadata.name` must be at most {MAX_NAME_LENGTH} characters: the operator names the control "
        f"Deployment `<name>{CONTROL_SUFFIX}`, which must fit in {DNS_LABEL_LENGTH}"
    )


def name_pattern_message() -> str:
    return (
        "`metadata.name` must consist of lowercase letters, digits and '-', start with a letter and end with a "
        "letter or digit: the operator gives the Service the same name, and a Service name is a DNS-1035 label"
    )


def name_problems(name: str) -> list[str]:
    """The name rules `name` breaks (the CRD's CEL rules on `metadata.name`, in Python)."""
    problems = []
    if len(name) > MAX_NAME_LENGTH:
        problems.append(name_rule_message())
    if not re.fullmatch(DNS_1035_LABEL, name):
        problems.append(name_pattern_message())
    return problems


def engine_deployment_name(name: str) -> str:
    return name + SPECULATIVE_SUFFIX


def control_deployment_name(name: str) -> str:
    return name + CONTROL_SUFFIX


def service_name(name: str) -> str:
    return name


def config_map_name(name: str) -> str:
    return name + CONFIG_SUFFIX
