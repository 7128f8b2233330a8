"""Models bigger than a node (issue 33, point 1): GPUs per node, the layout TP within a node × pipeline stages
across nodes, the last stage's memory plan, the network hop in the cost model, and suggestions that never ask one
pod for more GPUs than a node holds."""

from __future__ import annotations

from typing import Any

import pytest

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import Suggestion, Verdict
from specdeploy.engines import EngineInputs, render_engine
from specdeploy.planning.catalog import resolve_draft, resolve_target
from specdeploy.planning.gpus import GPU_PRODUCTS
from specdeploy.planning.plan import make_plan, plan_document
from specdeploy.planning.roofline import pipeline_hop_seconds
from specdeploy.planning.speedup import speculation_cost
from specdeploy.planning.topology import gpus_per_node, layout_findings, node_layout

LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
DEEPSEEK_R1 = "deepseek-ai/DeepSeek-R1"


def make_spec(model: str = LLAMA_405B, *, engine: str = "vllm", tp: int = 8, pp: int = 1,
              speculation: dict[str, Any] | None = None, gpu: dict[str, Any] | None = None,
              serving: dict[str, Any] | None = None) -> SpeculativeDeploymentSpec:
    if speculation is None:
        speculation = ({"method": "mtp", "numSpeculativeTokens": 1} if model == DEEPSEEK_R1 else
                       {"method": "draft_model", "numSpeculativeTokens": 4, "draft": {"name": LLAMA_8B}})
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"name": model}, "engine": {"kind": engine}, "speculation": speculation,
        "resources": {"gpu": gpu or {"product": "H100-80GB"}, "tensorParallelSize": tp, "pipelineParallelSize": pp},
        "serving": serving or {"maxModelLen": 8192, "maxNumSeqs": 32},
    })


def codes(spec: SpeculativeDeploymentSpec) -> list[str]:
    return [finding.code for finding in layout_findings(spec)]


# --- GPUs per node and the layout -----------------------------------------------------------------------------


@pytest.mark.parametrize("product", ["H100-80GB", "H200", "B200"])
def test_hgx_products_have_eight_gpus_per_node(product: str) -> None:
    assert GPU_PRODUCTS[product].gpus_per_node == 8
    assert gpus_per_node(make_spec(gpu={"product": product})) == 8


def test_the_spec_overrides_gpus_per_node_and_an_unknown_product_takes_eight() -> None:
    assert gpus_per_node(make_spec(gpu={"product": "H100-80GB", "perNode": 4})) == 4
    assert gpus_per_node(make_spec(gpu={"product": "MI300X", "memoryGiB": 191})) == 8


def test_a_layout_within_a_node_is_one_pod_of_every_rank() -> None:
    layout = node_layout(make_spec(tp=4, pp=2))
    assert (layout.nodes, layout.gpus_per_pod, layout.gpus, layout.spans_nodes) == (1, 8, 8, False)
    assert codes(make_spec(tp=4, pp=2)) == []


def test_more_gpus_than_a_node_holds_spans_nodes_one_pod_each() -> None:
    layout = node_layout(make_spec(tp=8, pp=2))
    assert (layout.nodes, layout.gpus_per_pod, layout.spans_nodes) == (2, 8, True)
    assert layout.describe() == "2 nodes × 8 GPUs (TP 8 × PP 2; 8 GPUs per node)"
    assert layout.to_wire() == {"nodes": 2, "gpusPerPod": 8, "gpusPerNode": 8, "tensorParallelSize": 8,
                                "pipelineParallelSize": 2}
    assert codes(make_spec(tp=8, pp=2)) == []
    assert node_layout(make_spec(tp=4, pp=2, gpu={"product": "H100-80GB", "perNode": 4})).nodes == 2


def test_tensor_parallelism_across_nodes_is_refused_with_the_layout_that_works() -> None:
    findings = list(layout_findings(make_spec(tp=16)))
    assert [f.code for f in findings] == ["TensorParallelAcrossNodes"]
    assert "TP 8 × PP 2" in findings[0].message


def test_a_pod_larger_than_a_node_is_refused() -> None:
    assert codes(make_spec(tp=8, gpu={"product": "H100-80GB", "count": 16})) == ["PodExceedsNode"]


def test_ranks_that_leave_a_node_partly_used_are_refused() -> None:
    assert codes(make_spec(tp=4, pp=3)) == ["LayoutLeavesNodePartlyUsed"]


