"""The probe's pure part: its requests within the budget, vLLM's per-request counts, and the cells."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.judgment.probe import (
    DEFAULT_TEMPERATURES,
    ProbeBudget,
    ProbeOutcome,
    ProbeRequest,
    SpecDecodeCounts,
    not_paying,
    predicted_speedup,
    probe_cells,
    probe_requests,
    probe_result,
)
from specdeploy.modelsource.resolve import ConfigMapConfig, Supplied, resolve_models
from specdeploy.planning.plan import make_plan

HUB_FIXTURES = Path(__file__).parent.parent / "fixtures" / "hub"

WORKLOADS = {"code": ["def add(a, b):", "class Stack:"], "support": ["My order is late."]}


def test_requests_are_interleaved_across_cells_and_bounded_by_the_budget() -> None:
    budget = ProbeBudget(requests_per_cell=3, max_tokens=32, requests_per_second=2.0)
    requests = probe_requests(WORKLOADS, DEFAULT_TEMPERATURES, budget)
    cells = len(WORKLOADS) * len(DEFAULT_TEMPERATURES)
    assert len(requests) == budget.requests(cells) == 18
    assert budget.tokens(cells) == 18 * 32 and budget.shortest_seconds(cells) == 9.0
    first_round = requests[:cells]
    assert {(r.workload, r.temperature) for r in first_round} == {
        (w, t) for w in WORKLOADS for t in DEFAULT_TEMPERATURES}
    assert [r.prompt for r in requests if r.workload == "code" and r.temperature == 0.0] == [
        "def add(a, b):", "class Stack:", "def add(a, b):"]


def test_an_empty_prompt_set_and_an_empty_budget_are_refused() -> None:
    with pytest.raises(ValueError, match="'support' has no prompts"):
        probe_requests({"support": []}, DEFAULT_TEMPERATURES, ProbeBudget())
    with pytest.raises(ValueError):
        ProbeBudget(requests_per_cell=0)
    with pytest.raises(ValueError):
        ProbeBudget(requests_per_second=0)


def _vllm_response(steps: int, drafted: int, accepted: int) -> dict[str, object]:
    """The shape of vLLM 0.32's `metrics.speculative_decoding` (RequestSpecDecodeMetrics.to_dict)."""
    return {"choices": [{"text": "…"}], "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate": accepted / drafted,
        "acceptance_histogram": [0, 0, 0, steps], "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted, "num_spec_tokens": 3}}}


def test_vllms_per_request_counts_are_read_and_anything_else_is_none() -> None:
    assert SpecDecodeCounts.from_response(_vllm_response(4, 12, 9)) == SpecDecodeCounts(4, 12, 9)
    assert SpecDecodeCounts.from_response({"choices": []}) is None                      # the flag off
    assert SpecDecodeCounts.from_response({"metrics": {"speculative_decoding": None}}) is None
    assert SpecDecodeCounts.from_response({"metrics": {"speculative_decoding": {"num_spec_steps": 1}}}) is None
    broken = _vllm_response(4, 12, 9)
    broken["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] = 13  # type: ignore[index]
    assert SpecDecodeCounts.from_response(broken) is None                                # more accepted than drafted


def test_cells_sum_their_requests_and_name_the_ones_below_break_even() -> None:
    code_cold, code_hot = ProbeRequest("code", 0.0, "p"), ProbeRequest("code", 1.0, "p")
    support = ProbeRequest("support", 0.0, "q")
    outcomes = [
        ProbeOutcome(code_cold, SpecDecodeCounts(4, 12, 10)), ProbeOutcome(code_cold, SpecDecodeCounts(4, 12, 8)),
        ProbeOutcome(code_hot, SpecDecodeCounts(6, 18, 9)),
        ProbeOutcome(support, SpecDecodeCounts(10, 30, 3)), ProbeOutcome(support, error="timed out"),
    ]
    cells = probe_cells(outcomes, k=3, break_even=0.3)
    assert [(c.workload, c.temperature, c.requests, c.failed) for c in cells] == [
        ("code", 0.0, 2, 0), ("code", 1.0, 1, 0), ("support", 0.0, 1, 1)]
    assert cells[0].acceptance_rate == pytest.approx(18 / 24) and cells[0].mean_acceptance_length == pytest.approx(3.25)
    assert cells[0].acceptance_rate > cells[1].acceptance_rate                  # falls with temperature
    assert [c.pays for c in cells] == [True, True, False]
    [sentence] = not_paying(cells, 0.3)
    assert sentence.startswith("support at temperature 0: acceptance 0.10 is below the break-even 0.30")
    assert all(c.pays is None for c in probe_cells(outcomes, k=3, break_even=None))


def test_a_cell_with_no_counts_measures_nothing() -> None:
    [cell] = probe_cells([ProbeOutcome(ProbeRequest("code", 0.7, "p"), error="pod not ready")], k=3, break_even=0.3)
    assert (cell.requests, cell.failed, cell.acceptance_rate, cell.pays) == (0, 1, None, None)


@given(st.floats(0, 1), st.floats(0, 1), st.integers(1, 10))
def test_the_predicted_speedup_is_one_at_break_even_and_grows_with_acceptance(rate: float, break_even: float,
                                                                              k: int) -> None:
    assert predicted_speedup(break_even, k, break_even) == pytest.approx(1.0)
    assert (predicted_speedup(rate, k, break_even) > 1.0) == (rate > break_even) or rate == pytest.approx(break_even)


def test_the_break_even_is_the_plans_whichever_source_resolved_its_models() -> None:
    """Qwen3-4B-Thinking with a Qwen3-0.6B draft, neither in the catalog, their config.json from ConfigMaps: the probe
    judges its cells by the plan's break-even; without a plan it predicts nothing."""
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"name": "Qwen/Qwen3-4B-Thinking-2507", "configMapRef": "target-config"},
        "speculation": {"method": "draft_model", "numSpeculativeTokens": 5,
                        "draft": {"name": "Qwen/Qwen3-0.6B", "configMapRef": "draft-config"}},
        "resources": {"gpu": {"product": "H100-80GB"}}, "serving": {"maxModelLen": 32768, "maxNumSeqs": 32}})

    def config_map(name: str, repo: str) -> Supplied:
        return Supplied(config_map=ConfigMapConfig(name, {"config.json": (HUB_FIXTURES / repo / "config.json").read_text()}))

    plan = make_plan(spec, resolve_models(spec, offline=True, target=config_map("target-config", spec.model.name),
                                          draft=config_map("draft-config", "Qwen/Qwen3-0.6B")))
    floor = plan.acceptance_floor()
    assert floor is not None and 0.0 < floor.break_even < 1.0
    outcomes = [ProbeOutcome(ProbeRequest("support", 0.0, "?"), SpecDecodeCounts(steps=10, drafted=50, accepted=0))]
    at = datetime(2026, 12, 5, tzinfo=UTC)
    judged = probe_result(spec, plan, outcomes, ProbeBudget(1), 1, "qwen", "http://127.0.0.1:8000", at, "Manual")
    assert judged.break_even == floor.break_even and judged.break_even_basis == floor.describe()
    assert judged.cells[0].pays is False and judged.not_paying
    unplanned = probe_result(spec, None, outcomes, ProbeBudget(1), 1, "qwen", "http://127.0.0.1:8000", at, "Manual")
    assert unplanned.break_even is None and unplanned.cells[0].pays is None and not unplanned.not_paying
