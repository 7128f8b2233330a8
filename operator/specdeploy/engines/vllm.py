"""vLLM: `vllm serve MODEL …` with speculation in one `--speculative-config` JSON.

Flag names and value types are checked against vLLM's own parser by tests/unit/test_engine_flags.py
(inventory in tests/data/engine-flags/vllm.json, extracted from vllm 0.33.0). The per-flag speculative
options (--speculative-model, --num-speculative-tokens, --ngram-prompt-lookup-*, …) were removed in
vLLM PR #15466; everything goes through --speculative-config, whose keys are SpeculativeConfig fields
(vllm/config/speculative.py).
"""

from __future__ import annotations

from typing import Any

from specdeploy.api.spec import NGRAM_METHODS, KvCacheDtype, Method
from specdeploy.api.units import GIB
from specdeploy.engines.base import (
    LISTEN_HOST,
    EngineCommand,
    EngineInputs,
    MetricNames,
    NodeRank,
    compact_json,
    explicit_quantization,
    hub_token_env,
    merge_extra_config,
    user_env,
)

# vllm/v1/metrics/loggers.py (PrometheusStatLogger) and vllm/v1/spec_decode/metrics.py (vllm 0.33.0);
# prometheus_client adds `_total` to counter names. Labels: model_name (the served model name), engine.
METRICS = MetricNames(
    drafts_total="vllm:spec_decode_num_drafts_total",
    draft_tokens_total="vllm:spec_decode_num_draft_tokens_total",
    accepted_tokens_total="vllm:spec_decode_num_accepted_tokens_total",
    accepted_tokens_per_pos_total="vllm:spec_decode_num_accepted_tokens_per_pos_total",
    acceptance_rate_gauge=None,
    acceptance_length_gauge=None,
    time_to_first_token="vllm:time_to_first_token_seconds",
    inter_token_latency="vllm:inter_token_latency_seconds",
    # vLLM V1 observes inter_token_latency once per engine step per request (IterationStats in
    # vllm/v1/metrics/stats.py): a speculative step that emits several tokens is one long "gap", so that
    # histogram rises with speculation even when tokens arrive faster. The per-token figure is this one.
    time_per_output_token="vllm:request_time_per_output_token_seconds",
    e2e_request_latency="vllm:e2e_request_latency_seconds",
    request_queue_time="vllm:request_queue_time_seconds",
    requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    request_success_total="vllm:request_success_total",
    model_label="model_name",
    position_label="position",
    generation_tokens_total="vllm:generation_tokens_total",
    # vllm/v1/metrics/stats.py (FinishedRequestStats): prefill = first token − scheduled, inference = last token
    # − scheduled; both leave out the WAITING phase that request_queue_time_seconds measures.
    request_prefill_time="vllm:request_prefill_time_seconds",
    request_inference_time="vllm:request_inference_time_seconds",
)

COMMAND = ("vllm", "serve")    # the console script of the vllm/vllm-openai image; the model is the first argument
HEALTH_PATH = "/health"        # vllm/entrypoints/serve/instrumentator/health.py
METRICS_PATH = "/metrics"      # vllm/entrypoints/serve/instrumentator/metrics.py
MASTER_PORT = 29501
"""The torch.distributed port of a multi-node group: vLLM's default `master_port` (vllm/config/parallel.py)."""

# spec method -> SpeculativeConfig.method (the Literal SpeculativeMethod in vllm/config/speculative.py).
SPECULATIVE_METHODS = {
    Method.DRAFT_MODEL: "draft_model",
    Method.EAGLE: "eagle",
    Method.EAGLE3: "eagle3",
    Method.MTP: "mtp",
    Method.NGRAM: "ngram",
    Method.SUFFIX: "suffix",
    Method.DFLASH: "dflash",
    Method.DSPARK: "dspark",
    Method.NGRAM_GPU: "ngram_gpu",
}
# The per-family MTP names in the same Literal (deepseek_mtp, qwen3_next_mtp, …: MTPModelTypes) are deprecated
# aliases that SpeculativeConfig rewrites to "mtp" with a warning ("method `%s` is deprecated and replaced with
# mtp"), so the operator renders mtp for them all.

# spec kvCacheDtype -> --kv-cache-dtype (CacheDType in vllm/config/cache.py); auto is left out.
KV_CACHE_DTYPES = {
    KvCacheDtype.FP8: "fp8",
    KvCacheDtype.FP8_E4M3: "fp8_e4m3",
    KvCacheDtype.FP8_E5M2: "fp8_e5m2",
}


def engine_key(key: str) -> str:
    """A --speculative-config key as vLLM reads it (EngineArgs.create_speculative_config: `-` becomes `_`)."""
    return key.replace("-", "_")


