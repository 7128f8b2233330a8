"""The batch-size schedule (planning/schedule.py): what Auto derives, what a Table predicts, and what the plan does
with it (memory, findings, `plan -o json`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_fixtures import DEEPSEEK_V3, EAGLE3_8B, LLAMA_1B, LLAMA_8B, LLAMA_70B

from specdeploy.api.spec import Method, ScheduleMode, SpeculativeDeploymentSpec
from specdeploy.engines.base import BatchK
from specdeploy.planning.acceptance import (
    MTP_REUSED_ALPHA,
    expected_tokens_from_positions,
    expected_tokens_per_step,
    prior_position_acceptance,
)
from specdeploy.planning.compat import schedule_findings
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.memory import plan_memory
from specdeploy.planning.modelinfo import ModelInfo
from specdeploy.planning.plan import make_plan, plan_document
from specdeploy.planning.schedule import (
    ZERO_K_SPEEDUP,
    best_k_at,
    derive_schedule,
    schedule_cost,
    speculation_schedule,
    step_speedup,
    table_schedule,
)
from specdeploy.planning.speedup import KNEE, SpeculationCost, speculation_cost


def make_spec(method: str = "draft_model", draft: str | None = "meta-llama/Llama-3.2-1B-Instruct", *,
              model: str = "meta-llama/Llama-3.1-8B-Instruct", k: int = 5, max_num_seqs: int = 256,
              schedule: dict[str, Any] | None = None, engine: str = "vllm", tp: int = 1, gpu: str = "H100-80GB",
              **speculation: Any) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {
        "engine": {"kind": engine},
        "model": {"name": model},
        "speculation": {"method": method, "numSpeculativeTokens": k, **speculation},
        "resources": {"gpu": {"product": gpu}, "tensorParallelSize": tp},
        # maxModelLen 8192: the plan assumes 1,024 cached tokens per sequence (planning.speedup.context_tokens_for),
        # the measured table's context, so the worked examples are the table's.
        "serving": {"maxModelLen": 8192, "maxNumSeqs": max_num_seqs, "maxNumBatchedTokens": max(8192, max_num_seqs)},
    }
    if draft is not None:
        document["speculation"]["draft"] = {"name": draft}
    if schedule is not None:
        document["speculation"]["schedule"] = schedule
    return SpeculativeDeploymentSpec.model_validate(document)


def cost_of(target: ModelInfo, method: str, draft: ModelInfo | None, *, tp: int = 1,
            gpu: str = "H100-80GB") -> SpeculationCost:
    spec = make_spec(method, draft.name if draft is not None else None, model=target.name, tp=tp)
    product = find_gpu(gpu)
    assert product is not None
    return speculation_cost(spec, target, draft, product)


DENSE_COSTS = {
    "llama-8b + 1b draft": cost_of(LLAMA_8B, "draft_model", LLAMA_1B),
    "llama-70b + 8b draft, TP 4": cost_of(LLAMA_70B, "draft_model", LLAMA_8B, tp=4),
    "llama-8b + EAGLE-3": cost_of(LLAMA_8B, "eagle3", EAGLE3_8B),
    "llama-8b ngram": cost_of(LLAMA_8B, "ngram", None),
    "llama-70b ngram on L40S, TP 4": cost_of(LLAMA_70B, "ngram", None, tp=4, gpu="L40S"),
}
NGRAM_COSTS = {name: cost for name, cost in DENSE_COSTS.items() if "ngram" in name}


def geometric(alpha: float, k: int) -> list[float]:
    """Per-position acceptance of Leviathan's model: position i accepted with α^i."""
    return [alpha**i for i in range(1, k + 1)]


def k_at(ranges: tuple[Any, ...], batch: int) -> int:
    return next(r.k for r in ranges if r.min_batch <= batch <= r.max_batch)


# --- the worked example --------------------------------------------------------------------------------


