"""The alert a rollback raises, as Alertmanager's API v2 `postableAlert`: labels identify the rollback,
annotations explain it. Pure; clients/alertmanager.py sends it.

Alertmanager identifies an alert by its labels, so the same rollback posted twice (after a restart, or
re-sent each analysis cycle to keep it firing) is one alert while its labels and `startsAt` (the rollback
time from status) stay the same; `endsAt` resolves it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from specdeploy.judgment.evidence import rfc3339

ALERT_NAME = "SpeculationRolledBack"
SEVERITY = "warning"


def rollback_alert(namespace: str, name: str, reason: str, evidence: str, generator_url: str,
                   starts_at: datetime, ends_at: datetime | None = None) -> dict[str, Any]:
    """One `postableAlert` for POST /api/v2/alerts: labels identify the rollback, annotations explain it."""
    alert: dict[str, Any] = {
        "labels": {
            "alertname": ALERT_NAME,
            "namespace": namespace,
            "name": name,
            "reason": reason,
            "severity": SEVERITY,
        },
        "annotations": {
            "summary": f"Speculative decoding of {namespace}/{name} was rolled back ({reason})",
            "description": evidence,
        },
        "startsAt": rfc3339(starts_at),
    }
    if generator_url:
        alert["generatorURL"] = generator_url    # the schema wants a URI; an empty one is left out
    if ends_at is not None:
        alert["endsAt"] = rfc3339(ends_at)
    return alert
