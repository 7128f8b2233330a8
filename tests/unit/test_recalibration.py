"""An Auto schedule follows the measured acceptance per draft position, through status: one pass decides the
change (status and one Event), the next pass's plan renders the new table from that status, the same sample
again changes nothing, a Fixed schedule is never calibrated, and a restart renders the same table."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest
from analysis_samples import T0, cumulative, sample

from specdeploy.api import names
from specdeploy.api.reasons import CalibrationReason
from specdeploy.api.resource import SpeculativeDeployment, parse_resource
from specdeploy.api.status import SpeculativeDeploymentStatus
from specdeploy.controller.reconciler import plan_resource
from specdeploy.judgment.calibration import (
    MIN_PERIOD_SECONDS,
    acceptance_now,
)
from specdeploy.judgment.samples import DeploymentSample, Signal
from specdeploy.judgment.speculation import schedule_at_load, step_speculation
from specdeploy.planning.plan import make_plan
from specdeploy.planning.schedule import calibrated_acceptance, calibration_key
from specdeploy.reconcile.children import Variant, desired_children, engine_command
from specdeploy.reconcile.decide import Actions, Observed, decide
from specdeploy.reconcile.observed import observe_pods
from specdeploy.reconcile.status import DeploymentState, Planned

NAME, NAMESPACE = "llama-draft", "ns"
LATER = T0 + timedelta(hours=1)          # past the minimum period since speculation started at T0


def _body(mode: str = "Auto", engine: str = "vllm", status: SpeculativeDeploymentStatus | None = None,
          k: int = 5) -> dict[str, Any]:
    """Llama-3.1-8B with a Llama-3.2-1B draft on an H100, maxNumSeqs 32: the prior derives k = 2 at every batch."""
    return {
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "generation": 1, "uid": "u1"},
        "spec": {
            "replicas": 1, "engine": {"kind": engine},
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "draft_model", "draft": {"name": "meta-llama/Llama-3.2-1B-Instruct"},
                            "numSpeculativeTokens": k, "schedule": {"mode": mode}},
            "resources": {"gpu": {"product": "H100-80GB", "count": 1}},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            "analysis": {"baseline": {"mode": "Control", "controlReplicas": 1}, "failureLimit": 10},
        },
        "status": status.to_wire() if status is not None else {},
    }


def _resource(body: dict[str, Any]) -> SpeculativeDeployment:
    return parse_resource({**body, "status": None})


def _previous(body: dict[str, Any]) -> SpeculativeDeploymentStatus:
    return SpeculativeDeploymentStatus.model_validate(body["status"])


def _planned(body: dict[str, Any]) -> Planned:
    """What the reconciler plans for `body`: the measured positions of its status as read."""
    return plan_resource(_resource(body), previous=_previous(body))


def _observed(body: dict[str, Any], sample_: DeploymentSample | None = None) -> Observed:
    """A pass over `body` with its children as the last pass's plan rendered them, one speculating pod."""
    resource, previous, planned = _resource(body), _previous(body), _planned(body)
    assert planned.plan is not None
    fingerprint = desired_children(resource.model_copy(update={"status": previous}), planned.plan).fingerprint(1)
    deployments = tuple(DeploymentState(name=name, variant=v, replicas=1, updated_replicas=1, available_replicas=1,
                                        generation=1, observed_generation=1, sd_generation=1,
                                        children_fingerprint=fingerprint)
                        for name, v in ((names.engine_deployment_name(NAME), Variant.SPECULATIVE),
                                        (names.control_deployment_name(NAME), Variant.CONTROL)))
    pod = {"metadata": {"name": f"{NAME}-speculative-1", "labels": {"specdeploy.io/variant": "speculative"},
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "rs1"}]},
           "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}}
    replica_set = {"metadata": {"name": "rs1", "annotations": {"specdeploy.io/speculating": "true"}}}
    pods = observe_pods([pod], [replica_set], "specdeploy.io/variant", "speculative")
    return Observed(body, previous, resource, planned=planned, deployments=deployments, pods=pods, sample=sample_)


