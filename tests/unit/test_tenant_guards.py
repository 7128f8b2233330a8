"""Issue 30's guards of the analysis: the allow-list of URLs the operator asks, and series pinned to an SD's own pods
(clients/endpoints.py, controller/own_pods.py, judgment/queries.py, controller/analysis_loop.py)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml
from lightkube import ALL_NS

from specdeploy.api.spec import EngineKind
from specdeploy.clients import kube
from specdeploy.clients.alertmanager import AlertmanagerNotAllowed, post_alerts
from specdeploy.clients.endpoints import AllowedEndpoints
from specdeploy.clients.prometheus import PrometheusClient
from specdeploy.controller import analysis_loop
from specdeploy.controller.analysis_loop import Guards
from specdeploy.controller.metrics import OperatorMetrics
from specdeploy.controller.own_pods import OwnPods
from specdeploy.controller.settings import OperatorSettings
from specdeploy.controller.watched import SD, Watched
from specdeploy.judgment.queries import (
    SELECTOR,
    TemplateError,
    pinned_selector,
    promql,
    queries_for,
    series_pods_query,
)
from specdeploy.judgment.samples import DeploymentSample, QueryErrorKind, Signal
from specdeploy.judgment.verdict import _ERROR_REASONS

OWN = "http://prometheus.example.net:9090"


def test_the_default_allows_in_cluster_services_loopback_and_the_operators_own_urls() -> None:
    allowed = AllowedEndpoints.of(None, OWN)
    for url in ("http://prometheus.monitoring.svc:9090", "https://am.monitoring.svc.cluster.local:9093/am",
                "http://127.0.0.1:41000", "http://localhost:9090", "http://[::1]:9090", OWN, OWN + "/"):
        assert allowed.allows(url), url
    for url in ("http://10.0.0.7:8080", "http://169.254.169.254/latest", "http://metadata.google.internal",
                "http://evil.svc.example.com", "http://prometheus.example.net:9091", "file:///etc/passwd",
                "http://x.svc@10.0.0.7/", "not a url"):
        assert not allowed.allows(url), url


def test_given_patterns_replace_the_default_and_may_name_a_port() -> None:
    allowed = AllowedEndpoints.of(["prometheus.monitoring.svc:9090", " *.example.org "], OWN)
    assert allowed.allows("http://prometheus.monitoring.svc:9090")
    assert not allowed.allows("http://prometheus.monitoring.svc:9091")
    assert allowed.allows("https://thanos.example.org")
    assert not allowed.allows("http://127.0.0.1:9090")     # loopback only by the default
    assert allowed.allows(OWN)


def test_a_refusal_says_what_to_set_and_never_repeats_credentials() -> None:
    message = AllowedEndpoints.of(None).refusal("http://user:s3cret@10.0.0.7:8080/p?token=t2", "spec.analysis.prometheus.url")
    assert message is not None
    assert "http://10.0.0.7:8080/p (`spec.analysis.prometheus.url`) is not in the operator's allow-list" in message
    assert "allowedEndpoints" in message and "SPECDEPLOY_ALLOWED_ENDPOINTS" in message
    assert "s3cret" not in message and "t2" not in message
    assert AllowedEndpoints.of(None).refusal("http://p.monitoring.svc", "x") is None


def test_the_allow_list_comes_from_the_environment() -> None:
    settings = OperatorSettings.from_environment({"SPECDEPLOY_ALLOWED_ENDPOINTS": "*.svc, prom.corp:9090,"})
    assert settings.allowed_endpoints == ("*.svc", "prom.corp:9090")
    assert OperatorSettings.from_environment({}).allowed_endpoints is None


def test_a_not_allowed_url_is_its_own_inconclusive_reason() -> None:
    assert _ERROR_REASONS[QueryErrorKind.NOT_ALLOWED].value == "PrometheusUrlNotAllowed"


def test_a_pinned_selector_names_the_sds_own_pods_and_nothing_else_can_be_spliced_in() -> None:
    assert pinned_selector("prod", "llama", ["llama-b", "llama.a"]) == \
        '{namespace="prod",specdeploy_io_name="llama",pod=~"llama-b|llama\\\\.a"}'
    assert pinned_selector("prod", "llama", []).endswith('pod=~"$^"}')
    for bad in ('a"}', "a|b", "A", ""):
        with pytest.raises(TemplateError):
            pinned_selector("prod", "llama", [bad])
    pinned = pinned_selector("prod", "llama", ["llama-a"])
    for query in queries_for(EngineKind.VLLM, 300.0, pinned):
        assert SELECTOR not in query.promql and pinned in query.promql and query.selector == pinned
    assert promql(Signal.ACCEPTANCE_RATE, EngineKind.VLLM, 300.0) == queries_for(EngineKind.VLLM, 300.0)[0].promql


def test_the_series_pods_query_reads_every_metric_the_analysis_reads() -> None:
    text = series_pods_query(EngineKind.VLLM, 300.0)
    assert text.startswith("group by (namespace, specdeploy_io_name, specdeploy_io_variant, pod, job)")
    assert text.endswith("[330s:30s]")
    for name in ("vllm:spec_decode_num_accepted_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:num_requests_running", "vllm:spec_decode_num_accepted_tokens_per_pos_total"):
        assert name in text


def _pod(name: str, variant: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"specdeploy.io/variant": variant}}}


def test_own_pods_are_remembered_after_they_are_gone_for_the_window_and_then_forgotten() -> None:
    own = OwnPods()
    own.record("prod", "llama", [_pod("llama-s1", "speculative"), _pod("llama-c1", "control")], now=1000.0)
    reported = {"speculative": {("llama-s1", "j")}, "control": {("llama-c1", "j"), ("llama-s1", "j")}}
    assert own.foreign("prod", "llama", reported) == {("control", "llama-s1", "j")}   # the wrong variant's pod
    assert own.foreign("team-b", "llama", {"speculative": {("llama-s1", "j")}}) == {("speculative", "llama-s1", "j")}
    own.record("prod", "llama", [_pod("llama-s2", "speculative")], now=2000.0)     # s1 deleted since: still known
    assert own.pods("prod", "llama") == {"llama-s1", "llama-c1", "llama-s2"}
    own.record("prod", "llama", [_pod("llama-s2", "speculative")], now=5000.0)
    assert own.pods("prod", "llama") == {"llama-s2"}
    own.record("prod", "llama", [], now=5000.0 + 7000.0, window_seconds=4000.0)    # kept twice a long window
    assert own.pods("prod", "llama") == {"llama-s2"}
    own.prune(5000.0 + 9000.0)                                                     # a deleted SD's pods go too
    assert own.pods("prod", "llama") == set()


def test_a_restarted_operator_knows_a_pod_deleted_before_it_started_by_its_replica_set() -> None:
    """A rollback rolled the speculative pod llama-spec-7d9f-x2k4q away; the operator restarted inside the window:
    the pod is not listed, but its ReplicaSet (the Deployment's old revision) is, so its series are the SD's."""
    own = OwnPods()
    replica_sets = [_pod("llama-spec-7d9f", "speculative"), _pod("llama-spec-5c4b", "speculative")]
    own.record("prod", "llama", [_pod("llama-spec-5c4b-m2x7z", "speculative")], now=1000.0, replica_sets=replica_sets)
    reported = {"speculative": {("llama-spec-7d9f-x2k4q", "j"), ("llama-spec-5c4b-m2x7z", "j")}}
    assert own.foreign("prod", "llama", reported) == set()
    forged = {"speculative": {("llama-spec-7d9f-x2k4q-extra", "j"), ("llama-spec-7d9f", "j"),
                              ("llama-spec-0000-x2k4q", "j")},
              "control": {("llama-spec-7d9f-x2k4q", "j")}}      # another variant's ReplicaSet is not this one's
    assert own.foreign("prod", "llama", forged) == {(variant, pod, "j") for variant, pods in forged.items()
                                                   for pod, _ in pods}
    assert own.foreign("team-b", "llama", reported) == {("speculative", pod, "j") for pod, _ in reported["speculative"]}
    own.prune(1000.0 + 3601.0)                                  # the ReplicaSets are forgotten like pods
    assert own.foreign("prod", "llama", reported) == {("speculative", pod, "j") for pod, _ in reported["speculative"]}


# --- the analysis loop against a Prometheus that holds forged series ---------------------------------------------

FORGED_ACCEPTANCE, OWN_ACCEPTANCE = 0.05, 0.8


def _sd(namespace: str, name: str, url: str | None = None) -> dict[str, Any]:
    analysis: dict[str, Any] = {"interval": "30s"}
    if url:
        analysis["prometheus"] = {"url": url}
    return {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "speculation": {"method": "ngram"},
                     "analysis": analysis}, "status": {}}


def _vector(result: list[dict[str, Any]], kind: str = "vector") -> httpx.Response:
    return httpx.Response(200, json={"status": "success", "data": {"resultType": kind, "result": result}})


def _prometheus(asked: list[str]) -> httpx.MockTransport:
    """The victim `prod/llama` has pods llama-s1 (speculative) and llama-c1 (control); a pod of another namespace's
    job writes series labelled as llama's, with a collapse in them. Unpinned queries see the forged value."""
    labels = {"namespace": "prod", "specdeploy_io_name": "llama", "specdeploy_io_variant": "speculative"}

    def handle(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        asked.append(query)
        if query.startswith("group by"):
            pods = [("llama-s1", "prod/llama", "speculative"), ("llama-c1", "prod/llama", "control"),
                    ("forger-0", "team-b/forger", "speculative")]
            return _vector([{"metric": {**labels, "specdeploy_io_variant": variant, "pod": pod, "job": job},
                             "values": [[1.0, "1"]]} for pod, job, variant in pods], "matrix")
        if "spec_decode_num_accepted_tokens_total" in query and "/" in query and "1 +" not in query:
            pinned = 'pod=~"llama-c1|llama-s1"' in query
            value = OWN_ACCEPTANCE if pinned else FORGED_ACCEPTANCE
            return _vector([{"metric": labels, "value": [1.0, str(value)]}])
        return _vector([])

    return httpx.MockTransport(handle)


class _Recording:
    def __init__(self, watched: Watched) -> None:
        self.watched, self.client, self.metrics = watched, None, OperatorMetrics()
        self.samples: dict[str, DeploymentSample] = {}

    async def reconcile(self, namespace: str, name: str, trigger: object, sample: DeploymentSample) -> None:
        self.samples[f"{namespace}/{name}"] = sample


def _run(monkeypatch: pytest.MonkeyPatch, watched: Watched, transport: httpx.MockTransport, guards: Guards,
         cycles: int = 1) -> tuple[_Recording, list[Any], list[str]]:
    events: list[Any] = []
    listed: list[str] = []

    async def engine_pods(client: Any, namespace: str, name: str) -> list[dict[str, Any]]:
        listed.append(f"{namespace}/{name}")
        return [_pod("llama-s1", "speculative"), _pod("llama-c1", "control")]

    async def post_event(client: Any, body: Any, event: Any, name: str | None = None) -> bool:
        events.append((body["metadata"], event))
        return True

    async def engine_replica_sets(client: Any, namespace: str, name: str) -> list[dict[str, Any]]:
        return []

    monkeypatch.setattr(kube, "engine_pods", engine_pods)
    monkeypatch.setattr(kube, "engine_replica_sets", engine_replica_sets)
    monkeypatch.setattr(kube, "post_event", post_event)
    monkeypatch.setattr(analysis_loop, "PrometheusClient", functools.partial(PrometheusClient, transport=transport))
    reconciler = _Recording(watched)

    async def go() -> None:
        for _ in range(cycles):
            await analysis_loop.analyse_once(reconciler, [ALL_NS], OWN, guards=guards)  # type: ignore[arg-type]

    asyncio.run(go())
    return reconciler, events, listed


def test_forged_series_for_another_namespaces_sd_change_nothing_for_it_and_are_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched()
    watched.seen(SD, _sd("prod", "llama"))
    asked: list[str] = []
    guards = Guards(AllowedEndpoints.of(None, OWN))
    reconciler, events, listed = _run(monkeypatch, watched, _prometheus(asked), guards, cycles=2)
    sample = reconciler.samples["prod/llama"]
    assert sample.speculative.acceptance_rate == OWN_ACCEPTANCE, "sampled from its own pods only"
    assert listed == ["prod/llama"] * 2, "its pods listed only while a series names a pod not seen as its own"
    assert len(events) == 1, "told once, not every cycle"
    metadata, event = events[0]
    assert (metadata["namespace"], metadata["name"], event.reason) == ("prod", "llama", "ForeignSeriesIgnored")
    assert "series from pods that are not this SD's were ignored: 1 pod(s)" in event.message
    assert "pod=forger-0 job=team-b/forger (speculative)" in event.message
    assert str(FORGED_ACCEPTANCE) not in event.message
    assert reconciler.metrics.value("specdeploy_foreign_series_ignored_total", namespace="prod", name="llama") == 2


def test_an_sd_whose_series_are_all_its_own_is_sampled_once_without_a_list_or_an_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched()
    watched.seen(SD, _sd("prod", "llama"))
    asked: list[str] = []

    def honest(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        asked.append(query)
        if query.startswith("group by"):
            return _vector([{"metric": {"namespace": "prod", "specdeploy_io_name": "llama",
                                        "specdeploy_io_variant": "speculative", "pod": "llama-s1", "job": "j"},
                             "values": [[1.0, "1"]]}], "matrix")
        return _vector([])

    guards = Guards(AllowedEndpoints.of(None, OWN))
    guards.own_pods.record("prod", "llama", [_pod("llama-s1", "speculative")], now=analysis_loop.time.time())
    reconciler, events, listed = _run(monkeypatch, watched, httpx.MockTransport(honest), guards)
    assert listed == [] and events == []
    assert len(asked) == len(queries_for(EngineKind.VLLM, 300.0)) + 1, "one more query per engine and window"
    assert "prod/llama" in reconciler.samples


def test_a_prometheus_outside_the_allow_list_is_never_asked_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched()
    watched.seen(SD, _sd("team-a", "llama", "http://10.0.0.7:8080"))
    asked: list[str] = []
    reconciler, events, _ = _run(monkeypatch, watched, _prometheus(asked), Guards(AllowedEndpoints.of(None, OWN)))
    assert asked == []
    sample = reconciler.samples["team-a/llama"]
    assert {error.kind for error in sample.errors.values()} == {QueryErrorKind.NOT_ALLOWED}
    message = sample.errors[Signal.ACCEPTANCE_RATE].message
    assert "http://10.0.0.7:8080 (`spec.analysis.prometheus.url`) is not in the operator's allow-list" in message
    assert json.dumps(message)   # a plain string for status


def test_an_alertmanager_outside_the_allow_list_is_sent_nothing() -> None:
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200))
    allowed = AllowedEndpoints.of(None, "http://am.example.net:9093")
    with pytest.raises(AlertmanagerNotAllowed, match=r"http://10.0.0.7:9093 \(`spec.alerting.alertmanagerUrl`\)"):
        asyncio.run(post_alerts("http://10.0.0.7:9093", [{"labels": {}}], transport=transport, allowed=allowed))
    asyncio.run(post_alerts("http://am.example.net:9093", [{"labels": {}}], transport=transport, allowed=allowed))
    asyncio.run(post_alerts("http://am.monitoring.svc:9093", [{"labels": {}}], transport=transport, allowed=allowed))
    assert len(sent) == 2


# --- the chart's admission policy: the same list, refused at apply -------------------------------------------------

def _policy(*sets: str) -> list[dict[str, Any]]:
    from test_chart import _helm  # the chart tests' helm, skipped with them before `make cluster-binaries`

    chart = Path(__file__).resolve().parents[2] / "charts" / "specdeploy"
    args = [_helm(), "template", "sd", str(chart), "--show-only", "templates/endpoint-policy.yaml",
            "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    result = subprocess.run([*args, *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0 and "could not find template" in result.stderr:
        return []
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _policy_allows(policy: dict[str, Any], url: str) -> bool:
    """The policy's host regexes applied as its CEL applies them (RE2 and Python's re agree on these)."""
    expression = policy["spec"]["validations"][0]["expression"]
    own = re.findall(r"variables\.prometheusUrl == '([^']+)'", expression)
    if url in own:
        return True
    hosts, host_ports = (re.search(r"getHostname\(\)\.lowerAscii\(\)\.matches\(r'([^']+)'\)", expression),
                         re.search(r"\)\)\.matches\(r'([^']+)'\)", expression))
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = str(parts.port or (443 if parts.scheme == "https" else 80))
    return bool((hosts and re.fullmatch(hosts.group(1), host))
                or (host_ports and re.fullmatch(host_ports.group(1), f"{host}:{port}")))


@pytest.mark.parametrize("patterns", [None, ["*.svc", "thanos.example.org:443", "prom-?.corp"]],
                         ids=["default", "given"])
def test_the_charts_policy_allows_exactly_what_the_operator_allows(patterns: list[str] | None) -> None:
    sets = ["prometheusUrl=http://prometheus.example.net:9090"]
    if patterns:
        sets.append("allowedEndpoints={" + ",".join(patterns) + "}")
    documents = _policy(*sets)
    policy = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    operator = AllowedEndpoints.of(patterns, "http://prometheus.example.net:9090")
    for url in ("http://prometheus.monitoring.svc:9090", "http://a.b.svc.cluster.local:9093", "http://127.0.0.1:9",
                "http://localhost:9090", "http://[::1]:9090", "https://thanos.example.org", "http://thanos.example.org",
                "http://prom-1.corp", "http://prom-12.corp", "http://10.0.0.7:8080", "http://169.254.169.254",
                "http://evil.svc.example.com", "http://prometheus.example.net:9090"):
        assert _policy_allows(policy, url) == operator.allows(url), url
    assert "allowedEndpoints" in policy["spec"]["validations"][0]["message"]
    assert [v["message"].split("`")[1] for v in policy["spec"]["validations"]] == \
        ["spec.analysis.prometheus.url", "spec.alerting.alertmanagerUrl"]


def test_the_policy_is_left_out_where_it_is_turned_off() -> None:
    assert _policy("endpointPolicy.enabled=false") == []
