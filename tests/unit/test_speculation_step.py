"""step_speculation: rollback after failureLimit, never on nothing, at once on OOM, and back again."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from specdeploy.analysis.oom import OutOfMemory
from specdeploy.analysis.rollback import RETRY_ANNOTATION
from specdeploy.analysis.samples import DeploymentSample, SignalValues
from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.status import AnalysisStatus, SpeculationStatus
from specdeploy.reconcile.speculation import SpeculationStep, step_speculation

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-8b-ngram.yaml"
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def _resource(**spec_updates: Any) -> SpeculativeDeployment:
    resource = load_resource(EXAMPLE.read_text())
    analysis = resource.spec.analysis.model_copy(update=spec_updates)
    return resource.model_copy(update={"spec": resource.spec.model_copy(update={"analysis": analysis})})


def _sample(acceptance: float, requests: float = 500, itl: float = 0.02, control_itl: float = 0.02) -> DeploymentSample:
    return DeploymentSample(
        window_seconds=300,
        speculative=SignalValues(acceptance_rate=acceptance, mean_acceptance_length=1 + 3 * acceptance,
                                 p99_inter_token_latency_seconds=itl, p99_e2e_latency_seconds=4.0,
                                 p99_time_to_first_token_seconds=0.2, requests=requests),
        control=SignalValues(p99_inter_token_latency_seconds=control_itl, p99_e2e_latency_seconds=4.0,
                             p99_time_to_first_token_seconds=0.2, requests=requests / 2),
    )


def _run(resource: SpeculativeDeployment, samples: list[DeploymentSample | None],
         start: SpeculationStatus | None = None) -> list[SpeculationStep]:
    speculation = start or SpeculationStatus(active=True, since="2026-11-29T09:00:00Z")
    analysis: AnalysisStatus | None = None
    steps = []
    for i, sample in enumerate(samples):
        step = step_speculation(resource, speculation, analysis, True, sample, [], T0 + timedelta(seconds=30 * i))
        speculation, analysis = step.speculation, step.analysis
        steps.append(step)
    return steps


def test_failure_limit_consecutive_failures_roll_back_with_evidence() -> None:
    steps = _run(_resource(failure_limit=3), [_sample(0.3)] * 3)
    assert [s.rollback is not None for s in steps] == [False, False, True]
    last = steps[-1]
    assert not last.speculation.active
    record = last.speculation.last_rollback
    assert record is not None and record.reason == "AcceptanceBelowMinimum"
    assert "0.3" in record.evidence and "0.5" in record.evidence
    assert record.speculation_hash and not record.notified
    assert last.speculation.rollbacks == 1


def test_a_healthy_sample_resets_the_count() -> None:
    steps = _run(_resource(failure_limit=3), [_sample(0.3), _sample(0.3), _sample(0.8), _sample(0.3), _sample(0.3)])
    assert all(s.rollback is None for s in steps)
    assert steps[2].analysis is not None and steps[2].analysis.verdict == "Healthy"


def test_no_data_and_idle_never_roll_back() -> None:
    empty = DeploymentSample(window_seconds=300)
    idle = _sample(0.1, requests=3)
    steps = _run(_resource(failure_limit=1), [empty] * 30 + [idle] * 30)
    assert all(s.rollback is None and s.speculation.active for s in steps)
    assert steps[-1].analysis is not None and steps[-1].analysis.verdict == "Inconclusive: TooFewRequests"


def test_latency_regression_against_control_rolls_back() -> None:
    steps = _run(_resource(failure_limit=2), [_sample(0.8, itl=0.05, control_itl=0.02)] * 2)
    assert steps[-1].rollback is not None
    assert steps[-1].rollback.reason.value == "InterTokenLatencyRegressed"


def test_out_of_memory_rolls_back_at_once_without_a_sample() -> None:
    death = OutOfMemory(pod="x-1", container="engine", reason="Error", exit_code=1,
                        finished_at="2026-11-29T10:00:00Z", detail="torch.OutOfMemoryError: CUDA out of memory")
    speculation = SpeculationStatus(active=True, since="2026-11-29T09:00:00Z")
    step = step_speculation(_resource(), speculation, None, True, None, [death], T0)
    assert step.rollback is not None and step.rollback.reason.value == "SpeculativePodOutOfMemory"
    assert not step.speculation.active


def _rolled_back(resource: SpeculativeDeployment) -> SpeculationStatus:
    return _run(resource, [_sample(0.3)] * 3)[-1].speculation


def test_retry_annotation_brings_speculation_back_once() -> None:
    resource = _resource()
    speculation = _rolled_back(resource)
    same = step_speculation(resource, speculation, None, True, None, [], T0 + timedelta(minutes=5))
    assert not same.speculation.active
    annotated = resource.model_copy(update={"metadata": resource.metadata.model_copy(
        update={"annotations": {RETRY_ANNOTATION: "1"}})})
    back = step_speculation(annotated, speculation, None, True, None, [], T0 + timedelta(minutes=5))
    assert back.speculation.active and back.reenabled is not None
    assert [e.reason for e in back.events] == ["SpeculationReenabled"]
    again = step_speculation(annotated, back.speculation, back.analysis, True, None, [], T0 + timedelta(minutes=6))
    assert again.reenabled is None, "the same annotation value is acted on once"


def test_changing_spec_speculation_brings_it_back() -> None:
    resource = _resource()
    speculation = _rolled_back(resource)
    changed = resource.model_copy(update={"spec": resource.spec.model_copy(update={
        "speculation": resource.spec.speculation.model_copy(update={"num_speculative_tokens": 2})})})
    step = step_speculation(changed, speculation, None, True, None, [], T0 + timedelta(minutes=1))
    assert step.speculation.active and step.reenabled is not None


def test_auto_reenable_after_the_cooldown() -> None:
    resource = _resource(reenable="Auto", cooldown=600)
    speculation = _rolled_back(resource)
    at = datetime.fromisoformat(speculation.last_rollback.at.replace("Z", "+00:00"))  # type: ignore[union-attr]
    early = step_speculation(resource, speculation, None, True, None, [], at + timedelta(seconds=599))
    assert not early.speculation.active
    due = step_speculation(resource, speculation, None, True, None, [], at + timedelta(seconds=600))
    assert due.speculation.active


def test_a_rejected_generation_changes_nothing() -> None:
    speculation = SpeculationStatus(active=True, since="2026-11-29T09:00:00Z")
    step = step_speculation(_resource(failure_limit=1), speculation, None, False, _sample(0.1), [], T0)
    assert step.speculation == speculation and step.rollback is None


def test_a_sample_while_rolled_back_is_recorded_so_the_next_is_an_interval_later() -> None:
    resource = _resource()
    speculation = _rolled_back(resource)
    later = T0 + timedelta(minutes=3)
    step = step_speculation(resource, speculation, None, True, _sample(0.8), [], later)
    assert step.analysis is not None and step.analysis.last_sample_at == "2026-11-29T10:03:00Z"
    assert step.analysis.previous_baseline is not None, "the pods without speculation are the Previous baseline"
