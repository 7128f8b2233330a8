"""Pairing by what a checkpoint is (its config.json's quantization_config, the base model it holds) and the
tensor-parallel topologies the engines accept. Plans are made from the catalog and from config.json files
served by the fake Hub on loopback (devcluster/fakehub.py), never huggingface.co."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.spec import Quantization, SpeculativeDeploymentSpec
from specdeploy.api.status import Finding, Severity
from specdeploy.devcluster.fakehub import FakeHub, FakeRepo
from specdeploy.modelsource.hub import HubClient, quantised_from
from specdeploy.modelsource.resolve import ArchitectureSource, ConfigMapConfig, Supplied, resolve_models
from specdeploy.planning.catalog import lookup
from specdeploy.planning.checkpoint import UNQUANTISED, CheckpointQuantization, read_checkpoint_quantization
from specdeploy.planning.plan import Plan, make_plan
from specdeploy.planning.topology import GPUS_PER_NODE, valid_tensor_parallel_sizes

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hub"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FP8_DYNAMIC = "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic"
AWQ = "casperhansen/llama-3.3-70b-instruct-awq"
BASE = "meta-llama/Llama-3.3-70B-Instruct"
HEAD = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"


def fixture_config(repo: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / repo / "config.json").read_text())
    return loaded


def spec(model: dict[str, Any], *, tp: int = 2, method: str = "eagle3", draft: str | None = HEAD,
         engine: str = "vllm", utilization: float = 0.9) -> SpeculativeDeploymentSpec:
    speculation: dict[str, Any] = {"method": method, "numSpeculativeTokens": 3}
    if draft is not None:
        speculation["draft"] = {"name": draft}
    return SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": engine}, "model": model, "speculation": speculation,
        "resources": {"tensorParallelSize": tp, "gpu": {"product": "H100-80GB", "count": tp},
                      "gpuMemoryUtilization": utilization},
        "serving": {"maxModelLen": 8192, "maxNumSeqs": 16},
    })


def findings(plan: Plan) -> dict[str, Finding]:
    return {finding.code: finding for finding in plan.compatibility.findings}


# --- what a config.json says it stores -------------------------------------------------------------------

def test_the_quantisation_is_read_from_each_format_as_the_quantisers_write_it() -> None:
    assert read_checkpoint_quantization(fixture_config(FP8_DYNAMIC)) == CheckpointQuantization(
        Quantization.FP8, "compressed-tensors")
    assert read_checkpoint_quantization(fixture_config(AWQ)) == CheckpointQuantization(Quantization.AWQ, "awq")
    assert read_checkpoint_quantization(fixture_config("meta-llama/Llama-3.1-8B-Instruct")) == UNQUANTISED
    assert read_checkpoint_quantization({"quantization_config": {"quant_method": "gptq", "bits": 4}}) == \
        CheckpointQuantization(Quantization.GPTQ, "gptq")
    int4 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}
    assert read_checkpoint_quantization({"text_config": {"quantization_config": int4}}).scheme == Quantization.INT4
    # a format the planner has no size for is still known to be quantised, by its method
    assert read_checkpoint_quantization({"quantization_config": {"quant_method": "mxfp4"}}) == \
        CheckpointQuantization(None, "mxfp4")


def test_the_catalog_counts_a_quantised_repository_at_what_it_stores() -> None:
    fp8, awq, base = lookup(FP8_DYNAMIC), lookup(AWQ), lookup(BASE)
    assert fp8 is not None and awq is not None and base is not None
    assert fp8.base_model == awq.base_model == BASE and base.base_model == ""
    assert fp8.architecture == base.architecture
    # 70.55B at 1 byte + the 2.1B embedding and LM head parameters at 2: vLLM loads 67.72 GiB (llm-d data)
    assert fp8.checkpoint_bytes_per_param is not None
    assert fp8.checkpoint_bytes_per_param * base.architecture.num_parameters / 2**30 == pytest.approx(67.7, abs=0.2)
    assert awq.checkpoint_bytes_per_param is not None and 0.5 < awq.checkpoint_bytes_per_param < 0.6


# --- a head pairs with checkpoints of its base model -----------------------------------------------------

def test_an_fp8_dynamic_checkpoint_plans_with_the_base_models_head_and_the_fp8_weights() -> None:
    plan = make_plan(spec({"name": FP8_DYNAMIC}))
    found = findings(plan)
    assert plan.compatibility.compatible, plan.compatibility.findings
    assert "EagleHeadTargetMismatch" not in found
    assert found["TargetQuantized"].severity == Severity.INFO
    assert "compressed-tensors" in found["TargetQuantized"].message
    assert plan.memory.per_gpu.target_weights_gib == pytest.approx(67.7 / 2, abs=0.2)   # FP8, not 16-bit, per GPU


def test_an_awq_checkpoint_plans_with_the_base_models_head_and_awq_is_passed_to_the_engine() -> None:
    plan = make_plan(spec({"name": AWQ, "quantization": "awq"}, tp=1))
    assert plan.compatibility.compatible, plan.compatibility.findings
    assert "TargetQuantized" in findings(plan)
    assert plan.memory.per_gpu.target_weights_gib < 40


def test_a_local_path_pairs_through_its_base_model_and_is_described_by_the_base() -> None:
    path = "/models/llama-3.3-70b-awq"
    with pytest.raises(ValueError, match="not in the built-in catalog"):
        make_plan(spec({"name": path, "quantization": "awq"}, tp=1))
    plan = make_plan(spec({"name": path, "quantization": "awq", "baseModel": BASE}, tp=1))
    assert plan.compatibility.compatible, plan.compatibility.findings
    assert plan.target.base_model == BASE and plan.target.stored_quantization is None
    assert plan.target.architecture == lookup(BASE).architecture  # type: ignore[union-attr]
    resolved = resolve_models(spec({"name": path, "quantization": "awq", "baseModel": BASE}, tp=1), offline=True)
    assert resolved.target.origin.source == ArchitectureSource.CATALOG
    assert "spec.model.baseModel" in resolved.target.info.source


def test_a_local_config_is_read_for_its_quantisation_and_pairs_through_base_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(fixture_config(AWQ)))
    document = {"name": str(tmp_path), "baseModel": BASE, "configPath": str(tmp_path)}
    written = spec(document, tp=1)
    models = resolve_models(written, offline=True, target=Supplied(config_path=tmp_path))
    assert models.target.info.stored_quantization == CheckpointQuantization(Quantization.AWQ, "awq")
    plan = make_plan(written, models)
    assert plan.compatibility.compatible, plan.compatibility.findings
    assert plan.memory.per_gpu.target_weights_gib < 40   # counted as the AWQ it stores, with quantization none


def test_a_config_map_checkpoint_is_read_for_its_quantisation_and_a_contradiction_refused() -> None:
    config_map = ConfigMapConfig("llama-fp8", {"config.json": json.dumps(fixture_config(FP8_DYNAMIC))})
    for quantization, contradicts in (("none", False), ("fp8", True)):
        written = spec({"name": "/models/llama", "baseModel": BASE, "configMapRef": "llama-fp8",
                        "quantization": quantization})
        models = resolve_models(written, offline=True, target=Supplied(config_map=config_map))
        assert models.target.origin.source == ArchitectureSource.CONFIG_MAP
        plan = make_plan(written, models)
        assert ("QuantizationContradictsCheckpoint" in findings(plan)) == contradicts
        assert "EagleHeadTargetMismatch" not in findings(plan)
        assert plan.memory.per_gpu.target_weights_gib == pytest.approx(67.7 / 2, abs=0.2)


def test_a_path_named_like_a_catalog_model_is_not_refused_for_what_its_files_might_store() -> None:
    plan = make_plan(spec({"name": "/models/Llama-3.3-70B-Instruct", "quantization": "awq"}, tp=1))
    assert plan.target.stored_quantization is None
    assert "QuantizationContradictsCheckpoint" not in findings(plan) and plan.compatibility.compatible


def test_without_base_model_a_head_for_another_model_is_still_refused_with_the_field_to_set() -> None:
    plan = make_plan(spec({"name": "meta-llama/Llama-3.1-70B-Instruct", "quantization": "fp8"}))
    mismatch = findings(plan)["EagleHeadTargetMismatch"]
    assert mismatch.severity == Severity.ERROR and "`spec.model.baseModel`" in mismatch.message


# --- a spec quantisation the checkpoint contradicts ------------------------------------------------------

def test_fp8_on_a_compressed_tensors_checkpoint_is_refused_with_none_as_the_fix() -> None:
    error = findings(make_plan(spec({"name": FP8_DYNAMIC, "quantization": "fp8"})))[
        "QuantizationContradictsCheckpoint"]
    assert error.severity == Severity.ERROR
    assert "(compressed-tensors) does not match" in error.message
    assert "set `spec.model.quantization` to none" in error.message


def test_awq_on_a_16_bit_checkpoint_is_refused_naming_an_awq_repository_of_it() -> None:
    error = findings(make_plan(spec({"name": BASE, "quantization": "awq"}, tp=1)))["QuantizationContradictsCheckpoint"]
    assert "not quantised" in error.message and AWQ in error.message


@pytest.mark.parametrize(("name", "quantization", "engine"), [
    (BASE, "fp8", "vllm"),            # quantised to FP8 as it loads
    (AWQ, "awq", "vllm"), (AWQ, "int4", "vllm"), (AWQ, "none", "sglang"), (FP8_DYNAMIC, "none", "vllm"),
])
def test_what_the_checkpoint_stores_agrees(name: str, quantization: str, engine: str) -> None:
    plan = make_plan(spec({"name": name, "quantization": quantization}, engine=engine))
    assert "QuantizationContradictsCheckpoint" not in findings(plan)


@pytest.mark.parametrize(("name", "quantization", "engine"), [
    (AWQ, "fp8", "vllm"), (AWQ, "gptq", "sglang"), (FP8_DYNAMIC, "awq", "trtllm"), (BASE, "fp8", "trtllm"),
    ("openai/gpt-oss-20b", "fp8", "vllm"),
])
def test_what_the_checkpoint_stores_contradicts(name: str, quantization: str, engine: str) -> None:
    written = spec({"name": name, "quantization": quantization}, engine=engine, method="ngram", draft=None)
    assert findings(make_plan(written))["QuantizationContradictsCheckpoint"].severity == Severity.ERROR


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_every_example_names_a_checkpoint_its_quantisation_loads(path: Path) -> None:
    from specdeploy.api.resource import load_resource

    resource = load_resource(path.read_text())
    plan = make_plan(resource.spec)
    codes = findings(plan)
    assert "QuantizationContradictsCheckpoint" not in codes and "EagleHeadTargetMismatch" not in codes
    stored = plan.target.stored_quantization
    assert stored is not None   # every example names a model whose config.json the catalog holds
    if resource.spec.model.quantization in (Quantization.AWQ, Quantization.GPTQ):
        assert stored.scheme == resource.spec.model.quantization


# --- topologies the engines accept -----------------------------------------------------------------------

def test_tp_3_on_a_64_head_model_is_refused_with_the_sizes_that_work() -> None:
    plan = make_plan(spec({"name": BASE, "quantization": "fp8"}, tp=3))
    error = findings(plan)["TensorParallelSizeInvalid"]
    assert error.severity == Severity.ERROR and not plan.accepted
    assert "64 attention heads" in error.message and error.message.endswith("set one of 1, 2, 4, 8")
    assert "DraftTensorParallelSizeInvalid" not in findings(plan)   # reported once, for the target


def test_valid_sizes_follow_heads_and_kv_heads() -> None:
    qwen_7b = lookup("Qwen/Qwen2.5-7B-Instruct")   # 28 heads, 4 KV heads: 7 divides the heads, not the KV heads
    assert qwen_7b is not None and valid_tensor_parallel_sizes(qwen_7b.architecture) == [1, 2, 4]
    qwen_1_5b = lookup("Qwen/Qwen2.5-1.5B-Instruct")   # 12 heads, 2 KV heads: 4 replicates each KV head twice
    assert qwen_1_5b is not None and valid_tensor_parallel_sizes(qwen_1_5b.architecture) == [1, 2, 4, 6]
    deepseek = lookup("deepseek-ai/DeepSeek-V3")   # MLA: only the 128 heads divide
    assert deepseek is not None and valid_tensor_parallel_sizes(deepseek.architecture) == [1, 2, 4, 8]


def test_a_pod_larger_than_a_node_is_refused() -> None:
    plan = make_plan(spec({"name": "meta-llama/Llama-3.1-405B-Instruct"}, tp=16, method="ngram", draft=None))
    assert findings(plan)["PodExceedsNode"].severity == Severity.ERROR


def test_a_draft_the_engine_cannot_shard_at_the_targets_tp_is_refused() -> None:
    # Qwen2.5-7B shards over 4; a Qwen2.5-0.5B draft (14 heads, 2 KV heads) does not
    written = spec({"name": "Qwen/Qwen2.5-7B-Instruct"}, tp=4, method="draft_model", draft="Qwen/Qwen2.5-0.5B-Instruct")
    error = findings(make_plan(written))["DraftTensorParallelSizeInvalid"]
    assert "`spec.speculation.draft.tensorParallelSize` to 1" in error.message


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"])
def test_no_fix_asks_for_more_gpus_than_a_node_has(model: str) -> None:
    for tp in (1, 2, 4, 8):
        plan = make_plan(spec({"name": model}, tp=tp, method="ngram", draft=None))
        sizes = [int(s.value) for s in plan.memory.suggestions if s.field == "spec.resources.tensorParallelSize"]
        assert all(size <= GPUS_PER_NODE for size in sizes), (tp, sizes)


def test_a_quantised_checkpoint_is_not_told_to_set_fp8_and_an_awq_fix_names_a_repository() -> None:
    plan = make_plan(spec({"name": FP8_DYNAMIC}, tp=1, method="ngram", draft=None, utilization=0.8))
    assert not plan.memory.fits   # 67.7 GiB of FP8 weights in a 63 GiB budget
    quantisation = {s.value: s.message for s in plan.memory.suggestions if s.field == "spec.model.quantization"}
    assert "fp8" not in quantisation and AWQ in quantisation["awq"]


# --- from the Hub: the checkpoint's own config.json ------------------------------------------------------

@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub.from_fixtures(FIXTURES) as fake:
        yield fake
    assert not [t for t in threading.enumerate() if t.name == "fakehub"], "a fake hub was left running"


@pytest.mark.parametrize(("name", "quantization", "stored"), [
    (FP8_DYNAMIC, "none", CheckpointQuantization(Quantization.FP8, "compressed-tensors")),
    (AWQ, "awq", CheckpointQuantization(Quantization.AWQ, "awq")),
])
def test_hub_checkpoints_plan_with_the_head_from_their_own_config(
        hub: FakeHub, tmp_path: Path, name: str, quantization: str, stored: CheckpointQuantization) -> None:
    written = spec({"name": name, "quantization": quantization}, draft=None, method="ngram")
    models = resolve_models(written, hub=HubClient(tmp_path, endpoint=hub.url))
    assert models.target.origin.source == ArchitectureSource.HUB
    assert models.target.info.stored_quantization == stored and models.target.info.base_model == BASE
    with_head = spec({"name": name, "quantization": quantization})
    plan = make_plan(with_head, resolve_models(with_head, hub=HubClient(tmp_path, endpoint=hub.url)))
    assert plan.compatibility.compatible, plan.compatibility.findings


def test_the_hub_model_tree_names_the_base_of_a_repository_the_catalog_does_not_know(tmp_path: Path) -> None:
    unknown = "someone/Llama-3.3-70B-Instruct-FP8"
    quantised = [f"base_model:{BASE}", f"base_model:quantized:{BASE}"]
    repos = [
        FakeRepo.with_files(unknown, {"config.json": (FIXTURES / FP8_DYNAMIC / "config.json").read_bytes()},
                            tags=quantised),
        FakeRepo.with_files("someone/Llama-3.3-70B-finetune", {"config.json": (FIXTURES / FP8_DYNAMIC /
                            "config.json").read_bytes()}, tags=[f"base_model:finetune:{BASE}"]),
        FakeRepo.with_files(HEAD, {"config.json": (FIXTURES / HEAD / "config.json").read_bytes()}),
    ]
    with FakeHub(repos) as hub:
        client = HubClient(tmp_path, endpoint=hub.url)
        written = spec({"name": unknown})
        plan = make_plan(written, resolve_models(written, hub=client))
        assert plan.compatibility.compatible, plan.compatibility.findings
        assert plan.target.base_model == BASE and "TargetQuantized" in findings(plan)
        # the same commit again, from the cache: no model_info asked, and the base still known
        sha = hub.sha(unknown)
        pinned = spec({"name": unknown, "revision": sha})
        asked = len(hub.requests_for(f"/api/models/{unknown}"))
        again = make_plan(pinned, resolve_models(pinned, hub=client))
        assert len(hub.requests_for(f"/api/models/{unknown}")) == asked
        assert again.target.base_model == BASE and again.compatibility.compatible
        # a fine-tune holds other weights: the base's head is still refused for it
        finetune = spec({"name": "someone/Llama-3.3-70B-finetune"})
        refused = make_plan(finetune, resolve_models(finetune, hub=client))
        assert findings(refused)["EagleHeadTargetMismatch"].severity == Severity.ERROR


def test_only_one_quantised_base_counts() -> None:
    assert quantised_from([f"base_model:quantized:{BASE}", f"base_model:{BASE}"]) == BASE
    assert quantised_from([f"base_model:finetune:{BASE}"]) == ""
    assert quantised_from([f"base_model:quantized:{BASE}", "base_model:quantized:other/model"]) == ""