def _after(body: dict[str, Any], actions: Actions) -> dict[str, Any]:
    """The SD as the next pass reads it: the status written, through JSON (as the apiserver hands it back)."""
    return {**body, "status": json.loads(json.dumps(actions.status.to_wire()))}


def _speculating(**spec: Any) -> dict[str, Any]:
    body = _body(**spec)
    return _after(body, decide(_observed(body), T0))


def _measured(alpha: float = 0.3, drafts: float = 20_000, positions: int = 2, running: float = 8.0,
              drafted: bool = False) -> DeploymentSample:
    """A window whose drafts accept each position with probability `alpha` given the one before (positions
    1..`positions` counted, as vLLM under a table whose smallest k is `positions`), `running` sequences a pod."""
    accepted = {i: drafts * alpha**i for i in range(1, positions + 1)}
    found = sample(alpha, itl=0.018, control_itl=0.02, k=positions, drafts=drafts, running=running,
                   positions={Signal.ACCEPTED_PER_POSITION: accepted,
                              **({Signal.DRAFTED_PER_POSITION: dict.fromkeys(accepted, drafts)} if drafted else {})})
    return found


def _table(plan_or_body: Any) -> list[tuple[int, int, int]]:
    plan = plan_or_body if not isinstance(plan_or_body, dict) else _planned(plan_or_body).plan
    assert plan is not None and plan.schedule is not None
    return [(r.min_batch, r.max_batch, r.k) for r in plan.schedule.ranges]


def _recalibrated(actions: Actions) -> list[Any]:
    return [e for e in actions.events if e.reason == CalibrationReason.SCHEDULE_RECALIBRATED]


def test_collapsed_acceptance_writes_a_new_table_to_status_with_one_event_and_the_next_plan_renders_it() -> None:
    body = _speculating()
    assert _table(body) == [(1, 32, 2)]                        # the prior's table
    actions = decide(_observed(body, _measured(0.3)), LATER)

    calibration = actions.status.speculation.calibration if actions.status.speculation else None
    assert calibration is not None and calibration.changes == 1
    assert [p.rate for p in calibration.positions][:2] == pytest.approx([0.3, 0.09])
    assert [p.source for p in calibration.positions] == ["Measured"] * 2 + ["Extrapolated"] * 3
    assert calibration.positions[0].standard_error == pytest.approx((0.3 * 0.7 / 20_000) ** 0.5)
    assert [(e.min_batch, e.max_batch, e.k) for e in calibration.schedule] == [(1, 32, 1)]
    assert calibration.last_change_at == calibration.measured_at
    decision = calibration.last_decision
    assert decision is not None and (decision.kind, decision.reason, decision.batch) == ("Changed", CalibrationReason.SCHEDULE_RECALIBRATED, 8)
    assert decision.speedup_after is not None and decision.speedup_before is not None
    assert decision.speedup_after >= 1.05 * decision.speedup_before

    [event] = _recalibrated(actions)
    assert event.type.value == "Normal"
    assert "[1–32: k 2] → [1–32: k 1]" in event.message and "batch 8" in event.message, event.message

    # The next pass plans from that status: the new table, rendered into the speculative Deployment.
    after = _after(body, actions)
    assert _table(after) == [(1, 32, 1)]
    plan = _planned(after).plan
    assert plan is not None
    argv = " ".join(engine_command(plan, Variant.SPECULATIVE, speculate=True).argv())
    assert '"num_speculative_tokens":1' in argv and "[[1,32,1]]" in argv, argv
    # A pass that finds the Deployments the old table rendered applies the new children; once applied, none.
    stale = dataclasses.replace(_observed(after), deployments=_observed(body).deployments)
    assert decide(stale, LATER + timedelta(seconds=30)).children is not None
    assert decide(_observed(after), LATER + timedelta(seconds=30)).children is None


