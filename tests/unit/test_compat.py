"""Compatibility rules: each rule fires on the case it is for, with its message, and not on a good spec."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from model_fixtures import (
    EAGLE1_8B,
    EAGLE3_8B,
    LLAMA2_7B,
    LLAMA_1B,
    LLAMA_8B,
    LLAMA_70B,
    MIMO_7B,
    MISTRAL_7B,
    QWEN_05B,
    QWEN_7B,
    arch,
)

from specdeploy.api.spec import EngineKind, Method, Quantization, SpeculativeDeploymentSpec
from specdeploy.api.status import Finding, Severity
from specdeploy.engines import EngineInputs, render_engine
from specdeploy.engines.vllm import REMOVED_FLAGS as REMOVED_VLLM_FLAGS
from specdeploy.planning.acceptance import DEFAULT_ALPHA
from specdeploy.planning.compat import MANAGED_FLAGS, SUPPORTED_METHODS, check_compatibility, draft_size_ratio
from specdeploy.planning.managed_flags import find_managed_flags
from specdeploy.planning.modelinfo import ModelInfo, ModelKind
from specdeploy.planning.speedup import estimate_speedup


def make_spec(method: str = "draft_model", draft: str | None = "meta-llama/Llama-3.2-1B-Instruct", *,
              model: str = "meta-llama/Llama-3.1-8B-Instruct", engine: str = "vllm", k: int = 3,
              extra: dict[str, Any] | None = None, **speculation: Any) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {
        "engine": {"kind": engine},
        "model": {"name": model},
        "speculation": {"method": method, "numSpeculativeTokens": k, **speculation},
    }
    if draft is not None:
        document["speculation"]["draft"] = {"name": draft}
    for key, value in (extra or {}).items():
        section, _, field = key.partition(".")
        document.setdefault(section, {})[field] = value
    return SpeculativeDeploymentSpec.model_validate(document)


def codes(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> dict[str, Any]:
    return {f.code: f for f in check_compatibility(spec, target, draft).findings}


def only(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None, code: str) -> Any:
    found = [f for f in check_compatibility(spec, target, draft).findings if f.code == code]
    assert len(found) == 1, check_compatibility(spec, target, draft).findings
    return found[0]


# --- good specs have no errors ---------------------------------------------------------------------------

def test_well_matched_draft_model_is_compatible_without_findings() -> None:
    spec = make_spec("draft_model", LLAMA_8B.name, model=LLAMA_70B.name)
    result = check_compatibility(spec, LLAMA_70B, LLAMA_8B)
    assert result.compatible
    assert result.findings == []


def test_eagle3_head_of_its_own_target_is_compatible() -> None:
    result = check_compatibility(make_spec("eagle3", EAGLE3_8B.name), LLAMA_8B, EAGLE3_8B)
    assert result.compatible and result.findings == []


def test_ngram_and_mtp_on_an_mtp_model_are_compatible() -> None:
    assert check_compatibility(make_spec("ngram", None), LLAMA_8B, None).findings == []
    mtp = make_spec("mtp", None, model=MIMO_7B.name, k=1)
    assert check_compatibility(mtp, MIMO_7B, None).findings == []


# --- vocabulary ------------------------------------------------------------------------------------------

def test_vocabulary_mismatch_is_an_error_quoting_vllm() -> None:
    finding = only(make_spec("draft_model", QWEN_05B.name), LLAMA_8B, QWEN_05B, "DraftVocabularyMismatch")
    assert finding.severity == Severity.ERROR
    assert "151936" in finding.message and "128256" in finding.message
    assert '"Target and draft model should have the same vocabulary size"' in finding.message
    assert "`spec.speculation.draft.name`" in finding.message
    assert "must share one tokenizer" in finding.message
    assert not check_compatibility(make_spec("draft_model", QWEN_05B.name), LLAMA_8B, QWEN_05B).compatible


def test_padded_vocabulary_of_one_family_is_refused_by_vllm_only() -> None:
    vllm = only(make_spec("draft_model", QWEN_05B.name, model=QWEN_7B.name), QWEN_7B, QWEN_05B,
                "DraftVocabularyMismatch")
    assert vllm.severity == Severity.ERROR and "padded differently" in vllm.message
    sglang_spec = make_spec("draft_model", QWEN_05B.name, model=QWEN_7B.name, engine="sglang")
    sglang = only(sglang_spec, QWEN_7B, QWEN_05B, "DraftVocabularyPaddingDiffers")
    assert sglang.severity == Severity.WARNING
    assert check_compatibility(sglang_spec, QWEN_7B, QWEN_05B).compatible


def test_same_vocabulary_size_from_other_families_is_a_warning() -> None:
    finding = only(make_spec("draft_model", LLAMA2_7B.name, model=MISTRAL_7B.name), MISTRAL_7B, LLAMA2_7B,
                   "DraftTokenizerFamilyDiffers")
    assert finding.severity == Severity.WARNING
    assert "llama2" in finding.message and "mistral" in finding.message and "(32000)" in finding.message


def test_reduced_eagle3_draft_vocabulary_is_fine_but_not_larger_than_the_target() -> None:
    assert "DraftVocabularyMismatch" not in codes(make_spec("eagle3", EAGLE3_8B.name), LLAMA_8B, EAGLE3_8B)
    oversized = ModelInfo(EAGLE3_8B.name, EAGLE3_8B.architecture, kind=ModelKind.EAGLE3, family="llama3",
                          targets=EAGLE3_8B.targets, draft_vocab_size=200_000)
    finding = only(make_spec("eagle3", EAGLE3_8B.name), LLAMA_8B, oversized, "DraftVocabularyMismatch")
    assert "must not be larger" in finding.message and "(d2t)" in finding.message


# --- MTP -------------------------------------------------------------------------------------------------

def test_mtp_on_a_model_without_mtp_layers_is_an_error() -> None:
    finding = only(make_spec("mtp", None), LLAMA_8B, None, "ModelHasNoMTPLayers")
    assert finding.severity == Severity.ERROR
    assert "setting method mtp does not give a model MTP layers" in finding.message
    assert "eagle3" in finding.message and "draft_model" in finding.message and "ngram" in finding.message


def test_mtp_with_more_tokens_than_layers_informs_that_acceptance_falls() -> None:
    finding = only(make_spec("mtp", None, model=MIMO_7B.name, k=3), MIMO_7B, None, "MTPLayerReused")
    assert finding.severity == Severity.INFO
    assert "acceptance falls" in finding.message and "vLLM warns" in finding.message


def test_mtp_tokens_must_be_a_multiple_of_several_layers() -> None:
    three_layers = ModelInfo("example/mtp3", arch(36, 4096, 11008, 32, 8, 128, 151680, 7.8e9, nextn=3))
    finding = only(make_spec("mtp", None, model=three_layers.name, k=4), three_layers, None,
                   "MTPTokensNotDivisible")
    assert "multiple of the model's 3 MTP layers" in finding.message and "set 3 or 6" in finding.message
    assert "MTPTokensNotDivisible" not in codes(make_spec("mtp", None, k=6), three_layers, None)


def test_mtp_on_trtllm_warns_for_models_other_than_deepseek() -> None:
    finding = only(make_spec("mtp", None, model=MIMO_7B.name, k=1, engine="trtllm"), MIMO_7B, None,
                   "TrtllmMtpDeepSeekOnly")
    assert finding.severity == Severity.WARNING and "DeepSeek" in finding.message
    deepseek = ModelInfo("deepseek-ai/DeepSeek-V3", MIMO_7B.architecture, family="deepseek_v3")
    assert "TrtllmMtpDeepSeekOnly" not in codes(make_spec("mtp", None, k=1, engine="trtllm"), deepseek, None)


# --- EAGLE heads -----------------------------------------------------------------------------------------

def test_eagle_head_of_another_target_is_an_error() -> None:
    spec = make_spec("eagle3", EAGLE3_8B.name, model=LLAMA_70B.name)
    finding = only(spec, LLAMA_70B, EAGLE3_8B, "EagleHeadTargetMismatch")
    assert finding.severity == Severity.ERROR
    assert "was trained for meta-llama/Llama-3.1-8B-Instruct" in finding.message
    assert "must belong to its target" in finding.message


def test_head_target_match_ignores_case_but_not_model_variants() -> None:
    lower = make_spec("eagle3", EAGLE3_8B.name, model="META-LLAMA/llama-3.1-8b-instruct")
    assert "EagleHeadTargetMismatch" not in codes(lower, LLAMA_8B, EAGLE3_8B)
    base = ModelInfo("meta-llama/Llama-3.1-8B", LLAMA_8B.architecture, family="llama3")
    assert "EagleHeadTargetMismatch" in codes(make_spec("eagle3", EAGLE3_8B.name, model=base.name), base, EAGLE3_8B)
    # Base and Instruct count as one only when the head's own targets list says so.
    both = ModelInfo(EAGLE3_8B.name, EAGLE3_8B.architecture, kind=ModelKind.EAGLE3, family="llama3",
                     targets=(LLAMA_8B.name, base.name), draft_vocab_size=32000)
    assert "EagleHeadTargetMismatch" not in codes(make_spec("eagle3", both.name, model=base.name), base, both)


def test_findings_from_the_heads_own_config_replace_those_of_the_same_code_only_while_speculating() -> None:
    from_config = Finding(code="EagleHeadTargetMismatch", severity=Severity.ERROR, message="from its config.json")
    spec = make_spec("eagle3", EAGLE3_8B.name, model=LLAMA_70B.name)
    findings = check_compatibility(spec, LLAMA_70B, EAGLE3_8B, [from_config]).findings
    assert [f for f in findings if f.code == "EagleHeadTargetMismatch"] == [from_config]
    assert [f.code for f in findings if f.code != from_config.code] == [
        f.code for f in check_compatibility(spec, LLAMA_70B, EAGLE3_8B).findings if f.code != from_config.code]
    off = spec.model_copy(update={"speculation": spec.speculation.model_copy(update={"enabled": False})})
    assert check_compatibility(off, LLAMA_70B, EAGLE3_8B, [from_config]).findings == []


def test_head_outside_the_catalog_is_a_warning_not_an_error() -> None:
    custom = ModelInfo("my-org/my-eagle3-head", EAGLE3_8B.architecture)   # kind BASE, one layer, no targets
    finding = only(make_spec("eagle3", custom.name), LLAMA_8B, custom, "EagleHeadTargetUnknown")
    assert finding.severity == Severity.WARNING and "cannot be checked" in finding.message
    assert check_compatibility(make_spec("eagle3", custom.name), LLAMA_8B, custom).compatible


def test_eagle_method_with_a_full_model_is_an_error() -> None:
    finding = only(make_spec("eagle3", LLAMA_1B.name), LLAMA_8B, LLAMA_1B, "DraftNotAnEagleHead")
    assert "is a full language model (16 layers)" in finding.message and "draft_model" in finding.message


def test_draft_model_method_with_a_head_is_an_error() -> None:
    finding = only(make_spec("draft_model", EAGLE3_8B.name), LLAMA_8B, EAGLE3_8B, "DraftIsAnEagleHead")
    assert "is an EAGLE head, not a language model" in finding.message and "set method eagle3" in finding.message


def test_eagle_version_must_match_the_method() -> None:
    finding = only(make_spec("eagle", EAGLE3_8B.name), LLAMA_8B, EAGLE3_8B, "EagleVersionMismatch")
    assert "EAGLE-3 head" in finding.message and "set method eagle3" in finding.message
    finding = only(make_spec("eagle3", EAGLE1_8B.name), LLAMA_8B, EAGLE1_8B, "EagleVersionMismatch")
    assert "EAGLE-1/2 head" in finding.message and "set method eagle" in finding.message


# --- draft size ------------------------------------------------------------------------------------------

def test_draft_ratio_of_llama_70b_with_8b_is_inside_the_range() -> None:
    assert draft_size_ratio(LLAMA_70B, LLAMA_8B) == pytest.approx(8.79, abs=0.01)


def test_far_smaller_draft_warns_with_the_acceptance_the_estimate_assumes() -> None:
    spec = make_spec("draft_model", LLAMA_1B.name, model=LLAMA_70B.name)
    finding = only(spec, LLAMA_70B, LLAMA_1B, "DraftTooSmall")
    assert finding.severity == Severity.WARNING
    alpha = estimate_speedup(spec, LLAMA_70B, LLAMA_1B, None).alpha
    assert alpha < DEFAULT_ALPHA[Method.DRAFT_MODEL], "the estimate rates the small draft lower, as the warning says"
    assert "1:57" in finding.message and f"α {alpha:.2f}" in finding.message


def test_larger_draft_warns_about_memory_and_compute() -> None:
    finding = only(make_spec("draft_model", LLAMA_1B.name), LLAMA_8B, LLAMA_1B, "DraftTooLarge")
    assert "1:6.5" in finding.message and "KV cache" in finding.message and "share of a target step" in finding.message


def test_draft_ratio_is_not_checked_for_heads() -> None:
    assert not {"DraftTooSmall", "DraftTooLarge"} & set(codes(make_spec("eagle3", EAGLE3_8B.name), LLAMA_8B, EAGLE3_8B))


# --- quantisation ----------------------------------------------------------------------------------------

def test_quantised_target_informs_int4_drops_more_than_fp8() -> None:
    fp8 = make_spec("draft_model", LLAMA_8B.name, model=LLAMA_70B.name)
    fp8 = fp8.model_copy(update={"model": fp8.model.model_copy(update={"quantization": Quantization.FP8})})
    finding = only(fp8, LLAMA_70B, LLAMA_8B, "TargetQuantized")
    assert finding.severity == Severity.INFO and "fp8" in finding.message and "a little" in finding.message
    awq = SpeculativeDeploymentSpec.model_validate({
        "model": {"name": LLAMA_70B.name, "quantization": "awq"},
        "speculation": {"method": "draft_model", "draft": {"name": LLAMA_8B.name, "quantization": "int4"}},
    })
    found = codes(awq, LLAMA_70B, LLAMA_8B)
    assert "more than fp8 or int8" in found["TargetQuantized"].message
    assert "acceptance drops" in found["DraftQuantized"].message
    assert check_compatibility(awq, LLAMA_70B, LLAMA_8B).compatible


# --- engines ---------------------------------------------------------------------------------------------

def test_sglang_topk_above_one_warns_that_the_overlap_scheduler_is_off() -> None:
    spec = make_spec("eagle3", EAGLE3_8B.name, engine="sglang", eagleTopk=4)
    finding = only(spec, LLAMA_8B, EAGLE3_8B, "OverlapSchedulerDisabled")
    assert finding.severity == Severity.WARNING
    assert '"spec v2 currently only supports topk = 1"' in finding.message
    assert "`spec.speculation.eagleTopk`" in finding.message
    assert "OverlapSchedulerDisabled" not in codes(make_spec("eagle3", EAGLE3_8B.name, engine="sglang"),
                                                   LLAMA_8B, EAGLE3_8B)


def test_topk_is_ignored_outside_sglang() -> None:
    finding = only(make_spec("eagle3", EAGLE3_8B.name, eagleTopk=4), LLAMA_8B, EAGLE3_8B, "EagleTopkIgnored")
    assert finding.severity == Severity.INFO and "vllm ignores it" in finding.message


def test_trtllm_refuses_eagle1_heads() -> None:
    spec = make_spec("eagle", EAGLE1_8B.name, model="meta-llama/Meta-Llama-3-8B-Instruct", engine="trtllm")
    finding = only(spec, LLAMA_8B, EAGLE1_8B, "TrtllmNeedsEagle3Checkpoint")
    assert finding.severity == Severity.ERROR
    assert "EAGLE-1/2 checkpoints are incompatible" in finding.message and "method eagle3" in finding.message


def test_trtllm_and_sglang_run_ngram_mtp_and_draft_model() -> None:
    for engine in (EngineKind.SGLANG, EngineKind.TRTLLM):
        assert {"ngram", "mtp", "draft_model", "eagle3"} <= {m.value for m in SUPPORTED_METHODS[engine]}
    assert check_compatibility(make_spec("ngram", None, engine="trtllm"), LLAMA_8B, None).compatible


def test_suffix_outside_vllm_is_refused_even_when_cel_was_bypassed() -> None:
    valid = make_spec("ngram", None, engine="sglang")
    bypassed = valid.model_copy(update={"speculation": valid.speculation.model_copy(update={"method": Method.SUFFIX})})
    finding = only(bypassed, LLAMA_8B, None, "MethodNotSupportedByEngine")
    assert "suffix is not supported by `spec.engine.kind` sglang" in finding.message


def test_vllm_draft_tensor_parallel_must_be_one_or_the_targets() -> None:
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"name": LLAMA_70B.name},
        "resources": {"tensorParallelSize": 4},
        "speculation": {"method": "draft_model", "draft": {"name": LLAMA_8B.name, "tensorParallelSize": 2}},
    })
    finding = only(spec, LLAMA_70B, LLAMA_8B, "DraftTensorParallelInvalid")
    assert "must be 1 or `spec.resources.tensorParallelSize` (4), got 2" in finding.message
    for good in (1, 4):
        ok = spec.model_copy(update={"speculation": spec.speculation.model_copy(update={
            "draft": spec.speculation.draft.model_copy(update={"tensor_parallel_size": good})})})  # type: ignore[union-attr]
        assert "DraftTensorParallelInvalid" not in codes(ok, LLAMA_70B, LLAMA_8B)
    sglang = spec.model_copy(update={"engine": spec.engine.model_copy(update={"kind": EngineKind.SGLANG})})
    assert codes(sglang, LLAMA_70B, LLAMA_8B)["DraftTensorParallelIgnored"].severity == Severity.WARNING


# --- extraArgs -------------------------------------------------------------------------------------------

def extra(engine: str, *args: str) -> SpeculativeDeploymentSpec:
    return make_spec("ngram", None, engine=engine, extra={"engine.extraArgs": list(args)})


@pytest.mark.parametrize("arguments", [["--max-model-len", "4096"], ["--max-model-len=4096"],
                                       ["--max_model_len", "4096"], ["--max-model", "4096"]])
def test_vllm_managed_flag_in_any_form_names_the_spec_field(arguments: list[str]) -> None:
    finding = only(extra("vllm", "--enable-prefix-caching", *arguments), LLAMA_8B, None, "ManagedFlagInExtraArgs")
    assert finding.severity == Severity.ERROR
    assert finding.message.startswith("`spec.engine.extraArgs[1]` must not set --max")
    assert "set `spec.serving.maxModelLen` instead" in finding.message


def test_vllm_speculative_config_even_in_dotted_form_belongs_to_spec_speculation() -> None:
    finding = only(extra("vllm", "--speculative-config.method", "ngram"), LLAMA_8B, None, "ManagedFlagInExtraArgs")
    assert "`spec.speculation`" in finding.message


@pytest.mark.parametrize("flag", sorted(REMOVED_VLLM_FLAGS))
def test_removed_vllm_flags_name_speculative_config(flag: str) -> None:
    finding = only(extra("vllm", flag, "5"), LLAMA_8B, None, "RemovedFlagInExtraArgs")
    assert finding.severity == Severity.ERROR
    assert "vLLM removed it" in finding.message and "--speculative-config" in finding.message
    assert "`spec.speculation`" in finding.message


def test_removed_vllm_flag_with_equals_and_underscores() -> None:
    finding = only(extra("vllm", "--speculative_model=meta-llama/Llama-3.2-1B"), LLAMA_8B, None,
                   "RemovedFlagInExtraArgs")
    assert "--speculative_model (--speculative-model)" in finding.message


def test_unknown_speculative_vllm_flag_counts_as_removed() -> None:
    finding = only(extra("vllm", "--speculative-acceptance-method", "x"), LLAMA_8B, None, "RemovedFlagInExtraArgs")
    assert "only speculative flag left" in finding.message


def test_sglang_speculative_flags_and_aliases() -> None:
    found = check_compatibility(extra("sglang", "--speculative-num-steps", "5", "--tp", "2",
                                      "--mem-fraction-static=0.8", "--enable-metrics"), LLAMA_8B, None).findings
    assert [f.code for f in found] == ["ManagedFlagInExtraArgs"] * 3
    assert "`spec.speculation`" in found[0].message
    assert "`spec.resources.tensorParallelSize`" in found[1].message
    assert "`spec.resources.gpuMemoryUtilization`" in found[2].message


def test_trtllm_flags_are_exact_because_click_has_no_abbreviations() -> None:
    finding = only(extra("trtllm", "--extra_llm_api_options", "x.yaml"), LLAMA_8B, None, "ManagedFlagInExtraArgs")
    assert "`spec.speculation`" in finding.message
    assert find_managed_flags(EngineKind.TRTLLM, ["--max_seq", "9", "--log_level", "info"]) == []
    assert find_managed_flags(EngineKind.TRTLLM, ["--max_seq_len", "9"])[0].owner == "spec.serving.maxModelLen"


def test_host_is_owned_by_the_operator() -> None:
    finding = only(extra("vllm", "--host", "127.0.0.1"), LLAMA_8B, None, "ManagedFlagInExtraArgs")
    assert "the operator sets it for every pod (the pod must listen on all interfaces" in finding.message
    finding = only(extra("trtllm", "--backend", "tensorrt"), LLAMA_8B, None, "ManagedFlagInExtraArgs")
    assert "PyTorch backend" in finding.message


def test_free_flags_values_and_ambiguous_abbreviations_pass() -> None:
    args = ["--enable-prefix-caching", "--seed", "-1", "--swap-space", "4", "--max-num", "4"]
    assert find_managed_flags(EngineKind.VLLM, args) == []


def test_extra_args_are_checked_even_without_speculation() -> None:
    spec = make_spec("mtp", None, extra={"engine.extraArgs": ["-tp", "2"]}, enabled=False)
    result = check_compatibility(spec, LLAMA_8B, None)
    assert [f.code for f in result.findings] == ["ManagedFlagInExtraArgs"]   # mtp on a model without MTP: ignored


def test_short_option_with_glued_value() -> None:
    assert find_managed_flags(EngineKind.VLLM, ["-qfp8"])[0].owner == "spec.model.quantization"


def test_managed_flag_table_covers_every_engine_with_spec_fields() -> None:
    assert set(MANAGED_FLAGS) == set(EngineKind)
    for table in MANAGED_FLAGS.values():
        assert table["--port"] == "spec.serving.port"
        assert all(owner for owner in table.values())


@pytest.mark.parametrize("engine", list(EngineKind))
@pytest.mark.parametrize("method", ["draft_model", "eagle3", "ngram", "mtp"])
def test_every_flag_the_renderers_emit_is_managed(engine: EngineKind, method: str) -> None:
    # The other direction of the contract: a flag the operator renders must never be free for extraArgs.
    if method == "mtp" or (method, engine) == ("eagle3", EngineKind.TRTLLM):
        target = "deepseek-ai/DeepSeek-V3" if method == "mtp" else LLAMA_8B.name
    else:
        target = LLAMA_8B.name
    draft = {"draft_model": LLAMA_1B.name, "eagle3": EAGLE3_8B.name}.get(method)
    spec = make_spec(method, draft, model=target, engine=engine.value,
                     extra={"serving.kvCacheDtype": "fp8", "serving.maxModelLen": 4096})
    command = render_engine(EngineInputs(spec, served_model_name="chat", max_model_len=4096))
    rendered = [arg for arg in command.args if arg.startswith("--")]
    assert rendered
    unmanaged = [arg for arg in rendered if not find_managed_flags(engine, [arg])]
    assert unmanaged == [] or set(unmanaged) <= {"--enable-metrics"}, unmanaged


@given(st.lists(st.sampled_from(["--seed", "1", "--enable-prefix-caching", "--max-model-len", "--port=9",
                                 "-tp", "--speculative-model", "--x_y"]), max_size=12))
def test_every_managed_argument_is_found_once_in_order(args: list[str]) -> None:
    found = find_managed_flags(EngineKind.VLLM, args)
    managed = [i for i, a in enumerate(args) if a in ("--max-model-len", "--port=9", "-tp", "--speculative-model")]
    assert [use.position for use in found] == managed
