"""controller/metrics: the operator's metrics as prometheus_client exposes them (checked by promtool when present)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from specdeploy.api.reasons import FailureReason, InconclusiveReason
from specdeploy.controller.metrics import OperatorMetrics
from specdeploy.judgment.verdict import Failing, Healthy, Inconclusive, kind


def filled() -> OperatorMetrics:
    metrics = OperatorMetrics()
    metrics.rollback("prod", "llama", "AcceptanceBelowMinimum")
    metrics.rollback("prod", "llama", "AcceptanceBelowMinimum")
    metrics.rollback("dev", 'we"ird\\name', "SpeculativePodOutOfMemory")
    metrics.would_roll_back("prod", "llama", "InterTokenLatencyRegressed")
    metrics.speculation_active("prod", "llama", False)
    metrics.speculation_active("prod", "qwen", True)
    metrics.acceptance_rate("prod", "qwen", 0.71)
    metrics.verdict("Healthy")
    metrics.verdict("Failing")
    metrics.queries([0.004, 0.03, 12.0])
    metrics.cycle(0.05)
    return metrics


def test_exposition_lines() -> None:
    text = filled().render()
    assert 'specdeploy_rollbacks_total{name="llama",namespace="prod",reason="AcceptanceBelowMinimum"} 2.0' in text
    assert 'specdeploy_rollbacks_total{name="we\\"ird\\\\name",namespace="dev",reason="SpeculativePodOutOfMemory"} 1.0' \
        in text
    assert "# TYPE specdeploy_rollbacks_created gauge" in text      # as vLLM's own counters have
    assert 'specdeploy_would_rollbacks_total{name="llama",namespace="prod",reason="InterTokenLatencyRegressed"} 1.0' \
        in text
    assert 'specdeploy_speculation_active{name="llama",namespace="prod"} 0.0' in text
    assert 'specdeploy_acceptance_rate{name="qwen",namespace="prod"} 0.71' in text
    assert 'specdeploy_analysis_verdicts_total{verdict="Failing"} 1.0' in text
    assert "# TYPE specdeploy_analysis_query_seconds histogram" in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="0.005"} 1.0' in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="0.05"} 2.0' in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="10.0"} 2.0' in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="+Inf"} 3.0' in text
    assert "specdeploy_analysis_query_seconds_count 3.0" in text
    assert "specdeploy_analysis_query_seconds_sum 12.034" in text
    assert text.endswith("\n")


def test_a_resync_counts_its_time_and_its_failures() -> None:
    metrics = OperatorMetrics()
    metrics.resync(0.4, failed=0)
    metrics.resync(2.0, failed=1)
    assert metrics.value("specdeploy_resync_seconds_count") == 2
    assert metrics.value("specdeploy_resync_seconds_bucket", le="0.5") == 1
    assert metrics.value("specdeploy_resync_failures_total") == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_accepts_the_exposition() -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=filled().render(), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_verdict_labels_stay_three_whatever_the_reason() -> None:
    """The reason goes into status and Events, never into a label: the series count stays bounded."""
    metrics = OperatorMetrics()
    verdicts = [Healthy("fine"), *(Failing(r, "…") for r in FailureReason),
                *(Inconclusive(r, "…") for r in InconclusiveReason)]
    for result in verdicts:
        metrics.verdict(kind(result))
    lines = [line for line in metrics.render().splitlines() if line.startswith("specdeploy_analysis_verdicts_total{")]
    assert sorted(lines) == [
        f'specdeploy_analysis_verdicts_total{{verdict="Failing"}} {float(len(FailureReason))}',
        'specdeploy_analysis_verdicts_total{verdict="Healthy"} 1.0',
        f'specdeploy_analysis_verdicts_total{{verdict="Inconclusive"}} {float(len(InconclusiveReason))}',
    ]
    assert "NotDrafting" not in metrics.render() and "NotEnoughEvidence" not in metrics.render()


def test_the_speedup_is_three_series_and_nothing_when_nothing_was_compared() -> None:
    metrics = OperatorMetrics()
    metrics.speedup_interval("prod", "llama", (1.67, 1.64, 1.69))
    for bound, value in (("estimate", 1.67), ("low", 1.64), ("high", 1.69)):
        assert metrics.value("specdeploy_speedup", namespace="prod", name="llama", bound=bound) == value
    metrics.speedup_interval("prod", "llama", None)          # an Inconclusive sample: no stale speedup
    assert 'specdeploy_speedup{' not in metrics.render()
    metrics.speedup_interval("prod", "llama", (0.4, 0.39, 0.41))
    metrics.forget("prod", "llama")
    assert 'specdeploy_speedup{' not in metrics.render()


def test_unmeasured_acceptance_removes_the_series() -> None:
    metrics = filled()
    metrics.acceptance_rate("prod", "qwen", float("nan"))
    assert metrics.value("specdeploy_acceptance_rate", namespace="prod", name="qwen") is None
    metrics.acceptance_rate("prod", "qwen", 0.5)
    metrics.forget("prod", "qwen")
    assert "qwen" not in metrics.render()


def test_the_last_probe_is_one_series_per_cell_and_cells_it_lost_go() -> None:
    from specdeploy.api.status import ProbeCellStatus

    metrics = OperatorMetrics()
    code = ProbeCellStatus(workload="code", temperature=0.7, requests=8, acceptance_rate=0.8, predicted_speedup=2.1)
    support = ProbeCellStatus(workload="support", temperature=0.0, requests=8, acceptance_rate=0.05,
                              predicted_speedup=0.9)
    metrics.probe("prod", "chat", [code, support])
    labels = {"namespace": "prod", "name": "chat", "workload": "code", "temperature": "0.7"}
    assert metrics.value("specdeploy_probe_acceptance_rate", **labels) == 0.8
    assert metrics.value("specdeploy_probe_predicted_speedup", **{**labels, "workload": "support",
                                                                   "temperature": "0"}) == 0.9
    unmeasured = ProbeCellStatus(workload="code", temperature=0.7, requests=0, failed=8)
    metrics.probe("prod", "chat", [unmeasured])          # a new probe: support gone, code measured nothing
    assert metrics.value("specdeploy_probe_acceptance_rate", **labels) is None
    assert metrics.value("specdeploy_probe_acceptance_rate", **{**labels, "workload": "support",
                                                                 "temperature": "0"}) is None
    metrics.probe("prod", "chat", [code])
    metrics.forget("prod", "chat")
    assert metrics.value("specdeploy_probe_acceptance_rate", **labels) is None


def test_the_verdict_is_one_series_per_sd_that_the_next_verdict_replaces() -> None:
    """What the alerts read: the last verdict and reason (one series, 1), the floor, the Observe label."""
    metrics = OperatorMetrics()
    metrics.judged("prod", "llama", "Inconclusive", "NotEnoughEvidence", observe=False, floor=0.11,
                   inconclusive_samples=3)
    assert metrics.value("specdeploy_verdict", namespace="prod", name="llama", verdict="Inconclusive",
                         reason="NotEnoughEvidence", observe="false") == 1
    assert metrics.value("specdeploy_acceptance_floor", namespace="prod", name="llama") == 0.11
    assert metrics.value("specdeploy_consecutive_inconclusive_samples", namespace="prod", name="llama") == 3
    metrics.judged("prod", "llama", "Failing", "AcceptanceBelowMinimum", observe=True, floor=None,
                   inconclusive_samples=0)
    lines = [line for line in metrics.render().splitlines() if line.startswith("specdeploy_verdict{")]
    assert lines == ['specdeploy_verdict{name="llama",namespace="prod",observe="true",reason="AcceptanceBelowMinimum",'
                     'verdict="Failing"} 1.0']
    assert metrics.value("specdeploy_acceptance_floor", namespace="prod", name="llama") is None   # none in force


def test_batch_and_k_and_a_deleted_sd_leaves_no_gauge() -> None:
    metrics = OperatorMetrics()
    metrics.batch_and_k("prod", "llama", {"speculative": 12.5, "control": 12.0}, 3)
    assert metrics.value("specdeploy_running_batch", namespace="prod", name="llama", variant="speculative") == 12.5
    assert metrics.value("specdeploy_k_in_use", namespace="prod", name="llama") == 3
    metrics.batch_and_k("prod", "llama", {"speculative": None, "control": 12.0}, None)
    assert metrics.value("specdeploy_running_batch", namespace="prod", name="llama", variant="speculative") is None
    assert metrics.value("specdeploy_k_in_use", namespace="prod", name="llama") is None
    metrics.batch_and_k("prod", "llama", {"speculative": 300.0, "control": 300.0}, 0)
    metrics.judged("prod", "llama", "Healthy", "", observe=False, floor=0.11, inconclusive_samples=0)
    metrics.speculation_active("prod", "llama", True)
    metrics.acceptance_rate("prod", "llama", 0.6)
    metrics.forget("prod", "llama")
    gauges = [line for line in metrics.render().splitlines() if not line.startswith("#") and 'name="llama"' in line]
    assert gauges == []


def test_k_in_use_is_the_rendered_schedules_k_at_the_measured_batch() -> None:
    from specdeploy.api.resource import parse_resource
    from specdeploy.api.status import SpeculationStatus, SpeculativeDeploymentStatus
    from specdeploy.controller.reconciler import _k_in_use, plan_resource
    from specdeploy.reconcile.decide import Observed

    body = {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
            "metadata": {"name": "llama", "namespace": "prod", "generation": 1},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                     "speculation": {"method": "draft_model", "draft": {"name": "meta-llama/Llama-3.2-1B-Instruct"},
                                     "numSpeculativeTokens": 4, "schedule": {"mode": "Table", "table": [
                                         {"minBatch": 1, "maxBatch": 8, "k": 4}, {"minBatch": 9, "maxBatch": 32, "k": 1}]}},
                     "resources": {"gpu": {"product": "H100-80GB", "count": 1}},
                     "serving": {"maxModelLen": 8192, "maxNumSeqs": 32}}}
    resource = parse_resource(body)
    observed = Observed(body, SpeculativeDeploymentStatus(), resource, planned=plan_resource(resource))
    speculating = SpeculativeDeploymentStatus(speculation=SpeculationStatus(decided=True, active=True))
    assert _k_in_use(observed, speculating, 4.4) == 4
    assert _k_in_use(observed, speculating, 8.6) == 1      # a mean of 8.6 running: the 9-32 range
    assert _k_in_use(observed, speculating, None) is None
    rolled_back = SpeculativeDeploymentStatus(speculation=SpeculationStatus(decided=False, active=False))
    assert _k_in_use(observed, rolled_back, 4.4) == 0
