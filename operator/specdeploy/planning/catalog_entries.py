"""The built-in catalog's facts: config.json numbers of public models and EAGLE heads.

Each entry is the part of the model's Hugging Face config.json the planner reads (source: the
config.json URL next to it), parsed by `architecture_from_hf_config` like any user config. Where the
model card publishes the exact parameter count it is given; otherwise it is computed from the shapes
(checked against the published counts in tests/unit/test_catalog.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdeploy.planning.modelinfo import ModelKind

GIB = 2**30


def config_url(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


@dataclass(frozen=True)
class Entry:
    """One architecture and every public repository that shares it (base and Instruct variants)."""

    names: tuple[str, ...]  # the first is where the numbers were read
    family: str
    config: dict[str, Any]
    parameters: int | None = None  # published count; None: estimated from the shapes
    kind: ModelKind = ModelKind.BASE
    targets: tuple[str, ...] = ()
    draft_vocab_size: int | None = None
    checkpoint_bytes_per_param: float | None = None
    base_model: str = ""  # a quantised repository: the model whose weights it holds (its model card's base_model)
    note: str = ""
    sources: tuple[str, ...] = field(default=())

    @property
    def source(self) -> str:
        return " ; ".join((config_url(self.names[0]), *self.sources))


def _llama(layers: int, hidden: int, intermediate: int, heads: int, head_dim: int, tied: bool) -> dict[str, Any]:
    return {
        "model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
        "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": 8,
        "head_dim": head_dim, "vocab_size": 128256, "max_position_embeddings": 131072,
        "tie_word_embeddings": tied,
    }


def _qwen(model_type: str, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
          head_dim: int, vocab: int, max_positions: int, tied: bool) -> dict[str, Any]:
    return {
        "model_type": model_type, "num_hidden_layers": layers, "hidden_size": hidden,
        "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "vocab_size": vocab, "max_position_embeddings": max_positions,
        "tie_word_embeddings": tied, "sliding_window": 32768 if model_type == "qwen2" else None,
        "use_sliding_window": False,
    }


# llm-compressor's FP8_DYNAMIC scheme as compressed-tensors writes it (RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic).
_FP8_DYNAMIC: dict[str, Any] = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"], "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                              "symmetric": True},
    }},
}
# AutoAWQ's default (casperhansen/llama-3.3-70b-instruct-awq).
_AUTOAWQ_4BIT: dict[str, Any] = {
    "quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True,
    "modules_to_not_convert": None,
}


def _meta(*names: str) -> tuple[str, ...]:
    """meta-llama publishes each Llama-3.1 model twice: "Llama-3.1-…" and the older "Meta-Llama-3.1-…"."""
    return tuple(f"meta-llama/{prefix}{name}" for name in names for prefix in ("", "Meta-"))


def _eagle3_head(hidden: int, intermediate: int, heads: int, vocab: int, max_positions: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_attention_heads": heads,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": vocab, "draft_vocab_size": 32000,
        "max_position_embeddings": max_positions, "tie_word_embeddings": False,
    }


def _qwen3_8b_block_drafter(architecture: str, **extra: Any) -> dict[str, Any]:
    """A DFlash-style drafter for Qwen3-8B: five Qwen3-8B decoder layers reading five of its layers (the layout of
    z-lab's Qwen3 DFlash configs: num_hidden_layers 5, dflash_config.target_layer_ids [1, 9, 17, 25, 33],
    block_size 16). The shapes are assumed from that layout and the target's, not read from these repositories."""
    return {
        **_qwen("qwen3", 5, 4096, 12288, 32, 8, 128, 151936, 40960, tied=False), "architectures": [architecture],
        "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]}, **extra,
    }


