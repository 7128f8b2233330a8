"""Weight memory: bytes per parameter by quantisation, and what a draft adds on top of its target.

Quantised checkpoints keep the token embeddings and the LM head in 16-bit: vLLM's online fp8 and the
public FP8/INT8 checkpoints quantise Linear layers only (RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic
loads as 67.72 GiB in vLLM, llm-d-benchmark config_explorer/empirical-vllm-memory-results.md, which is
70.55B parameters at 1 byte plus the 2 × 1.05B embedding/head parameters at 2 bytes), and AutoAWQ /
GPTQ leave `lm_head` unquantised by default. 4-bit formats store 0.5 byte per weight plus, per group
of 128 weights, a 16-bit scale and a packed 4-bit zero point (AutoAWQ `q_group_size=128`).

EAGLE heads and MTP layers share the target's token embeddings and LM head (vLLM
`vllm/v1/spec_decode/eagle.py` shares `embed_tokens` and `lm_head` with the target when the head's
checkpoint has none), so a head's weights are its own layers only. So do DFlash and DSpark drafters
(vLLM `vllm/model_executor/models/qwen3_dflash.py` loads `embed_tokens` / `lm_head` only when the checkpoint
ships them): their `numParameters` is what `block_drafter_parameters` counts.
"""

from __future__ import annotations

from specdeploy.api.spec import Architecture, Quantization
from specdeploy.planning.modelinfo import ModelInfo, ModelKind

GROUP_SIZE = 128
"""Weights per quantisation group in AWQ/GPTQ checkpoints (AutoAWQ and GPTQ default)."""

_FOUR_BIT = 0.5 + (2.0 + 0.5) / GROUP_SIZE  # packed weights + fp16 scale + packed zero per group
BYTES_PER_PARAM: dict[Quantization, float] = {
    Quantization.FP8: 1.0,
    Quantization.INT8: 1.0,
    Quantization.AWQ: _FOUR_BIT,
    Quantization.GPTQ: _FOUR_BIT,
    Quantization.INT4: _FOUR_BIT,
}
"""Bytes per quantised (Linear-layer) parameter; `none` means the checkpoint's own dtype."""


def head_dim(arch: Architecture) -> int:
    return arch.head_dim if arch.head_dim is not None else arch.hidden_size // arch.num_attention_heads


def embedding_parameters(arch: Architecture) -> int:
    """Token embeddings plus the LM head (once when tied)."""
    per_matrix = arch.vocab_size * arch.hidden_size
    return per_matrix if arch.tie_word_embeddings else 2 * per_matrix


def attention_parameters(arch: Architecture, input_size: int | None = None) -> int:
    """q, k, v and o projections of one standard (non-MLA) attention layer."""
    hidden = arch.hidden_size
    width = head_dim(arch)
    q_width, kv_width = arch.num_attention_heads * width, arch.num_key_value_heads * width
    return (input_size or hidden) * (q_width + 2 * kv_width) + q_width * hidden


def mlp_parameters(arch: Architecture) -> int:
    """Gate, up and down projections of one dense MLP."""
    return 3 * arch.hidden_size * arch.intermediate_size


def average_layer_parameters(arch: Architecture) -> float:
    """Parameters of one decoder layer, averaged over the model (what an MTP layer is sized like)."""
    return max(arch.num_parameters - embedding_parameters(arch), 0) / arch.num_layers


def head_parameters(arch: Architecture, kind: ModelKind, draft_vocab_size: int | None = None) -> int:
    """Parameters an EAGLE head adds to its target, from its config shapes.

    EAGLE-1/2 (SafeAILab/EAGLE `model/cnets1.py`): `fc` maps [embedding; feature] (2h) to h, then
    decoder layers; embeddings and LM head are the target's. EAGLE-3 (`model/cnets.py`): `fc` fuses
    three target layers (3h to h), its first layer's q/k/v read [embedding; hidden] (2h), and it has
    its own LM head over the draft vocabulary.
    """
    hidden = arch.hidden_size
    norms = 2 * hidden
    if kind == ModelKind.EAGLE3:
        fc = 3 * hidden * hidden
        first = attention_parameters(arch, input_size=2 * hidden) + mlp_parameters(arch) + norms
        rest = (arch.num_layers - 1) * (attention_parameters(arch) + mlp_parameters(arch) + norms)
        lm_head = (draft_vocab_size or arch.vocab_size) * hidden
        return fc + first + rest + lm_head + hidden
    fc = 2 * hidden * hidden + hidden  # EAGLE-1 fc has a bias
    layers = arch.num_layers * (attention_parameters(arch) + mlp_parameters(arch) + norms)
    return fc + layers