def test_worked_example_llama_8b_with_a_1b_draft_on_h100() -> None:
    """Llama-3.1-8B-Instruct + Llama-3.2-1B-Instruct (draft_model), one H100-80GB, numSpeculativeTokens 5,
    maxNumSeqs 256, the draft_model prior per position for a draft 1:6.5 of its target (α 0.61, planning.acceptance
    draft_size_alpha), mode Auto:

        batch 1–39     k 2   1.34× → 1.29×
        batch 40–256   k 1   1.27× → 1.06×

    k 2 wins at small batches (the 1B draft costs 0.26 of a target step, so a third drafted token, accepted
    0.6³ = 22% of the time, does not pay for its pass); from 40 running sequences the verify pass of 3 tokens
    per sequence costs enough more than 2 that k 1 is better — the verify pass grows smoothly with the batch
    (measured on an H100: tests/data/h100-step-times.json), not only past a compute knee. It never reaches
    k = 0: at 256 sequences k 1 still gives 1.06× against vLLM's 0.80× for a step at k = 0. The engine starts
    with num_speculative_tokens 2 and the memory plan reserves for 2, not 5.
    """
    plan = make_plan(make_spec(schedule={"mode": "Auto"}))
    assert plan.schedule is not None and plan.schedule.mode == ScheduleMode.AUTO
    assert [(r.min_batch, r.max_batch, r.k) for r in plan.schedule.ranges] == [(1, 39, 2), (40, 256, 1)]
    speedups = [(r.speedup_at_min_batch, r.speedup_at_max_batch) for r in plan.schedule.ranges]
    assert speedups == [pytest.approx((1.34, 1.29), abs=0.01), pytest.approx((1.27, 1.06), abs=0.01)]
    assert plan.engine_schedule == (BatchK(1, 39, 2), BatchK(40, 256, 1))
    assert plan.schedule.largest_k == 2


def test_plan_json_carries_the_schedule() -> None:
    document = plan_document(make_plan(make_spec(schedule={"mode": "Auto"})))
    model_fields = ("modelSource", "modelError", "predictedSpeedupInterval", "predictedSpeedupAtMaxBatchInterval")
    assert [{k: v for k, v in entry.items() if k not in model_fields}
            for entry in document["speculationSchedule"]] == [
        {"minBatch": 1, "maxBatch": 39, "k": 2, "predictedSpeedup": pytest.approx(1.34, abs=0.01),
         "predictedSpeedupAtMaxBatch": pytest.approx(1.29, abs=0.01)},
        {"minBatch": 40, "maxBatch": 256, "k": 1, "predictedSpeedup": pytest.approx(1.27, abs=0.01),
         "predictedSpeedupAtMaxBatch": pytest.approx(1.06, abs=0.01)},
    ]


def test_fixed_is_the_default_and_renders_no_schedule() -> None:
    spec = make_spec()
    assert spec.speculation.schedule is None and spec.speculation.schedule_mode == ScheduleMode.FIXED
    assert "schedule" not in spec.speculation.to_wire(), "an older resource hashes as before"
    plan = make_plan(spec)
    assert plan.engine_schedule is None
    assert plan.schedule is not None and [(r.min_batch, r.max_batch, r.k) for r in plan.schedule.ranges] == [
        (1, 256, 5)]
    assert plan_document(plan)["speculationSchedule"][0]["k"] == 5


def test_without_speculation_there_is_no_schedule() -> None:
    plan = make_plan(make_spec(enabled=False))
    assert plan.schedule is None and plan_document(plan)["speculationSchedule"] is None


def test_a_larger_target_stops_drafting_where_no_k_pays() -> None:
    """Llama-3.1-70B + Llama-3.1-8B on 4 H100s at α 0.4: past about 350 running sequences even k 1 is predicted
    below a step at k = 0, so the schedule drafts 0 there."""
    ranges = derive_schedule(DENSE_COSTS["llama-70b + 8b draft, TP 4"], geometric(0.4, 5), 5, 2048)
    assert [r.k for r in ranges] == [1, 0]
    zero = ranges[-1]
    assert zero.max_batch == 2048 and zero.speedup_at_min_batch == zero.speedup_at_max_batch == ZERO_K_SPEEDUP
    assert 300 < zero.min_batch < 400


def test_tensorrt_llm_drafts_zero_where_no_k_beats_no_speculation_for_its_k_zero_is_free() -> None:
    """TensorRT-LLM skips the drafter past its schedule, so its k = 0 is no speculation (1.0×), not vLLM's 0.80×:
    the same 70B + 8B pair stops drafting where k 1 stops paying (about 205 sequences), and no range that drafts
    is predicted below 1×; vLLM's table keeps k 1 to 300 at a loss smaller than its k = 0 would cost."""
    def table(engine: str) -> tuple[Any, ...]:
        spec = make_spec(model=LLAMA_70B.name, draft=LLAMA_8B.name, k=3, max_num_seqs=300, tp=4, engine=engine,
                         schedule={"mode": "Auto"})
        schedule = speculation_schedule(spec, LLAMA_70B, schedule_cost(spec, LLAMA_70B, LLAMA_8B, find_gpu("H100-80GB")))
        return schedule.ranges

    vllm, trtllm = table("vllm"), table("trtllm")
    assert [r.k for r in vllm] == [2, 1] and [r.k for r in trtllm] == [2, 1, 0]
    assert 150 < trtllm[-1].min_batch < 300
    assert trtllm[-1].speedup_at_min_batch == 1.0
    assert all(r.speedup_at_max_batch >= 1.0 for r in trtllm if r.k > 0)
    assert ZERO_K_SPEEDUP < vllm[1].speedup_at_max_batch < 1.0   # vLLM drafts k 1 at a loss rather than pay its k = 0