ENTRIES: tuple[Entry, ...] = (
    # --- Llama 3.x (family llama3: one 128,256-token vocabulary) --------------------------------------
    Entry(_meta("Llama-3.1-8B-Instruct", "Llama-3.1-8B"), "llama3",
          _llama(32, 4096, 14336, 32, 128, tied=False), parameters=8_030_261_248),
    Entry(_meta("Llama-3.1-70B-Instruct", "Llama-3.1-70B"), "llama3",
          _llama(80, 8192, 28672, 64, 128, tied=False), parameters=70_553_706_496),
    Entry(("meta-llama/Llama-3.3-70B-Instruct",), "llama3",
          _llama(80, 8192, 28672, 64, 128, tied=False), parameters=70_553_706_496,
          note="the architecture of Llama-3.1-70B"),
    # Quantised repositories of Llama-3.3-70B-Instruct: the base's shapes and parameter count, their own
    # `quantization_config` (the keys and values of each repository's config.json), and the base model their
    # model card names (`base_model: meta-llama/Llama-3.3-70B-Instruct`), so the base's EAGLE heads pair with them.
    Entry(("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",), "llama3",
          {**_llama(80, 8192, 28672, 64, 128, tied=False), "quantization_config": _FP8_DYNAMIC},
          parameters=70_553_706_496, base_model="meta-llama/Llama-3.3-70B-Instruct",
          note="llm-compressor FP8_DYNAMIC: FP8 weights per channel, FP8 activations per token"),
    Entry(("casperhansen/llama-3.3-70b-instruct-awq",), "llama3",
          {**_llama(80, 8192, 28672, 64, 128, tied=False), "quantization_config": _AUTOAWQ_4BIT},
          parameters=70_553_706_496, base_model="meta-llama/Llama-3.3-70B-Instruct",
          note="AutoAWQ 4-bit, group size 128, GEMM kernels"),
    Entry(_meta("Llama-3.1-405B-Instruct", "Llama-3.1-405B"), "llama3",
          _llama(126, 16384, 53248, 128, 128, tied=False), parameters=405_853_388_800),
    Entry(("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"), "llama3",
          _llama(16, 2048, 8192, 32, 64, tied=True), parameters=1_235_814_400),
    Entry(("meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B"), "llama3",
          _llama(28, 3072, 8192, 24, 128, tied=True), parameters=3_212_749_824),
    # --- Qwen2.5 (family qwen2); 7B pads its embedding to 152,064 rows ---------------------------------
    Entry(("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B"), "qwen2",
          _qwen("qwen2", 24, 896, 4864, 14, 2, 64, 151936, 32768, tied=True), parameters=494_032_768),
    Entry(("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B"), "qwen2",
          _qwen("qwen2", 28, 1536, 8960, 12, 2, 128, 151936, 32768, tied=True), parameters=1_543_714_304),
    Entry(("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"), "qwen2",
          _qwen("qwen2", 28, 3584, 18944, 28, 4, 128, 152064, 32768, tied=False), parameters=7_615_616_512),
    # --- Qwen3 (family qwen3) ---------------------------------------------------------------------------
    Entry(("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B-Base"), "qwen3",
          _qwen("qwen3", 28, 1024, 3072, 16, 8, 128, 151936, 40960, tied=True)),
    Entry(("Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B-Base"), "qwen3",
          _qwen("qwen3", 28, 2048, 6144, 16, 8, 128, 151936, 40960, tied=True)),
    Entry(("Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base"), "qwen3",
          _qwen("qwen3", 36, 2560, 9728, 32, 8, 128, 151936, 40960, tied=True)),
    Entry(("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"), "qwen3",
          _qwen("qwen3", 36, 4096, 12288, 32, 8, 128, 151936, 40960, tied=False)),
    Entry(("Qwen/Qwen3-32B",), "qwen3",
          _qwen("qwen3", 64, 5120, 25600, 64, 8, 128, 151936, 40960, tied=False)),
    # --- Mistral (family mistral); v0.1's every layer slides over 4,096 tokens -----------------------
    Entry(("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"), "mistral",
          {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "max_position_embeddings": 32768, "sliding_window": 4096}, parameters=7_241_732_096),
    Entry(("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"), "mistral",
          {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
           "max_position_embeddings": 32768, "sliding_window": None}, parameters=7_248_023_552),
    Entry(("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"), "mistral",
          {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "max_position_embeddings": 32768, "sliding_window": None, "num_local_experts": 8,
           "num_experts_per_tok": 2}, parameters=46_702_792_704),
    # --- DeepSeek-V3 / R1 (MLA, one MTP layer, FP8 checkpoint) ----------------------------------------
    Entry(("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3-Base",
           "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-0528"), "deepseek_v3",
          {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
           "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
           "first_k_dense_replace": 3, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [128, 128]}},
          parameters=671_000_000_000,
          # FP8 e4m3 weights with one fp32 scale per 128x128 block; embedding and head in bf16.
          checkpoint_bytes_per_param=1.003,
          sources=("https://arxiv.org/abs/2412.19437 (671B parameters + 14B MTP module)",)),
    # --- MiMo (MTP) ---------------------------------------------------------------------------------------
    Entry(("XiaomiMiMo/MiMo-7B-RL", "XiaomiMiMo/MiMo-7B-Base", "XiaomiMiMo/MiMo-7B-SFT",
           "XiaomiMiMo/MiMo-7B-RL-0530"), "mimo",
          {"model_type": "mimo", "num_hidden_layers": 36, "hidden_size": 4096, "intermediate_size": 11008,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 151680,
           "max_position_embeddings": 32768, "num_nextn_predict_layers": 1, "tie_word_embeddings": False}),
    # --- gpt-oss (alternating 128-token sliding-window layers, MoE, MXFP4 experts) --------------------
    Entry(("openai/gpt-oss-20b",), "gpt_oss",
          {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880, "intermediate_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
           "max_position_embeddings": 131072, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 12, "num_local_experts": 32,
           "num_experts_per_tok": 4, "tie_word_embeddings": False, "quantization_config": {"quant_method": "mxfp4"}},
          parameters=20_914_757_184,
          # vLLM loads the MXFP4 checkpoint as 13.47 GiB (llm-d-benchmark empirical-vllm-memory-results.md).
          checkpoint_bytes_per_param=13.47 * GIB / 20_914_757_184,
          sources=("https://openai.com/index/gpt-oss-model-card/ (20.91B parameters)",)),
    Entry(("openai/gpt-oss-120b",), "gpt_oss",
          {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
           "max_position_embeddings": 131072, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 18, "num_local_experts": 128,
           "num_experts_per_tok": 4, "tie_word_embeddings": False, "quantization_config": {"quant_method": "mxfp4"}},
          parameters=116_829_156_672,
          checkpoint_bytes_per_param=64.38 * GIB / 116_829_156_672,  # 64.38 GiB in vLLM (llm-d data)
          sources=("https://openai.com/index/gpt-oss-model-card/ (116.83B parameters)",)),
    # --- EAGLE heads ----------------------------------------------------------------------------------
    Entry(("yuhuili/EAGLE-LLaMA3.1-Instruct-8B",), "llama3",
          {"architectures": ["LlamaForCausalLMEagle"], "model_type": "llama", "num_hidden_layers": 1,
           "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072},
          kind=ModelKind.EAGLE, targets=_meta("Llama-3.1-8B-Instruct"),
          sources=("https://github.com/SafeAILab/EAGLE (EAGLE-1 head for Llama-3.1-8B-Instruct)",)),
    Entry(("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",), "llama3", _eagle3_head(4096, 14336, 32, 128256, 131072),
          kind=ModelKind.EAGLE3, targets=_meta("Llama-3.1-8B-Instruct"), draft_vocab_size=32000),
    Entry(("yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",), "llama3", _eagle3_head(8192, 28672, 64, 128256, 131072),
          kind=ModelKind.EAGLE3, targets=("meta-llama/Llama-3.3-70B-Instruct",), draft_vocab_size=32000),
    Entry(("AngelSlim/Qwen3-8B_eagle3",), "qwen3", _eagle3_head(4096, 12288, 32, 151936, 40960),
          kind=ModelKind.EAGLE3, targets=("Qwen/Qwen3-8B",), draft_vocab_size=32000,
          sources=("https://github.com/vllm-project/vllm/pull/22333 (Qwen3-8B EAGLE-3 heads in vLLM)",)),
    Entry(("Tengyunw/qwen3_8b_eagle3",), "qwen3", _eagle3_head(4096, 12288, 32, 151936, 40960),
          kind=ModelKind.EAGLE3, targets=("Qwen/Qwen3-8B",), draft_vocab_size=32000,
          sources=("https://github.com/sgl-project/sglang/pull/7745 (EAGLE-3 for Qwen3-8B)",)),
    # --- DFlash and DSpark drafters (block drafters: kind dflash / dspark) ------------------------------
    Entry(("z-lab/Qwen3-8B-DFlash-b16",), "qwen3", _qwen3_8b_block_drafter("DFlashDraftModel", block_size=16),
          kind=ModelKind.DFLASH, targets=("Qwen/Qwen3-8B",),
          note="shapes assumed from z-lab's Qwen3 DFlash layout and Qwen3-8B's layers, not read from the repository",
          sources=("vLLM vllm/model_executor/models/qwen3_dflash.py (DFlash drafter: fc over target layers, no "
                   "embed_tokens or lm_head of its own)",)),
    Entry(("deepseek-ai/dspark_qwen3_8b_block7",), "qwen3",
          _qwen3_8b_block_drafter("Qwen3DSparkModel", dspark_block_size=7, markov_rank=256),
          kind=ModelKind.DSPARK, targets=("Qwen/Qwen3-8B",),
          note="shapes assumed (five layers, Markov rank 256) from the DSpark layout, not read from the repository",
          sources=("vLLM vllm/config/speculative.py names deepseek-ai/dspark_qwen3_8b_block7 among its DSpark "
                   "examples; vllm/model_executor/models/qwen3_dspark.py (Markov and confidence heads)",)),
)