def test_the_same_sample_again_changes_nothing_and_raises_no_second_event() -> None:
    body = _speculating()
    first = _after(body, decide(_observed(body, _measured(0.3)), LATER))
    again = decide(_observed(first, _measured(0.3)), LATER + timedelta(seconds=30))
    assert _recalibrated(again) == []
    before, now = _previous(first).speculation, again.status.speculation
    assert before is not None and now is not None and before.calibration is not None and now.calibration is not None
    assert now.calibration.positions == before.calibration.positions
    assert now.calibration.schedule == before.calibration.schedule and now.calibration.changes == 1
    assert now.calibration.last_decision is not None
    assert (now.calibration.last_decision.kind, now.calibration.last_decision.reason) == ("Kept", "SameSchedule")
    # and so on: a third pass writes nothing new
    third_body = _after(first, again)
    third = decide(_observed(third_body, _measured(0.3)), LATER + timedelta(seconds=60))
    assert _recalibrated(third) == [] and third.status.speculation == _previous(third_body).speculation


def test_a_fixed_schedule_is_never_calibrated() -> None:
    body = _speculating(mode="Fixed")
    actions = decide(_observed(body, _measured(0.3)), LATER)
    assert actions.status.speculation is not None and actions.status.speculation.calibration is None
    assert _recalibrated(actions) == []
    assert _table(_after(body, actions)) == [(1, 32, 5)]


def test_a_switch_from_auto_to_fixed_drops_the_calibration() -> None:
    body = _speculating()
    after = _after(body, decide(_observed(body, _measured(0.3)), LATER))
    fixed = _body(mode="Fixed", status=_previous(after))
    actions = decide(_observed(fixed, _measured(0.3)), LATER + timedelta(seconds=30))
    assert actions.status.speculation is not None and actions.status.speculation.calibration is None
    assert _table(_after(fixed, actions)) == [(1, 32, 5)] and _recalibrated(actions) == []


def test_a_restart_renders_the_table_the_status_records() -> None:
    body = _speculating()
    after = _after(body, decide(_observed(body, _measured(0.3)), LATER))
    restarted = SpeculativeDeploymentStatus.model_validate(json.loads(json.dumps(after["status"])))
    speculation = restarted.speculation
    assert speculation is not None and speculation.calibration is not None
    recorded = [(e.min_batch, e.max_batch, e.k) for e in speculation.calibration.schedule]
    plan = make_plan(_resource(after).spec, calibration=speculation.calibration)
    assert _table(plan) == recorded == _table(after)
    assert plan.schedule is not None and plan.schedule.acceptance_measured


def test_a_change_within_the_minimum_period_is_kept_and_says_until_when() -> None:
    body = _speculating()
    soon = T0 + timedelta(seconds=MIN_PERIOD_SECONDS / 2)
    actions = decide(_observed(body, _measured(0.3)), soon)
    assert _recalibrated(actions) == []
    calibration = actions.status.speculation.calibration if actions.status.speculation else None
    assert calibration is not None and calibration.positions == [] and calibration.changes == 0
    decision = calibration.last_decision
    assert decision is not None and (decision.kind, decision.reason) == ("Kept", "WithinMinimumPeriod")
    assert decision.earliest_change_at == "2026-11-29T10:30:00Z"
    assert _table(_after(body, actions)) == [(1, 32, 2)]        # the prior's table stays


def test_too_few_drafts_keep_the_prior() -> None:
    body = _speculating()
    actions = decide(_observed(body, _measured(0.3, drafts=500)), LATER)
    calibration = actions.status.speculation.calibration if actions.status.speculation else None
    assert calibration is not None and calibration.last_decision is not None
    assert calibration.last_decision.reason == "TooFewDrafts" and calibration.positions == []
    assert _recalibrated(actions) == []


def test_positions_measured_for_another_speculation_are_not_used() -> None:
    body = _speculating()
    after = _after(body, decide(_observed(body, _measured(0.3)), LATER))
    assert _table(after) == [(1, 32, 1)]
    changed = _body(k=4, status=_previous(after))               # the user changed numSpeculativeTokens
    spec = _resource(changed).spec
    calibration = _previous(changed).speculation.calibration  # type: ignore[union-attr]
    assert calibration is not None and calibration.key != calibration_key(spec)
    assert calibrated_acceptance(spec, calibration) is None
    assert _table(changed) == _table(make_plan(spec))           # the prior again


