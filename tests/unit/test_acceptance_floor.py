"""The acceptance floor (minAcceptanceRate unset = Auto): the break-even acceptance of the plan's cost model plus a
margin, or the spec's fixed number; checked against SpeculationCost.speedup itself."""

from __future__ import annotations

import dataclasses
import math
from functools import cache
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.modelsource.resolve import ResolvedModel, ResolvedModels
from specdeploy.planning.acceptance import alpha_from_acceptance_rate, expected_tokens_per_step
from specdeploy.planning.acceptance_floor import AUTO, AUTO_MARGIN, DEFAULT_BATCH_SIZE, FIXED, AcceptanceFloor
from specdeploy.planning.catalog import UnknownModel
from specdeploy.planning.plan import Plan, make_plan, models_without_io
from specdeploy.planning.speedup import SpeculationCost

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
EAGLE3_8B = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def make_spec(model: str, method: str, draft: str | None, k: int, *, tp: int = 1, max_num_seqs: int = 256,
              gpu: str = "H100-80GB", quantization: str = "none", draft_quantization: str = "none",
              kv_cache_dtype: str = "auto", enabled: bool = True, checks: dict[str, Any] | None = None,
              **model_fields: Any) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {
        "model": {"name": model, "quantization": quantization, **model_fields},
        "speculation": {"method": method, "numSpeculativeTokens": k, "enabled": enabled},
        "resources": {"tensorParallelSize": tp, "gpu": {"product": gpu}},
        # 1,024 cached tokens per sequence, the measured table's context (planning.speedup.context_tokens_for).
        "serving": {"maxModelLen": 8192, "maxNumSeqs": max_num_seqs, "kvCacheDtype": kv_cache_dtype},
        "analysis": {"checks": checks or {}},
    }
    if draft is not None:
        document["speculation"]["draft"] = {"name": draft, "quantization": draft_quantization}
    return SpeculativeDeploymentSpec.model_validate(document)


EAGLE3 = make_spec(LLAMA_8B, "eagle3", EAGLE3_8B, 3, max_num_seqs=512)
DRAFT_70B = make_spec(LLAMA_70B, "draft_model", LLAMA_8B, 4, tp=4, max_num_seqs=512)
DRAFT_70B_FP8 = make_spec(LLAMA_70B, "draft_model", LLAMA_8B, 4, tp=2, quantization="fp8",
                          draft_quantization="fp8", max_num_seqs=512)   # examples/llama-70b-fp8-tp2.yaml
NGRAM = make_spec(LLAMA_8B, "ngram", None, 3, max_num_seqs=512)
# A 3B draft for an 8B target: each drafted token costs about half a target step.
DRAFT_3B = make_spec(LLAMA_8B, "draft_model", "meta-llama/Llama-3.2-3B-Instruct", 4, max_num_seqs=512)
SPECS = {"eagle3": EAGLE3, "draft-70b": DRAFT_70B, "draft-70b-fp8": DRAFT_70B_FP8, "ngram": NGRAM}
batches = st.integers(min_value=1, max_value=512)


@cache
def _plan(spec_json: str) -> Plan:
    return make_plan(SpeculativeDeploymentSpec.model_validate_json(spec_json))


def plan_of(spec: SpeculativeDeploymentSpec) -> Plan:
    """The spec's plan (from the catalog), made once per spec: the hypothesis tests ask it thousands of times."""
    return _plan(spec.model_dump_json())


def cost_of(spec: SpeculativeDeploymentSpec) -> SpeculationCost:
    cost = plan_of(spec).cost
    assert cost is not None
    return cost


def floor_of(spec: SpeculativeDeploymentSpec, batch: float | None = None) -> AcceptanceFloor | None:
    return plan_of(spec).acceptance_floor(batch)


def auto(spec: SpeculativeDeploymentSpec, batch: float | None = None) -> AcceptanceFloor:
    floor = floor_of(spec, batch)
    assert floor is not None and floor.source == AUTO
    return floor


def be(spec: SpeculativeDeploymentSpec, batch: int) -> float:
    return auto(spec, batch).break_even


def verify_share(cost: SpeculationCost, batch: int, k: int) -> float:
    """What the verify step costs beyond a baseline step, as a share of it."""
    verify = cost.speculative_step_seconds(batch, k) - k * cost.draft_pass_seconds(batch)
    return verify / cost.baseline_step_seconds(batch) - 1


