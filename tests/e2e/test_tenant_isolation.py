"""Tenants apart: one namespace's SD names a Prometheus that accepts connections and never answers; another
namespace's SD, on the dev cluster's Prometheus, collapses acceptance. The second rolls back within the same bound
as alone (test_rollback_scenarios.py: 90 s from the collapse); the first is Inconclusive, PrometheusUnavailable,
with the time it took — and nothing it did reached the other. A failing endpoint's body reaches neither status nor
Events; a URL outside the operator's allow-list is never asked; and a scrape target that writes series labelled as
another namespace's SD (with a collapse in them) changes nothing for that SD, and is counted and told on it."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_resources import SCENARIO_NAME, SCENARIO_SD, serve_scenario
from loopback_exposition import expositions_on_loopback
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.devcluster import DevCluster, monitoring, wait_for
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.simadmin import sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json, wait_for_object
from specdeploy.judgment.evidence import parse_rfc3339

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


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128   # a cycle's queries arrive at once: the default backlog of 5 resets some of them


class _LoopbackHttp:
    """An HTTP server on a loopback port, answering from its own thread until close()."""

    def _serve(self, server: http.server.ThreadingHTTPServer) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class FailingEndpoint(_LoopbackHttp):
    """A loopback HTTP server that answers every request 500 with MARKER in its body, counting them in `requests`;
    `close()` stops it."""

    def __init__(self) -> None:
        self.requests = 0
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 - http.server's naming
                endpoint.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = f'{{"status": "error", "errorType": "internal", "error": "{MARKER}"}}'.encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(_Server(("127.0.0.1", 0), Handler))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"


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


def test_a_prometheus_outside_the_allow_list_is_never_asked_and_the_sd_says_why(
    dev_cluster: DevCluster, namespace: str, failing_prometheus: FailingEndpoint,
    operator_processes: Callable[..., Any],
) -> None:
    """The failing endpoint stands for an in-cluster one the operator can reach and the user cannot: with an
    allow-list that does not name it, it is asked nothing at all."""
    operator = operator_processes("operator", "--analysis-tick-seconds", "1",
                                  env={"SPECDEPLOY_ALLOWED_ENDPOINTS": "*.svc,*.svc.cluster.local"})
    manifest = SCENARIO_SD.replace("    interval: 3s\n",
                                   f"    interval: 3s\n    prometheus: {{url: '{failing_prometheus.url}'}}\n")
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    obj = wait_for_object(dev_cluster, ["sd", NAME],
                          lambda o: _analysis(o).get("verdictReason") == "PrometheusUrlNotAllowed", 60,
                          "Inconclusive: PrometheusUrlNotAllowed", namespace=namespace)
    message = _analysis(obj)["message"]
    assert f"{failing_prometheus.url} (`spec.analysis.prometheus.url`) is not in the operator's allow-list" in message
    assert "allowedEndpoints" in message, "the fix: the chart value to set"
    assert failing_prometheus.requests == 0, "nothing was sent to it"
    assert obj["status"]["speculation"]["active"] is True, "Inconclusive is never a rollback"
    assert "Traceback" not in operator.output(), operator.output()[-3000:]


FORGER_POD = "forger-0"
FORGED_DRAFTS_PER_SCRAPE, FORGED_ACCEPTED_PER_SCRAPE = 5000, 50   # acceptance 0.01, and most of the SD's drafts


@contextlib.contextmanager
def _forging(cluster: DevCluster, namespace: str) -> Iterator[None]:
    """A loopback /metrics whose vLLM counters grow on every scrape with acceptance 0.01 (series that, labelled as
    another SD's speculative pod, would collapse its acceptance), registered with the dev Prometheus as a target
    whose labels say it is the test namespace's SD's speculative pod (what a scrape that relabels, or honours a
    target's own labels, can write); removed after."""
    scrapes = itertools.count(1)

    def forged() -> str:
        n = next(scrapes)
        return (f"vllm:spec_decode_num_draft_tokens_total {n * FORGED_DRAFTS_PER_SCRAPE}\n"
                f"vllm:spec_decode_num_accepted_tokens_total {n * FORGED_ACCEPTED_PER_SCRAPE}\n"
                f"vllm:spec_decode_num_drafts_total {n * FORGED_DRAFTS_PER_SCRAPE // 4}\n")

    name = f"forger-{uuid.uuid4().hex[:6]}"
    with expositions_on_loopback({"/metrics": forged}) as address:
        try:
            monitoring.write_target(cluster.monitoring_paths, name, address, {
                "namespace": namespace, "pod": FORGER_POD, "specdeploy_io_name": NAME,
                "specdeploy_io_variant": "speculative"})
            yield
        finally:
            monitoring.remove_target(cluster.monitoring_paths, name)


def _prometheus_value(cluster: DevCluster, promql: str) -> float | None:
    result = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": promql}, timeout=5).json()
    values = result["data"]["result"]
    return float(values[0]["value"][1]) if values else None


def _events(cluster: DevCluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in get_json(cluster, "events", namespace=namespace)["items"] if e.get("reason") == reason]


def test_forged_series_for_another_namespaces_sd_change_nothing_for_it_and_are_counted(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any],
) -> None:
    operator = analysing_operator(metrics=True)
    serving = serve_scenario(dev_cluster, namespace)
    traffic = Traffic(dev_cluster, serving, qps=4, duration=150).start()
    try:
        healthy = wait_for_object(dev_cluster, ["sd", NAME], lambda o: _analysis(o).get("verdict") == "Healthy", 90,
                                  "a healthy sample at acceptance 0.8", namespace=namespace)
        before = float(_analysis(healthy)["acceptanceRate"])
        with _forging(dev_cluster, namespace):
            selector = f'namespace="{namespace}",specdeploy_io_name="{NAME}",specdeploy_io_variant="speculative"'
            unpinned = (f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{selector}}}[20s]))"
                        f" / sum(rate(vllm:spec_decode_num_draft_tokens_total{{{selector}}}[20s]))")
            # The forged series are in the window: read as the queries did before, acceptance collapsed.
            collapsed = wait_for(lambda: (v := _prometheus_value(dev_cluster, unpinned)) is not None and v < 0.3 and v,
                                 60, "the forged series in the SD's window")
            since = time.time()
            event = wait_for(lambda: _events(dev_cluster, namespace, "ForeignSeriesIgnored"), 60,
                             "the ForeignSeriesIgnored Event")[0]
            # Two windows (20 s each) of samples with the forged series in them: a failure limit of 2 at 3 s
            # intervals would have rolled back within them.
            obj = wait_for_object(
                dev_cluster, ["sd", NAME],
                lambda o: _last_sample_at(o) > since + 40, 90, "two windows of samples beside the forged series",
                namespace=namespace)
    finally:
        traffic.stop()
    metrics = httpx.get(operator.metrics_url, timeout=10).text
    ignored = _metric(metrics, "specdeploy_foreign_series_ignored_total", namespace=namespace, name=NAME)
    print(f"TENANTS forged acceptance {collapsed:.2f} in Prometheus; the SD stayed {_analysis(obj).get('verdict')} at "
          f"{_analysis(obj).get('acceptanceRate')} ({_analysis(healthy)['acceptanceRate']} before); "
          f"{ignored:.0f} series ignored")
    assert obj["status"]["speculation"]["active"] is True, obj["status"]
    assert not obj["status"]["speculation"].get("lastRollback"), "the forged collapse rolled nothing back"
    assert _analysis(obj).get("verdict") == "Healthy", _analysis(obj)
    after = float(_analysis(obj)["acceptanceRate"])
    assert after > 0.5 and abs(after - before) < 0.15, f"its own pods' acceptance: {before} before, {after} beside"
    assert ignored >= 1
    message = event["message"]
    assert f"pod={FORGER_POD} job=dev-cluster (speculative)" in message and f"namespace={namespace}" in message
    assert str(FORGED_DRAFTS_PER_SCRAPE) not in message, "labels only, never values"
    assert len(_events(dev_cluster, namespace, "ForeignSeriesIgnored")) == 1, "told once"
    assert "Traceback" not in operator.output(), operator.output()[-3000:]