def test_calibration_key_ignores_the_pinned_revision() -> None:
    spec = _resource(_body()).spec
    draft = spec.speculation.draft
    assert draft is not None
    pinned = spec.model_copy(update={"speculation": spec.speculation.model_copy(
        update={"draft": draft.model_copy(update={"revision": "0" * 40})})})
    assert calibration_key(pinned) == calibration_key(spec)


def test_step_speculation_without_a_plan_calibrates_nothing() -> None:
    body = _speculating()
    previous = _previous(body)
    step = step_speculation(_resource(body), previous.speculation, previous.analysis, True, _measured(0.3), [], LATER)
    assert step.recalibrated is None and step.speculation.calibration is None


# -- the rollback under a schedule names the load it happened at --------------------------------------------


def _judged(body: dict[str, Any], sample_: DeploymentSample, failure_limit: int = 1) -> Any:
    """One analysis step of `body` (failureLimit 1 unless said) while it speculates, with the plan its pods run."""
    body["spec"]["analysis"]["failureLimit"] = failure_limit
    resource = _resource(body)
    previous = _previous(body)
    return step_speculation(resource, previous.speculation, previous.analysis, True, sample_, [], LATER,
                            plan=_planned(body).plan)


def test_a_rollback_under_an_auto_schedule_names_the_batch_and_the_k_the_table_drafts_there() -> None:
    regressed = sample(0.6, itl=0.03, control_itl=0.02, k=2, running=11.6)
    step = _judged(_speculating(), regressed)

    assert step.rollback is not None, step.verdict
    assert step.rollback.evidence.endswith(
        "; at 11.6 running requests per pod the schedule drafts k 2 (table 1–32: k 2)"), step.rollback.evidence
    assert step.speculation.last_rollback.evidence == step.rollback.evidence   # status and the Event say it


def test_a_rollback_under_a_fixed_schedule_says_nothing_of_a_table() -> None:
    regressed = sample(0.6, itl=0.03, control_itl=0.02, k=5, running=11.6)
    step = _judged(_speculating(mode="Fixed"), regressed)

    assert step.rollback is not None, step.verdict
    assert "schedule" not in step.rollback.evidence, step.rollback.evidence


@pytest.mark.parametrize(("running", "said"), [
    (3.2, "at 3.2 running requests per pod the schedule drafts k 3"),
    (0.4, "at 0.4 running requests per pod the schedule drafts k 3"),     # below the table: its first range
    (20.0, "at 20.0 running requests per pod the schedule drafts k 0, drafting off in the engine"),
    (40.0, "at 40.0 running requests per pod the schedule drafts k 0, drafting off in the engine"),  # above it
])
def test_the_load_a_table_was_judged_at_is_named_with_its_k(running: float, said: str) -> None:
    body = _body(mode="Table")
    body["spec"]["speculation"]["schedule"]["table"] = [{"minBatch": 1, "maxBatch": 8, "k": 3},
                                                       {"minBatch": 9, "maxBatch": 32, "k": 0}]
    plan = _planned(body).plan
    where = schedule_at_load(plan, sample(0.6, k=3, running=running))
    assert where == f"{said} (table 1–8: k 3, 9–32: k 0)"


# -- a loss no schedule fixes: measured slower, and no k pays at the measured acceptance -------------------


def _window(alpha: float, itl: float, drafts: float = 20_000) -> DeploymentSample:
    """A window at 8 running sequences a pod, the control at 20 ms per token, positions 1–2 accepting α, α²."""
    return sample(alpha, itl=itl, control_itl=0.02, k=2, drafts=drafts, running=8.0,
                  positions={Signal.ACCEPTED_PER_POSITION: {1: drafts * alpha, 2: drafts * alpha**2}})