def speculative_config(inputs: EngineInputs) -> dict[str, Any]:
    """The --speculative-config object: method, k (and the schedule), and the draft's own settings where it has
    a draft, then the keys of spec.speculation.extraConfig (SpeculativeConfig fields the spec has no field for).

    dflash and dspark name their drafter in `model` like an EAGLE head; k is `num_speculative_tokens`, the
    drafted tokens of one block (vLLM verifies k + 1: DFlash queries one bonus token and k mask tokens, DSpark
    reuses the bonus query for the first of its k; SpeculativeConfig.max_num_new_slots_for_drafting).

    A schedule becomes `num_speculative_tokens_per_batch_size: [[start, end, k], …]` (vllm/config/speculative.py;
    validated by vllm/v1/spec_decode/dynamic/utils.py: ranges inclusive, ascending, the first from 1, k ≥ 0) with
    `num_speculative_tokens` its largest k, the startup maximum vLLM sizes its buffers for.
    """
    spec = inputs.spec
    speculation = spec.speculation
    config: dict[str, Any] = {
        "method": SPECULATIVE_METHODS[speculation.enabled_method],
        "num_speculative_tokens": inputs.max_k,
    }
    if inputs.schedule is not None:
        config["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in inputs.schedule]
    draft = speculation.draft
    if draft is not None:
        config["model"] = draft.name
        if draft.revision:
            config["revision"] = draft.revision
        if draft.tensor_parallel_size is not None:
            config["draft_tensor_parallel_size"] = draft.tensor_parallel_size
        quantization = explicit_quantization(draft.quantization)
        if quantization:
            config["quantization"] = quantization
    if speculation.method in NGRAM_METHODS:
        # ngram_gpu reads the same prompt_lookup_min/max (SpeculativeConfig: `if self.method in ("ngram",
        # "ngram_gpu")`).
        config["prompt_lookup_min"] = speculation.prompt_lookup_min
        config["prompt_lookup_max"] = speculation.prompt_lookup_max
    return merge_extra_config(config, spec, engine_key)


def render(inputs: EngineInputs) -> EngineCommand:
    """`vllm serve` for the spec's target, speculating when `inputs.speculating`."""
    spec = inputs.spec
    model, serving, resources = spec.model, spec.serving, spec.resources
    args: list[str] = [
        model.name,
        "--host", LISTEN_HOST,
        "--port", str(serving.port),
        "--served-model-name", inputs.served_model_name,
        "--dtype", model.dtype.value,
        "--tensor-parallel-size", str(resources.tensor_parallel_size),
        *(["--pipeline-parallel-size", str(resources.pipeline_parallel_size)]
          if resources.pipeline_parallel_size > 1 else []),
        "--max-model-len", str(inputs.max_model_len),
        "--max-num-seqs", str(serving.max_num_seqs),
        "--max-num-batched-tokens", str(serving.max_num_batched_tokens),
        "--gpu-memory-utilization", str(resources.gpu_memory_utilization),
    ]
    if serving.kv_cache_memory_gib is not None:
        # CacheConfig.kv_cache_memory_bytes: bytes per GPU; when set vLLM ignores gpu_memory_utilization.
        args += ["--kv-cache-memory-bytes", str(int(serving.kv_cache_memory_gib * GIB))]
    if model.revision:
        args += ["--revision", model.revision]
    quantization = explicit_quantization(model.quantization)
    if quantization:
        args += ["--quantization", quantization]
    if serving.kv_cache_dtype in KV_CACHE_DTYPES:
        args += ["--kv-cache-dtype", KV_CACHE_DTYPES[serving.kv_cache_dtype]]
    if inputs.speculating:
        args += ["--speculative-config", compact_json(speculative_config(inputs))]
        if spec.analysis.probe is not None:
            # Each answer carries its own drafted and accepted tokens (vLLM 0.32+, ObservabilityConfig
            # per_request_spec_decode_metrics), so the operator's probe is told apart from the traffic beside it.
            args += ["--per-request-spec-decode-metrics", "summary"]
    args += spec.engine.extra_args
    return EngineCommand(
        command=COMMAND,
        args=tuple(args),
        env=user_env(spec),
        # vLLM downloads the target and the draft with huggingface_hub (vllm/transformers_utils): HF_TOKEN.
        secret_env=hub_token_env(spec),
        port=serving.port,
        health_path=HEALTH_PATH,
        metrics_path=METRICS_PATH,
        metrics=METRICS,
    )


def node_args(node: NodeRank) -> list[str]:
    """vLLM's multi-node launch without Ray (vllm/config/parallel.py `nnodes`, `node_rank`, `master_addr`: the
    multiprocessing executor across nodes): every pod runs `vllm serve` with the same flags and its rank; the
    pods of rank above 0 run `--headless` (vllm/entrypoints/cli/serve.py `run_headless`: workers only, no API
    server), so only the leader serves HTTP."""
    args = ["--nnodes", str(node.nodes), "--node-rank", node.rank, "--master-addr", node.leader_address,
            "--master-port", str(MASTER_PORT)]
    return args if node.leader else [*args, "--headless"]
