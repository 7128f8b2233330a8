"""Hugging Face config.json → Architecture, for models the catalog does not know.

Handles the keys of Llama, Qwen2/Qwen3, Mistral/Mixtral (`num_local_experts`), DeepSeek-V3 (MLA:
`kv_lora_rank`, `qk_rope_head_dim`; `num_nextn_predict_layers`), gpt-oss (`sliding_window` with
`layer_types`), Gemma 3 (`sliding_window_pattern`, `text_config`), MiMo (`num_nextn_predict_layers`)
EAGLE heads (`draft_vocab_size`, `architectures: [...Eagle3...]`) and DFlash / DSpark drafters
(`architectures: [DFlashDraftModel]`, `[Qwen3DSparkModel]`; `dflash_config.target_layer_ids`, `markov_rank`). The parameter count, which
config.json does not carry, is estimated from the shapes. Reading a file is the one I/O in planning/.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specdeploy.api.spec import Architecture
from specdeploy.planning.modelinfo import ModelKind
from specdeploy.planning.weights import block_drafter_parameters, head_parameters

_SLIDING_LAYER_TYPES = ("sliding_attention", "sliding_window", "local_attention", "chunked_attention")


def load_hf_config(config: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """The config as a dict: `config` itself, or the JSON in a config.json file (or a model directory)."""
    if isinstance(config, Mapping):
        return dict(config)
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read a Hugging Face config.json from {str(path)!r}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object, so it is not a config.json")
    return loaded


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model's numbers under `text_config`; those win."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _required(config: Mapping[str, Any], *keys: str) -> int:
    value = _first(config, *keys)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"config.json must give `{keys[0]}` as a positive whole number (got {value!r}); describe the "
            "model with `spec.model.architecture` instead if its config uses other names"
        )
    return value


def head_kind(config: Mapping[str, Any]) -> ModelKind:
    """EAGLE3 for an EAGLE-3 head's config, EAGLE for an EAGLE-1/2 head's, DFLASH / DSPARK for those drafters'
    (by their architectures, as vLLM's SpeculativeConfig detects them: DFlashDraftModel, Qwen3DSparkModel,
    DSparkDraftModel, …), BASE otherwise."""
    architectures = " ".join(str(a) for a in config.get("architectures") or ()).lower()
    if "dspark" in architectures:
        return ModelKind.DSPARK
    if "dflash" in architectures:
        return ModelKind.DFLASH
    if "eagle3" in architectures or "draft_vocab_size" in config:
        return ModelKind.EAGLE3
    if "eagle" in architectures:
        return ModelKind.EAGLE
    return ModelKind.BASE


def _target_layer_ids(config: Mapping[str, Any]) -> list[Any]:
    """The target layers a DFlash / DSpark drafter reads (`dflash_config.target_layer_ids`, or DSpark's
    `dspark_target_layer_ids`); empty when the config names none (vLLM then reads num_hidden_layers of them)."""
    nested = config.get("dflash_config")
    ids = nested.get("target_layer_ids") if isinstance(nested, Mapping) else None
    ids = ids or config.get("dspark_target_layer_ids") or config.get("target_layer_ids")
    return list(ids) if isinstance(ids, list) else []


def trained_block_tokens(config: Mapping[str, Any]) -> int | None:
    """The drafted tokens per block a DFlash or DSpark drafter's config.json says it was trained for: DFlash's
    `block_size` (top level or in `dflash_config`) is the verify window, bonus token included, so one less
    (SGLang: "Block size (verify window length)"); DSpark's `dspark_block_size` (or `block_size`) is gamma, the
    drafted tokens themselves (vLLM defaults num_speculative_tokens to it). None for other models."""
    kind = head_kind(config)
    nested = config.get("dflash_config")
    nested = nested if isinstance(nested, Mapping) else {}
    if kind == ModelKind.DSPARK:
        block, bonus = config.get("dspark_block_size") or nested.get("block_size") or config.get("block_size"), 0
    elif kind == ModelKind.DFLASH:
        block, bonus = nested.get("block_size") or config.get("block_size"), 1
    else:
        return None
    return block - bonus if isinstance(block, int) and not isinstance(block, bool) and block > bonus else None


def _markov_rank(config: Mapping[str, Any]) -> int:
    """A DSpark drafter's Markov-head rank (`markov_rank`, or DeepSeek's `dspark_markov_rank`); 0 when absent."""
    rank = config.get("markov_rank") or config.get("dspark_markov_rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else 0


def _sliding_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int | None, int | None]:
    """(window, sliding layers); (None, None) when no layer slides."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or window < 1 or config.get("use_sliding_window") is False:
        return None, None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum(1 for kind in layer_types if str(kind) in _SLIDING_LAYER_TYPES)
        return (window, sliding) if sliding else (None, None)
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return window, num_layers - num_layers // pattern  # every pattern-th layer is global (Gemma 3)
    return window, None  # Mistral v0.1: every layer