# --- properties ------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(DENSE_COSTS)), st.floats(0.0, 0.97), st.integers(1, 8), st.integers(1, 3000))
def test_ranges_cover_every_batch_size_once_in_ascending_order(name: str, alpha: float, max_k: int,
                                                              max_num_seqs: int) -> None:
    ranges = derive_schedule(DENSE_COSTS[name], geometric(alpha, max_k), max_k, max_num_seqs)
    assert ranges[0].min_batch == 1 and ranges[-1].max_batch == max_num_seqs
    assert all(r.min_batch <= r.max_batch for r in ranges)
    assert all(b.min_batch == a.max_batch + 1 for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(a.k != b.k for a, b in zip(ranges, ranges[1:], strict=False)), "equal neighbours are merged"
    assert all(0 <= r.k <= max_k for r in ranges)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(DENSE_COSTS)), st.floats(0.0, 0.97), st.integers(1, 8), st.integers(1, 1500),
       st.data())
def test_each_batch_size_gets_the_best_k_of_the_model(name: str, alpha: float, max_k: int, max_num_seqs: int,
                                                      data: st.DataObject) -> None:
    cost, acceptance = DENSE_COSTS[name], geometric(alpha, max_k)
    ranges = derive_schedule(cost, acceptance, max_k, max_num_seqs)
    for batch in data.draw(st.lists(st.integers(1, max_num_seqs), min_size=1, max_size=8)):
        assert k_at(ranges, batch) == best_k_at(cost, acceptance, batch, max_k)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(DENSE_COSTS)), st.floats(0.0, 0.97), st.integers(1, 8), st.integers(1, 4096))
def test_k_is_zero_exactly_where_no_k_beats_a_step_at_zero(name: str, alpha: float, max_k: int, batch: int) -> None:
    cost, acceptance = DENSE_COSTS[name], geometric(alpha, max_k)
    speedups = [step_speedup(cost, acceptance, batch, k) for k in range(1, max_k + 1)]
    k = best_k_at(cost, acceptance, batch, max_k)
    if k == 0:
        assert max(speedups) <= ZERO_K_SPEEDUP
    else:
        assert max(speedups) > ZERO_K_SPEEDUP
        assert speedups[k - 1] >= (1 - KNEE) * max(speedups), "the knee: within 1% of the best"


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(DENSE_COSTS)), st.floats(0.0, 0.97), st.floats(0.0, 0.97), st.integers(1, 8),
       st.integers(1, 4096))
def test_higher_acceptance_never_drafts_fewer_tokens(name: str, a: float, b: float, max_k: int, batch: int) -> None:
    low, high = sorted((a, b))
    cost = DENSE_COSTS[name]
    assert best_k_at(cost, geometric(low, max_k), batch, max_k) <= best_k_at(cost, geometric(high, max_k), batch, max_k)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(NGRAM_COSTS)), st.floats(0.0, 0.97), st.integers(1, 8), st.integers(1, 3000))
def test_a_free_drafter_drafts_fewer_tokens_as_the_batch_grows(name: str, alpha: float, max_k: int,
                                                               max_num_seqs: int) -> None:
    """With no drafting pass to pay (ngram) only the verify pass grows with k, and it grows faster the more
    compute-bound the step: k never rises with the batch."""
    ranges = derive_schedule(NGRAM_COSTS[name], geometric(alpha, max_k), max_k, max_num_seqs)
    assert all(a.k > b.k for a, b in zip(ranges, ranges[1:], strict=False))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(DENSE_COSTS)), st.floats(0.0, 0.97), st.integers(1, 8), st.integers(1, 1024))
