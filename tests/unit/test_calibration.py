"""Calibration of the Auto schedule (judgment/calibration.py): the evidence rule, the monotone acceptance, and when a
re-derived table is rolled — all at the module's own constants."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_fixtures import LLAMA_1B, LLAMA_8B, LLAMA_70B

from specdeploy.api.reasons import CalibrationReason
from specdeploy.api.spec import Method, ScheduleMode, SpeculativeDeploymentSpec
from specdeploy.api.status import PositionSource
from specdeploy.judgment.calibration import (
    MAX_HALF_WIDTH,
    MIN_DRAFTS,
    MIN_PERIOD_SECONDS,
    MIN_RELATIVE_GAIN,
    Z_95,
    CalibrationDecision,
    acceptance_per_position,
    calibrate,
    evidence_of,
    non_increasing,
)
from specdeploy.judgment.samples import PositionCounts
from specdeploy.modelsource.resolve import ArchitectureSource, Origin, ResolvedModel, ResolvedModels
from specdeploy.planning.acceptance import prior_position_acceptance
from specdeploy.planning.modelinfo import ModelInfo
from specdeploy.planning.plan import Plan, make_plan
from specdeploy.planning.schedule import SpeculationSchedule

DOCS = Path(__file__).resolve().parents[2] / "docs" / "speedup-model.md"
K = 4
MAX_NUM_SEQS = 256
T0 = 1_767_225_600.0                  # the last change
LATER = T0 + 2 * MIN_PERIOD_SECONDS   # well past the minimum period


def plan_of(target: ModelInfo, draft: ModelInfo, tp: int) -> Plan:
    """The plan of `target` with `draft` on `tp` H100s, the models as given (the judgment asks it, not a cost)."""
    spec = SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": "vllm"},
        "model": {"name": target.name},
        "speculation": {"method": "draft_model", "numSpeculativeTokens": K, "draft": {"name": draft.name},
                        "schedule": {"mode": "Auto"}},
        "resources": {"gpu": {"product": "H100-80GB"}, "tensorParallelSize": tp},
        "serving": {"maxModelLen": 8192, "maxNumSeqs": MAX_NUM_SEQS, "maxNumBatchedTokens": 8192},
    })
    def resolved(info: ModelInfo) -> ResolvedModel:
        return ResolvedModel(info, Origin(ArchitectureSource.SPEC, info.name, None, location="model_fixtures"))

    return make_plan(spec, ResolvedModels(resolved(target), resolved(draft)))


# Llama-3.1-70B with a Llama-3.1-8B draft on 4×H100: at the draft-model prior (α 0.6) the schedule drafts 2, then 1.
PLAN = plan_of(LLAMA_70B, LLAMA_8B, 4)
PRIOR = prior_position_acceptance(Method.DRAFT_MODEL, K)


def auto(acceptance: tuple[float, ...] = PRIOR, plan: Plan = PLAN) -> SpeculationSchedule:
    return plan.derive_schedule(acceptance)


CURRENT = auto()


def geometric(alpha: float, k: int = K) -> tuple[float, ...]:
    return tuple(alpha**i for i in range(1, k + 1))


def counts(rates: tuple[float, ...], drafts: float = 100_000) -> PositionCounts:
    """vLLM's counters: drafts as a whole, and per position the drafts that got that far."""
    return PositionCounts(drafts, tuple(float(round(drafts * rate)) for rate in rates))


def run(measured: PositionCounts | None, current: SpeculationSchedule = CURRENT, *, batch: float = 8,
        since_change: float = LATER - T0, plan: Plan = PLAN) -> CalibrationDecision:
    return calibrate(measured, current, plan, max_k=K, max_num_seqs=MAX_NUM_SEQS, batch=batch,
                     last_change_at=T0, now=T0 + since_change)


def k_at(decision: CalibrationDecision, batch: int) -> int:
    assert decision.schedule is not None
    return next(r.k for r in decision.schedule if r.min_batch <= batch <= r.max_batch)