@pytest.mark.parametrize("mode", ["Auto", "Fixed"])
def test_measurably_slower_with_the_acceptance_surely_below_its_floor_is_rolled_back_under_the_ratio_limit(
        mode: str) -> None:
    """The acceptance's interval (0.10 over 20,000 drafts) lies below the floor (0.25 at k 2): the verdict's own
    SlowerBelowAcceptanceFloor (judgment/verdict.py) names the loss before NoSchedulePays is asked, under any k."""
    step = _judged(_speculating(mode=mode), _window(0.1, itl=0.021))     # +5%: under maxPerTokenLatencyRatio 1.10

    assert step.rollback is not None and step.rollback.reason.value == "SlowerBelowAcceptanceFloor", step.verdict
    assert step.verdict.evidence.startswith("per-token latency +5% (95% interval +4%…+6%) vs the control, slower "
                                            "beyond noise"), step.verdict
    # A loss measured on per-token latency is the noise failureLimit counts: one sample does not decide.
    assert _judged(_speculating(mode=mode), _window(0.1, itl=0.021), failure_limit=3).rollback is None


@pytest.mark.parametrize(("mode", "alpha", "itl", "drafts", "why"), [
    ("Auto", 0.6, 0.021, 20_000, "the measured acceptance pays at some k: calibration's to fix, not a rollback"),
    ("Auto", 0.1, 0.0195, 20_000, "not slower than the control"),
    ("Auto", 0.1, 0.0201, 20_000, "slower within noise: the interval reaches 1"),
    ("Auto", 0.1, 0.021, 400, "too few drafts to know the acceptance (calibration's evidence rule)"),
])
def test_no_schedule_pays_needs_a_measured_loss_a_known_acceptance_and_an_auto_schedule(
        mode: str, alpha: float, itl: float, drafts: float, why: str) -> None:
    step = _judged(_speculating(mode=mode), _window(alpha, itl, drafts))

    assert step.rollback is None, why
    assert step.analysis.verdict_reason != "NoSchedulePays", why


def test_a_verdict_already_failing_keeps_its_own_reason() -> None:
    step = _judged(_speculating(), _window(0.1, itl=0.03))      # +50%: above the 1.10 limit

    assert step.rollback is not None and step.rollback.reason.value == "InterTokenLatencyRegressed"


@pytest.mark.parametrize(("table", "running", "k"), [
    ([(1, 8, 3), (9, 32, 1)], 4.0, 3),
    ([(1, 8, 3), (9, 32, 1)], 20.0, 1),
    ([(1, 8, 3), (9, 32, 0)], 20.0, 3),       # drafting off there: the window's drafts were made below it
])
def test_the_acceptance_floor_under_a_table_is_the_break_even_of_the_k_drafted_at_the_pods_batch(
        table: list[tuple[int, int, int]], running: float, k: int) -> None:
    body = _body(mode="Table")
    body["spec"]["speculation"]["schedule"]["table"] = [{"minBatch": lo, "maxBatch": hi, "k": kk}
                                                       for lo, hi, kk in table]
    step = _judged(_after(body, decide(_observed(body), T0)), sample(0.6, k=k, running=running))

    basis = step.analysis.acceptance_floor_basis
    assert f"k={k} " in basis, basis
    assert f"at batch {round(running)} " in basis, basis


def test_the_acceptance_floor_of_a_fixed_schedule_is_at_numspeculativetokens() -> None:
    step = _judged(_speculating(mode="Fixed"), sample(0.6, k=5, running=20.0))
    assert "k=5 " in step.analysis.acceptance_floor_basis


# -- when acceptance moves within the window: the latest slice's counts, and a loss the model states ----------------

LATEST_JITTER = (0.0,) * 9 + (0.6,)
"""The speculative pods' per-token latency steady through the window, then 60% up in its latest slice."""


