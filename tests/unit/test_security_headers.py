"""Credentials for Prometheus and Alertmanager: header values from Secrets are checked before use, sent,
and never shown — not in repr, not in error messages (httpx.MockTransport stands in for the servers)."""

from __future__ import annotations

import asyncio
import base64
import logging
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.clients.alertmanager import AlertmanagerError, AlertmanagerRejected, post_alerts
from specdeploy.clients.headers import Headers, InvalidHeaders, directory_headers, http_headers
from specdeploy.clients.prometheus import PrometheusClient, PrometheusRefused
from specdeploy.controller.analysis_loop import Source, source_of
from specdeploy.judgment.alerts import rollback_alert

PASSWORD = "hunter2-Zq9"
AUTHORIZATION = "Basic " + base64.b64encode(f"specdeploy:{PASSWORD}".encode()).decode()
SOURCE = "Secret team-a/monitoring-auth"
ALERT = rollback_alert("team-a", "llama", "AcceptanceBelowMinimum", "acceptance 0.3", "",
                       datetime(2026, 3, 1, tzinfo=UTC))


def _assert_hidden(text: str) -> None:
    for secret in (PASSWORD, AUTHORIZATION, AUTHORIZATION.split()[1]):
        assert secret not in text, text


def test_a_secrets_keys_become_headers_with_surrounding_whitespace_stripped() -> None:
    headers = http_headers({"Authorization": f"{AUTHORIZATION}\n".encode(), "X-Scope-OrgID": b"team-a"}, SOURCE)
    assert headers == {"Authorization": AUTHORIZATION, "X-Scope-OrgID": "team-a"}


def test_headers_show_their_names_only(caplog: pytest.LogCaptureFixture) -> None:
    headers = http_headers({"Authorization": AUTHORIZATION}, SOURCE)
    logging.getLogger("specdeploy.test").warning("headers %s %r", headers, headers)
    for text in (repr(headers), str(headers), f"{headers}", repr({"h": headers}), caplog.text):
        _assert_hidden(text)
        assert "Authorization" in text
    assert isinstance(headers, Headers) and dict(headers) == {"Authorization": AUTHORIZATION}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("Authorization", f"{AUTHORIZATION}\r\nX-Injected: 1", "printable ASCII on one line"),
    ("Authorization", f"{AUTHORIZATION}\x00", "printable ASCII on one line"),
    ("Authorization", f"Basic {PASSWORD}é", "printable ASCII on one line"),
    ("Authorization", b"Basic \xff" + PASSWORD.encode(), "not UTF-8 text"),
    ("Authorization", "", "printable ASCII on one line"),
    ("Author ization", AUTHORIZATION, "is not an HTTP header name"),
])
def test_a_value_that_cannot_be_a_header_is_refused_without_showing_it(key: str, value: str | bytes,
                                                                      message: str) -> None:
    with pytest.raises(InvalidHeaders, match=message) as caught:
        http_headers({key: value}, SOURCE)
    text = str(caught.value)
    assert text.startswith(SOURCE)
    _assert_hidden(text)


def test_the_alert_carries_the_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    headers = http_headers({"Authorization": AUTHORIZATION}, SOURCE)
    asyncio.run(post_alerts("http://am:9093", [ALERT], headers=headers, transport=httpx.MockTransport(handler)))
    [request] = seen
    assert request.headers["authorization"] == AUTHORIZATION