def test_the_defaults_are_the_documented_ones() -> None:
    assert (MIN_DRAFTS, MAX_HALF_WIDTH, MIN_RELATIVE_GAIN, MIN_PERIOD_SECONDS) == (1000, 0.02, 0.05, 1800.0)
    text = DOCS.read_text()
    section = text[text.index("## Calibration of the Auto schedule"):text.index("## Known limits")]
    for stated in ("at least 1 000 drafts", "at most 0.02", "at least 5%", "at least 30 minutes", "2 401 drafts"):
        assert stated in " ".join(section.split()), stated
    assert [(r.min_batch, r.max_batch, r.k) for r in CURRENT.ranges] == [(1, 48, 2), (49, 256, 1)]


# --- the evidence rule ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("drafts", "rate", "enough"), [
    (2400, 0.5, False),     # 95% half-width 0.020004: the widest case needs 2 401 drafts
    (2401, 0.5, True),
    (1800, 0.75, False),
    (1801, 0.75, True),
    (999, 0.99, False),     # the interval (±0.006) is narrow but a thousand drafts are needed whatever it says
    (1000, 0.99, True),
    (1000, 0.5, False),
])
def test_position_1_must_be_known_to_two_hundredths_from_a_thousand_drafts(drafts: int, rate: float,
                                                                           enough: bool) -> None:
    measured = PositionCounts(drafts, (drafts * rate, drafts * rate**2))
    evidence = evidence_of(measured)
    assert evidence.half_width == pytest.approx(Z_95 * math.sqrt(rate * (1 - rate) / drafts))
    assert evidence.enough is enough
    decision = run(PositionCounts(drafts, tuple(drafts * r for r in geometric(rate))))
    assert (decision.reason == CalibrationReason.TOO_FEW_DRAFTS) is not enough
    if not enough:
        assert not decision.change and decision.schedule is None and decision.evidence == evidence


@given(drafts=st.integers(0, MIN_DRAFTS - 1), alpha=st.floats(0.0, 1.0), batch=st.floats(1, MAX_NUM_SEQS))
@settings(max_examples=50, deadline=None)
def test_too_few_drafts_keep_the_schedule_whatever_they_say(drafts: int, alpha: float, batch: float) -> None:
    decision = run(PositionCounts(drafts, tuple(drafts * r for r in geometric(alpha))) if drafts else None,
                   batch=batch)
    assert not decision.change
    assert decision.reason in (CalibrationReason.TOO_FEW_DRAFTS, CalibrationReason.NO_POSITION_COUNTS)


def test_without_counts_per_position_there_is_nothing_to_calibrate() -> None:
    """SGLang exports an accept length only (DeploymentSample.position_counts is None)."""
    assert run(None) == CalibrationDecision(False, CalibrationReason.NO_POSITION_COUNTS)


def test_fixed_and_table_schedules_are_the_users() -> None:
    fixed = dataclasses.replace(CURRENT, mode=ScheduleMode.FIXED)
    table = dataclasses.replace(CURRENT, mode=ScheduleMode.TABLE)
    for current in (fixed, table):
        assert run(counts(geometric(0.1)), current) == CalibrationDecision(False, CalibrationReason.NOT_AUTO)


def test_every_position_states_its_binomial_standard_error() -> None:
    decision = run(counts(geometric(0.2), drafts=10_000))
    for estimate in decision.positions:
        assert estimate.measured_rate is not None and estimate.standard_error is not None
        p = estimate.accepted / estimate.drafted
        assert estimate.standard_error == pytest.approx(math.sqrt(p * (1 - p) / estimate.drafted))


# --- what changes and what does not ---------------------------------------------------------------------------------


def test_acceptance_collapsing_moves_the_table_to_lower_k_and_to_0_where_it_stops_paying() -> None:
    decision = run(counts(geometric(0.25)), batch=32)
    assert decision.change and decision.reason is None
    assert decision.schedule is not None
    assert [(r.min_batch, r.max_batch, r.k) for r in decision.schedule] == [(1, 184, 1), (185, 256, 0)]
    for compared in decision.comparison:
        assert compared.k_after <= compared.k_before
    # At the observed batch the running table drafts 2, the new one 1: 13% faster under the measured acceptance.
    assert decision.batch == 32
    assert decision.speedup_before == pytest.approx(PLAN.predicted_speedup(geometric(0.25), 32, 2))
    assert decision.speedup_after == pytest.approx(PLAN.predicted_speedup(geometric(0.25), 32, 1))
    assert decision.gain == pytest.approx(decision.speedup_after / decision.speedup_before - 1)
    assert decision.gain >= MIN_RELATIVE_GAIN