def block_drafter_parameters(arch: Architecture, target_layers: int, markov_rank: int = 0,
                             draft_vocab_size: int | None = None) -> int:
    """Parameters a DFlash drafter (or, with `markov_rank`, a DSpark drafter) adds to its target.

    DFlash (vLLM `qwen3_dflash.py`): `fc` maps the hidden states of `target_layers` target layers (n·h) to h, a
    `hidden_norm`, then its decoder layers and a final norm; embeddings and LM head are the target's. DSpark
    (vLLM `qwen3_dspark.py`) adds a low-rank Markov head (`markov_w1`: vocabulary × r, `markov_w2`: r × draft
    vocabulary) and a confidence head (one linear over [hidden; r] to 1, with a bias).
    """
    hidden = arch.hidden_size
    norms = 2 * hidden
    fc = target_layers * hidden * hidden
    layers = arch.num_layers * (attention_parameters(arch) + mlp_parameters(arch) + norms)
    parameters = fc + hidden + layers + hidden
    if markov_rank:
        markov = (arch.vocab_size + (draft_vocab_size or arch.vocab_size)) * markov_rank
        parameters += markov + hidden + markov_rank + 1
    return parameters


def mtp_parameters(arch: Architecture) -> float:
    """Parameters of a model's multi-token-prediction layers (loaded only when method is mtp).

    DeepSeek-V3 (`modeling_deepseek.py`, and its report: 14B MTP weights including copies of the
    embedding and head) and MiMo: each MTP module is one decoder layer plus `eh_proj` (2h to h) and
    two norms; embedding and head are shared.
    """
    per_layer = average_layer_parameters(arch) + 2 * arch.hidden_size * arch.hidden_size
    return arch.num_nextn_predict_layers * per_layer


def _quantised_bytes(parameters: float, sixteen_bit: float, quantization: Quantization, dtype_bytes: float) -> float:
    """`parameters` in total, of which `sixteen_bit` stay in the activation dtype."""
    sixteen_bit = min(sixteen_bit, parameters)
    return (parameters - sixteen_bit) * BYTES_PER_PARAM[quantization] + sixteen_bit * dtype_bytes


def model_weight_bytes(model: ModelInfo, quantization: Quantization, dtype_bytes: float) -> float:
    """Bytes of a full model (a target or a draft_model draft), before tensor-parallel sharding."""
    arch = model.architecture
    if quantization == Quantization.NONE:
        per_param = model.checkpoint_bytes_per_param or dtype_bytes
        return arch.num_parameters * per_param
    return _quantised_bytes(arch.num_parameters, embedding_parameters(arch), quantization, dtype_bytes)


def draft_weight_bytes(draft: ModelInfo, quantization: Quantization, dtype_bytes: float) -> float:
    """Bytes a draft adds: a whole model for a draft_model draft, its own layers for an EAGLE head or a DFlash or
    DSpark drafter (whose `numParameters` already counts only its own: `block_drafter_parameters`)."""
    if draft.kind == ModelKind.BASE:
        return model_weight_bytes(draft, quantization, dtype_bytes)
    if draft.kind in (ModelKind.DFLASH, ModelKind.DSPARK):
        own = draft.architecture.num_parameters
        return own * dtype_bytes if quantization == Quantization.NONE else _quantised_bytes(own, 0, quantization,
                                                                                            dtype_bytes)
    parameters = head_parameters(draft.architecture, draft.kind, draft.draft_vocab_size)
    if quantization == Quantization.NONE:
        return parameters * dtype_bytes
    own_head = (draft.draft_vocab_size or draft.architecture.vocab_size) * draft.architecture.hidden_size
    sixteen_bit = own_head if draft.kind == ModelKind.EAGLE3 else 0
    return _quantised_bytes(parameters, sixteen_bit, quantization, dtype_bytes)


def mtp_weight_bytes(target: ModelInfo, quantization: Quantization, dtype_bytes: float) -> float:
    """Bytes of the target's MTP layers, stored like the rest of the target."""
    parameters = mtp_parameters(target.architecture)
    if quantization == Quantization.NONE:
        return parameters * (target.checkpoint_bytes_per_param or dtype_bytes)
    return parameters * BYTES_PER_PARAM[quantization]
