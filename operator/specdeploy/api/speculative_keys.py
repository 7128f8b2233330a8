"""The keys of each engine's speculative config, for `spec.speculation.extraConfig`: which ones the operator
renders from typed fields (refused at admission), which ones the engine fills in itself, and which ones exist.

Pure data, shared by the CRD's rules (api/spec.py), the renderers (engines/) and the plan (planning/compat.py);
it imports nothing, so the API models can use it. Keyed by engine name (`EngineKind.value`).

Sources, read 2026-12:
- vLLM: `vllm/config/speculative.py`, the fields of the `SpeculativeConfig` dataclass, which is what
  `--speculative-config` JSON is passed to (`EngineArgs.create_speculative_config`: `SpeculativeConfig(**config)`,
  after replacing `-` by `_` in the keys). vLLM 0.33.0 (the default image): the `speculative_config.fields` list in
  tests/data/engine-flags/vllm.json, extracted by scripts/engine-flag-inventory.py (a unit test keeps the two equal).
  vLLM 0.32.0 (the CPU build the dev cluster runs) has the same fields except the six in `VLLM_KEYS_SINCE_0_33`.
- TensorRT-LLM: `tensorrt_llm/llmapi/llm_args.py` on the main branch (NVIDIA/TensorRT-LLM commit 0004396720),
  the pydantic fields of `DecodingBaseConfig` and of the subclass each `decoding_type` selects
  (`Eagle3DecodingConfig` < `EagleDecodingConfig`, `MTPDecodingConfig`, `NGramDecodingConfig`,
  `DraftTargetDecodingConfig`); PrivateAttrs and `init=False` fields left out. These are `StrictBaseModel`s
  (extra="forbid"): an unknown key stops trtllm-serve at start-up.
- SGLang has no speculative config object: its speculative settings are separate `--speculative-*` flags
  (sglang/srt/server_args.py), so there is nothing to merge an extraConfig into.
"""

from __future__ import annotations

from typing import NamedTuple

MAX_EXTRA_CONFIG_KEYS = 64
"""Keys of `spec.speculation.extraConfig` (the CRD's maxProperties): vLLM's SpeculativeConfig has 43 fields."""

MAX_EXTRA_CONFIG_TEXT = 8192
"""Characters of `spec.speculation.extraConfig` as compact JSON, checked by the plan: the values are free-form
JSON, which the apiserver's CEL cannot see, so the size of the values cannot be bounded at admission. The
operator copies the text into every Deployment's args (vLLM) or the engine ConfigMap (TensorRT-LLM)."""


class ManagedKey(NamedTuple):
    """A key the operator renders from a typed field; `json_type` is the OpenAPI type the CRD declares for it
    (the CEL rule that refuses the key can only see declared properties)."""

    owner: str        # the field to set instead, as a user writes it
    json_type: str    # "string" or "integer"


VLLM_SPECULATIVE_CONFIG_KEYS: tuple[str, ...] = (
    "attention_backend", "code_revision", "disable_eagle_block_drop", "disable_lookahead_block_hashes",
    "disable_padded_drafter_batch", "draft_lm_head_quantization", "draft_load_config", "draft_model_config",
    "draft_parallel_config", "draft_sample_method", "draft_tensor_parallel_size", "dspark_draft_topk",
    "enable_adaptive_verification", "enforce_eager", "fly_entropy_threshold", "fly_entropy_top_k",
    "fly_window_size", "index_share_for_mtp_iteration", "kv_cache_dtype", "max_model_len", "method", "model",
    "moe_backend", "num_speculative_tokens", "num_speculative_tokens_per_batch_size", "parallel_drafting",
    "prompt_lookup_max", "prompt_lookup_min", "quantization", "rejection_sample_method", "revision",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor", "suffix_decoding_max_tree_depth",
    "suffix_decoding_min_token_prob", "synthetic_acceptance_length", "synthetic_acceptance_rates",
    "target_model_config", "target_parallel_config", "tensor_parallel_size", "use_heterogeneous_vocab",
    "use_local_argmax_reduction", "xpress_topc",
)
"""Every field of vLLM 0.33.0's SpeculativeConfig, sorted."""

VLLM_KEYS_SINCE_0_33: frozenset[str] = frozenset({
    "disable_lookahead_block_hashes", "draft_lm_head_quantization", "fly_entropy_threshold", "fly_entropy_top_k",
    "fly_window_size", "xpress_topc",
})
"""SpeculativeConfig fields of vLLM 0.33.0 that 0.32.0 does not have (an older image refuses them)."""