# --- the floor is where the model says so ----------------------------------------------------------------

@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("batch", [1, 8, 32, 64, 100])
def test_break_even_and_floor_are_where_the_predicted_speedup_is_1_and_1_plus_margin(name: str, batch: int) -> None:
    spec = SPECS[name]
    k, cost = spec.speculation.num_speculative_tokens, cost_of(spec)
    floor = auto(spec, batch)
    assert 0.0 <= floor.break_even <= floor.rate < 1.0
    if floor.break_even > 0.0:
        alpha = alpha_from_acceptance_rate(floor.break_even, k)
        assert cost.speedup(batch, alpha, k) == pytest.approx(1.0, abs=1e-9)
    else:   # a free drafter while verify is memory-bound: nothing accepted costs nothing either
        assert cost.speedup(batch, 0.0, k) >= 1.0 - 1e-12
    alpha = alpha_from_acceptance_rate(floor.rate, k)
    assert cost.speedup(batch, alpha, k) == pytest.approx(1.0 + AUTO_MARGIN, abs=1e-9)


@given(batch=batches, rate=st.floats(min_value=0.0, max_value=1.0))
def test_a_rate_below_the_floor_is_predicted_to_pay_less_than_the_margin(batch: int, rate: float) -> None:
    k, cost = 3, cost_of(EAGLE3)
    floor = auto(EAGLE3, batch)
    predicted = cost.speedup(batch, alpha_from_acceptance_rate(rate, k), k)
    if rate < floor.rate - 1e-9:
        assert predicted < 1.0 + AUTO_MARGIN
    elif rate > floor.rate + 1e-9:
        assert predicted > 1.0 + AUTO_MARGIN


# --- sanity numbers ---------------------------------------------------------------------------------------

def test_eagle3_on_llama_8b_breaks_even_far_below_a_healthy_047() -> None:
    floor = auto(EAGLE3)
    assert floor.batch_size == DEFAULT_BATCH_SIZE == 1
    assert 0.05 <= floor.break_even <= 0.2
    assert floor.break_even == pytest.approx(0.0888, abs=0.002)
    assert floor.rate == pytest.approx(0.1099, abs=0.002)
    # The healthy head of the brief: 0.47 at k=3 is 2.41 tokens per step and well above the floor.
    alpha = alpha_from_acceptance_rate(0.47, 3)
    assert expected_tokens_per_step(alpha, 3) == pytest.approx(2.41)
    assert cost_of(EAGLE3).speedup(1, alpha, 3) == pytest.approx(1.90, abs=0.01)
    assert 3 * floor.rate < 0.47


def test_while_verifying_costs_about_one_step_the_break_even_is_about_the_draft_cost_ratio() -> None:
    # speedup = (1 + k·rate) ÷ (k·c + 1 + v) with v the verify step's share beyond a baseline step: it breaks even
    # at rate = c + v ÷ k. At small batches v is a few percent (measured on an H100: 5 tokens per sequence cost
    # 1.05 steps at batch 1 and 1.07 at 16 on Llama-3.1-8B, 1.06 at 16 on a 70B TP-4 rank), so the break-even sits
    # just above c.
    for spec in SPECS.values():
        cost, k = cost_of(spec), spec.speculation.num_speculative_tokens
        for batch in (1, 4, 16):
            extra = verify_share(cost, batch, k)
            assert 0.0 < extra < 0.06
            assert be(spec, batch) == pytest.approx(cost.draft_cost_ratio(batch) + extra / k, abs=1e-12)
            assert auto(spec, batch).draft_cost_ratio == pytest.approx(cost.draft_cost_ratio(batch))


def test_a_70b_draft_model_breaks_even_higher_than_an_eagle3_head() -> None:
    assert be(DRAFT_70B, 1) == pytest.approx(0.1900, abs=0.002)
    assert be(DRAFT_70B_FP8, 1) == pytest.approx(0.1906, abs=0.002)
    for batch in (1, 8, 32, 64, 128, 256):
        assert be(DRAFT_70B, batch) > be(EAGLE3, batch)
        assert be(DRAFT_70B_FP8, batch) > be(EAGLE3, batch)


