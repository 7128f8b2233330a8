"""The catalog: its facts match the published config.json numbers, lookups find variants, config.json
parsing handles each architecture family, and unknown models fail with the field to fill in."""

from __future__ import annotations

import json

import pytest

from specdeploy.api.spec import Architecture, SpeculativeDeploymentSpec
from specdeploy.planning.catalog import (
    CATALOG,
    UnknownModel,
    architecture_from_hf_config,
    guess_family,
    lookup,
    resolve_draft,
    resolve_target,
)
from specdeploy.planning.catalog_entries import ENTRIES
from specdeploy.planning.hf_config import estimate_parameters
from specdeploy.planning.kv import layer_bytes_per_token
from specdeploy.planning.modelinfo import ModelKind

REQUIRED = [
    "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-405B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B",
    "mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-v0.3", "mistralai/Mixtral-8x7B-v0.1",
    "deepseek-ai/DeepSeek-V3", "XiaomiMiMo/MiMo-7B-RL", "openai/gpt-oss-20b", "openai/gpt-oss-120b",
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "AngelSlim/Qwen3-8B_eagle3", "Tengyunw/qwen3_8b_eagle3",
]
ENTRIES_BY_NAME = {name: entry.names[0] for entry in ENTRIES for name in entry.names}
ENTRIES_CONFIG = {entry.names[0]: entry.config for entry in ENTRIES}


def spec_for(model: dict, speculation: dict | None = None) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({"model": model, "speculation": speculation or {"method": "ngram"}})


@pytest.mark.parametrize("name", REQUIRED)
def test_required_models_are_catalogued_with_a_config_json_source(name: str) -> None:
    model = CATALOG[name]
    assert model.name == name
    assert f"https://huggingface.co/{ENTRIES_BY_NAME[name]}/blob/main/config.json" in model.source
    assert model.family in {"llama3", "qwen2", "qwen3", "mistral", "deepseek_v3", "mimo", "gpt_oss"}



@pytest.mark.parametrize(("name", "expected"), [
    # vLLM KV bytes per token, bf16, TP 1 (the facts): 2 × layers × kv heads × head dim × 2.
    ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
    ("meta-llama/Llama-3.1-70B-Instruct", 327_680),
    ("Qwen/Qwen3-1.7B", 114_688),
])
def test_kv_bytes_per_token_of_published_models(name: str, expected: int) -> None:
    arch = CATALOG[name].architecture
    assert layer_bytes_per_token(arch, 1, 2) * arch.num_layers == expected


@pytest.mark.parametrize(("name", "published"), [
    ("Qwen/Qwen3-0.6B", 0.6e9), ("Qwen/Qwen3-1.7B", 1.7e9), ("Qwen/Qwen3-4B", 4.0e9),
    ("Qwen/Qwen3-8B", 8.2e9), ("Qwen/Qwen3-32B", 32.8e9), ("XiaomiMiMo/MiMo-7B-RL", 7.6e9),
])
def test_parameters_estimated_from_shapes_match_the_model_cards(name: str, published: float) -> None:
    assert CATALOG[name].architecture.num_parameters == pytest.approx(published, rel=0.02)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.parameters and e.kind == ModelKind.BASE],
                         ids=lambda e: e.names[0])
def test_the_shape_estimate_agrees_with_every_published_count(entry) -> None:
    # The same estimate sizes user-supplied config.json files, so it must hold on the known ones.
    assert estimate_parameters(entry.config) == pytest.approx(entry.parameters, rel=0.005)


def test_qwen3_8b_parameter_count_is_exact() -> None:
    assert CATALOG["Qwen/Qwen3-8B"].architecture.num_parameters == 8_190_735_360  # Hugging Face model page


def test_architectures_of_the_special_families() -> None:
    deepseek = CATALOG["deepseek-ai/DeepSeek-V3"].architecture
    assert (deepseek.kv_lora_rank, deepseek.qk_rope_head_dim, deepseek.num_nextn_predict_layers) == (512, 64, 1)
    assert (deepseek.num_experts, deepseek.num_experts_per_token) == (256, 8)
    assert CATALOG["XiaomiMiMo/MiMo-7B-RL"].architecture.num_nextn_predict_layers == 1
    oss = CATALOG["openai/gpt-oss-20b"].architecture
    assert (oss.sliding_window, oss.sliding_window_layers, oss.num_experts) == (128, 12, 32)
    assert CATALOG["openai/gpt-oss-120b"].architecture.num_experts == 128
    mistral = CATALOG["mistralai/Mistral-7B-v0.1"].architecture
    assert (mistral.sliding_window, mistral.sliding_window_layers) == (4096, None)  # every layer slides
    assert CATALOG["mistralai/Mistral-7B-v0.3"].architecture.sliding_window is None
    assert CATALOG["mistralai/Mixtral-8x7B-v0.1"].architecture.num_experts == 8
    assert CATALOG["Qwen/Qwen3-8B"].architecture.sliding_window is None  # use_sliding_window is false


