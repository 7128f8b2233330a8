"""Observe mode and the pause annotation: the judgment runs and says what it would do, nothing is rolled back;
acting again decides on the failures already counted. And the deprecated names of the mean-ratio checks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from analysis_samples import T0
from test_decide import _after, _body, _failing, _observed, _pods

from specdeploy.api.spec import Checks
from specdeploy.api.status import VerdictKind
from specdeploy.reconcile.decide import PAUSED_ANNOTATION, Actions, decide, paused


def _two_failing(body: dict[str, Any]) -> tuple[dict[str, Any], Actions]:
    """Speculating, then two failing samples (failureLimit 2 in these SDs)."""
    first = decide(_observed(body, applied=False), T0)
    body = _after(body, first)
    body = _after(body, decide(_observed(body, pods=_pods(True)), T0))
    body = _after(body, decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=30)))
    return body, decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=60))


def _healthy_condition(actions: Actions) -> str:
    return next(c.message for c in actions.status.conditions if c.type == "SpeculationHealthy")


@pytest.mark.parametrize("analysis, annotations, holder", [
    ({"mode": "Observe"}, None, "spec.analysis.mode is Observe"),
    (None, {PAUSED_ANNOTATION: "2026-12-05T23:30:00Z"}, f"annotation {PAUSED_ANNOTATION}"),
])
def test_a_collapse_held_back_says_it_would_roll_back_and_rolls_nothing_back(
        analysis: dict[str, Any] | None, annotations: dict[str, str] | None, holder: str) -> None:
    _, actions = _two_failing(_body(analysis, annotations))
    assert actions.rollback is None and not actions.write_first and actions.notice is None
    speculation = actions.status.speculation
    assert speculation is not None and speculation.decided and speculation.rollbacks == 0
    assert speculation.last_rollback is None
    assert actions.would_roll_back is not None and actions.would_roll_back.reason.value == "InterTokenLatencyRegressed"
    analysis_status = actions.status.analysis
    assert analysis_status is not None and analysis_status.verdict == VerdictKind.FAILING
    assert analysis_status.consecutive_failures == 2
    message = _healthy_condition(actions)
    assert message.startswith("would roll back (InterTokenLatencyRegressed): 2 consecutive failing samples")
    assert holder in message
    assert actions.alert is not None and actions.alert["labels"]["observe"] == "true"
    assert actions.alert["labels"]["alertname"] == "SpeculationRolledBack"
    # Children keep speculating.
    assert actions.children is None or "--speculative-config" in str(actions.children.deployments)


def test_a_switch_to_act_rolls_back_at_the_next_failing_sample_on_the_failures_counted() -> None:
    body, observed = _two_failing(_body({"mode": "Observe"}))
    body = _after(body, observed)
    body["spec"]["analysis"]["mode"] = "Act"
    acting = decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=90))
    assert acting.rollback is not None and acting.write_first and acting.would_roll_back is None
    assert "3 consecutive failing samples" in acting.rollback.evidence
    assert acting.alert is None and acting.notice is not None and "observe" not in acting.notice.alert["labels"]


def test_a_healthy_or_failing_sample_under_observe_says_that_nothing_acts() -> None:
    body = _body({"mode": "Observe"})
    body = _after(body, decide(_observed(body, applied=False), T0))
    body = _after(body, decide(_observed(body, pods=_pods(True)), T0))
    once = decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=30))
    assert once.would_roll_back is None and once.alert is None
    assert _healthy_condition(once).startswith("spec.analysis.mode is Observe: nothing is rolled back. ")


@pytest.mark.parametrize("value, expected", [("true", True), ("2026-12-05", True), ("false", False), ("", False)])
def test_the_pause_annotation(value: str, expected: bool) -> None:
    assert paused({"metadata": {"annotations": {PAUSED_ANNOTATION: value}}}) is expected
    assert not paused({"metadata": {}})


# -- the mean-ratio checks under their names and their deprecated ones ------------------------------------

def test_the_checks_read_the_new_name_else_the_old_one_else_the_default() -> None:
    assert Checks().per_token_latency_ratio == 1.10 and Checks().deprecated_names() == []
    old = Checks.model_validate({"maxP99InterTokenLatencyRatio": 1.3, "maxP99E2ELatencyRatio": 1.4,
                                 "maxP99TimeToFirstTokenRatio": 1.6})
    assert (old.per_token_latency_ratio, old.inference_time_ratio, old.prefill_time_ratio) == (1.3, 1.4, 1.6)
    assert len(old.deprecated_names()) == 3 and "rename it maxPerTokenLatencyRatio" in old.deprecated_names()[0]
    both = Checks.model_validate({"maxPerTokenLatencyRatio": 1.2, "maxP99InterTokenLatencyRatio": 1.3})
    assert both.per_token_latency_ratio == 1.2
    assert both.deprecated_names() == ["`spec.analysis.checks.maxP99InterTokenLatencyRatio` is deprecated and "
                                       "ignored: maxPerTokenLatencyRatio 1.2 is used; remove "
                                       "maxP99InterTokenLatencyRatio"]


def test_the_old_name_decides_as_the_new_one_and_status_warns() -> None:
    old_body = _body({"checks": {"maxP99InterTokenLatencyRatio": 3.0}})
    new_body = _body({"checks": {"maxPerTokenLatencyRatio": 3.0}})
    # Twice the control's per-token latency: within a limit of 3.0 under either name.
    for body in (old_body, new_body):
        body = _after(body, decide(_observed(body, applied=False), T0))
        body = _after(body, decide(_observed(body, pods=_pods(True)), T0))
        actions = decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=30))
        assert actions.status.analysis is not None and actions.status.analysis.verdict_reason != (
            "InterTokenLatencyRegressed")
        warned = "maxP99InterTokenLatencyRatio` is deprecated" in _healthy_condition(actions)
        assert warned is (body["spec"]["analysis"]["checks"].get("maxP99InterTokenLatencyRatio") is not None)
