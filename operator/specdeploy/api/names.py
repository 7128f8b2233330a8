"""Names of the children of a SpeculativeDeployment, and the longest SD name they allow.

Every child name is the SD name plus at most `LONGEST_SUFFIX`; Services must be DNS-1035 labels of at
most 63 characters, so the SD name is limited up front (a CEL rule) rather than failing at a child.
"""

from __future__ import annotations

DNS_LABEL_LENGTH = 63
SPECULATIVE_SUFFIX = ""
CONTROL_SUFFIX = "-control"
CONFIG_SUFFIX = "-engine"
LONGEST_SUFFIX = max(len(s) for s in (SPECULATIVE_SUFFIX, CONTROL_SUFFIX, CONFIG_SUFFIX))
MAX_NAME_LENGTH = DNS_LABEL_LENGTH - LONGEST_SUFFIX


def name_rule_message() -> str:
    return (
        f"`metadata.name` must be at most {MAX_NAME_LENGTH} characters: the operator names the control "
        f"Deployment `<name>{CONTROL_SUFFIX}`, which must fit in {DNS_LABEL_LENGTH}"
    )


def engine_deployment_name(name: str) -> str:
    return name + SPECULATIVE_SUFFIX


def control_deployment_name(name: str) -> str:
    return name + CONTROL_SUFFIX


def service_name(name: str) -> str:
    return name


def config_map_name(name: str) -> str:
    return name + CONFIG_SUFFIX
