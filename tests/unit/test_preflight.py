"""GPU preflight: the pure decision on injected GPU figures, plan.json parsing, and the torch reader."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.resource import load_resource
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import PLAN_FILE, Variant, desired_children
from specdeploy_engine import preflight
from specdeploy_engine.preflight import (
    GIB,
    GpuMemory,
    GpuUnavailable,
    LaunchPlan,
    PlanError,
    check,
    engine_args,
    flag_value,
    gpus_from_json,
    launch_plan,
    read_gpus,
    read_gpus_with_torch,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
H100_TOTAL = int(79.19 * GIB)

# The speculative variant of examples/llama-70b-fp8-tp2.yaml as the operator writes it (vLLM, TP 2, 0.9).
MEMORY_PLAN: dict[str, Any] = {
    "verdict": "FitsWithWarnings",
    "fits": True,
    "perGpu": {"budgetGiB": 71.271, "targetWeightsGiB": 33.833, "draftWeightsGiB": 4.229, "overheadGiB": 2.582,
               "activationPeakGiB": 1.234, "nonTorchGiB": 0.55, "cudaGraphGiB": 0.798, "kvCacheGiB": 30.628},
    "kvBytesPerToken": 229376,
    "kvCacheTokens": 143360,
    "maxModelLen": 32768,
}
VLLM_ARGV = ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--port", "8000",
             "--tensor-parallel-size", "2", "--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]


def _plan(argv: list[str] | None = None, **per_gpu: float) -> LaunchPlan:
    memory = {**MEMORY_PLAN, "perGpu": {**MEMORY_PLAN["perGpu"], **per_gpu}}
    return launch_plan({"memoryPlan": memory, "argv": VLLM_ARGV if argv is None else argv})


def _gpu(index: int, free_gib: float, total: int = H100_TOTAL, name: str = "NVIDIA H100 80GB HBM3") -> GpuMemory:
    return GpuMemory(index, int(free_gib * GIB), total, name)


def test_an_idle_gpu_pair_holds_the_plan() -> None:
    result = check(_plan(), [_gpu(0, 78.6), _gpu(1, 78.6)])
    assert result.ok
    assert [c.gpu.index for c in result.checks] == [0, 1]
    assert result.checks[0].need_gib == pytest.approx(33.833 + 4.229 + 2.582 + 30.628)
    assert result.checks[0].requested_gib == pytest.approx(79.19 * 0.9)
    report = result.report()
    assert "starting vllm" in report
    assert "the plan needs 71.27 GiB (weights 38.06 + overhead 2.58 + KV cache 30.63)" in report
    assert "78.60 GiB of 79.19 GiB is free" in report


def test_another_process_on_the_gpu_refuses_with_numbers_and_fixes() -> None:
    result = check(_plan(), [_gpu(0, 78.6), _gpu(1, 52.1)])
    assert not result.ok
    assert [c.ok for c in result.checks] == [True, False]
    report = result.report()
    assert report.startswith("specdeploy preflight refused to start vllm: GPU 1 cannot hold the memory plan.")
    # The failing GPU comes first, with the plan's need, the real figures and vLLM's own request.
    assert report.index("GPU 1 (NVIDIA H100 80GB HBM3)") < report.index("GPU 0 (NVIDIA H100 80GB HBM3)")
    assert "the plan needs 71.27 GiB" in report
    assert "52.10 GiB of 79.19 GiB is free (27.09 GiB in use): does not fit" in report
    assert "The plan needs 19.17 GiB more than is free." in report
    assert "total × gpuMemoryUtilization = 79.19 × 0.9 = 71.27 GiB" in report
    # Fixes: who holds the memory, and the utilisation that would start (52.10 / 79.19 = 0.657 → 0.65),
    # with the KV cache it leaves: 0.65 × 79.19 − 40.644 = 10.83 GiB = 50,688 tokens (16-token blocks) of 229,376 B.
    assert "free the GPU: 27.09 GiB of it is held by another process" in report
    assert "lower `spec.resources.gpuMemoryUtilization` to 0.65 (the KV cache shrinks to 10.83 GiB: 50,688 tokens" \
        in report
    assert "1.55 sequences of 32,768" in report
    assert "SPECDEPLOY_PREFLIGHT=warn" in report


def test_lowering_utilisation_is_not_offered_when_one_sequence_would_not_fit() -> None:
    # 45 GiB free: 0.56 × 79.19 − 40.64 = 3.70 GiB of KV, less than the 7 GiB one 32,768-token sequence needs.
    failing = check(_plan(), [_gpu(0, 45.0), _gpu(1, 78.6)]).checks[0]
    assert not failing.ok
    assert not any("gpuMemoryUtilization` to" in fix for fix in failing.fixes)
    assert any(fix.startswith("free the GPU: 34.19 GiB") for fix in failing.fixes)


def test_a_gpu_smaller_than_the_plan_suggests_a_bigger_gpu() -> None:
    a100_40 = int(39.39 * GIB)
    failing = check(_plan(), [GpuMemory(0, a100_40 - GIB // 2, a100_40, "A100-40GB"),
                              GpuMemory(1, a100_40 - GIB // 2, a100_40, "A100-40GB")]).checks[0]
    assert not failing.ok
    assert len(failing.fixes) == 1
    assert failing.fixes[0].startswith("use a GPU with more memory (this one has 39.39 GiB")
    assert "`spec.model.quantization: fp8`" in failing.fixes[0]


def test_vllm_request_above_free_refuses_even_when_the_plan_itself_fits() -> None:
    # Planned for an H100 but running on an H200 (139.8 GiB) where 20 GiB is taken: the plan's 71.27 GiB is
    # free, but vLLM asks for 0.9 × 139.8 = 125.8 GiB and would exit.
    h200 = int(139.8 * GIB)
    gpus = [GpuMemory(i, h200 - 20 * GIB, h200, "NVIDIA H200") for i in range(2)]
    failing = check(_plan(), gpus).checks[0]
    assert failing.problems == ("vLLM asks for total × gpuMemoryUtilization = 139.80 × 0.9 = 125.82 GiB at "
                                "start-up and exits when less is free.",)
    assert any("gpuMemoryUtilization` to 0.85" in fix for fix in failing.fixes)


def test_a_bigger_gpu_than_planned_fits_with_a_note() -> None:
    h200 = int(139.8 * GIB)
    result = check(_plan(), [GpuMemory(i, h200 - GIB // 2, h200, "NVIDIA H200") for i in range(2)])
    assert result.ok
    assert "check that `spec.resources.gpu` names this GPU" in result.checks[0].notes[0]


@pytest.mark.parametrize("argv", [
    ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp-size", "2", "--mem-fraction-static", "0.9"],
    ["trtllm-serve", "m", "--tp_size", "2", "--config", "/etc/specdeploy/trtllm.yaml"],
], ids=["sglang", "trtllm"])
def test_other_engines_check_the_plan_without_vllms_request(argv: list[str]) -> None:
    plan = _plan(argv)
    fits = check(plan, [_gpu(0, 72.0), _gpu(1, 72.0)])
    assert fits.ok and fits.checks[0].requested_gib is None
    refused = check(plan, [_gpu(0, 60.0), _gpu(1, 72.0)])
    assert not refused.ok
    # Lowering the memory share does not help these engines: another process' memory comes out of their KV.
    assert not any("gpuMemoryUtilization" in fix for fix in refused.checks[0].fixes)
    assert refused.report().startswith(f"specdeploy preflight refused to start {engine_args(argv).engine}")


def test_too_few_visible_gpus_refuse() -> None:
    result = check(_plan(), [_gpu(0, 78.6)])
    assert not result.ok
    assert "needs 2 GPUs (tensor parallel × pipeline parallel) but 1 are visible" in result.report()


def test_a_layout_across_nodes_checks_one_nodes_share_in_each_pod() -> None:
    """TP 8 × PP 2 over two pods (one per node): each pod holds 8 GPUs, not 16 (the operator writes `nodes`)."""
    argv = [*VLLM_ARGV[:5], "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
    memory = {**MEMORY_PLAN, "perGpu": {**MEMORY_PLAN["perGpu"]}}
    eight = [_gpu(i, 78.6) for i in range(8)]
    across = launch_plan({"memoryPlan": memory, "argv": argv, "nodes": 2})
    assert across.gpus_per_pod == 8 and check(across, eight).ok
    alone = check(launch_plan({"memoryPlan": memory, "argv": argv}), eight)
    assert "needs 16 GPUs (tensor parallel × pipeline parallel) but 8 are visible" in alone.report()
    short = check(across, eight[:4])
    assert "needs 16 GPUs (tensor parallel × pipeline parallel), 8 in each of its 2 pods, but 4 are visible" \
        in short.report()


def test_no_gpu_refuses() -> None:
    result = check(_plan(), [])
    assert not result.ok
    assert "No GPU is visible" in result.report()


def test_only_the_gpus_the_engine_uses_are_checked() -> None:
    single = _plan([a if a != "2" else "1" for a in VLLM_ARGV])
    assert check(single, [_gpu(0, 78.6), _gpu(1, 3.0)]).ok


@given(free_gib=st.floats(min_value=0.0, max_value=79.19))
def test_refusal_follows_the_rule(free_gib: float) -> None:
    """Refused exactly when the plan's need or vLLM's request exceeds free memory (to rounding)."""
    result = check(_plan(), [_gpu(0, free_gib), _gpu(1, 78.6)])
    free = int(free_gib * GIB) / GIB
    need, request = 71.272, 79.19 * 0.9
    assert result.checks[0].ok == (free + 0.01 >= max(need, request))
    assert result.ok == result.checks[0].ok


# ------------------------------------------------------------------------------------------ plan.json


@pytest.mark.parametrize("example", ["llama-70b-fp8-tp2.yaml", "sglang-llama-8b-eagle3.yaml",
                                     "trtllm-llama-8b-eagle3.yaml"])
def test_reads_the_plan_json_the_operator_writes(example: str) -> None:
    resource = load_resource((EXAMPLES / example).read_text())
    plan = make_plan(resource.spec)
    children = desired_children(resource, plan)
    text = children.config_map["data"][f"{Variant.SPECULATIVE.value}.{PLAN_FILE}"]
    parsed = launch_plan(json.loads(text))
    container = children.deployments[Variant.SPECULATIVE]["spec"]["template"]["spec"]["containers"][0]
    assert list(parsed.argv) == container["command"] + container["args"]
    assert parsed.memory.need_gib == pytest.approx(
        plan.memory.per_gpu.target_weights_gib + plan.memory.per_gpu.draft_weights_gib
        + plan.memory.per_gpu.overhead_gib + plan.memory.per_gpu.kv_cache_gib)
    assert parsed.memory.max_model_len == plan.memory.max_model_len
    assert parsed.engine_args.gpus == resource.spec.resources.tensor_parallel_size
    assert parsed.engine_args.port == resource.spec.serving.port


@pytest.mark.parametrize(("data", "expected"), [
    ([], "must hold a JSON object"),
    ({"argv": ["vllm"]}, "has no `memoryPlan`"),
    ({"memoryPlan": {"perGpu": None}}, "`memoryPlan.perGpu` must be an object"),
    ({"memoryPlan": {"perGpu": {**MEMORY_PLAN["perGpu"], "kvCacheGiB": "lots"}}},
     "`memoryPlan.perGpu.kvCacheGiB` must be a number, got 'lots'"),
    ({"memoryPlan": MEMORY_PLAN, "argv": "vllm serve"}, "`argv` must be a list of strings"),
    ({"memoryPlan": MEMORY_PLAN, "nodes": 0}, "`nodes` must be a whole number of at least 1, got 0"),
])
def test_an_invalid_plan_names_the_field(data: Any, expected: str) -> None:
    with pytest.raises(PlanError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        launch_plan(data)


@pytest.mark.parametrize(("argv", "value"), [
    (["--port", "1", "--port=2"], "2"),
    (["--port=3"], "3"),
    (["--port"], None),
    (["--ports", "4"], None),
])
def test_flag_value_keeps_the_last_as_argparse_does(argv: list[str], value: str | None) -> None:
    assert flag_value(argv, "--port") == value


def test_engine_args_read_parallelism_and_memory_share() -> None:
    args = engine_args(["vllm", "serve", "m", "-tp", "4", "--pipeline-parallel-size=2"])
    assert (args.engine, args.gpus, args.gpu_memory_utilization, args.port) == ("vllm", 8, 0.9, None)
    assert engine_args(["/usr/local/bin/trtllm-serve", "m", "--pp_size", "2"]).gpus == 2


# ------------------------------------------------------------------------------------------ reading


def test_reader_without_torch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` raises ImportError
    with pytest.raises(GpuUnavailable, match="torch is not installed in this image"):
        read_gpus_with_torch()


def _fake_torch(devices: list[tuple[int, int, str]]) -> types.ModuleType:
    torch = types.ModuleType("torch")
    cuda = types.SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        mem_get_info=lambda index: devices[index][:2],
        get_device_name=lambda index: devices[index][2],
    )
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


def test_reader_reports_each_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch([(10 * GIB, 80 * GIB, "A"), (20 * GIB, 80 * GIB, "B")]))
    assert read_gpus_with_torch() == [GpuMemory(0, 10 * GIB, 80 * GIB, "A"), GpuMemory(1, 20 * GIB, 80 * GIB, "B")]


def test_reader_without_a_visible_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch([]))
    with pytest.raises(GpuUnavailable, match="torch sees no CUDA GPU"):
        read_gpus_with_torch()


def test_reader_answer_round_trips_through_json(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch([(10 * GIB, 80 * GIB, "NVIDIA H200")]))
    assert preflight.main(["--read-gpus"]) == 0
    assert gpus_from_json(capsys.readouterr().out) == [GpuMemory(0, 10 * GIB, 80 * GIB, "NVIDIA H200")]


def test_reader_errors_come_back_as_gpu_unavailable() -> None:
    with pytest.raises(GpuUnavailable, match="no GPU here"):
        gpus_from_json('{"error": "no GPU here"}\n')
    with pytest.raises(GpuUnavailable, match=r"reader failed \(exit 1\): ImportError: boom"):
        gpus_from_json("", "Traceback …\nImportError: boom\n", 1)


def test_read_gpus_runs_a_child_python_that_exits() -> None:
    """The real child process, here without torch (the test environment has none)."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here; the child would read real GPUs")
    with pytest.raises(GpuUnavailable, match="torch is not installed"):
        read_gpus()