def test_for_tensorrt_llm_k_never_rises_with_the_batch(name: str, alpha: float, max_k: int, max_num_seqs: int
                                                       ) -> None:
    """TensorRT-LLM drafts its table's largest k from batch 1 up: where the best k rises with the batch (a fixed-cost
    drafter), Auto raises the smaller batches to it, so what it derives is what the engine runs."""
    free = DENSE_COSTS[name]
    acceptance = geometric(alpha, max_k)
    ranges = derive_schedule(dataclasses.replace(free, largest_k_first=True), acceptance, max_k, max_num_seqs)
    unconstrained = derive_schedule(free, acceptance, max_k, max_num_seqs)
    assert all(a.k > b.k for a, b in zip(ranges, ranges[1:], strict=False))
    assert ranges[0].min_batch == 1 and ranges[-1].max_batch == max_num_seqs
    for batch in {1, max_num_seqs, *(r.min_batch for r in unconstrained), *(r.max_batch for r in unconstrained)}:
        later = max(r.k for r in unconstrained if r.max_batch >= batch)
        assert k_at(ranges, batch) == later, "the most the unconstrained table drafts at this batch or above"


def test_a_tensorrt_llm_auto_table_drafts_its_largest_k_first() -> None:
    """DeepSeek-V3 MTP on 8 H200s, whose best k rises with the batch before it falls (an MoE: see
    test_moe_drafts_more_once_every_expert_is_read_anyway), at α 0.5 measured per position as calibration passes it:
    on vLLM the table rises 1 → 2 → 3 and falls, on TensorRT-LLM its smaller batch sizes are raised to k 3, and the
    plan can run it."""
    product = find_gpu("H200")
    measured = geometric(0.5, 8)
    tables = {}
    for engine in ("vllm", "trtllm"):
        spec = make_spec("mtp", None, model=DEEPSEEK_V3.name, engine=engine, k=8, max_num_seqs=1024, tp=8, gpu="H200",
                         schedule={"mode": "Auto"})
        schedule = speculation_schedule(spec, DEEPSEEK_V3, schedule_cost(spec, DEEPSEEK_V3, None, product),
                                        position_acceptance=measured)
        tables[engine] = [r.k for r in schedule.ranges]
        if engine == "trtllm":
            assert not [f for f in schedule_findings(spec, schedule) if f.code == "ScheduleNotExpressible"]
    assert tables == {"vllm": [1, 2, 3, 2, 1], "trtllm": [3, 2, 1]}


def test_moe_drafts_more_once_every_expert_is_read_anyway() -> None:
    """DeepSeek-V3 MTP on 8 H200s: at small batches every verified token reads experts no other token needed;
    once the batch touches them all, verifying more tokens costs little, so k rises with the batch before it
    falls again at the compute ridge."""
    cost = cost_of(DEEPSEEK_V3, "mtp", None, tp=8, gpu="H200")
    ranges = derive_schedule(cost, geometric(0.8, 8), 8, 2048)
    ks = [r.k for r in ranges]
    assert ks[0] < max(ks) and ks[-1] < max(ks)


# --- acceptance per position -----------------------------------------------------------------------------


@given(st.floats(0.0, 1.0), st.integers(0, 12))
def test_tokens_from_positions_are_leviathans_for_one_alpha(alpha: float, k: int) -> None:
    assert expected_tokens_from_positions(geometric(alpha, 12), k) == pytest.approx(expected_tokens_per_step(alpha, k))


def test_prior_per_position_is_alpha_to_the_i_and_a_reused_mtp_layer_accepts_less() -> None:
    assert prior_position_acceptance(Method.EAGLE3, 3) == pytest.approx((0.75, 0.75**2, 0.75**3))
    assert prior_position_acceptance(Method.MTP, 3, mtp_layers=1) == pytest.approx(
        (0.85, 0.85 * MTP_REUSED_ALPHA, 0.85 * MTP_REUSED_ALPHA**2))


def test_measured_acceptance_per_position_replaces_the_prior() -> None:
    spec = make_spec(schedule={"mode": "Auto"})
    product = find_gpu("H100-80GB")
    cost = schedule_cost(spec, LLAMA_8B, LLAMA_1B, product)
    measured = speculation_schedule(spec, LLAMA_8B, cost, position_acceptance=[0.9, 0.85, 0.8, 0.75, 0.7])
    prior = speculation_schedule(spec, LLAMA_8B, cost)
    assert measured.acceptance_measured and not prior.acceptance_measured
    assert k_at(measured.ranges, 1) > k_at(prior.ranges, 1), "a better draft earns more tokens"


def test_measured_positions_cap_the_k() -> None:
    ranges = derive_schedule(DENSE_COSTS["llama-8b ngram"], [0.99, 0.99], 8, 16)
    assert max(r.k for r in ranges) <= 2


# --- tables ----------------------------------------------------------------------------------------------


