"""Every setting of a running operator, each with its one default.

`specdeploy run` builds them from its flags (a flag not given keeps the environment's value or the default)
and hands them to the handlers through kopf's memo. Started as `kopf run -m specdeploy.controller.handlers`
(the in-process e2e fixture, kopf.testing.KopfRunner), the handlers read the same settings from the
environment: `SPECDEPLOY_<NAME>` for each field, and the Hub's own `HF_ENDPOINT`, `HF_TOKEN`,
`HF_HUB_OFFLINE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specdeploy.modelsource.local import is_true
from specdeploy.paths import cache_dir

ENV_PREFIX = "SPECDEPLOY_"
HUB_VARIABLES = {"hub_endpoint": "HF_ENDPOINT", "hub_token": "HF_TOKEN", "hub_offline": "HF_HUB_OFFLINE"}
"""huggingface_hub's own variables: what a platform engineer already sets for every other Hub client."""


class OperatorSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: tuple[str, ...] = Field((), description="Namespaces to watch; none: all")
    lease_namespace: str = Field("default", description="Namespace of the Lease that keeps one operator active")
    resync_seconds: float = Field(30.0, gt=0, description="Period of the full re-reconcile")
    analysis_tick_seconds: float = Field(5.0, gt=0, description="How often the analysis loop looks for due SDs")
    prometheus_url: str | None = Field(None, description="Prometheus for SDs that set none")
    alertmanager_url: str | None = Field(None, description="Alertmanager for SDs that set none")
    prometheus_headers_dir: Path | None = Field(None, description="One file per HTTP header for prometheus_url")
    alertmanager_headers_dir: Path | None = Field(None, description="The same for alertmanager_url")
    metrics_port: int = Field(8081, ge=0, le=65535, description="Port of the operator's /metrics; 0: off")
    hub_endpoint: str | None = Field(None, description="A Hugging Face Hub mirror (HF_ENDPOINT)")
    hub_token: SecretStr | None = Field(None, description="The operator's Hub token (HF_TOKEN); never shown")
    hub_offline: bool = Field(False, description="Never ask the Hub (HF_HUB_OFFLINE=1)")
    cache_dir: Path = Field(default_factory=cache_dir, description="Where fetched config.json files are kept")
    pod_monitors: bool = Field(
        True, description="A PodMonitor per SD where the prometheus-operator CRD exists; false: none (then the "
        "chart's engineMonitoring.podMonitor or your own scrape configuration must scrape the engines)")
    pod_monitor_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels for each SD's PodMonitor besides the operator's own, e.g. "
        "release=kube-prometheus-stack (SPECDEPLOY_POD_MONITOR_LABELS: comma-separated key=value pairs)")
    # --- endpoints the operator may send requests to (issue 30: no arbitrary fetching) ---
    allowed_endpoints: tuple[str, ...] | None = Field(
        None, description="Host globs (optionally host:port) of the Prometheus and Alertmanager URLs SDs may name, "
        "besides the operator's own; None: clients/endpoints.py DEFAULT_ALLOWED (SPECDEPLOY_ALLOWED_ENDPOINTS: "
        "comma-separated)")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], **given: Any) -> OperatorSettings:
        """Settings from `environ` (empty values count as unset), overridden by `given` values that are not
        None (the flags a user passed)."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = environ.get(HUB_VARIABLES.get(name, ENV_PREFIX + name.upper()))
            if raw:
                values[name] = _parsed(name, raw)
        if "lease_namespace" not in values and environ.get("POD_NAMESPACE"):
            values["lease_namespace"] = environ["POD_NAMESPACE"]   # the operator's own namespace, in a pod
        values.update({name: value for name, value in given.items() if value is not None})
        return cls.model_validate(values)


def _parsed(name: str, raw: str) -> Any:
    if name == "namespaces":
        return tuple(ns for ns in raw.split(",") if ns)
    if name in ("hub_offline", "pod_monitors"):
        return is_true(raw)
    if name == "pod_monitor_labels":
        return label_pairs(raw.split(","))
    if name == "allowed_endpoints":
        return tuple(pattern.strip() for pattern in raw.split(",") if pattern.strip())
    return raw


def label_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """`key=value` words as labels; raises ValueError naming a word without `=`."""
    labels: dict[str, str] = {}
    for pair in (p.strip() for p in pairs):
        if not pair:
            continue
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise ValueError(f"a label must be key=value, got {pair!r}")
        labels[key.strip()] = value.strip()
    return labels