def test_past_the_new_break_even_a_table_that_still_loses_there_is_not_rolled() -> None:
    """At batch 250 the derived table's k = 0 (0.8×, vLLM's cost of a step that drafts nothing) beats drafting
    k 1 (0.75×), but both lose to no speculation: the rollback's pods, not a new table, fix that load."""
    decision = run(counts(geometric(0.25)), batch=250)
    assert not decision.change and decision.reason == CalibrationReason.LOSES_AT_LOAD
    assert k_at(decision, 250) == 0
    assert decision.speedup_after == pytest.approx(0.8)             # planning.schedule.ZERO_K_SPEEDUP
    assert decision.speedup_before is not None and decision.speedup_before < 0.8 / (1 + MIN_RELATIVE_GAIN)
    assert decision.gain is not None and decision.gain >= MIN_RELATIVE_GAIN


def test_unchanged_acceptance_keeps_the_table() -> None:
    decision = run(counts(PRIOR))
    assert not decision.change and decision.reason == CalibrationReason.SAME_SCHEDULE
    assert decision.schedule == CURRENT.ranges and decision.gain == 0.0


@given(noise=st.lists(st.floats(-MAX_HALF_WIDTH, MAX_HALF_WIDTH), min_size=K, max_size=K),
       batch=st.integers(1, MAX_NUM_SEQS))
@settings(max_examples=60, deadline=None)
def test_the_prior_measured_within_its_uncertainty_never_churns(noise: list[float], batch: int) -> None:
    """Counts that say the prior up to the noise the evidence rule allows: a boundary may move, but the gain at any
    batch stays under the minimum, so nothing rolls."""
    rates = tuple(min(max(rate + delta, 0.0), 1.0) for rate, delta in zip(PRIOR, noise, strict=True))
    decision = run(counts(rates), batch=batch)
    assert not decision.change
    assert decision.reason in (CalibrationReason.SAME_SCHEDULE, CalibrationReason.GAIN_BELOW_MINIMUM)


def test_a_new_table_that_gains_nothing_at_the_observed_batch_is_kept() -> None:
    """Both tables draft 1 at batch 100: the change would restart pods for nothing there."""
    decision = run(counts(geometric(0.25)), batch=100)
    assert not decision.change and decision.reason == CalibrationReason.GAIN_BELOW_MINIMUM
    assert decision.gain == 0.0 and decision.schedule is not None and decision.schedule != CURRENT.ranges


@pytest.mark.parametrize(("alpha", "k_after", "gain", "change"), [
    (0.7, 3, 0.017, False),     # a better draft earns a third token at batch 1: 1.7% faster, not worth a restart
    (0.3, 1, 0.085, True),      # a worse one loses the second: 8.5% faster with one
])
def test_the_gain_at_the_observed_batch_must_reach_five_percent(alpha: float, k_after: int, gain: float,
                                                                change: bool) -> None:
    decision = run(counts(geometric(alpha)), batch=1)
    assert decision.schedule != CURRENT.ranges and k_at(decision, 1) == k_after
    assert decision.gain == pytest.approx(gain, abs=0.0005)
    assert decision.change is change
    assert decision.reason == (None if change else CalibrationReason.GAIN_BELOW_MINIMUM)


def test_a_change_waits_out_the_minimum_period_and_says_until_when() -> None:
    early = run(counts(geometric(0.25)), batch=32, since_change=MIN_PERIOD_SECONDS - 1)
    assert not early.change and early.reason == CalibrationReason.WITHIN_MINIMUM_PERIOD
    assert early.earliest_change_at == T0 + MIN_PERIOD_SECONDS
    on_time = run(counts(geometric(0.25)), batch=32, since_change=MIN_PERIOD_SECONDS)
    assert on_time.change and on_time.earliest_change_at is None
    assert early.schedule == on_time.schedule and early.gain == on_time.gain     # what would roll, said before