def _shifted(alpha_before: float, alpha_now: float, itl: float = 0.014, latest_jitter: tuple[float, ...] = LATEST_JITTER,
             drafts: float = 200_000, latest_drafts: float = 20_000) -> DeploymentSample:
    """A window at 8 running sequences a pod whose drafts accepted `alpha_before` per position (α, α²) until its
    latest slice and `alpha_now` in it; per-token latency `itl` (the control at 20 ms) × (1 + latest_jitter[i])."""
    before = drafts - latest_drafts

    def counts(alpha: float, n: float) -> dict[int, float]:
        return {1: n * alpha, 2: n * alpha**2}

    window = {p: a + b for (p, a), b in zip(counts(alpha_before, before).items(), counts(alpha_now, latest_drafts).values(),
                                            strict=True)}
    found = sample(alpha_now, itl=itl, control_itl=0.02, k=2, drafts=drafts, running=8.0, latest_drafts=latest_drafts,
                   positions={Signal.ACCEPTED_PER_POSITION: window,
                              Signal.LATEST_ACCEPTED_PER_POSITION: counts(alpha_now, latest_drafts)})
    spec = dataclasses.replace(found.speculative, series={
        **found.speculative.series,
        **dict(zip((Signal.INTER_TOKEN_LATENCY_SUM_SERIES, Signal.INTER_TOKEN_LATENCY_COUNT_SERIES),
                   cumulative(itl, 500, latest_jitter), strict=True))})
    return dataclasses.replace(found, speculative=spec)


def test_acceptance_that_turned_in_the_latest_slice_fails_at_once_on_the_models_loss_and_the_latest_slice() -> None:
    """The window still says 0.6 and 30% faster; its latest slice says 0.1 and slower than the control. At 0.1 the
    table's k 2 is predicted at 0.75×, and no k pays (k 1: 0.88×)."""
    step = _judged(_speculating(), _shifted(0.6, 0.1))

    assert step.rollback is not None and step.rollback.reason.value == "NoSchedulePays", step.verdict
    said = step.verdict.evidence
    assert said.startswith("position 1's acceptance moved from 0.60 ± 0.002 over the rest of the window to 0.10 ± "
                           "0.004 in its last 30 s; at the acceptance measured per draft position (0.10, 0.01, 0.00, "
                           "0.00, 0.00; 20,000 drafts) the schedule's k 2 is predicted at 0.75× of no speculation and "
                           "no k pays at 8 running requests per pod: the best, k 1, is predicted at 0.88× of no "
                           "speculation; in the window's latest slice per-token latency was +"), said
    assert said.endswith("still mixes slices from before) — a loss no schedule fixes"), said
    # Counts of 20,000 drafts, a loss beyond the model's error, the latest slice agreeing: not the noise failureLimit
    # guards against, so the default's 3 in a row are not waited for.
    default = _judged(_speculating(), _shifted(0.6, 0.1), failure_limit=3)
    assert default.rollback is not None and default.rollback.evidence.startswith(
        "a loss the cost model states beyond its error, confirmed by the latest slice: this sample decides, not "
        "failureLimit 3; position 1's acceptance moved"), default.rollback


@pytest.mark.parametrize(("alpha_now", "latest_jitter", "why"), [
    (0.1, (0.0,) * 10, "the latest slice is faster than the control: the measurement contradicts the model"),
    (0.5, LATEST_JITTER, "at 0.5 k 2 pays: a table's to follow, not a loss"),
])
def test_a_loss_the_model_states_needs_the_latest_slice_to_agree_and_no_k_to_pay(
        alpha_now: float, latest_jitter: tuple[float, ...], why: str) -> None:
    step = _judged(_speculating(), _shifted(0.6, alpha_now, latest_jitter=latest_jitter))

    assert step.rollback is None, why
    assert step.analysis.verdict_reason != "NoSchedulePays", why


def test_a_loss_within_the_models_error_is_left_to_the_measurement() -> None:
    """The table runs k 1 (calibrated at α 0.3); at α 0.2 it is predicted at 0.99×, within the model's ±5%: no k
    pays, but only a measured loss (the window's interval above 1) makes that a failure."""
    body = _speculating()
    body = _after(body, decide(_observed(body, _measured(0.3)), LATER))
    assert _table(body) == [(1, 32, 1)]
    step = _judged(body, _shifted(0.6, 0.2))

    assert step.rollback is None and step.analysis.verdict_reason != "NoSchedulePays", step.verdict