def _attention_parameters(config: Mapping[str, Any], hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    kv_lora_rank = config.get("kv_lora_rank")
    if kv_lora_rank:  # DeepSeek MLA (modeling_deepseek.py DeepseekV3Attention)
        nope, rope = config.get("qk_nope_head_dim") or 128, config.get("qk_rope_head_dim") or 64
        v_head = config.get("v_head_dim") or nope
        q_lora = config.get("q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        kv = hidden * (kv_lora_rank + rope) + kv_lora_rank * heads * (nope + v_head)
        return q + kv + heads * v_head * hidden
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    parameters = hidden * (q_width + 2 * kv_width) + q_width * hidden
    bias = config.get("attention_bias", config.get("model_type") in ("qwen2", "mimo"))
    if bias:
        parameters += q_width + 2 * kv_width
    if config.get("model_type") in ("qwen3", "qwen3_moe"):
        parameters += 2 * head_dim  # q_norm and k_norm
    return parameters


def _mlp_parameters(config: Mapping[str, Any], hidden: int, intermediate: int, layer: int) -> int:
    experts = _first(config, "n_routed_experts", "num_local_experts", "num_experts")
    dense_layers = config.get("first_k_dense_replace") or 0
    if not experts or layer < dense_layers:
        return 3 * hidden * intermediate
    expert_size = config.get("moe_intermediate_size") or intermediate
    shared = config.get("n_shared_experts") or 0
    return (experts + shared) * 3 * hidden * expert_size + hidden * experts  # experts + router


def estimate_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of a decoder-only model from its config shapes (MTP layers not included)."""
    config = _flatten(dict(config))
    layers = _required(config, "num_hidden_layers")
    hidden = _required(config, "hidden_size")
    heads = _required(config, "num_attention_heads")
    kv_heads = _first(config, "num_key_value_heads") or heads
    head_dim = _first(config, "head_dim") or hidden // heads
    intermediate = _required(config, "intermediate_size")
    vocab = _required(config, "vocab_size")
    tied = bool(config.get("tie_word_embeddings", False))
    attention = _attention_parameters(config, hidden, heads, kv_heads, head_dim)
    total = vocab * hidden * (1 if tied else 2) + hidden
    for layer in range(layers):
        total += attention + _mlp_parameters(config, hidden, intermediate, layer) + 2 * hidden
    return total


def architecture_from_hf_config(config: Mapping[str, Any] | str | Path) -> Architecture:
    """The Architecture described by a config.json (a dict, or a path to the file or its directory).

    For an EAGLE head, `numParameters` counts the head's own weights only (its target's embeddings
    and LM head are shared), so the memory plan does not count them twice.
    """
    raw = load_hf_config(config)
    flat = _flatten(raw)
    layers = _required(flat, "num_hidden_layers")
    hidden = _required(flat, "hidden_size")
    heads = _required(flat, "num_attention_heads")
    mla = bool(flat.get("kv_lora_rank"))
    head_dim = _first(flat, "head_dim")
    if mla:
        head_dim = (flat.get("qk_nope_head_dim") or 128) + (flat.get("qk_rope_head_dim") or 64)
    window, sliding_layers = _sliding_layers(flat, layers)
    kind = head_kind(raw)
    arch = Architecture(
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=_required(flat, "intermediate_size"),
        num_attention_heads=heads,
        num_key_value_heads=_first(flat, "num_key_value_heads") or heads,
        head_dim=head_dim,
        vocab_size=_required(flat, "vocab_size"),
        num_parameters=1,
        max_position_embeddings=_first(flat, "max_position_embeddings", "max_seq_len") or 4096,
        tie_word_embeddings=bool(flat.get("tie_word_embeddings", False)),
        sliding_window=window,
        sliding_window_layers=sliding_layers,
        kv_lora_rank=flat.get("kv_lora_rank") or None,
        qk_rope_head_dim=flat.get("qk_rope_head_dim") if mla else None,
        num_nextn_predict_layers=flat.get("num_nextn_predict_layers") or 0,
        num_experts=_first(flat, "n_routed_experts", "num_local_experts", "num_experts"),
        num_experts_per_token=_first(flat, "num_experts_per_tok", "experts_per_token", "num_experts_per_token"),
    )
    if kind == ModelKind.BASE:
        parameters = estimate_parameters(flat)
    elif kind in (ModelKind.DFLASH, ModelKind.DSPARK):
        parameters = block_drafter_parameters(arch, len(_target_layer_ids(flat)) or layers,
                                              _markov_rank(flat) if kind == ModelKind.DSPARK else 0,
                                              flat.get("draft_vocab_size"))
    else:
        parameters = head_parameters(arch, kind, flat.get("draft_vocab_size"))
    return arch.model_copy(update={"num_parameters": parameters})
