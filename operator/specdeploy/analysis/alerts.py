"""The Alertmanager alert a rollback raises, and the POST that sends it (Alertmanager API v2).

    alert = rollback_alert("prod", "llama", "AcceptanceBelowMinimum", evidence,
                           generator_url="…", starts_at=rolled_back_at)
    await post_alerts(spec.alerting.alertmanager_url, [alert], headers=secret_headers)

Alertmanager identifies an alert by its labels and deduplicates on them; annotations are always the most
recently received ones (prometheus.io/docs/alerting/latest/clients). So the same rollback posted twice —
an operator that crashed after posting and posts again on restart, or the repeat below — is one alert,
as long as its labels and `startsAt` (the rollback time from status) are the same. An alert without
`endsAt` resolves by itself after Alertmanager's `resolve_timeout` (default 5m) unless re-sent, so the
operator re-sends it every analysis interval while speculation stays rolled back, and sends it once with
`endsAt` when speculation comes back. `headers` (from `spec.alerting.headersSecretRef`, checked by
analysis.headers) go with the POST and never into a message.

    AlertmanagerError
    ├── AlertmanagerUnavailable   connection refused, timeout, HTTP 5xx or 429: retry next cycle
    └── AlertmanagerRejected      another 4xx: the payload or the URL is wrong
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from specdeploy.analysis.evidence import rfc3339

ALERT_NAME = "SpeculationRolledBack"
SEVERITY = "warning"
ALERTS_PATH = "/api/v2/alerts"


class AlertmanagerError(Exception):
    """The alert was not accepted; the message says by whom and why."""


class AlertmanagerUnavailable(AlertmanagerError):
    pass


class AlertmanagerRejected(AlertmanagerError):
    pass


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


async def post_alerts(url: str, alerts: Sequence[dict[str, Any]], headers: Mapping[str, str] | None = None,
                      timeout: float = 10.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
    """POST `alerts` to the Alertmanager at base URL `url` with `headers` (e.g. Authorization); raises
    AlertmanagerError unless it says 200."""
    if not alerts:
        return
    target = url.rstrip("/") + ALERTS_PATH
    try:
        async with httpx.AsyncClient(headers=dict(headers or {}), timeout=httpx.Timeout(timeout),
                                     transport=transport) as client:
            response = await client.post(target, json=list(alerts))
    except httpx.HTTPError as exc:
        raise AlertmanagerUnavailable(f"cannot reach Alertmanager at {target}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500 or response.status_code == 429:
        raise AlertmanagerUnavailable(f"Alertmanager at {target} failed (HTTP {response.status_code}): "
                                      f"{response.text[:300]}")
    if response.status_code >= 300:
        check = ("the headers in `spec.alerting.headersSecretRef`" if response.status_code in (401, 403)
                 else "`spec.alerting.alertmanagerUrl`")
        raise AlertmanagerRejected(f"Alertmanager at {target} rejected the alerts (HTTP {response.status_code}): "
                                   f"{response.text[:300]}; check {check}")
