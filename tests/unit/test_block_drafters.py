"""The 2026 drafters: DFlash and DSpark (block drafters) on vLLM and SGLang, GPU n-gram on vLLM.

Each is planned (memory, compatibility, a cost model of its drafting pass), rendered in the engine's own words
(checked against the flag inventories in test_engine_flags.py) and timed by the simulator as what it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from model_fixtures import EAGLE3_8B, LLAMA_8B, arch

from specdeploy.api.spec import Method, Quantization, SpeculativeDeploymentSpec
from specdeploy.api.status import Severity
from specdeploy.cli import main
from specdeploy.engines import EngineInputs, render_engine
from specdeploy.planning.catalog import lookup
from specdeploy.planning.compat import check_compatibility
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.hf_config import architecture_from_hf_config, head_kind, trained_block_tokens
from specdeploy.planning.modelinfo import ModelInfo, ModelKind
from specdeploy.planning.pairing import check_head_pairing
from specdeploy.planning.plan import hardware_scaled, make_plan
from specdeploy.planning.speedup import speculation_cost
from specdeploy.planning.weights import block_drafter_parameters, draft_weight_bytes
from specdeploy_engine.sim.argv import EngineArgvError, parse_engine_argv
from specdeploy_engine.sim.hardware import DRAFT_PASS_OVERHEAD_S
from specdeploy_engine.sim.model import StepShape, served_model

H100 = find_gpu("H100-80GB")
assert H100 is not None
QWEN3_8B = "Qwen/Qwen3-8B"
DFLASH = "z-lab/Qwen3-8B-DFlash-b16"
DSPARK = "deepseek-ai/dspark_qwen3_8b_block7"
DRAFTS = {"dflash": DFLASH, "dspark": DSPARK}
# A trimmed DFlash drafter config.json in z-lab's layout (architectures, dflash_config), for Qwen3-4B.
DFLASH_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 5, "hidden_size": 2560,
    "intermediate_size": 9728, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "block_size": 16,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}


def spec(method: str, engine: str = "vllm", *, model: str = QWEN3_8B, k: int = 7, draft: dict[str, Any] | None = None,
         **speculation: Any) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {
        "engine": {"kind": engine}, "model": {"name": model},
        "speculation": {"method": method, "numSpeculativeTokens": k, **speculation},
        "resources": {"gpu": {"product": "H100-80GB", "count": 1}, "gpuMemoryUtilization": 0.9},
        "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
    }
    if draft is not None or method in DRAFTS:
        document["speculation"]["draft"] = draft or {"name": DRAFTS[method]}
    return SpeculativeDeploymentSpec.model_validate(document)


def codes(s: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> dict[str, Any]:
    return {f.code: f for f in check_compatibility(s, target, draft).findings}


# --- plan and render -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "engine"), [("dflash", "vllm"), ("dspark", "vllm"), ("dflash", "sglang"),
                                                ("dspark", "sglang")])
def test_a_block_drafter_plans_with_its_own_weights_and_kv_and_renders_the_engines_config(
        method: str, engine: str) -> None:
    plan = make_plan(spec(method, engine))
    assert plan.compatibility.compatible, plan.compatibility.findings
    assert plan.draft is not None and plan.draft.kind == ModelKind(method)
    memory, without = plan.memory, plan.memory_without_speculation
    # A block drafter is a model: its own weights (about 1B parameters in bf16) and its five layers' KV per token.
    assert 1.5 < memory.per_gpu.draft_weights_gib < 2.5
    assert memory.kv_bytes_per_token - without.kv_bytes_per_token == 5 * 2 * 8 * 128 * 2
    assert memory.draft_cost.kv_cache_tokens > 0
    assert plan.speedup is not None and plan.speedup.speedup_at_batch_1 > 1
    argv = render_engine(EngineInputs(plan.spec, served_model_name="m", max_model_len=8192)).argv()
    if engine == "vllm":
        config = json.loads(argv[argv.index("--speculative-config") + 1])
        assert config == {"method": method, "model": DRAFTS[method], "num_speculative_tokens": 7}
    else:
        assert argv[argv.index("--speculative-algorithm") + 1] == method.upper()
        flag = f"--speculative-{method}-block-size"
        assert argv[argv.index(flag) + 1] == ("8" if method == "dflash" else "7")


def test_the_dspark_drafter_weighs_its_markov_and_confidence_heads() -> None:
    dflash, dspark = lookup(DFLASH), lookup(DSPARK)
    assert dflash is not None and dspark is not None
    # Same backbone; DSpark adds a rank-256 Markov head over the vocabulary both ways and a confidence head.
    added = dspark.architecture.num_parameters - dflash.architecture.num_parameters
    assert added == 2 * 151936 * 256 + 4096 + 256 + 1


def test_ngram_gpu_plans_on_vllm_without_a_drafter() -> None:
    plan = make_plan(spec("ngram_gpu", k=4))
    assert plan.compatibility.compatible
    assert plan.draft is None and plan.memory.per_gpu.draft_weights_gib == 0
    assert plan.cost is not None and plan.cost.draft is None   # matching costs no model pass
    config = json.loads(render_engine(EngineInputs(plan.spec, served_model_name="m", max_model_len=8192))
                        .argv()[-1])
    assert config["method"] == "ngram_gpu" and config["prompt_lookup_max"] == 5


def test_ngram_gpu_outside_vllm_is_refused_even_when_cel_was_bypassed() -> None:
    valid = spec("ngram", "sglang")
    bypassed = valid.model_copy(update={"speculation": valid.speculation.model_copy(
        update={"method": Method.NGRAM_GPU})})
    finding = codes(bypassed, LLAMA_8B, None)["MethodNotSupportedByEngine"]
    assert finding.severity == Severity.ERROR and "ngram_gpu" in finding.message


# --- compatibility -------------------------------------------------------------------------------------


def test_an_unknown_target_for_a_dflash_drafter_is_a_finding_not_a_crash() -> None:
    unknown = {"name": "someone/my-dflash", "architecture": {
        "numLayers": 5, "hiddenSize": 4096, "intermediateSize": 14336, "numAttentionHeads": 32,
        "numKeyValueHeads": 8, "vocabSize": 128256, "numParameters": 1_100_000_000, "maxPositionEmbeddings": 131072}}
    plan = make_plan(spec("dflash", model="meta-llama/Llama-3.1-8B-Instruct", draft=unknown))
    found = {f.code: f for f in plan.compatibility.findings}
    assert found["DrafterTargetUnknown"].severity == Severity.WARNING
    assert "someone/my-dflash" in found["DrafterTargetUnknown"].message
    assert plan.compatibility.compatible and plan.draft is not None and plan.draft.kind == ModelKind.DFLASH


def test_a_block_drafter_trained_for_another_target_is_refused() -> None:
    drafter = lookup(DFLASH)
    assert drafter is not None
    found = codes(spec("dflash", model="meta-llama/Llama-3.1-8B-Instruct"), LLAMA_8B, drafter)
    assert found["DrafterTargetMismatch"].severity == Severity.ERROR
    assert "Qwen/Qwen3-8B" in found["DrafterTargetMismatch"].message
    assert found["DraftVocabularyMismatch"].severity == Severity.ERROR   # 151,936 tokens against 128,256


def test_a_block_method_needs_a_drafter_of_its_kind() -> None:
    found = codes(spec("dflash", model="meta-llama/Llama-3.1-8B-Instruct",
                       draft={"name": EAGLE3_8B.name}), LLAMA_8B, EAGLE3_8B)
    assert found["DraftNotABlockDrafter"].severity == Severity.ERROR
    assert "set method eagle3" in found["DraftNotABlockDrafter"].message
    dspark = lookup(DSPARK)
    assert dspark is not None
    qwen = lookup(QWEN3_8B)
    assert qwen is not None
    assert "set method dspark" in codes(spec("dflash", draft={"name": DSPARK}), qwen, dspark)[
        "DraftNotABlockDrafter"].message


def test_k_past_the_block_the_drafter_was_trained_on_is_a_warning() -> None:
    qwen, dflash, dspark = lookup(QWEN3_8B), lookup(DFLASH), lookup(DSPARK)
    assert qwen is not None and dflash is not None and dspark is not None
    assert (dflash.trained_block_tokens, dspark.trained_block_tokens) == (15, 7)   # block 16 with its bonus; gamma 7
    assert "BlockLongerThanTrained" not in codes(spec("dflash", k=15), qwen, dflash)
    found = codes(spec("dspark", k=8), qwen, dspark)["BlockLongerThanTrained"]
    assert found.severity == Severity.WARNING and "set it to 7 or less" in found.message


def test_sglang_notes_what_it_changes_for_a_block_drafter() -> None:
    qwen, dflash, dspark = lookup(QWEN3_8B), lookup(DFLASH), lookup(DSPARK)
    assert qwen is not None and dflash is not None and dspark is not None
    on_dflash = codes(spec("dflash", "sglang", eagleTopk=4), qwen, dflash)
    assert on_dflash["DFlashDisablesOverlapScheduler"].severity == Severity.INFO
    assert on_dflash["EagleTopkIgnored"].severity == Severity.INFO
    assert "OverlapSchedulerDisabled" not in on_dflash   # no tree: topk is forced to 1, not a spec-v1 fallback
    assert codes(spec("dspark", "sglang"), qwen, dspark)["DSparkVerifiesWholeBlock"].severity == Severity.INFO
    assert not {"DFlashDisablesOverlapScheduler", "DSparkVerifiesWholeBlock"} & set(
        codes(spec("dflash"), qwen, dflash))


def test_dsparks_own_speculative_config_key_is_refused_for_another_method() -> None:
    qwen, dflash, dspark = lookup(QWEN3_8B), lookup(DFLASH), lookup(DSPARK)
    assert qwen is not None and dflash is not None and dspark is not None
    topk = {"dspark_draft_topk": 64}
    found = codes(spec("dflash", extraConfig=topk), qwen, dflash)["ExtraConfigKeyNeedsMethod"]
    assert found.severity == Severity.ERROR and "only supported by DSpark" in found.message
    assert "ExtraConfigKeyNeedsMethod" not in codes(spec("dspark", extraConfig=topk), qwen, dspark)
    config = json.loads(render_engine(EngineInputs(spec("dspark", extraConfig=topk), served_model_name="m",
                                                   max_model_len=8192)).argv()[-1])
    assert config["dspark_draft_topk"] == 64


def test_a_drafter_config_that_names_its_verifier_is_held_to_it() -> None:
    config = {**DFLASH_CONFIG, "speculators_config": {"verifier": {"name_or_path": "Qwen/Qwen3-4B"}}}
    found = {f.code: f for f in check_head_pairing(Method.DFLASH, QWEN3_8B, arch(36, 4096, 12288, 32, 8, 128, 151936,
                                                                                  8.2e9), "x/dflash", config)}
    assert found["DrafterTargetMismatch"].severity == Severity.ERROR
    assert "Qwen/Qwen3-4B" in found["DrafterTargetMismatch"].message
    assert "EagleHeadHiddenSizeMismatch" in found   # 2,560 wide against the 8B's 4,096
    assert check_head_pairing(Method.DFLASH, "Qwen/Qwen3-4B", arch(36, 2560, 9728, 32, 8, 128, 151936, 4e9),
                              "x/dflash", config) == []


# --- model config and memory ---------------------------------------------------------------------------


def test_a_dflash_config_is_read_as_a_drafter_of_its_own_layers() -> None:
    assert head_kind(DFLASH_CONFIG) == ModelKind.DFLASH
    assert trained_block_tokens(DFLASH_CONFIG) == 15
    assert trained_block_tokens({**DFLASH_CONFIG, "architectures": ["Qwen3DSparkModel"], "dspark_block_size": 7}) == 7
    assert trained_block_tokens({"architectures": ["LlamaForCausalLM"], "block_size": 16}) is None
    assert head_kind({**DFLASH_CONFIG, "architectures": ["Qwen3DSparkModel"]}) == ModelKind.DSPARK
    architecture = architecture_from_hf_config(DFLASH_CONFIG)
    assert architecture.num_parameters == block_drafter_parameters(architecture, 5)
    # fc over five 2,560-wide target layers, five decoder layers, no embeddings or lm_head of its own.
    assert 0.5e9 < architecture.num_parameters < 0.8e9
    drafter = ModelInfo("x/dflash", architecture, kind=ModelKind.DFLASH)
    assert draft_weight_bytes(drafter, Quantization.NONE, 2) == architecture.num_parameters * 2
    assert draft_weight_bytes(drafter, Quantization.FP8, 2) == architecture.num_parameters


# --- cost of the drafting pass -----------------------------------------------------------------------------


def test_a_block_drafter_drafts_k_tokens_in_one_pass() -> None:
    qwen, dflash, dspark = lookup(QWEN3_8B), lookup(DFLASH), lookup(DSPARK)
    assert qwen is not None and dflash is not None and dspark is not None
    block = speculation_cost(spec("dflash", k=15), qwen, dflash, H100, context_tokens=1024)
    markov = speculation_cost(spec("dspark", k=15), qwen, dspark, H100, context_tokens=1024)
    assert block.parallel_drafting and not block.sequential_selections and markov.sequential_selections
    for batch in (1, 32):
        one_pass = block.block_draft_seconds(batch, 15)
        # One pass over 16 query tokens: dearer than one token's pass, far cheaper than 15 chained passes.
        assert block.draft_pass_seconds(batch) < one_pass < 15 * block.draft_pass_seconds(batch) / 3
        verify_only = block.speculative_step_seconds(batch, 15) - one_pass
        assert verify_only == pytest.approx(block.baseline_step_seconds(batch) - block.target_pass_seconds(batch, 1)
                                            + block.target_pass_seconds(batch, 16))
        # DSpark picks its 15 tokens one by one (its Markov head): 14 more selections than DFlash's one.
        assert markov.block_draft_seconds(batch, 15) - markov.draft_pass_seconds(batch) > \
            14 * markov.draft_pass_overhead_s


# --- simulator -----------------------------------------------------------------------------------------


def test_the_simulator_times_a_block_drafter_as_one_pass_over_the_block() -> None:
    argv = ["vllm", "serve", QWEN3_8B, "--speculative-config",
            json.dumps({"method": "dflash", "model": DFLASH, "num_speculative_tokens": 7})]
    served = served_model(parse_engine_argv(argv, gpu=H100), H100)
    timing = served.timing
    assert served.draft is not None and served.draft.kind == ModelKind.DFLASH
    assert timing.draft is not None and timing.parallel_drafting and not timing.sequential_selections
    shape = StepShape(decode_seqs=8, verify_tokens=8, decode_kv_tokens=8 * 1024, drafting_seqs=8)
    target = timing.target.seconds(tokens=64, tokens_per_sequence=8, kv_tokens=8 * 1024)
    block = timing.draft.seconds(tokens=64, tokens_per_sequence=8, kv_tokens=8 * 1024, attention_pairs=8 * 8 * 1024)
    assert timing.step_seconds(shape) == pytest.approx(target + timing.step_overhead_s + block + DRAFT_PASS_OVERHEAD_S)


@pytest.mark.parametrize(("flags", "method", "k"), [
    (["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", DFLASH,
      "--speculative-dflash-block-size", "8"], Method.DFLASH, 7),
    (["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", DSPARK,
      "--speculative-dspark-block-size", "7"], Method.DSPARK, 7),
])
def test_the_simulator_reads_sglang_block_sizes_as_sglang_does(flags: list[str], method: Method, k: int) -> None:
    config = parse_engine_argv(["python3", "-m", "sglang.launch_server", "--model-path", QWEN3_8B, *flags], gpu=H100)
    assert config.speculation is not None
    assert (config.speculation.method, config.speculation.num_speculative_tokens) == (method, k)
    assert config.speculation.verify_tokens == k + 1


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", QWEN3_8B, "--speculative-config", '{"method": "dspark", "num_speculative_tokens": 5}'],
    ["python3", "-m", "sglang.launch_server", "--model-path", QWEN3_8B, "--speculative-algorithm", "DSPARK"],
])
def test_dspark_inside_the_targets_checkpoint_is_not_guessed(argv: list[str]) -> None:
    with pytest.raises(EngineArgvError) as caught:
        parse_engine_argv(argv, gpu=H100)
    assert caught.value.exit_code == 2 and "cannot simulate DSpark stages" in caught.value.stderr


def test_an_unknown_dspark_drafter_is_timed_as_a_dspark_drafter_of_the_targets_shape() -> None:
    argv = ["vllm", "serve", QWEN3_8B, "--speculative-config",
            json.dumps({"method": "dspark", "model": "acme/qwen3-8b-dspark", "num_speculative_tokens": 5})]
    served = served_model(parse_engine_argv(argv, gpu=H100), H100)
    assert served.draft is not None and served.draft.kind == ModelKind.DSPARK
    assert served.timing.sequential_selections
    assert any("timed as a dspark drafter" in note for note in served.notes)


VLLM_METHODS = json.loads((Path(__file__).parent.parent / "data" / "engine-flags" / "vllm.json").read_text())[
    "speculative_config"]["method"]


@pytest.mark.parametrize("alias", [method for method in VLLM_METHODS if method.endswith("_mtp")])
def test_every_per_family_mtp_name_of_vllm_is_mtp(alias: str) -> None:
    config = parse_engine_argv(["vllm", "serve", "XiaomiMiMo/MiMo-7B-RL", "--speculative-config",
                                json.dumps({"method": alias, "num_speculative_tokens": 1})], gpu=H100)
    assert config.speculation is not None and config.speculation.method == Method.MTP


def test_a_drafter_read_from_its_config_json_plans_as_a_block_drafter(tmp_path: Path) -> None:
    drafter_dir = tmp_path / "qwen3-4b-dflash"
    drafter_dir.mkdir()
    config = {**DFLASH_CONFIG, "speculators_config": {"verifier": {"name_or_path": "Qwen/Qwen3-4B"}}}
    (drafter_dir / "config.json").write_text(json.dumps(config))
    document = {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment", "metadata": {"name": "d"},
                "spec": {"model": {"name": QWEN3_8B}, "speculation": {
                    "method": "dflash", "numSpeculativeTokens": 16,
                    "draft": {"name": "acme/qwen3-4b-dflash", "configPath": str(drafter_dir)}},
                    "resources": {"gpu": {"product": "H100-80GB", "count": 1}}, "serving": {"maxModelLen": 8192}}}
    sd = tmp_path / "sd.yaml"
    sd.write_text(json.dumps(document))
    result = CliRunner().invoke(main, ["plan", "--offline", "-o", "json", str(sd)])
    assert result.exit_code == 1, result.output   # refused: the drafter names another verifier
    plan = json.loads(result.stdout)
    found = {f["code"]: f for f in plan["compatibility"]["findings"]}
    assert found["DrafterTargetMismatch"]["severity"] == "Error" and "Qwen/Qwen3-4B" in found[
        "DrafterTargetMismatch"]["message"]
    assert "BlockLongerThanTrained" in found   # 16 drafted tokens, trained for 15 (block_size 16)
    assert plan["models"]["draft"]["source"] == "Path"


def test_a_fitted_hardware_factor_scales_the_block_pass_but_not_its_selections() -> None:
    qwen, dspark = lookup(QWEN3_8B), lookup(DSPARK)
    assert qwen is not None and dspark is not None
    prior = speculation_cost(spec("dspark", k=7), qwen, dspark, H100, context_tokens=1024)
    fitted = hardware_scaled(prior, 2.0)
    selections = 7 * prior.draft_pass_overhead_s
    assert fitted.block_draft_seconds(8, 7) - selections == pytest.approx(
        2 * (prior.block_draft_seconds(8, 7) - selections))