def test_eagle_heads_name_their_targets_and_kind() -> None:
    eagle3 = CATALOG["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]
    assert eagle3.kind == ModelKind.EAGLE3
    assert eagle3.draft_vocab_size == 32000
    assert "meta-llama/Llama-3.1-8B-Instruct" in eagle3.targets
    assert CATALOG["yuhuili/EAGLE-LLaMA3.1-Instruct-8B"].kind == ModelKind.EAGLE
    assert CATALOG["yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"].targets == ("meta-llama/Llama-3.3-70B-Instruct",)
    assert CATALOG["AngelSlim/Qwen3-8B_eagle3"].targets == ("Qwen/Qwen3-8B",)
    for head in (m for m in CATALOG.values() if m.kind != ModelKind.BASE):
        assert head.targets and all(lookup(target) is not None for target in head.targets)
        # A head's own parameters exclude the target's embeddings it shares.
        assert head.architecture.num_parameters < 2e9


def test_checkpoint_dtypes_of_non_16_bit_models() -> None:
    assert CATALOG["openai/gpt-oss-20b"].checkpoint_bytes_per_param == pytest.approx(0.69, abs=0.01)
    assert CATALOG["deepseek-ai/DeepSeek-V3"].checkpoint_bytes_per_param == pytest.approx(1.0, abs=0.01)
    assert CATALOG["meta-llama/Llama-3.1-8B-Instruct"].checkpoint_bytes_per_param is None


@pytest.mark.parametrize("name", [
    "meta-llama/llama-3.1-8b-instruct", "META-LLAMA/LLAMA-3.1-8B-INSTRUCT", " meta-llama/Llama-3.1-8B-Instruct/ ",
])
def test_lookup_ignores_case_and_surrounding_noise(name: str) -> None:
    model = lookup(name)
    assert model is not None and model.name == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(("variant", "same_as"), [
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"),
    ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
    ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("mistralai/Mistral-7B-Instruct-v0.1", "mistralai/Mistral-7B-v0.1"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
    ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"),
    ("XiaomiMiMo/MiMo-7B-Base", "XiaomiMiMo/MiMo-7B-RL"),
])
def test_base_and_instruct_variants_share_one_architecture(variant: str, same_as: str) -> None:
    model = lookup(variant)
    assert model is not None
    assert model.name == variant  # the variant keeps its own name (EAGLE target checks compare names)
    assert model.architecture == CATALOG[same_as].architecture
    assert model.family == CATALOG[same_as].family


def test_lookup_by_a_local_path_or_bare_repository_name() -> None:
    assert lookup("/models/Qwen3-8B").name == "Qwen/Qwen3-8B"  # type: ignore[union-attr]
    assert lookup("gpt-oss-20b").name == "openai/gpt-oss-20b"  # type: ignore[union-attr]
    assert lookup("acme/unknown-model-7b") is None


def test_unknown_target_names_the_field_to_add_and_near_catalog_models() -> None:
    spec = spec_for({"name": "meta-llama/Llama-3.1-8B-Instrukt"})
    with pytest.raises(UnknownModel) as caught:
        resolve_target(spec)
    message = str(caught.value)
    assert "`spec.model.architecture`" in message
    assert "meta-llama/Llama-3.1-8B-Instrukt" in message
    assert "meta-llama/Llama-3.1-8B-Instruct" in message  # the near name
    assert caught.value.field == "spec.model.architecture"
    assert isinstance(caught.value, ValueError)


def test_unknown_draft_names_the_draft_architecture_field() -> None:
    spec = spec_for({"name": "Qwen/Qwen3-8B"}, {"method": "draft_model", "draft": {"name": "acme/tiny-draft"}})
    with pytest.raises(UnknownModel, match=r"`spec\.speculation\.draft\.architecture`"):
        resolve_draft(spec)


ARCH = {
    "numLayers": 24, "hiddenSize": 2048, "intermediateSize": 5632, "numAttentionHeads": 16,
    "numKeyValueHeads": 4, "vocabSize": 100_000, "numParameters": 1_300_000_000, "maxPositionEmbeddings": 8192,
}


def test_an_unknown_model_with_an_architecture_resolves_with_a_guessed_family() -> None:
    target = resolve_target(spec_for({"name": "acme/qwen3-distill-1b", "architecture": ARCH}))
    assert target.architecture.num_layers == 24
    assert target.source == "spec.model.architecture"
    assert target.family == "qwen3"
    assert target.kind == ModelKind.BASE


def test_the_spec_architecture_overrides_a_catalog_models_numbers_and_keeps_its_identity() -> None:
    target = resolve_target(spec_for({"name": "Qwen/Qwen3-8B", "architecture": ARCH}))
    assert target.architecture.num_layers == 24
    assert target.family == "qwen3" and target.name == "Qwen/Qwen3-8B"


@pytest.mark.parametrize(("method", "kind"), [
    ("eagle", ModelKind.EAGLE), ("eagle3", ModelKind.EAGLE3), ("draft_model", ModelKind.BASE),
])
def test_an_uncatalogued_draft_takes_its_kind_from_the_method(method: str, kind: ModelKind) -> None:
    spec = spec_for({"name": "meta-llama/Llama-3.1-8B-Instruct"},
                    {"method": method, "draft": {"name": "acme/head", "architecture": {**ARCH, "numLayers": 1}}})
    draft = resolve_draft(spec)
    assert draft is not None and draft.kind == kind


def test_no_draft_for_methods_without_one() -> None:
    assert resolve_draft(spec_for({"name": "XiaomiMiMo/MiMo-7B-RL"}, {"method": "mtp"})) is None


def test_guess_family() -> None:
    assert guess_family("unsloth/Meta-Llama-3.1-8B-Instruct-bnb") == "llama3"
    assert guess_family("someone/gpt-oss-20b-finetune") == "gpt_oss"
    assert guess_family("acme/model") == ""


# --- config.json parsing ---------------------------------------------------------------------------------

LLAMA_31_8B_CONFIG = {  # https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def test_a_llama_config_gives_the_catalog_architecture() -> None:
    arch = architecture_from_hf_config(LLAMA_31_8B_CONFIG)
    assert arch == CATALOG["meta-llama/Llama-3.1-8B-Instruct"].architecture.model_copy(update={"head_dim": None})
    assert arch.num_parameters == 8_030_261_248


def test_a_config_file_path_or_its_directory_is_read(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B_CONFIG))
    assert architecture_from_hf_config(tmp_path / "config.json").num_layers == 32
    assert architecture_from_hf_config(str(tmp_path)).num_layers == 32


def test_an_unreadable_config_says_what_is_wrong(tmp_path) -> None:
    with pytest.raises(ValueError, match="cannot read a Hugging Face config.json"):
        architecture_from_hf_config(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="`num_hidden_layers`"):
        architecture_from_hf_config({"hidden_size": 4096})


def test_mixtral_config_counts_experts() -> None:
    config = {  # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": None,
    }
    arch = architecture_from_hf_config(config)
    assert (arch.num_experts, arch.num_experts_per_token) == (8, 2)
    assert arch.num_parameters == pytest.approx(46.7e9, rel=0.01)


def test_deepseek_config_is_mla_with_one_mtp_layer() -> None:
    arch = architecture_from_hf_config(ENTRIES_CONFIG["deepseek-ai/DeepSeek-V3"])
    assert (arch.kv_lora_rank, arch.qk_rope_head_dim, arch.num_nextn_predict_layers) == (512, 64, 1)
    assert arch.num_parameters == pytest.approx(671e9, rel=0.01)  # the MTP layer is not counted


def test_gpt_oss_config_counts_sliding_layers_from_layer_types() -> None:
    config = dict(ENTRIES_CONFIG["openai/gpt-oss-20b"])
    arch = architecture_from_hf_config(config)
    assert (arch.sliding_window, arch.sliding_window_layers) == (128, 12)
    assert arch.num_parameters == pytest.approx(20.91e9, rel=0.01)


def test_mimo_config_has_mtp_layers() -> None:
    assert architecture_from_hf_config(ENTRIES_CONFIG["XiaomiMiMo/MiMo-7B-RL"]).num_nextn_predict_layers == 1


def test_qwen2_sliding_window_is_ignored_when_disabled() -> None:
    config = {**ENTRIES_CONFIG["Qwen/Qwen2.5-7B-Instruct"], "sliding_window": 131072, "use_sliding_window": False}
    assert architecture_from_hf_config(config).sliding_window is None


def test_a_multimodal_config_reads_its_text_config_and_sliding_pattern() -> None:
    config = {  # google/gemma-3-4b-it config.json (text_config part)
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {
            "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 8, "num_hidden_layers": 34,
            "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6,
            "vocab_size": 262208, "max_position_embeddings": 131072,
        },
    }
    arch = architecture_from_hf_config(config)
    assert (arch.num_layers, arch.head_dim, arch.vocab_size) == (34, 256, 262208)
    assert (arch.sliding_window, arch.sliding_window_layers) == (1024, 29)


def test_an_eagle3_config_counts_only_the_heads_own_weights() -> None:
    config = {  # the shape of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_hidden_layers": 1, "num_key_value_heads": 8, "vocab_size": 128256,
        "draft_vocab_size": 32000, "max_position_embeddings": 2048,
    }
    arch = architecture_from_hf_config(config)
    # fc 3h×h + one layer (q/k/v read 2h) + a 32k-token LM head; no 128k-token embedding.
    assert arch.num_parameters == pytest.approx(0.425e9, rel=0.01)
    assert isinstance(arch, Architecture)

