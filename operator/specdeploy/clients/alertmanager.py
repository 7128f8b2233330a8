"""The POST that sends a rollback's alert to Alertmanager (API v2); the alert itself is judgment/alerts.py.

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
clients/headers.py) go with the POST and never into a message.

    AlertmanagerError
    ├── AlertmanagerUnavailable   connection refused, timeout, HTTP 5xx or 429: retry next cycle
    └── AlertmanagerRejected      another 4xx: the payload or the URL is wrong
        └── AlertmanagerNotAllowed    not sent: the URL is outside the operator's allow-list (clients/endpoints.py)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from specdeploy.clients.endpoints import AllowedEndpoints

ALERTS_PATH = "/api/v2/alerts"


class AlertmanagerError(Exception):
    """The alert was not accepted; the message says by whom and why."""


class AlertmanagerUnavailable(AlertmanagerError):
    pass


class AlertmanagerRejected(AlertmanagerError):
    pass


class AlertmanagerNotAllowed(AlertmanagerRejected):
    pass


async def post_alerts(url: str, alerts: Sequence[dict[str, Any]], headers: Mapping[str, str] | None = None,
                      timeout: float = 10.0, transport: httpx.AsyncBaseTransport | None = None,
                      allowed: AllowedEndpoints | None = None) -> None:
    """POST `alerts` to the Alertmanager at base URL `url` with `headers` (e.g. Authorization); raises
    AlertmanagerError unless it says 200. `allowed`: the operator's allow-list; a URL outside it is sent nothing
    (AlertmanagerNotAllowed, saying what to set)."""
    if not alerts:
        return
    refusal = allowed.refusal(url, "spec.alerting.alertmanagerUrl") if allowed is not None else None
    if refusal is not None:
        raise AlertmanagerNotAllowed(f"the alert was not sent: {refusal}")
    target = url.rstrip("/") + ALERTS_PATH
    try:
        async with httpx.AsyncClient(headers=dict(headers or {}), timeout=httpx.Timeout(timeout),
                                     transport=transport) as client:
            response = await client.post(target, json=list(alerts))
    except httpx.HTTPError as exc:
        raise AlertmanagerUnavailable(f"cannot reach Alertmanager at {target}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500 or response.status_code == 429:
        # The body is never repeated (docs/security.md "Fetching what a user names"): the status code says it.
        raise AlertmanagerUnavailable(f"Alertmanager at {target} failed (HTTP {response.status_code})")
    if response.status_code >= 300:
        check = ("the headers in `spec.alerting.headersSecretRef`" if response.status_code in (401, 403)
                 else "`spec.alerting.alertmanagerUrl`")
        raise AlertmanagerRejected(f"Alertmanager at {target} rejected the alerts (HTTP {response.status_code}); "
                                   f"check {check}")