def test_ngram_drafts_for_free() -> None:
    floor = auto(NGRAM)
    assert floor.draft_cost_ratio == 0.0
    # Only the verify pass's few percent above a step remain: (1.05 × V ÷ B − 1) ÷ k with V ≈ B.
    assert floor.break_even is not None and 0.0 < floor.break_even < 0.002
    assert floor.rate == pytest.approx(AUTO_MARGIN / 3, abs=0.002)
    assert "drafting takes no GPU time" in floor.describe()


# --- batch size -------------------------------------------------------------------------------------------

def test_the_break_even_rises_with_the_batch_past_the_compute_ridge() -> None:
    assert be(EAGLE3, 32) < be(EAGLE3, 128) < be(EAGLE3, 256)
    assert be(EAGLE3, 256) > 3.5 * be(EAGLE3, 1)
    assert be(DRAFT_70B_FP8, 384) > 0.65 > 0.3 > be(DRAFT_70B_FP8, 32)


@pytest.mark.parametrize("name", ["draft-70b", "draft-70b-fp8"])
@given(first=batches, second=batches)
def test_a_draft_models_floor_never_falls_as_the_batch_grows(name: str, first: int, second: int) -> None:
    spec = SPECS[name]
    low, high = sorted((first, second))
    assert be(spec, low) <= be(spec, high) + 1e-12
    assert auto(spec, low).rate <= auto(spec, high).rate + 1e-12


@pytest.mark.parametrize("name", SPECS)
@given(first=batches, second=batches)
def test_the_floor_never_falls_as_the_batch_grows(name: str, first: int, second: int) -> None:
    # An EAGLE head's fixed per-pass overhead shrinks against a baseline step that grows with the KV reads, but
    # the verify pass's share grows faster from the first sequences on (the smooth transition), so no floor dips.
    spec = SPECS[name]
    low, high = sorted((first, second))
    assert be(spec, low) <= be(spec, high) + 1e-12
    assert auto(spec, low).rate <= auto(spec, high).rate + 1e-12


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(None, 1), (0.0, 1), (-3.0, 1), (0.4, 1), (3.6, 4), (7.0, 7), (255.6, 256), (1e9, 256), (math.inf, 256),
     (math.nan, 1)],
)
def test_the_batch_is_rounded_and_clamped_to_max_num_seqs(batch: float | None, expected: int) -> None:
    spec = make_spec(LLAMA_8B, "eagle3", EAGLE3_8B, 3, max_num_seqs=256)
    assert auto(spec, batch).batch_size == expected


# --- when speculation cannot pay --------------------------------------------------------------------------

def test_speculation_that_never_pays_has_floor_1() -> None:
    floor = auto(DRAFT_3B, 256)
    assert not floor.pays
    assert floor.rate == 1.0 and floor.break_even == 1.0
    assert "never pays at batch 256" in floor.describe()
    assert floor.describe().endswith("floor 1.00")


def test_a_margin_out_of_reach_gives_floor_1_with_the_break_even_below_it() -> None:
    floor = auto(DRAFT_3B, 200)
    assert floor.pays and 0.9 < floor.break_even < 1.0
    assert floor.rate == 1.0
    assert "margin is out of reach" in floor.describe()


# --- Fixed, disabled, the plan's models ------------------------------------------------------------------

def test_a_fixed_min_acceptance_rate_is_the_floor() -> None:
    spec = make_spec(LLAMA_8B, "eagle3", EAGLE3_8B, 3, checks={"minAcceptanceRate": 0.5})
    floor = floor_of(spec, 200)
    assert floor is not None and floor.fixed
    assert (floor.rate, floor.source, floor.batch_size) == (0.5, FIXED, 200)
    assert floor.describe() == "Fixed: minAcceptanceRate 0.50"
    assert floor.break_even == be(EAGLE3, 200)   # the model's, for comparison
    assert floor.to_wire() == {"rate": 0.5, "breakEven": round(be(EAGLE3, 200), 3), "batchSize": 200,
                               "source": "Fixed"}
    zero = floor_of(make_spec(LLAMA_8B, "ngram", None, 3, checks={"minAcceptanceRate": 0.0}))
    assert zero is not None and zero.rate == 0.0 and zero.source == FIXED


