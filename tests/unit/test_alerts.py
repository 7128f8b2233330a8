"""clients/alertmanager: the Alertmanager v2 payload of a rollback, and the POST (against httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import httpx
import pytest

from specdeploy.clients.alertmanager import (
    ALERTS_PATH,
    AlertmanagerRejected,
    AlertmanagerUnavailable,
    post_alerts,
)
from specdeploy.judgment.alerts import rollback_alert

ROLLED_BACK_AT = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
EVIDENCE = ("3 consecutive failing samples (failureLimit 3); the last: acceptance rate 0.31 < minAcceptanceRate 0.50 "
            "(Fixed: minAcceptanceRate 0.50)")
LATENCY_EVIDENCE = ("3 consecutive failing samples (failureLimit 3); the last: per-token latency +18% (95% interval "
                    "+9%…+27%) vs the control, above maxPerTokenLatencyRatio 1.10; mean 5.9 ms vs 5 ms, "
                    "P99 < 10 ms vs ≈ 9.8 ms; 412 vs 198 requests in 10 slices over 5m (412 requests; control 198)")


def test_rollback_alert_is_a_postable_alert() -> None:
    alert = rollback_alert("prod", "llama", "AcceptanceBelowMinimum", EVIDENCE,
                           "http://specdeploy.example/prod/llama", ROLLED_BACK_AT)
    assert alert == {
        "labels": {"alertname": "SpeculationRolledBack", "namespace": "prod", "name": "llama",
                   "reason": "AcceptanceBelowMinimum", "severity": "warning"},
        "annotations": {"summary": "Speculative decoding of prod/llama was rolled back (AcceptanceBelowMinimum)",
                        "description": EVIDENCE},
        "startsAt": "2026-03-01T12:00:05Z",
        "generatorURL": "http://specdeploy.example/prod/llama",
    }


def test_the_same_rollback_is_the_same_alert() -> None:
    """Alertmanager deduplicates on labels: a repeat after a restart must not differ in them or in startsAt."""
    first = rollback_alert("prod", "llama", "AcceptanceBelowMinimum", EVIDENCE, "", ROLLED_BACK_AT)
    again = rollback_alert("prod", "llama", "AcceptanceBelowMinimum", EVIDENCE + " (re-sent)", "", ROLLED_BACK_AT)
    assert first["labels"] == again["labels"]
    assert first["startsAt"] == again["startsAt"]
    assert "generatorURL" not in first     # an empty URI would fail Alertmanager's schema


def test_resolving_alert_has_an_end() -> None:
    alert = rollback_alert("prod", "llama", "AcceptanceBelowMinimum", EVIDENCE, "", ROLLED_BACK_AT,
                           ends_at=datetime(2026, 3, 1, 13, 0, tzinfo=UTC))
    assert alert["endsAt"] == "2026-03-01T13:00:00Z"


def test_post_alerts_sends_a_json_array_to_api_v2() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    alert = rollback_alert("prod", "llama", "SpeculativePodOutOfMemory", "pod x ran out of memory", "", ROLLED_BACK_AT)
    asyncio.run(post_alerts("http://alertmanager:9093/", [alert], transport=httpx.MockTransport(handler)))
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", "http://alertmanager:9093" + ALERTS_PATH)
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == [alert]


def test_a_latency_rollback_reaches_alertmanager_as_utf8_json_unchanged() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    alert = rollback_alert("prod", "llama", "InterTokenLatencyRegressed", LATENCY_EVIDENCE, "", ROLLED_BACK_AT)
    assert alert["annotations"]["description"] == LATENCY_EVIDENCE
    assert alert["labels"]["reason"] == "InterTokenLatencyRegressed"
    asyncio.run(post_alerts("http://alertmanager:9093", [alert], transport=httpx.MockTransport(handler)))
    [request] = seen
    assert json.loads(request.content.decode("utf-8"))[0]["annotations"]["description"] == LATENCY_EVIDENCE


def test_post_alerts_sends_nothing_for_no_alerts() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    asyncio.run(post_alerts("http://alertmanager:9093", [], transport=httpx.MockTransport(handler)))


@pytest.mark.parametrize(("answer", "error", "text"), [
    (httpx.Response(503, text="shutting down"), AlertmanagerUnavailable, "HTTP 503"),
    (httpx.Response(400, text="labels: alertname required"), AlertmanagerRejected, r"\(HTTP 400\); check"),
    (httpx.ConnectError("connection refused"), AlertmanagerUnavailable, "connection refused"),
])
def test_post_alerts_errors(answer: httpx.Response | Exception, error: type, text: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    alert = rollback_alert("prod", "llama", "AcceptanceBelowMinimum", EVIDENCE, "", ROLLED_BACK_AT)
    with pytest.raises(error, match=text) as caught:
        asyncio.run(post_alerts("http://alertmanager:9093", [alert], transport=httpx.MockTransport(handler)))
    assert "shutting down" not in str(caught.value) and "alertname required" not in str(caught.value)