def test_a_table_is_predicted_range_by_range_and_its_last_k_holds_to_max_num_seqs() -> None:
    cost, acceptance = DENSE_COSTS["llama-8b + 1b draft"], geometric(0.6, 4)
    ranges = table_schedule(cost, acceptance, [BatchK(1, 8, 4), BatchK(9, 64, 2), BatchK(65, 128, 0),
                                               BatchK(300, 400, 1)], 256)
    assert [(r.min_batch, r.max_batch, r.k) for r in ranges] == [(1, 8, 4), (9, 64, 2), (65, 256, 0)]
    assert ranges[0].speedup_at_min_batch == pytest.approx(step_speedup(cost, acceptance, 1, 4))
    assert ranges[2].speedup_at_max_batch == ZERO_K_SPEEDUP


def test_a_table_schedule_from_the_spec() -> None:
    table = [{"minBatch": 1, "maxBatch": 16, "k": 3}, {"minBatch": 17, "maxBatch": 1000, "k": 1}]
    plan = make_plan(make_spec(schedule={"mode": "Table", "table": table}))
    assert plan.engine_schedule == (BatchK(1, 16, 3), BatchK(17, 256, 1))
    assert plan.schedule is not None and plan.schedule.mode == ScheduleMode.TABLE


# --- memory and findings ---------------------------------------------------------------------------------


def test_the_memory_plan_reserves_for_the_largest_k_of_the_schedule() -> None:
    auto = make_spec(schedule={"mode": "Auto"})
    plan = make_plan(auto)
    assert plan.schedule is not None and plan.schedule.largest_k == 2
    assert plan.memory == plan_memory(make_spec(k=2), plan.target, plan.draft)
    assert plan.memory != make_plan(make_spec(k=5)).memory, "not what numSpeculativeTokens 5 would reserve"


def findings(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    return {f.code: f for f in make_plan(spec).compatibility.findings}


def test_auto_refuses_a_draft_that_never_pays() -> None:
    """A 70B draft for an 8B target costs several target steps per drafted token: no k beats a step at k = 0."""
    found = findings(make_spec(draft="meta-llama/Llama-3.1-70B-Instruct", schedule={"mode": "Auto"}))
    assert found["ScheduleNeverPays"].severity == "Error"
    assert "`spec.speculation.enabled`" in found["ScheduleNeverPays"].message


def test_sglang_schedules_need_eagle_with_topk_1() -> None:
    assert findings(make_spec("ngram", None, engine="sglang", schedule={"mode": "Auto"}))[
        "ScheduleNotSupportedByEngine"].severity == "Error"
    eagle = make_spec("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", engine="sglang", k=7, schedule={"mode": "Auto"})
    found = findings(eagle)
    assert "ScheduleNotSupportedByEngine" not in found
    assert found["ScheduleFollowsAcceptance"].severity == "Info" and "candidate_steps" in found[
        "ScheduleFollowsAcceptance"].message


def test_a_schedule_and_the_same_key_in_extra_config_is_refused() -> None:
    spec = make_spec(schedule={"mode": "Auto"},
                     extraConfig={"num_speculative_tokens_per_batch_size": [[1, 8, 2], [9, 256, 1]]})
    assert findings(spec)["ScheduleSetTwice"].severity == "Error"
    assert not make_plan(spec).compatibility.compatible


def test_trtllm_refuses_a_schedule_that_drafts_more_above_batch_1() -> None:
    table = [{"minBatch": 1, "maxBatch": 8, "k": 1}, {"minBatch": 9, "maxBatch": 256, "k": 3}]
    spec = make_spec("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", engine="trtllm",
                     schedule={"mode": "Table", "table": table})
    assert findings(spec)["ScheduleNotExpressible"].severity == "Error"


def test_vllm_notes_the_thresholds_and_the_cost_of_drafting_zero() -> None:
    table = [{"minBatch": 1, "maxBatch": 32, "k": 3}, {"minBatch": 33, "maxBatch": 256, "k": 0}]
    found = findings(make_spec(schedule={"mode": "Table", "table": table}))
    assert "vllm#49548" in found["ScheduleThresholds"].message and "33" in found["ScheduleThresholds"].message
    assert "vllm#49986" in found["ScheduleDraftsZero"].message
    assert make_plan(make_spec(schedule={"mode": "Table", "table": table})).compatibility.compatible


def test_fixed_adds_no_schedule_finding() -> None:
    codes = set(findings(make_spec()))
    assert not {code for code in codes if code.startswith("Schedule")}