@given(alpha=st.floats(0.0, 1.0), batch=st.integers(1, MAX_NUM_SEQS),
       since=st.floats(0.0, MIN_PERIOD_SECONDS - 0.001))      # Unix times near 1.8e9 resolve 0.2 µs
@settings(max_examples=60, deadline=None)
def test_nothing_changes_within_the_minimum_period(alpha: float, batch: int, since: float) -> None:
    assert not run(counts(geometric(alpha)), batch=batch, since_change=since).change


@given(alpha=st.floats(0.0, 1.0), batch=st.floats(0.0, 400.0), since=st.floats(0.0, 4 * MIN_PERIOD_SECONDS))
@settings(max_examples=80, deadline=None)
def test_a_change_is_always_material_evidenced_and_out_of_the_period(alpha: float, batch: float,
                                                                      since: float) -> None:
    decision = run(counts(geometric(alpha)), batch=batch, since_change=since)
    assert decision.change is (decision.reason is None)
    if decision.change:
        assert decision.evidence is not None and decision.evidence.enough
        assert decision.gain is not None and decision.gain >= MIN_RELATIVE_GAIN
        assert since >= MIN_PERIOD_SECONDS
        assert decision.schedule is not None and decision.schedule != CURRENT.ranges
    if decision.schedule is not None:      # the comparison covers 1..maxNumSeqs, range after range
        assert decision.comparison[0].min_batch == 1 and decision.comparison[-1].max_batch == MAX_NUM_SEQS
        for low, high in zip(decision.comparison, decision.comparison[1:], strict=False):
            assert high.min_batch == low.max_batch + 1
        assert decision.batch is not None and 1 <= decision.batch <= MAX_NUM_SEQS


def test_acceptance_that_pays_at_no_batch_size_is_left_to_the_rollback() -> None:
    """A draft as large as the target: nothing drafted pays once acceptance collapses, and a table of k = 0 would
    still pay k = 0's cost on every step — that is an acceptance collapse, the rollback's to handle."""
    heavy = plan_of(LLAMA_8B, LLAMA_8B, 1)
    current = auto(geometric(0.95), heavy)
    assert current.largest_k > 0
    decision = run(counts(geometric(0.05)), current, plan=heavy)
    assert not decision.change and decision.reason == CalibrationReason.NEVER_PAYS
    assert decision.schedule is not None and all(r.k == 0 for r in decision.schedule)


def test_recovered_acceptance_raises_k_again_past_the_positions_the_running_table_drafts() -> None:
    """After a collapse the table drafts at most 1, so vLLM counts nothing at positions 2..4: they are unknown, not
    0. Extrapolated from position 1, a recovered acceptance earns its k back."""
    collapsed = auto(geometric(0.2))
    assert collapsed.largest_k == 1
    recovered = PositionCounts(100_000, (80_000.0, 0.0, 0.0, 0.0))
    decision = run(recovered, collapsed, batch=4)
    assert decision.change and k_at(decision, 4) > 1
    assert [p.source for p in decision.positions] == [PositionSource.MEASURED] + [PositionSource.EXTRAPOLATED] * 3
    assert decision.acceptance == pytest.approx(geometric(0.8))


# --- the acceptance per position ------------------------------------------------------------------------------------


def test_vllm_positions_past_the_smallest_k_drafted_are_extrapolated() -> None:
    """The running table drafts 2 at small batches and 1 above: every vLLM draft counted proposed position 1, only
    some position 2, so position 2's count over all drafts is a lower bound and is not used."""
    measured = PositionCounts(100_000, (70_000.0, 20_000.0, 0.0, 0.0))
    positions = acceptance_per_position(measured, CURRENT, K)
    assert [p.source for p in positions] == [PositionSource.MEASURED] + [PositionSource.EXTRAPOLATED] * 3
    assert [p.rate for p in positions] == pytest.approx(geometric(0.7))
    assert positions[1].measured_rate == pytest.approx(0.2)