def test_tensorrt_llm_refuses_a_layout_across_nodes_with_its_reason() -> None:
    findings = list(layout_findings(make_spec(engine="trtllm", tp=8, pp=2, speculation={"enabled": False})))
    assert [f.code for f in findings] == ["MultiNodeUnsupported"]
    assert "MPI" in findings[0].message
    # Within a node it launches, without speculation (with it, see the next test).
    assert codes(make_spec(engine="trtllm", tp=4, pp=2, speculation={"enabled": False})) == []


@pytest.mark.parametrize(("model", "method"), [(DEEPSEEK_R1, "mtp"), (LLAMA_405B, "draft_model")])
def test_tensorrt_llm_refuses_pipeline_stages_with_speculation_within_a_node_too(model: str, method: str) -> None:
    spec = make_spec(model, engine="trtllm", tp=4, pp=2)
    assert spec.speculation.method.value == method
    findings = list(layout_findings(spec))
    assert [f.code for f in findings] == ["PipelineWithSpeculationUnsupported"]
    assert "issue 9009" in findings[0].message and "vllm" in findings[0].message
    assert "tensorParallelSize" in findings[0].message
    assert codes(make_spec(model, engine="trtllm", tp=8, pp=1)) == []
    # Across nodes both reasons are given.
    assert codes(make_spec(model, engine="trtllm", tp=8, pp=2)) == [
        "PipelineWithSpeculationUnsupported", "MultiNodeUnsupported"]


# --- the Done-when plans: 405B + 8B draft and DeepSeek-R1 MTP on H100, across two nodes ------------------------


def test_llama_405b_with_an_8b_draft_lays_out_across_two_h100_nodes() -> None:
    one_node = make_plan(make_spec(tp=8, pp=1))
    two_nodes = make_plan(make_spec(tp=8, pp=2))
    assert one_node.verdict == Verdict.REJECTED
    assert two_nodes.accepted and two_nodes.layout.nodes == 2
    per_gpu, alone = two_nodes.memory.per_gpu, one_node.memory.per_gpu
    # 126 layers: 63 a stage, half the weights per GPU; the whole draft on the last stage.
    assert per_gpu.target_weights_gib == pytest.approx(alone.target_weights_gib / 2, rel=1e-3)
    assert per_gpu.draft_weights_gib == alone.draft_weights_gib
    assert two_nodes.memory.kv_bytes_per_token < one_node.memory.kv_bytes_per_token


def test_deepseek_r1_with_mtp_lays_out_across_two_h100_nodes() -> None:
    one_node = make_plan(make_spec(DEEPSEEK_R1, tp=8, pp=1))
    two_nodes = make_plan(make_spec(DEEPSEEK_R1, tp=8, pp=2))
    assert one_node.verdict == Verdict.REJECTED
    assert two_nodes.accepted and two_nodes.layout.describe().startswith("2 nodes × 8 GPUs")
    assert two_nodes.memory.per_gpu.draft_weights_gib == one_node.memory.per_gpu.draft_weights_gib > 0  # MTP layer
    # 61 layers: the last stage is planned with 31 of them.
    assert two_nodes.memory.per_gpu.target_weights_gib == pytest.approx(
        one_node.memory.per_gpu.target_weights_gib * 31 / 61, rel=1e-3)


def test_sglang_refuses_pipeline_stages_with_speculation_and_is_not_offered_them() -> None:
    findings = list(layout_findings(make_spec(DEEPSEEK_R1, engine="sglang", tp=8, pp=2)))
    assert [f.code for f in findings] == ["PipelineWithSpeculationUnsupported"]
    assert "vllm" in findings[0].message
    assert codes(make_spec(DEEPSEEK_R1, engine="sglang", tp=8, pp=2, speculation={"enabled": False})) == []
    suggestions = make_plan(make_spec(DEEPSEEK_R1, engine="sglang", tp=8)).memory.suggestions
    assert all(s.field != "spec.resources.pipelineParallelSize" for s in suggestions)


def test_the_plan_document_and_text_show_the_layout() -> None:
    from io import StringIO

    from rich.console import Console

    from specdeploy.report import render_plan

    the_plan = make_plan(make_spec(tp=8, pp=2))
    assert plan_document(the_plan)["layout"]["nodes"] == 2
    out = StringIO()
    render_plan("llama-405b", the_plan, None, Console(file=out, width=200))
    assert "Layout: 2 nodes × 8 GPUs (TP 8 × PP 2; 8 GPUs per node)" in out.getvalue()
    assert "16× H100-80GB, TP 8 × PP 2" in out.getvalue()


