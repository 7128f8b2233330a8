"""analysis/metrics: the operator's metrics in the Prometheus text format (checked by promtool when present)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from specdeploy.analysis.metrics import Counter, Gauge, Histogram, OperatorMetrics, Registry
from specdeploy.analysis.reasons import FailureReason, InconclusiveReason
from specdeploy.analysis.verdict import Failing, Healthy, Inconclusive, kind


def filled() -> OperatorMetrics:
    metrics = OperatorMetrics()
    metrics.rollback("prod", "llama", "AcceptanceBelowMinimum")
    metrics.rollback("prod", "llama", "AcceptanceBelowMinimum")
    metrics.rollback("dev", 'we"ird\\name', "SpeculativePodOutOfMemory")
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
    assert 'specdeploy_rollbacks_total{namespace="prod",name="llama",reason="AcceptanceBelowMinimum"} 2.0' in text
    assert 'specdeploy_rollbacks_total{namespace="dev",name="we\\"ird\\\\name",reason="SpeculativePodOutOfMemory"} 1.0' \
        in text
    assert 'specdeploy_speculation_active{namespace="prod",name="llama"} 0.0' in text
    assert 'specdeploy_acceptance_rate{namespace="prod",name="qwen"} 0.71' in text
    assert 'specdeploy_analysis_verdicts_total{verdict="Failing"} 1.0' in text
    assert "# TYPE specdeploy_analysis_query_seconds histogram" in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="0.005"} 1' in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="0.05"} 2' in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="10.0"} 2' in text
    assert 'specdeploy_analysis_query_seconds_bucket{le="+Inf"} 3' in text
    assert "specdeploy_analysis_query_seconds_count 3" in text
    assert "specdeploy_analysis_query_seconds_sum 12.034" in text
    assert text.endswith("\n")


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
    text = metrics.render()
    for bound, value in (("estimate", "1.67"), ("low", "1.64"), ("high", "1.69")):
        assert f'specdeploy_speedup{{namespace="prod",name="llama",bound="{bound}"}} {value}' in text
    metrics.speedup_interval("prod", "llama", None)          # an Inconclusive sample: no stale speedup
    assert 'specdeploy_speedup{' not in metrics.render()
    metrics.speedup_interval("prod", "llama", (0.4, 0.39, 0.41))
    metrics.forget("prod", "llama")
    assert 'specdeploy_speedup{' not in metrics.render()


def test_unmeasured_acceptance_removes_the_series() -> None:
    metrics = filled()
    metrics.acceptance_rate("prod", "qwen", float("nan"))
    assert metrics.acceptance.value(namespace="prod", name="qwen") is None
    metrics.acceptance_rate("prod", "qwen", 0.5)
    metrics.forget("prod", "qwen")
    assert "qwen" not in metrics.render()


def test_metric_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="must end in _total"):
        Counter("specdeploy_rollbacks", "x")
    counter = Counter("x_total", "x", ("a",))
    with pytest.raises(ValueError, match=r"takes labels \['a'\], got \['b'\]"):
        counter.inc(b="1")
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1, a="1")
    with pytest.raises(ValueError, match="sorted"):
        Histogram("h", "h", [1.0, 0.5])
    registry = Registry()
    registry.register(Gauge("g", "g"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Gauge("g", "g"))