VLLM_MANAGED_KEYS: dict[str, ManagedKey] = {
    # engines/vllm.py `speculative_config`: the keys it writes, and the spec field each comes from.
    "method": ManagedKey("spec.speculation.method", "string"),
    "model": ManagedKey("spec.speculation.draft.name", "string"),
    "num_speculative_tokens": ManagedKey("spec.speculation.numSpeculativeTokens", "integer"),
    "revision": ManagedKey("spec.speculation.draft.revision", "string"),
    "quantization": ManagedKey("spec.speculation.draft.quantization", "string"),
    "draft_tensor_parallel_size": ManagedKey("spec.speculation.draft.tensorParallelSize", "integer"),
    "prompt_lookup_min": ManagedKey("spec.speculation.promptLookupMin", "integer"),
    "prompt_lookup_max": ManagedKey("spec.speculation.promptLookupMax", "integer"),
}
"""vLLM --speculative-config keys the operator renders (the memory plan is made from the same fields)."""

VLLM_UNSETTABLE_KEYS: dict[str, str] = {
    # EngineArgs.create_speculative_config passes these two itself ("required configuration params passed from
    # engine"), replacing whatever the JSON had.
    "target_model_config": "vLLM passes the target's ModelConfig itself",
    "target_parallel_config": "vLLM passes the target's ParallelConfig itself",
    # "params generated in the post-init stage" of SpeculativeConfig.
    "draft_model_config": "vLLM builds the draft's ModelConfig from the other keys",
    "draft_parallel_config": "vLLM builds the draft's ParallelConfig from the other keys",
    # SpeculativeConfig.__post_init__: "'tensor_parallel_size' is not a valid argument in the speculative_config.
    # Please pass 'draft_tensor_parallel_size' instead."
    "tensor_parallel_size": "vLLM refuses it and asks for draft_tensor_parallel_size, which the operator renders "
                            "from `spec.speculation.draft.tensorParallelSize`",
}
"""SpeculativeConfig fields that are not user settings: vLLM fills them in, or refuses them."""

TRTLLM_MANAGED_KEYS: dict[str, ManagedKey] = {
    # engines/trtllm.py `speculative_config`: the keys it writes, and the spec field each comes from.
    "decoding_type": ManagedKey("spec.speculation.method", "string"),
    "max_draft_len": ManagedKey("spec.speculation.numSpeculativeTokens", "integer"),
    "speculative_model": ManagedKey("spec.speculation.draft.name", "string"),
    "speculative_model_dir": ManagedKey("spec.speculation.draft.name", "string"),  # an alias of speculative_model
    "num_nextn_predict_layers": ManagedKey("spec.speculation.numSpeculativeTokens", "integer"),
    "max_matching_ngram_size": ManagedKey("spec.speculation.promptLookupMax", "integer"),
}
"""TensorRT-LLM speculative_config keys the operator renders."""

_TRTLLM_BASE_KEYS = (
    # DecodingBaseConfig
    "max_draft_len", "max_total_draft_tokens", "speculative_model", "speculative_model_dir", "max_concurrency",
    "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
    "decoding_type",
)
_TRTLLM_EAGLE_KEYS = (
    # EagleDecodingConfig, and Eagle3DecodingConfig's sa_config
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
    "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
    "eagle3_model_arch", "sa_config",
)
_TRTLLM_MTP_KEYS = (
    # MTPDecodingConfig; num_nextn_predict_layers is init=False but still read (renamed to max_draft_len with a
    # deprecation warning) by a before-validator.
    "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla",
    "mtp_eagle_one_model", "use_dynamic_tree", "dynamic_tree_max_topK", "sa_config", "num_nextn_predict_layers",
    "begin_thinking_phase_token", "end_thinking_phase_token",
)
_TRTLLM_NGRAM_KEYS = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")

TRTLLM_SPECULATIVE_CONFIG_KEYS: dict[str, frozenset[str]] = {
    "Eagle3": frozenset((*_TRTLLM_BASE_KEYS, *_TRTLLM_EAGLE_KEYS)),
    "MTP": frozenset((*_TRTLLM_BASE_KEYS, *_TRTLLM_MTP_KEYS)),
    "NGram": frozenset((*_TRTLLM_BASE_KEYS, *_TRTLLM_NGRAM_KEYS)),
    "DraftTarget": frozenset(_TRTLLM_BASE_KEYS),
}
"""Per TensorRT-LLM decoding_type: the keys its decoding config class has."""

MANAGED_KEYS: dict[str, dict[str, ManagedKey]] = {"vllm": VLLM_MANAGED_KEYS, "trtllm": TRTLLM_MANAGED_KEYS}
"""Per engine with a speculative config object: the keys refused in extraConfig at admission."""