# --- suggestions never ask one pod for more GPUs than a node has --------------------------------------------------


def _apply(spec: SpeculativeDeploymentSpec, suggestion: Suggestion) -> SpeculativeDeploymentSpec:
    document = spec.to_wire()
    parent = document
    path = suggestion.field.removeprefix("spec.").split(".")
    for key in path[:-1]:
        parent = parent.setdefault(key, {})
    parent[path[-1]] = suggestion.value
    return SpeculativeDeploymentSpec.model_validate(document)


@pytest.mark.parametrize(("model", "engine", "tp"), [
    (LLAMA_405B, "vllm", 1), (LLAMA_405B, "vllm", 4), (LLAMA_405B, "vllm", 8), (LLAMA_405B, "sglang", 8),
    (DEEPSEEK_R1, "sglang", 8), (DEEPSEEK_R1, "vllm", 2), (LLAMA_405B, "trtllm", 8),
])
def test_no_suggestion_asks_one_pod_for_more_gpus_than_a_node(model: str, engine: str, tp: int) -> None:
    spec = make_spec(model, engine=engine, tp=tp)
    suggestions = make_plan(spec).memory.suggestions
    assert suggestions
    for suggestion in (s for s in suggestions if s.field.startswith("spec.resources.")):
        changed = _apply(spec, suggestion)
        layout = node_layout(changed)
        assert layout.gpus_per_pod <= layout.gpus_per_node, suggestion
        assert codes(changed) == [], suggestion


def test_a_node_too_small_for_the_weights_suggests_pipeline_stages_that_fit() -> None:
    spec = make_spec(tp=8, pp=1)
    suggestion = next(s for s in make_plan(spec).memory.suggestions if s.field == "spec.resources.pipelineParallelSize")
    assert suggestion.value == "2" and ": fits:" in suggestion.message
    assert make_plan(_apply(spec, suggestion)).accepted
    trtllm = make_plan(make_spec(engine="trtllm", tp=8)).memory.suggestions
    assert all(s.field != "spec.resources.pipelineParallelSize" for s in trtllm)


# --- the network hop in the cost model ----------------------------------------------------------------------------


def test_a_pipeline_across_nodes_adds_one_hop_per_stage_to_every_step() -> None:
    assert pipeline_hop_seconds(1, 64, 16384) == 0.0
    two = pipeline_hop_seconds(2, 64, 16384)
    assert pipeline_hop_seconds(2, 128, 16384) > two > pipeline_hop_seconds(2, 1, 16384) > 0.0
    assert pipeline_hop_seconds(3, 64, 16384) > two


def test_the_hop_is_added_to_the_step_and_nothing_else_changes() -> None:
    one, two = make_spec(tp=8, pp=1), make_spec(tp=8, pp=2)
    target, draft = resolve_target(one), resolve_draft(one)
    gpu = GPU_PRODUCTS["H100-80GB"]
    flat, piped = speculation_cost(one, target, draft, gpu), speculation_cost(two, target, draft, gpu)
    hidden = target.architecture.hidden_size
    for batch in (1, 16):
        assert piped.baseline_step_seconds(batch) - flat.baseline_step_seconds(batch) == pytest.approx(
            pipeline_hop_seconds(2, batch, hidden))
        assert piped.speculative_step_seconds(batch, 4) - flat.speculative_step_seconds(batch, 4) == pytest.approx(
            pipeline_hop_seconds(2, batch * 5, hidden))
        assert piped.draft_pass_seconds(batch) == flat.draft_pass_seconds(batch)


# --- the engines' pipeline flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "flag"), [
    ("vllm", "--pipeline-parallel-size"), ("sglang", "--pp-size"), ("trtllm", "--pp_size"),
])
def test_the_engines_render_the_pipeline_size_only_when_there_are_stages(engine: str, flag: str) -> None:
    staged = render_engine(EngineInputs(make_spec(engine=engine, pp=2), served_model_name="m", max_model_len=8192))
    flat = render_engine(EngineInputs(make_spec(engine=engine, pp=1), served_model_name="m", max_model_len=8192))
    assert staged.args[staged.args.index(flag) + 1] == "2"
    assert flag not in flat.args