def _last_sample_at(obj: dict[str, Any]) -> float:
    """The time of the SD's last sample (status.analysis.lastSampleAt), 0 when none."""
    last = _analysis(obj).get("lastSampleAt")
    return parse_rfc3339(last).timestamp() if last else 0.0


def _metric(text: str, sample_name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


CHART = Path(__file__).resolve().parents[2] / "charts" / "specdeploy"


def test_the_charts_admission_policy_refuses_a_url_outside_the_allow_list_at_apply(
    dev_cluster: DevCluster, namespace: str, crds: None,
) -> None:
    """The chart's ValidatingAdmissionPolicy (templates/endpoint-policy.yaml), rendered with an allow-list and bound
    to the test's namespace only: a URL outside it is refused by the apiserver with the message; an allowed one, and
    the operator's own, are created."""
    rendered = subprocess.run(
        [str(dev_cluster.helm_path), "template", f"iso-{namespace}"[:40], str(CHART),
         "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
         "--set", "prometheusUrl=http://prometheus.example.net:9090",
         "--set", "allowedEndpoints={*.svc,thanos.example.org:443}",
         "--show-only", "templates/endpoint-policy.yaml"], capture_output=True, text=True, check=True).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    binding = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding")
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    manifest = yaml.safe_dump_all(documents)
    dev_cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        def sd(name: str, prometheus: str, alertmanager: str | None = None) -> str:
            body = yaml.safe_load(SCENARIO_SD)
            body["metadata"]["name"] = name
            body["spec"]["analysis"]["prometheus"] = {"url": prometheus}
            if alertmanager:
                body["spec"]["alerting"] = {"alertmanagerUrl": alertmanager}
            return str(yaml.safe_dump(body))

        def refused() -> str | None:
            """The policy takes effect a moment after it is created: an SD created before is deleted (an update
            that keeps its URL is not checked) and created again."""
            result = dev_cluster.kubectl("create", "-n", namespace, "-f", "-", check=False,
                                         input=sd("outside", "http://10.0.0.7:8080"))
            if result.returncode == 0:
                dev_cluster.kubectl("delete", "sd", "outside", "-n", namespace, "--wait=false")
            return result.stderr if result.returncode != 0 and "allow-list" in result.stderr else None

        error = wait_for(refused, 30, "the policy refusing a URL outside the allow-list")
        assert "`spec.analysis.prometheus.url` names a host outside the operator's allow-list" in error, error
        assert "allowedEndpoints" in error
        for name, prometheus, alertmanager in (
                ("in-cluster", "http://prometheus.monitoring.svc:9090", None),
                ("own", "http://prometheus.example.net:9090", None),
                ("listed", "https://thanos.example.org", "http://am.monitoring.svc:9093")):
            dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sd(name, prometheus, alertmanager))
        wrong_alertmanager = dev_cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", check=False,
            input=sd("alerts-outside", "http://prometheus.monitoring.svc:9090", "http://169.254.169.254"))
        assert wrong_alertmanager.returncode != 0
        assert "`spec.alerting.alertmanagerUrl` names a host outside" in wrong_alertmanager.stderr
        names = dev_cluster.kubectl("get", "sd", "-n", namespace, "-o", "jsonpath={.items[*].metadata.name}").stdout
        assert set(names.split()) == {"in-cluster", "own", "listed"}
    finally:
        dev_cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=manifest, check=False)
