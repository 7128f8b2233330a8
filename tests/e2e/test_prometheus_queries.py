"""The analysis queries against the dev cluster's real Prometheus and Alertmanager.

A loopback server plays two engine pods of one SD (speculative and control) with vLLM's metric names,
its counters growing at fixed rates with the wall clock, registered as scrape targets with the labels a
PodMonitor gives (namespace, pod, specdeploy_io_name, specdeploy_io_variant). Rates measured by
Prometheus are then exact ratios: acceptance 80/100, mean acceptance length 1 + 80/25, and P99s inside
one histogram bucket, interpolated as histogram_quantile does.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from loopback_exposition import expositions_on_loopback

from specdeploy.api.reasons import FailureReason
from specdeploy.api.spec import BaselineMode, Checks, EngineKind
from specdeploy.clients.alertmanager import post_alerts
from specdeploy.clients.prometheus import PrometheusClient, query_all
from specdeploy.controller.metrics import OperatorMetrics
from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.judgment.alerts import rollback_alert
from specdeploy.judgment.queries import queries_for
from specdeploy.judgment.samples import QueryGroup, Samples, Signal
from specdeploy.judgment.verdict import Failing, Policy, verdict

pytestmark = pytest.mark.e2e

WINDOW = 30.0
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)


def _histogram(name: str, per_second: float, seconds: float, value: float, labels: str) -> list[str]:
    """A histogram whose every observation is `value`: counts step from 0 to all at the first bucket ≥ value."""
    count = per_second * seconds
    lines = [f"# TYPE {name} histogram"]
    for bound in BUCKETS:
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count if value <= bound else 0.0}')
    lines += [f'{name}_bucket{{{labels},le="+Inf"}} {count}', f"{name}_sum{{{labels}}} {count * value}",
              f"{name}_count{{{labels}}} {count}"]
    return lines


POSITION_ACCEPTED_PER_SECOND = (24.0, 22.0, 18.0, 16.0)


def _vllm_metrics(seconds: float, speculative: bool) -> str:
    """vLLM V1 names (engines/vllm.py METRICS) for one pod, `seconds` after it started."""
    labels = 'model_name="meta-llama/Llama-3.1-8B-Instruct",engine="0"'
    rate = 2.0 if speculative else 1.0
    lines = []
    if speculative:
        for name, per_second in (("vllm:spec_decode_num_drafts_total", 25.0),
                                 ("vllm:spec_decode_num_draft_tokens_total", 100.0),
                                 ("vllm:spec_decode_num_accepted_tokens_total", 80.0)):
            lines += [f"# TYPE {name} counter", f"{name}{{{labels}}} {per_second * seconds}"]
        # Of the 25 drafts a second, k = 4, 24 have position 1 accepted, 22 positions 1-2, ...: 80 accepted tokens.
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        lines.append(f"# TYPE {name} counter")
        lines += [f'{name}{{{labels},position="{position}"}} {per_second * seconds}'
                  for position, per_second in enumerate(POSITION_ACCEPTED_PER_SECOND)]
    lines += ["# TYPE vllm:request_success_total counter",
              f'vllm:request_success_total{{{labels},finished_reason="stop"}} {rate * seconds}']
    lines += _histogram("vllm:request_time_per_output_token_seconds", rate, seconds,
                        0.04 if speculative else 0.02, labels)
    lines += _histogram("vllm:e2e_request_latency_seconds", rate, seconds, 2.0, labels)
    lines += _histogram("vllm:time_to_first_token_seconds", rate, seconds, 0.2, labels)
    lines += ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} 4",
              "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} 1"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def engine_pods(dev_cluster: DevCluster, namespace: str) -> Iterator[str]:
    """Two fake vLLM pods of SD `llama` in `namespace`, scraped by Prometheus; yields the SD name."""
    started = time.time()
    def page(speculative: bool) -> Callable[[], str]:
        return lambda: _vllm_metrics(time.time() - started, speculative)

    with expositions_on_loopback({"/speculative/metrics": page(True), "/control/metrics": page(False)}) as address:
        targets = []
        try:
            for variant in ("speculative", "control"):
                target = f"{namespace}-{variant}"
                dev_cluster.add_scrape_target(target, address, {
                    "namespace": namespace, "pod": f"llama-{variant}-0", "specdeploy_io_name": "llama",
                    "specdeploy_io_variant": variant,
                }, metrics_path=f"/{variant}/metrics")
                targets.append(target)
            yield "llama"
        finally:
            for target in targets:
                dev_cluster.remove_scrape_target(target)


def _query_all(prometheus_url: str, groups: list[QueryGroup]) -> Samples:
    async def go() -> Samples:
        async with PrometheusClient(prometheus_url, timeout=5.0) as client:
            return await query_all(client, groups)
    return asyncio.run(go())


def test_query_all_reads_grouped_signals_from_real_prometheus(dev_cluster: DevCluster, namespace: str,
                                                              engine_pods: str) -> None:
    group = QueryGroup(EngineKind.VLLM, WINDOW)

    def measured() -> Samples | None:
        samples = _query_all(dev_cluster.prometheus_url, [group])
        sample = samples.for_deployment(namespace, engine_pods, EngineKind.VLLM, WINDOW)
        speculative, control = sample.speculative, sample.control
        # Every signal answered (under load one query can time out while the others answer) and every
        # value read, over at least two scrapes of each pod.
        ready = not sample.errors and all(v is not None and math.isfinite(v) and v > 0 for v in (
            speculative.acceptance_rate, speculative.mean_acceptance_length, speculative.requests,
            control.requests, speculative.p99_inter_token_latency_seconds,
            control.p99_inter_token_latency_seconds, speculative.p99_e2e_latency_seconds,
            speculative.p99_time_to_first_token_seconds, speculative.running, speculative.waiting))
        return samples if ready else None

    samples = wait_for(measured, timeout=90, interval=0.5,
                       what="two scrapes of both fake engine pods, every query answered")
    assert samples.query_count == len(queries_for(EngineKind.VLLM, WINDOW))   # every signal vLLM exports
    sample = samples.for_deployment(namespace, engine_pods, EngineKind.VLLM, WINDOW)
    assert sample.errors == {}
    speculative, control = sample.speculative, sample.control
    assert speculative.acceptance_rate == pytest.approx(0.8, rel=1e-9)
    assert speculative.mean_acceptance_length == pytest.approx(4.2, rel=1e-9)
    # Every observation in (0.025, 0.05]: histogram_quantile interpolates 0.025 + 0.99 × 0.025.
    assert speculative.p99_inter_token_latency_seconds == pytest.approx(0.025 + 0.99 * 0.025, rel=1e-9)
    assert control.p99_inter_token_latency_seconds == pytest.approx(0.01 + 0.99 * 0.015, rel=1e-9)
    assert speculative.p99_e2e_latency_seconds == pytest.approx(1.0 + 0.99 * 1.5, rel=1e-9)
    assert speculative.p99_time_to_first_token_seconds == pytest.approx(0.1 + 0.99 * 0.15, rel=1e-9)
    assert control.acceptance_rate is None                   # no speculation, no spec-decode counters
    # The calibration's counts per draft position: each position's share of the drafts, as exported.
    counts = sample.position_counts
    assert counts is not None and counts.drafts > 0 and counts.drafted is None
    assert [a / counts.drafts for a in counts.accepted] == pytest.approx(
        [a / 25.0 for a in POSITION_ACCEPTED_PER_SECOND], rel=1e-9)
    assert control.position_counts is None
    # increase() extrapolates over a window that holds only a few scrapes: twice the rate shows as more.
    assert speculative.requests and control.requests and speculative.requests > control.requests
    assert (speculative.running, speculative.waiting) == (4.0, 1.0)

    # Means from _sum / _count are exact: 40 ms and 20 ms per token, whatever the buckets.
    assert speculative.mean_inter_token_latency_seconds == pytest.approx(0.04, rel=1e-9)
    assert control.mean_inter_token_latency_seconds == pytest.approx(0.02, rel=1e-9)
    policy = Policy(Checks(), BaselineMode.CONTROL, min_requests=1)

    def judged() -> Failing | None:
        found = verdict(_query_all(dev_cluster.prometheus_url, [group]).for_deployment(
            namespace, engine_pods, EngineKind.VLLM, WINDOW), policy)
        return found if isinstance(found, Failing) else None

    # The paired comparison needs four slices of the window with requests of both pods (3 s slices, 2 s scrapes).
    result = wait_for(judged, timeout=60, interval=1.0, what="enough slices for the paired comparison")
    assert result.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED
    assert "per-token latency +100% (95% interval +100%…+100%) vs the control" in result.evidence
    # The control's P99 is 24.85 ms, exactly at a rounding edge: Prometheus' float arithmetic over rates
    # lands it on either side, so the figure is read back rather than matched as text.
    shown = re.search(r"mean 40 ms vs 20 ms, P99 ≈ ([\d.]+) ms vs ≈ ([\d.]+) ms", result.evidence)
    assert shown, result.evidence
    assert float(shown[1]) == pytest.approx(49.75, abs=0.051)
    assert float(shown[2]) == pytest.approx(24.85, abs=0.051)


def test_every_engines_queries_are_valid_promql(dev_cluster: DevCluster) -> None:
    """Prometheus parses and runs each rendered query (no series needed): no BadQuery for any engine."""
    groups = [QueryGroup(engine, window) for engine in EngineKind for window in (30.0, 300.0)]
    samples = _query_all(dev_cluster.prometheus_url, groups)
    rendered = sum(len(queries_for(group.engine, group.window_seconds)) for group in groups)
    assert rendered > len(groups) * len(Signal) / 2   # a signal an engine does not export is not queried
    assert samples.query_count == rendered
    assert {g: dict(s.errors) for g, s in samples.groups.items() if s.errors} == {}


def test_a_rollback_alert_posted_twice_is_one_alert(dev_cluster: DevCluster, namespace: str) -> None:
    at = datetime.now(UTC).replace(microsecond=0)
    first = rollback_alert(namespace, "llama", "AcceptanceBelowMinimum", "acceptance rate 0.31 < 0.50",
                           "http://specdeploy.invalid/sd", at)
    again = rollback_alert(namespace, "llama", "AcceptanceBelowMinimum", "acceptance rate 0.29 < 0.50 (re-sent)",
                           "http://specdeploy.invalid/sd", at)
    asyncio.run(post_alerts(dev_cluster.alertmanager_url, [first]))
    asyncio.run(post_alerts(dev_cluster.alertmanager_url, [again]))

    def listed() -> list[dict] | None:
        response = httpx.get(f"{dev_cluster.alertmanager_url}/api/v2/alerts",
                             params={"filter": f'namespace="{namespace}"'}, timeout=5)
        response.raise_for_status()
        alerts = response.json()
        return alerts if alerts and alerts[0]["annotations"]["description"].endswith("(re-sent)") else None

    alerts = wait_for(listed, timeout=30, what="the rollback alert in Alertmanager")
    assert len(alerts) == 1
    assert alerts[0]["labels"] == {"alertname": "SpeculationRolledBack", "namespace": namespace, "name": "llama",
                                   "reason": "AcceptanceBelowMinimum", "severity": "warning"}
    resolved = rollback_alert(namespace, "llama", "AcceptanceBelowMinimum", "speculation re-enabled", "", at,
                              ends_at=datetime.now(UTC))
    asyncio.run(post_alerts(dev_cluster.alertmanager_url, [resolved]))


def test_prometheus_scrapes_the_operator_metrics(dev_cluster: DevCluster, namespace: str) -> None:
    metrics = OperatorMetrics()
    metrics.rollback(namespace, "llama", "SpeculativePodOutOfMemory")
    metrics.speculation_active(namespace, "llama", False)
    metrics.queries([0.003, 0.02])
    target = f"{namespace}-operator"
    with expositions_on_loopback({"/metrics": metrics.render}) as address:
        dev_cluster.add_scrape_target(target, address, {"job_role": "operator"})
        try:
            def scraped() -> list[dict]:
                response = httpx.get(f"{dev_cluster.prometheus_url}/api/v1/query", timeout=5, params={
                    "query": f'specdeploy_rollbacks_total{{instance_name="{target}"}}'})
                return list(response.json()["data"]["result"])

            [series] = wait_for(scraped, timeout=30, what="Prometheus to scrape the operator metrics")
            assert series["metric"]["reason"] == "SpeculativePodOutOfMemory"
            assert float(series["value"][1]) == 1.0
        finally:
            dev_cluster.remove_scrape_target(target)