@pytest.mark.parametrize("answer", [
    httpx.Response(401, text="Unauthorized"),
    httpx.Response(403, text="Forbidden"),
    httpx.Response(500, text="internal error"),
    httpx.ConnectError("connection refused"),
    httpx.ReadTimeout("timed out"),
])
def test_an_alert_error_never_shows_the_headers(answer: httpx.Response | Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    headers = http_headers({"Authorization": AUTHORIZATION}, SOURCE)
    with pytest.raises(AlertmanagerError) as caught:
        asyncio.run(post_alerts("http://am:9093", [ALERT], headers=headers, transport=httpx.MockTransport(handler)))
    _assert_hidden(str(caught.value))
    _assert_hidden(repr(caught.value))


def test_refused_alert_headers_point_at_the_secret_reference() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, text="Unauthorized")

    with pytest.raises(AlertmanagerRejected, match=r"HTTP 401.*check the headers in `spec.alerting.headersSecretRef`"):
        asyncio.run(post_alerts("http://am:9093", [ALERT], transport=httpx.MockTransport(handler)))


def test_refused_prometheus_headers_name_the_secret_they_came_from() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == AUTHORIZATION
        return httpx.Response(401, text="Unauthorized")

    async def query() -> None:
        headers = http_headers({"Authorization": AUTHORIZATION}, SOURCE)
        async with PrometheusClient("http://prom:9090", headers=headers, headers_from=SOURCE,
                                    transport=httpx.MockTransport(handler)) as client:
            _assert_hidden(repr(client))
            await client.query("up")

    with pytest.raises(PrometheusRefused, match=f"HTTP 401.*check the headers in {SOURCE}") as caught:
        asyncio.run(query())
    _assert_hidden(str(caught.value))


def test_headers_that_could_not_be_had_stop_every_query_before_it_is_sent() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    async def query() -> None:
        async with PrometheusClient("http://prom:9090", transport=httpx.MockTransport(handler),
                                    unusable_headers=f"cannot read {SOURCE}: not labelled") as client:
            await client.query("up")

    with pytest.raises(PrometheusRefused, match=f"no query sent to Prometheus at http://prom:9090: cannot read {SOURCE}"):
        asyncio.run(query())
    assert sent == []   # without its tenant header a query could read another tenant's series


def test_a_mounted_secret_directory_is_one_header_per_file_without_the_kubelets_links(tmp_path: Path) -> None:
    # What the kubelet writes for a Secret volume: the keys as links into a hidden timestamped directory.
    data = tmp_path / "..2026_11_29_12_00_00.1"
    data.mkdir()
    (data / "Authorization").write_text(AUTHORIZATION + "\n")
    (data / "X-Scope-OrgID").write_text("team-a")
    (tmp_path / "..data").symlink_to(data.name)
    for key in ("Authorization", "X-Scope-OrgID"):
        (tmp_path / key).symlink_to(f"..data/{key}")
    headers = directory_headers(tmp_path)
    assert headers == {"Authorization": AUTHORIZATION, "X-Scope-OrgID": "team-a"}
    _assert_hidden(repr(headers))
    (data / "Authorization").write_text("Basic a\nb")
    with pytest.raises(InvalidHeaders, match="the headers directory .*Authorization") as caught:
        directory_headers(tmp_path)
    _assert_hidden(str(caught.value))
    with pytest.raises(InvalidHeaders, match="cannot be read: No such file or directory"):
        directory_headers(tmp_path / "missing")


def test_the_operators_headers_go_only_to_its_own_url_for_sds_that_name_no_secret() -> None:
    def resource(prometheus: dict[str, str]) -> SpeculativeDeployment:
        return SpeculativeDeployment.model_validate({
            "metadata": {"name": "llama", "namespace": "team-a"},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "speculation": {"method": "ngram"},
                     "analysis": {"prometheus": prometheus}}})

    own, operator_url = Path("/etc/specdeploy/prometheus-headers"), "http://prometheus.monitoring:9090"
    assert source_of(resource({}), operator_url, own) == Source(operator_url, "", None, own)
    assert source_of(resource({"url": "http://elsewhere:9090"}), operator_url, own) == \
        Source("http://elsewhere:9090", "", None, None)
    assert source_of(resource({"headersSecretRef": "auth"}), operator_url, own) == \
        Source(operator_url, "team-a", "auth", None)
    assert source_of(resource({}), None, own) is None
