"""spec.analysis.probe: when the operator probes, what a probe pass writes (status.probe, the Probed condition, an
Event), and that a failed probe is told, never acted on."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from analysis_samples import T0

from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, load_resource
from specdeploy.api.spec import Probe
from specdeploy.api.status import ConditionStatus, ProbeStatus, SpeculationStatus, SpeculativeDeploymentStatus
from specdeploy.controller.probe_loop import ready_speculative_pod
from specdeploy.judgment import evidence
from specdeploy.judgment.probe import (
    RETRY_AFTER_FAILURE_SECONDS,
    ProbeBudget,
    ProbeOutcome,
    ProbeRequest,
    ProbeTarget,
    SpecDecodeCounts,
    UnusableWorkloads,
    probe_due,
    probe_failed,
    probe_result,
    workloads_from_config_map,
)
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import LABEL_VARIANT, Variant, engine_command
from specdeploy.reconcile.decide import Observed, decide
from specdeploy.reconcile.status import Planned

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROLLED_OUT = ProbeTarget(speculating=True, rolled_out=True, deployment_generation=3)


def _probed(generation: int = 3, taken: datetime = T0, failure_at: datetime | None = None) -> ProbeStatus:
    status = ProbeStatus(taken_at=evidence.rfc3339(taken), trigger="NewGeneration", deployment_generation=generation)
    return probe_failed(status, "PodNotReady", "no pod", failure_at) if failure_at is not None else status


# --- when ----------------------------------------------------------------------------------------------------

def test_a_new_generation_is_probed_once_rolled_out_and_speculating() -> None:
    probe = Probe()
    assert probe_due(probe, None, ROLLED_OUT, T0) == "NewGeneration"
    assert probe_due(probe, _probed(generation=2), ROLLED_OUT, T0) == "NewGeneration"
    assert probe_due(probe, _probed(generation=3), ROLLED_OUT, T0) is None
    assert probe_due(probe, None, dataclasses.replace(ROLLED_OUT, rolled_out=False), T0) is None   # mid-rollout
    assert probe_due(probe, None, dataclasses.replace(ROLLED_OUT, speculating=False), T0) is None  # rolled back
    assert probe_due(probe, None, None, T0) is None                                                 # no Deployment
    assert probe_due(Probe(on_new_generation=False), None, ROLLED_OUT, T0) is None


def test_the_interval_counts_from_the_last_measurement() -> None:
    probe = Probe(interval=6 * 3600.0, on_new_generation=False)
    assert probe_due(probe, None, ROLLED_OUT, T0) == "Interval"
    assert probe_due(probe, _probed(taken=T0), ROLLED_OUT, T0 + timedelta(hours=5, minutes=59)) is None
    assert probe_due(probe, _probed(taken=T0), ROLLED_OUT, T0 + timedelta(hours=6)) == "Interval"


def test_a_failed_probe_is_tried_again_after_a_pause_for_the_same_reason() -> None:
    probe = Probe()
    failed = probe_failed(None, "PodNotReady", "no speculative pod is Ready", T0, deployment_generation=3)
    assert failed.deployment_generation is None and failed.taken_at is None
    just_after = T0 + timedelta(seconds=RETRY_AFTER_FAILURE_SECONDS - 1)
    assert probe_due(probe, failed, ROLLED_OUT, just_after) is None
    assert probe_due(probe, failed, ROLLED_OUT, T0 + timedelta(seconds=RETRY_AFTER_FAILURE_SECONDS)) == "NewGeneration"
    # new pods are probed at once
    assert probe_due(probe, failed, dataclasses.replace(ROLLED_OUT, deployment_generation=4), just_after) == "NewGeneration"
    # the cells and generation of the last good probe stay beside the failure
    kept = probe_failed(_probed(generation=2), "EngineUnreachable", "refused", T0)
    assert kept.deployment_generation == 2 and kept.taken_at == evidence.rfc3339(T0) and kept.last_failure


# --- what it reads ---------------------------------------------------------------------------------------------

def test_workloads_come_from_a_config_map_of_yaml_lists() -> None:
    data = {"code": "- write a function that adds two numbers\n- fix this loop", "support": '["where is my order"]'}
    assert workloads_from_config_map(data, "cm") == {
        "code": ["write a function that adds two numbers", "fix this loop"], "support": ["where is my order"]}
    for bad in ({}, {"code": "just one string"}, {"code": "[]"}, {"code": "- [unclosed"}):
        with pytest.raises(UnusableWorkloads, match="cm"):
            workloads_from_config_map(bad, "cm")


def _pod(name: str, ready: bool = True, ip: str | None = "127.80.0.5", variant: str = "speculative",
         deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {LABEL_VARIANT: variant}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": metadata, "status": status}


def test_the_pod_probed_is_a_ready_speculative_one_with_an_address() -> None:
    assert ready_speculative_pod([_pod("b"), _pod("a")])["metadata"]["name"] == "a"  # type: ignore[index]
    assert ready_speculative_pod([_pod("a", ready=False), _pod("b", ip=None), _pod("c", variant="control"),
                       _pod("d", deleting=True)]) is None


# --- what a probe pass writes ------------------------------------------------------------------------------------

def _body(probe: dict[str, Any] | None, status: SpeculativeDeploymentStatus, engine: str = "vllm") -> dict[str, Any]:
    document = yaml.safe_load((EXAMPLES / "llama-8b-ngram.yaml").read_text())
    document["metadata"] = {"name": "llama", "namespace": "ns", "generation": 1, "uid": "u1"}
    if probe is not None:
        document["spec"]["analysis"]["probe"] = probe
    document["spec"].setdefault("engine", {})["kind"] = engine
    document["status"] = status.to_wire()
    return dict(document)


def _speculating() -> SpeculativeDeploymentStatus:
    return SpeculativeDeploymentStatus(speculation=SpeculationStatus(decided=True, active=True,
                                                                     since=evidence.rfc3339(T0)))


def _observed(body: dict[str, Any], probe: ProbeStatus | None) -> Observed:
    resource = load_resource(yaml.safe_dump({**body, "status": None}))
    return Observed(body, SpeculativeDeploymentStatus.model_validate(body["status"]), resource,
                    planned=Planned(make_plan(resource.spec)), probe=probe)


def _result(resource: SpeculativeDeployment, accepted: int) -> ProbeStatus:
    request = ProbeRequest("neutral", 0.0, "hello")
    outcomes = [ProbeOutcome(request, SpecDecodeCounts(steps=10, drafted=40, accepted=accepted))] * 4
    return probe_result(resource.spec, make_plan(resource.spec), outcomes, ProbeBudget(4), 1, "llama", "http://127.80.0.5:8000", T0,
                        "NewGeneration")


def test_a_probe_pass_writes_the_cells_the_probed_condition_and_an_event() -> None:
    body = _body({"temperatures": [0]}, _speculating())
    observed = _observed(body, None)
    assert observed.resource is not None
    result = _result(observed.resource, accepted=30).model_copy(update={"pod": "llama-abc", "deployment_generation": 1})
    actions = decide(dataclasses.replace(observed, probe=result), T0 + timedelta(seconds=1))
    assert actions.status.probe == result
    [probed] = [c for c in actions.status.conditions if c.type == "Probed"]
    assert probed.status == ConditionStatus.TRUE and probed.reason == "Measured"
    assert "llama-abc" in probed.message and "NewGeneration" in probed.message
    assert [(e.type.value, e.reason) for e in actions.own_events] == [("Normal", "Probed")]
    # the next pass, with no probe of its own, keeps it and raises nothing
    later = _observed(_body({"temperatures": [0]}, actions.status), None)
    again = decide(later, T0 + timedelta(seconds=30))
    assert again.status.probe == result and again.own_events == ()


def test_a_cell_below_the_break_even_is_named_in_the_condition() -> None:
    observed = _observed(_body({}, _speculating()), None)
    assert observed.resource is not None
    result = _result(observed.resource, accepted=0)
    assert result.not_paying and "neutral at temperature 0" in result.not_paying[0]
    actions = decide(dataclasses.replace(observed, probe=result), T0)
    [probed] = [c for c in actions.status.conditions if c.type == "Probed"]
    assert result.not_paying[0] in probed.message


def test_a_failed_probe_is_a_condition_and_a_warning_and_never_a_rollback() -> None:
    observed = _observed(_body({}, _speculating()), None)
    failed = probe_failed(None, "EngineUnreachable", "pod llama-abc: connection refused", T0)
    actions = decide(dataclasses.replace(observed, probe=failed), T0)
    [probed] = [c for c in actions.status.conditions if c.type == "Probed"]
    assert (probed.status, probed.reason) == (ConditionStatus.FALSE, "EngineUnreachable")
    assert "connection refused" in probed.message and "not rolled back" in probed.message
    assert [(e.type.value, e.reason) for e in actions.own_events] == [("Warning", "ProbeFailed")]
    assert actions.rollback is None and actions.status.speculation is not None
    assert actions.status.speculation.decided is True


def test_without_spec_analysis_probe_there_is_no_probed_condition() -> None:
    actions = decide(_observed(_body(None, _speculating()), None), T0)
    assert "Probed" not in {c.type for c in actions.status.conditions}
    waiting = decide(_observed(_body({}, _speculating()), None), T0)
    [probed] = [c for c in waiting.status.conditions if c.type == "Probed"]
    assert (probed.status, probed.reason) == (ConditionStatus.UNKNOWN, "NotProbedYet")


# --- the spec ----------------------------------------------------------------------------------------------------

def test_vllm_pods_return_their_own_counts_when_the_operator_probes() -> None:
    with_probe = load_resource(yaml.safe_dump({**_body({}, _speculating()), "status": None}))
    without = load_resource(yaml.safe_dump({**_body(None, _speculating()), "status": None}))
    args = list(engine_command(make_plan(with_probe.spec), Variant.SPECULATIVE, True).args)
    assert args[args.index("--per-request-spec-decode-metrics") + 1] == "summary"
    for plan, variant in ((make_plan(without.spec), Variant.SPECULATIVE), (make_plan(with_probe.spec), Variant.CONTROL)):
        assert "--per-request-spec-decode-metrics" not in engine_command(plan, variant, True).args


@pytest.mark.parametrize(("probe", "message"), [
    ({"temperatures": [2.5]}, "`spec.analysis.probe.temperatures` must each be at least 0 and at most 2"),
    ({"interval": "5m"}, "`spec.analysis.probe.interval` must be at least 10m"),
    ({"timeout": "2h"}, "`spec.analysis.probe.timeout` must be at least 10s and at most 1h"),
])
def test_bad_probe_settings_are_refused(probe: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidResource, match=message.replace("`", ".").replace("(", ".").replace(")", ".")):
        load_resource(yaml.safe_dump({**_body(probe, _speculating()), "status": None}))


def test_the_probe_needs_vllm() -> None:
    with pytest.raises(InvalidResource, match="only vLLM returns"):
        load_resource(yaml.safe_dump({**_body({}, _speculating(), engine="sglang"), "status": None}))
