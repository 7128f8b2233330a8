"""Resolved models for planning tests, built here from config.json numbers (not from the catalog).

Numbers: ../shared/FACTS.md and the models' Hugging Face config.json files.
"""

from __future__ import annotations

from specdeploy.api.spec import Architecture
from specdeploy.planning.modelinfo import ModelInfo, ModelKind


def arch(layers: int, hidden: int, inter: int, heads: int, kv: int, head_dim: int, vocab: int, params: float,
         maxpos: int = 131072, nextn: int = 0, **more: object) -> Architecture:
    return Architecture.model_validate({
        "num_layers": layers, "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": head_dim, "vocab_size": vocab, "num_parameters": int(params),
        "max_position_embeddings": maxpos, "num_nextn_predict_layers": nextn, **more,
    })


LLAMA_8B = ModelInfo("meta-llama/Llama-3.1-8B-Instruct", arch(32, 4096, 14336, 32, 8, 128, 128256, 8.03e9),
                     family="llama3")
LLAMA_70B = ModelInfo("meta-llama/Llama-3.1-70B-Instruct", arch(80, 8192, 28672, 64, 8, 128, 128256, 70.6e9),
                      family="llama3")
LLAMA_1B = ModelInfo("meta-llama/Llama-3.2-1B-Instruct",
                     arch(16, 2048, 8192, 32, 8, 64, 128256, 1.24e9, tie_word_embeddings=True), family="llama3")
QWEN_05B = ModelInfo("Qwen/Qwen2.5-0.5B-Instruct",
                     arch(24, 896, 4864, 14, 2, 64, 151936, 0.49e9, tie_word_embeddings=True), family="qwen2")
QWEN_7B = ModelInfo("Qwen/Qwen2.5-7B-Instruct", arch(28, 3584, 18944, 28, 4, 128, 152064, 7.61e9, maxpos=32768),
                    family="qwen2")
MISTRAL_7B = ModelInfo("mistralai/Mistral-7B-v0.1", arch(32, 4096, 14336, 32, 8, 128, 32000, 7.24e9),
                       family="mistral")
LLAMA2_7B = ModelInfo("meta-llama/Llama-2-7b-hf", arch(32, 4096, 11008, 32, 32, 128, 32000, 6.74e9),
                      family="llama2")
MIMO_7B = ModelInfo("XiaomiMiMo/MiMo-7B-RL", arch(36, 4096, 11008, 32, 8, 128, 151680, 7.8e9, nextn=1),
                    family="mimo")
# DeepSeek-V3: 61 layers, MLA (kv_lora_rank 512 + rope 64), 256 routed experts, 8 per token, one MTP layer,
# 671B parameters, FP8 checkpoint.
DEEPSEEK_V3 = ModelInfo(
    "deepseek-ai/DeepSeek-V3",
    arch(61, 7168, 18432, 128, 128, 192, 129280, 671e9, maxpos=163840, nextn=1, kv_lora_rank=512,
         qk_rope_head_dim=64, num_experts=256, num_experts_per_token=8),
    family="deepseek_v3",
)
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one layer, vocabulary 128256 drafted from 32000 (d2t); about 0.4B
# parameters of its own (layer, fc over three hidden states, 32000-row lm_head).
EAGLE3_8B = ModelInfo("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", arch(1, 4096, 14336, 32, 8, 128, 128256, 0.4e9),
                      kind=ModelKind.EAGLE3, family="llama3", targets=("meta-llama/Llama-3.1-8B-Instruct",),
                      draft_vocab_size=32000)
# yuhuili/EAGLE-LLaMA3-Instruct-8B: an EAGLE-1 head for Llama-3-8B-Instruct; borrows the target's lm_head.
EAGLE1_8B = ModelInfo("yuhuili/EAGLE-LLaMA3-Instruct-8B", arch(1, 4096, 14336, 32, 8, 128, 128256, 0.25e9),
                      kind=ModelKind.EAGLE, family="llama3", targets=("meta-llama/Meta-Llama-3-8B-Instruct",))
# turboderp/Qwama-0.5B-Instruct: Qwen2-0.5B with Llama-3's vocabulary, the draft of vLLM's 2024-10-17 blog.
QWAMA_05B = ModelInfo("turboderp/Qwama-0.5B-Instruct",
                      arch(24, 896, 4864, 14, 2, 64, 128256, 0.47e9, tie_word_embeddings=True), family="llama3")
