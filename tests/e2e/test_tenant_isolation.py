"""Tenants apart: one namespace's SD names a Prometheus that accepts connections and never answers; another
namespace's SD, on the dev cluster's Prometheus, collapses acceptance. The second rolls back within the same bound
as alone (test_rollback_scenarios.py: 90 s from the collapse); the first is Inconclusive, PrometheusUnavailable,
with the time it took — and nothing it did reached the other."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2e_resources import SCENARIO_NAME, SCENARIO_SD, serve_scenario
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.simadmin import sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = SCENARIO_NAME
ROLLBACK_BOUND_S = 90   # test_rollback_scenarios.py's bound for the same collapse with the operator's one Prometheus


class SilentListener:
    """A loopback listener that accepts every connection and never answers; `close()` ends them all."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            self._held.append(connection)

    @property
    def accepted(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def silent_prometheus() -> Iterator[SilentListener]:
    listener = SilentListener()
    yield listener
    listener.close()


@pytest.fixture
def other_namespace(dev_cluster: DevCluster) -> Iterator[str]:
    name = f"tenant-silent-{uuid.uuid4().hex[:6]}"
    dev_cluster.kubectl("create", "namespace", name)
    yield name
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _source_cycles(metrics: str, url: str) -> float:
    """How many cycles the operator finished with the source at `url` (specdeploy_prometheus_source_seconds_count)."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "specdeploy_prometheus_source_seconds_count" and sample.labels.get("source") == url:
                return sample.value
    return 0.0


def _analysis(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("analysis") or {})


def _rolled_back(obj: dict[str, Any]) -> bool:
    speculation = obj.get("status", {}).get("speculation") or {}
    return speculation.get("active") is False and bool(speculation.get("lastRollback"))


def test_a_silent_prometheus_in_one_namespace_delays_no_rollback_in_another(
    dev_cluster: DevCluster, namespace: str, other_namespace: str, silent_prometheus: SilentListener,
    operator_processes: Callable[..., Any],
) -> None:
    port = free_port()
    operator = operator_processes(
        "operator", "--namespace", other_namespace, "--prometheus-url", dev_cluster.prometheus_url,
        "--alertmanager-url", dev_cluster.alertmanager_url, "--analysis-tick-seconds", "1", "--metrics-port", str(port))
    silent_sd = SCENARIO_SD.replace("    interval: 3s\n",
                                    f"    interval: 3s\n    prometheus: {{url: '{silent_prometheus.url}'}}\n")
    dev_cluster.kubectl("apply", "-n", other_namespace, "-f", "-", input=silent_sd)
    serving = serve_scenario(dev_cluster, namespace)
    traffic = Traffic(dev_cluster, serving, qps=4, duration=240).start()
    try:
        wait_for_object(dev_cluster, ["sd", NAME], lambda o: _analysis(o).get("verdict") == "Healthy", 90,
                        "a healthy sample at acceptance 0.8", namespace=namespace)
        silent = wait_for_object(
            dev_cluster, ["sd", NAME], lambda o: _analysis(o).get("verdictReason") == "PrometheusUnavailable", 60,
            "the silent Prometheus' SD Inconclusive", namespace=other_namespace)
        assert silent_prometheus.accepted > 0, "the operator did ask the silent Prometheus"
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})
        collapsed = time.monotonic()
        obj = wait_for_object(dev_cluster, ["sd", NAME], _rolled_back, ROLLBACK_BOUND_S, "the rollback",
                              namespace=namespace)
        took = time.monotonic() - collapsed
    finally:
        traffic.stop()
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    cycles = {url: _source_cycles(metrics, url) for url in (dev_cluster.prometheus_url, silent_prometheus.url)}
    print(f"TENANTS rollback {took:.1f} s after the collapse, beside a silent Prometheus (bound {ROLLBACK_BOUND_S} s); "
          f"cycles per source {cycles}")
    # The answering source was sampled at its SD's interval, not at the silent one's pace (10 s a cycle).
    assert cycles[dev_cluster.prometheus_url] >= 2 * cycles[silent_prometheus.url] > 0, cycles
    assert obj["status"]["speculation"]["lastRollback"]["reason"] == "AcceptanceBelowMinimum"
    analysis = _analysis(silent)
    assert analysis["verdict"] == "Inconclusive"
    assert f"Prometheus at {silent_prometheus.url} did not answer within" in analysis["message"]
    assert "(gave up after 1" in analysis["message"]    # the 10 s deadline of a query: "gave up after 10.0 s"
    silent = get_json(dev_cluster, "sd", NAME, namespace=other_namespace)
    assert silent["status"]["speculation"]["active"] is True, "Inconclusive is never a rollback"
    assert operator.process.poll() is None, operator.output()[-3000:]
    assert "Traceback" not in operator.output(), operator.output()[-3000:]


MARKER = "internal-endpoint-text-7f3a"


class FailingEndpoint:
    """A loopback HTTP server that answers every request 500 with MARKER in its body; `close()` stops it."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = f'{{"status": "error", "errorType": "internal", "error": "{MARKER}"}}'.encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def failing_prometheus() -> Iterator[FailingEndpoint]:
    endpoint = FailingEndpoint()
    yield endpoint
    endpoint.close()


def test_a_failing_endpoint_s_body_reaches_neither_status_nor_events(
    dev_cluster: DevCluster, namespace: str, failing_prometheus: FailingEndpoint,
    operator_processes: Callable[..., Any],
) -> None:
    operator = operator_processes("operator", "--analysis-tick-seconds", "1")
    manifest = SCENARIO_SD.replace("    interval: 3s\n",
                                   f"    interval: 3s\n    prometheus: {{url: '{failing_prometheus.url}'}}\n")
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    obj = wait_for_object(dev_cluster, ["sd", NAME], lambda o: _analysis(o).get("verdictReason") == "PrometheusUnavailable",
                          60, "Inconclusive: PrometheusUnavailable", namespace=namespace)
    assert f"Prometheus at {failing_prometheus.url} failed (HTTP 500, errorType internal)" in _analysis(obj)["message"]
    assert MARKER not in json.dumps(obj)
    assert MARKER not in json.dumps(get_json(dev_cluster, "events", namespace=namespace))
    assert MARKER not in operator.output()