def test_disabled_speculation_has_no_floor() -> None:
    assert floor_of(make_spec(LLAMA_8B, "eagle3", EAGLE3_8B, 3, enabled=False)) is None
    fixed = make_spec(LLAMA_8B, "eagle3", EAGLE3_8B, 3, enabled=False, checks={"minAcceptanceRate": 0.5})
    assert floor_of(fixed) is None


def test_the_floor_is_the_plans_resolved_models_not_the_catalogs() -> None:
    """A model resolved elsewhere (the Hub, a ConfigMap) is priced as resolved, not looked up again: the same
    name with another architecture — here a target of twice the layers and parameters — gets another floor."""
    catalog = models_without_io(EAGLE3)
    target = catalog.target.info
    doubled = target.architecture.model_copy(update={"num_layers": 2 * target.architecture.num_layers,
                                                     "num_parameters": 2 * target.architecture.num_parameters})
    resolved = ResolvedModels(ResolvedModel(dataclasses.replace(target, architecture=doubled), catalog.target.origin),
                              catalog.draft)
    floor = make_plan(EAGLE3, resolved).acceptance_floor(64)
    assert floor is not None and floor.break_even != pytest.approx(be(EAGLE3, 64), rel=0.05)
    assert floor.draft_cost_ratio is not None and floor.draft_cost_ratio < auto(EAGLE3, 64).draft_cost_ratio * 0.7


def test_an_unknown_model_has_no_plan_to_ask() -> None:
    with pytest.raises(UnknownModel):
        make_plan(make_spec("acme/secret-model", "ngram", None, 3))


def test_an_architecture_makes_an_unknown_model_resolvable() -> None:
    architecture = {"numLayers": 32, "hiddenSize": 4096, "intermediateSize": 14336, "numAttentionHeads": 32,
                    "numKeyValueHeads": 8, "vocabSize": 128256, "numParameters": 8_030_000_000,
                    "maxPositionEmbeddings": 131072}
    spec = make_spec("acme/secret-model", "ngram", None, 3, architecture=architecture)
    assert auto(spec).rate == pytest.approx(AUTO_MARGIN / 3, abs=0.002)


# --- output -----------------------------------------------------------------------------------------------

def test_describe_and_wire() -> None:
    floor = auto(EAGLE3, 4)
    assert floor.describe() == ("Auto: break-even 0.09 at batch 4 for eagle3 k=3 (draft 9% of a target step on "
                                "H100-80GB), floor 0.11 with the 5% margin")
    assert floor.to_wire() == {"rate": round(floor.rate, 3), "breakEven": round(be(EAGLE3, 4), 3), "batchSize": 4,
                               "source": "Auto"}


def test_an_unknown_gpu_is_planned_on_the_reference_gpu() -> None:
    floor = auto(make_spec(LLAMA_8B, "eagle3", EAGLE3_8B, 3, gpu="MI300X"))
    assert floor.gpu == "H100-80GB"
    assert floor.rate == auto(EAGLE3).rate


@pytest.mark.parametrize(
    "change",
    [{"k": 4}, {"tp": 2}, {"gpu": "H200"}, {"quantization": "fp8"}, {"draft_quantization": "fp8"},
     {"kv_cache_dtype": "fp8"}, {"draft": None, "method": "mtp", "model": "XiaomiMiMo/MiMo-7B-RL"}],
    ids=lambda change: ",".join(change),
)
def test_every_cost_field_moves_the_floor(change: dict[str, Any]) -> None:
    base: dict[str, Any] = {"model": LLAMA_8B, "method": "eagle3", "draft": EAGLE3_8B, "k": 3}
    changed = {**base, **change}
    keywords = {name: value for name, value in changed.items() if name not in base}
    spec = make_spec(changed["model"], changed["method"], changed["draft"], changed["k"], **keywords)
    reference, other = auto(EAGLE3, 64), auto(spec, 64)
    assert dataclasses.replace(other, batch_size=reference.batch_size) != reference
    cost, k = cost_of(spec), spec.speculation.num_speculative_tokens
    alpha = alpha_from_acceptance_rate(other.rate, k)
    assert cost.speedup(64, alpha, k) == pytest.approx(1.0 + AUTO_MARGIN, abs=1e-9)