def test_calibration_follows_the_latest_slice_when_acceptance_moved_and_says_so() -> None:
    """0.6 over the window's first 4.5 minutes, 0.3 in its last 30 s: the window's blend (0.57) derives the table
    running; the latest slice derives k 1, and the decision names the move."""
    body = _speculating()
    found = _shifted(0.6, 0.3, latest_jitter=(0.0,) * 10)
    actions = decide(_observed(body, found), LATER)

    calibration = actions.status.speculation.calibration if actions.status.speculation else None
    assert calibration is not None and calibration.changes == 1
    assert [(e.min_batch, e.max_batch, e.k) for e in calibration.schedule] == [(1, 32, 1)]
    assert calibration.positions[0].rate == pytest.approx(0.3)
    assert "position 1's acceptance moved from 0.60" in calibration.last_decision.message


def test_a_steady_acceptance_is_read_over_the_whole_window() -> None:
    """The latest slice within noise of the rest: the window's counts, ten times the drafts."""
    found = _shifted(0.6, 0.595, latest_jitter=(0.0,) * 10)
    measured = acceptance_now(found.position_counts, found.latest_position_counts)
    assert measured.shift is None and measured.counts == found.position_counts


def test_a_latest_slice_too_thin_to_calibrate_from_leaves_the_window() -> None:
    found = _shifted(0.6, 0.1, latest_drafts=500)
    measured = acceptance_now(found.position_counts, found.latest_position_counts)
    assert measured.shift is None and measured.counts == found.position_counts


def test_a_change_under_an_applied_hardware_fit_records_its_factor_and_the_next_plan_renders_that_models_table() -> None:
    """The hardware fit prices what calibration derives (judgment/hardware.py): the table a change writes is the fitted
    model's, the factor is recorded beside the positions, and the next plan renders that table, not the prior's."""
    from specdeploy.api.status import AnalysisStatus, HardwareFit

    body = _speculating()
    body["spec"]["serving"]["maxNumSeqs"] = 256
    fit = HardwareFit(factor=1.4, factor_half_width=0.02, prior_error=0.09, applied_factor=1.4, batch=8.0,
                      measured_step_seconds=0.01, prior_step_seconds=0.007, fitted_step_seconds=0.01, slices=6,
                      message="fitted")
    status = _previous(body)
    body["status"] = status.model_copy(update={"analysis": AnalysisStatus(hardware_fit=fit)}).to_wire()
    assert _table(body) == [(1, 39, 2), (40, 256, 1)]          # the prior's table, as rendered
    actions = decide(_observed(body, _measured(0.9, positions=1)), LATER)
    calibration = actions.status.speculation.calibration if actions.status.speculation else None
    assert calibration is not None and calibration.changes == 1 and calibration.hardware_factor == 1.4
    recorded = [(e.min_batch, e.max_batch, e.k) for e in calibration.schedule]
    after = _after(body, actions)
    assert _table(after) == recorded
    prior_model = make_plan(_resource(after).spec, calibration=calibration.model_copy(update={"hardware_factor": None}))
    assert _table(prior_model) != recorded       # the same positions under the prior cost model: another table


def test_an_applied_hardware_fit_prices_the_acceptance_floor_from_the_next_sample() -> None:
    from specdeploy.api.status import AnalysisStatus, HardwareFit

    body = _speculating()
    fit = HardwareFit(factor=2.0, factor_half_width=0.02, prior_error=0.09, applied_factor=2.0, batch=8.0,
                      measured_step_seconds=0.014, prior_step_seconds=0.007, fitted_step_seconds=0.014, slices=6,
                      message="fitted")
    fitted_body = {**body, "status": _previous(body).model_copy(
        update={"analysis": AnalysisStatus(hardware_fit=fit)}).to_wire()}
    floors = []
    for judged in (body, fitted_body):
        analysis = decide(_observed(judged, _measured(0.6)), LATER).status.analysis
        assert analysis is not None and analysis.acceptance_floor is not None
        floors.append(analysis.acceptance_floor)
    plan = _planned(body).plan
    assert plan is not None and plan.schedule is not None
    k = plan.schedule.k_at(8)
    expected = [plan.with_hardware_factor(factor).acceptance_floor(8.0, k) for factor in (None, 2.0)]
    assert floors == [round(found.rate, 3) for found in expected if found is not None]
    assert floors[0] != floors[1]