def test_trtllm_positions_are_measured_on_their_own_drafts() -> None:
    measured = PositionCounts(50_000, (40_000.0, 12_000.0, 500.0, 0.0), drafted=(50_000.0, 20_000.0, 900.0, 0.0))
    positions = acceptance_per_position(measured, CURRENT, K)
    # position 3 has fewer than MIN_DRAFTS drafts: extrapolated from position 2's conditional 0.6 / 0.8
    assert [p.source for p in positions] == [PositionSource.MEASURED] * 2 + [PositionSource.EXTRAPOLATED] * 2
    assert [p.rate for p in positions] == pytest.approx((0.8, 0.6, 0.45, 0.3375))
    assert positions[3].measured_rate is None and positions[3].standard_error is None


@pytest.mark.parametrize(("rates", "weights", "fitted"), [
    ((0.8, 0.6, 0.4), (1, 1, 1), (0.8, 0.6, 0.4)),            # already non-increasing: unchanged
    ((0.5, 0.6), (1, 1), (0.55, 0.55)),                       # a crossing pair pooled
    ((0.5, 0.6), (3, 1), (0.525, 0.525)),                     # … weighted by its drafts
    ((0.9, 0.5, 0.7, 0.2), (1, 1, 1, 1), (0.9, 0.6, 0.6, 0.2)),
    ((0.3, 0.4, 0.5), (1, 1, 1), (0.4, 0.4, 0.4)),            # pools merge backwards
])
def test_measured_rates_are_made_non_increasing_by_pooling(rates: tuple[float, ...], weights: tuple[float, ...],
                                                           fitted: tuple[float, ...]) -> None:
    assert non_increasing(rates, weights) == pytest.approx(fitted)


@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(1.0, 1e6)), min_size=1, max_size=8))
def test_the_monotone_fit_never_increases_and_keeps_the_weighted_total(pairs: list[tuple[float, float]]) -> None:
    rates, weights = [r for r, _ in pairs], [w for _, w in pairs]
    fitted = non_increasing(rates, weights)
    assert len(fitted) == len(rates)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(fitted, fitted[1:], strict=False))
    assert min(rates) - 1e-12 <= min(fitted) and max(fitted) <= max(rates) + 1e-12
    assert sum(f * w for f, w in zip(fitted, weights, strict=True)) == pytest.approx(
        sum(r * w for r, w in zip(rates, weights, strict=True)))
    if all(later <= earlier for earlier, later in zip(rates, rates[1:], strict=False)):
        assert fitted == tuple(rates)


@given(st.lists(st.floats(0.0, 1.0), min_size=K, max_size=K), st.lists(st.integers(MIN_DRAFTS, 10**6),
                                                                       min_size=K, max_size=K))
@settings(max_examples=60, deadline=None)
def test_the_acceptance_given_to_the_schedule_never_increases(rates: list[float], drafted: list[int]) -> None:
    """TensorRT-LLM's counts with their own drafts per position can cross; what derive_schedule gets never does."""
    measured = PositionCounts(drafted[0], tuple(r * n for r, n in zip(rates, drafted, strict=True)),
                              tuple(float(n) for n in drafted))
    acceptance = [p.rate for p in acceptance_per_position(measured, CURRENT, K)]
    assert all(0.0 <= rate <= 1.0 for rate in acceptance)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(acceptance, acceptance[1:], strict=False))


def test_the_decision_is_frozen_data() -> None:
    decision = run(counts(geometric(0.2)), batch=32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.change = False  # type: ignore[misc]


def test_a_small_draft_on_the_8b_target_is_calibrated_the_same_way() -> None:
    """The rule does not depend on the deployment: an 8B target with a 1B draft, lowered acceptance, small batch
    (α 0.3: k 1 still pays, 1.05×); collapsed further (α 0.1) the best table loses there (k 1 at 0.89×) and stays."""
    small = plan_of(LLAMA_8B, LLAMA_1B, 1)
    current = auto(PRIOR, small)
    decision = run(counts(geometric(0.3)), current, batch=4, plan=small)
    assert decision.change and k_at(decision, 4) < next(r.k for r in current.ranges if r.min_batch <= 4 <= r.max_batch)
    collapsed = run(counts(geometric(0.1)), current, batch=4, plan=small)
    assert not collapsed.change and collapsed.reason == CalibrationReason.LOSES_AT_LOAD
