"""SGLang: `python3 -m sglang.launch_server --model-path MODEL …` with `--speculative-*` flags.

Flag names and value types are checked against SGLang's own parser by tests/unit/test_engine_flags.py
(inventory in tests/data/engine-flags/sglang.json, extracted from sglang 0.5.23: ServerArgs.add_cli_args,
fields in sglang/srt/arg_groups/fields/). SGLang exposes /metrics only with --enable-metrics.
"""

from __future__ import annotations

from specdeploy.api.spec import KvCacheDtype, Method, SpeculativeDeploymentSpec
from specdeploy.engines.base import (
    LISTEN_HOST,
    EngineCommand,
    EngineInputs,
    EngineRenderError,
    MetricNames,
    explicit_quantization,
    user_env,
)

# sglang/srt/observability/metrics_collector.py (sglang 0.5.23). SGLang has no per-token draft/accept
# counters: it exports the acceptance rate and length as gauges (multiprocess mode "mostrecent").
# Labels: model_name (the served model name), engine_type, tp_rank, pp_rank, moe_ep_rank.
METRICS = MetricNames(
    drafts_total=None,
    draft_tokens_total=None,
    accepted_tokens_total=None,
    accepted_tokens_per_pos_total=None,
    acceptance_rate_gauge="sglang:spec_accept_rate",
    acceptance_length_gauge="sglang:spec_accept_length",
    time_to_first_token="sglang:time_to_first_token_seconds",
    inter_token_latency="sglang:inter_token_latency_seconds",
    # SGLang divides each interval by the tokens it emitted (metrics_collector.observe_inter_token_latency).
    time_per_output_token="sglang:inter_token_latency_seconds",
    e2e_request_latency="sglang:e2e_request_latency_seconds",
    request_queue_time="sglang:queue_time_seconds",
    requests_running="sglang:num_running_reqs",
    requests_waiting="sglang:num_queue_reqs",
    kv_cache_usage="sglang:token_usage",
    request_success_total="sglang:num_requests_total",
    model_label="model_name",
    generation_tokens_total="sglang:generation_tokens_total",
)

COMMAND = ("python3", "-m", "sglang.launch_server")
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"

# spec method -> --speculative-algorithm. NEXTN is SGLang's name for a model's own MTP layers (it runs
# them as EAGLE); STANDALONE is a separate small draft model (sglang/srt/arg_groups/speculative_hook.py).
SPECULATIVE_ALGORITHMS = {
    Method.DRAFT_MODEL: "STANDALONE",
    Method.EAGLE: "EAGLE",
    Method.EAGLE3: "EAGLE3",
    Method.MTP: "NEXTN",
    Method.NGRAM: "NGRAM",
}

# spec kvCacheDtype -> --kv-cache-dtype (choices auto, fp8_e4m3, fp8_e5m2, …; SGLang has no plain "fp8",
# and its FP8 KV cache default elsewhere is e4m3).
KV_CACHE_DTYPES = {
    KvCacheDtype.FP8: "fp8_e4m3",
    KvCacheDtype.FP8_E4M3: "fp8_e4m3",
    KvCacheDtype.FP8_E5M2: "fp8_e5m2",
}


def num_draft_tokens(steps: int, topk: int) -> int:
    """--speculative-num-draft-tokens: the tokens verified per step, root included.

    With topk 1 the draft is a chain of `steps` tokens and SGLang forces steps + 1 itself. With a wider
    tree (topk > 1) this takes 1 + steps × topk: every draft step can contribute topk candidates.
    """
    return steps + 1 if topk == 1 else 1 + steps * topk


def speculative_args(spec: SpeculativeDeploymentSpec) -> list[str]:
    """The --speculative-* flags for the spec's method."""
    speculation = spec.speculation
    method = speculation.enabled_method
    algorithm = SPECULATIVE_ALGORITHMS.get(method)
    if algorithm is None:
        raise EngineRenderError(
            f"`spec.speculation.method` {method.value} is not available in SGLang; "
            f"use one of {', '.join(m.value for m in SPECULATIVE_ALGORITHMS)}"
        )
    if speculation.extra_config:
        # planning.compat refuses the same spec with ExtraConfigNotSupported.
        raise EngineRenderError(
            "`spec.speculation.extraConfig` must not be set with `spec.engine.kind` sglang: SGLang has no "
            "speculative config object to merge it into (its speculative settings are --speculative-* flags, "
            "which the operator renders from `spec.speculation`); remove it, or use vllm or trtllm"
        )
    k = speculation.num_speculative_tokens
    args = ["--speculative-algorithm", algorithm]
    if speculation.method == Method.NGRAM:
        # NGRAM sets topk from --speculative-ngram-max-bfs-breadth and steps from the draft tokens.
        return [*args, "--speculative-num-draft-tokens", str(k + 1)]
    draft = speculation.draft
    if draft is not None:
        args += ["--speculative-draft-model-path", draft.name]
        if draft.revision:
            args += ["--speculative-draft-model-revision", draft.revision]
        quantization = explicit_quantization(draft.quantization)
        if quantization:
            args += ["--speculative-draft-model-quantization", quantization]
    topk = speculation.eagle_topk
    return args + [
        "--speculative-num-steps", str(k),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(num_draft_tokens(k, topk)),
    ]


def render(inputs: EngineInputs) -> EngineCommand:
    """`sglang.launch_server` for the spec's target, speculating when `inputs.speculating`.

    spec.resources.gpuMemoryUtilization becomes --mem-fraction-static: the share of GPU memory SGLang
    takes for weights and KV cache together (the memory planner uses the same meaning for SGLang).
    """
    spec = inputs.spec
    model, serving, resources = spec.model, spec.serving, spec.resources
    args: list[str] = [
        "--model-path", model.name,
        "--host", LISTEN_HOST,
        "--port", str(serving.port),
        "--served-model-name", inputs.served_model_name,
        "--dtype", model.dtype.value,
        "--tp-size", str(resources.tensor_parallel_size),
        "--context-length", str(inputs.max_model_len),
        "--max-running-requests", str(serving.max_num_seqs),
        "--chunked-prefill-size", str(serving.max_num_batched_tokens),
        "--mem-fraction-static", str(resources.gpu_memory_utilization),
        "--enable-metrics",
    ]
    if model.revision:
        args += ["--revision", model.revision]
    quantization = explicit_quantization(model.quantization)
    if quantization:
        args += ["--quantization", quantization]
    if serving.kv_cache_dtype in KV_CACHE_DTYPES:
        args += ["--kv-cache-dtype", KV_CACHE_DTYPES[serving.kv_cache_dtype]]
    if inputs.speculating:
        args += speculative_args(spec)
    args += spec.engine.extra_args
    return EngineCommand(
        command=COMMAND,
        args=tuple(args),
        env=user_env(spec),
        port=serving.port,
        health_path=HEALTH_PATH,
        metrics_path=METRICS_PATH,
        metrics=METRICS,
    )
