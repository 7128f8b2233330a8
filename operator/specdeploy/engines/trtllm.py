"""TensorRT-LLM: `trtllm-serve MODEL --config /etc/specdeploy/trtllm.yaml …` on the PyTorch backend.

Speculation, the KV cache and metrics live in the YAML (LlmArgs fields, tensorrt_llm/llmapi/llm_args.py);
the command line carries what trtllm-serve has flags for (tensorrt_llm/commands/serve.py; --config is an
alias of --extra_llm_api_options since NVIDIA/TensorRT-LLM PR #9104). TensorRT-LLM cannot be
pip-installed without NVIDIA's package index, so its flags and YAML keys are checked against a
hand-written table, tests/data/engine-flags/trtllm.json, that names those sources. Speculation cannot be
switched off while the server runs: a rollback re-renders the YAML without speculative_config and
restarts the pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import yaml

from specdeploy.api.spec import EngineKind, KvCacheDtype, Method
from specdeploy.api.speculative_keys import TRTLLM_MANAGED_KEYS, TRTLLM_SPECULATIVE_CONFIG_KEYS
from specdeploy.api.status import Severity
from specdeploy.engines.base import (
    CONFIG_MOUNT_PATH,
    LISTEN_HOST,
    BatchK,
    EngineCommand,
    EngineInputs,
    EngineRenderError,
    MetricNames,
    hub_token_env,
    merge_extra_config,
    user_env,
)
from specdeploy.engines.profile import (
    HOST_REASON,
    MAX_BATCHED_FIELD,
    MAX_MODEL_LEN_FIELD,
    MAX_NUM_SEQS_FIELD,
    PORT_FIELD,
    PP_FIELD,
    REVISION_FIELD,
    SPECULATION_FIELD,
    TP_FIELD,
    UTILIZATION_FIELD,
    AcceptanceSignal,
    EngineProfile,
    ManagedFlags,
    MemoryAccounting,
    MemoryBudget,
    MethodRefusal,
    MultiNode,
    NoMultiNodeLaunch,
    ScheduleExpression,
    ScheduleSupport,
    SpeculativeConfigKeys,
    UnmodelledKey,
    command_head,
)

# tensorrt_llm/metrics/collector.py (MetricsCollector, metric_prefix "trtllm_"), served under
# /prometheus/metrics by tensorrt_llm/serve/openai_server.py when return_perf_metrics is true; the
# iteration gauges and speculative counters also need enable_iter_perf_stats (NVIDIA/TensorRT-LLM PR
# #12545 made the spec-decode numbers counters). TensorRT-LLM reports time per output token, not an
# inter-token latency histogram; TPOT is the closest signal. Labels: model_name, engine_type. The per-position
# counters (drafted and accepted, token_position from 0) are added when a request finishes
# (MetricsCollector.log_request_metrics_dict), and a position's series appears only once it counted something.
METRICS = MetricNames(
    drafts_total=None,
    draft_tokens_total="trtllm_spec_decode_num_draft_tokens_total",
    accepted_tokens_total="trtllm_spec_decode_num_accepted_tokens_total",
    accepted_tokens_per_pos_total="trtllm_spec_decode_accepted_tokens_total",
    acceptance_rate_gauge=None,
    acceptance_length_gauge="trtllm_spec_decode_acceptance_length",
    time_to_first_token="trtllm_time_to_first_token_seconds",
    inter_token_latency="trtllm_time_per_output_token_seconds",
    time_per_output_token="trtllm_time_per_output_token_seconds",
    e2e_request_latency="trtllm_e2e_request_latency_seconds",
    request_queue_time="trtllm_request_queue_time_seconds",
    requests_running="trtllm_num_requests_running",
    requests_waiting="trtllm_num_requests_waiting",
    kv_cache_usage="trtllm_kv_cache_utilization",
    request_success_total="trtllm_request_success_total",
    model_label="model_name",
    position_label="token_position",
    drafted_tokens_per_pos_total="trtllm_spec_decode_drafted_tokens_total",
    generation_tokens_total="trtllm_generation_tokens_total",
)

# The trtllm_-prefixed Prometheus metrics arrived with NVIDIA/TensorRT-LLM PR #12545 (2026-03), so the image must be
# from the 1.3 line; 1.3.0rc23 is the newest release tag seen in use.
DEFAULT_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc23"

COMMAND = ("trtllm-serve",)
CONFIG_FILE = "trtllm.yaml"
HEALTH_PATH = "/health"                 # OpenAIServer.register_routes
METRICS_PATH = "/prometheus/metrics"    # OpenAIServer.mount_metrics (/metrics is JSON iteration stats)

# spec method -> speculative_config.decoding_type (tensorrt_llm/llmapi/llm_args.py: Eagle3DecodingConfig,
# MTPDecodingConfig, NGramDecodingConfig, DraftTargetDecodingConfig). The draft-target class's Literal is
# "Draft_Target"; "DraftTarget" is the documented spelling (docs/source/features/speculative-decoding.md,
# NVIDIA's DGX Spark speculative-decoding playbook on release 1.2.0rc6 and 1.3.0rc12) and is used here.
DECODING_TYPES = {
    Method.EAGLE3: "Eagle3",
    Method.MTP: "MTP",
    Method.NGRAM: "NGram",
    Method.DRAFT_MODEL: "DraftTarget",
}


def schedule_config(schedule: tuple[BatchK, ...]) -> dict[str, Any]:
    """`max_concurrency` or `draft_len_schedule` for a schedule (DecodingBaseConfig, PyTorch backend; read in
    tensorrt_llm/llmapi/llm_args.py on the main branch, 2026-12).

    draft_len_schedule maps each range's largest batch size to its draft length ({4: 4, 8: 2, 32: 1}: batch
    sizes 1-4 draft 4, 5-8 draft 2, 9-32 draft 1, 33 and up 0), and its smallest key must map to max_draft_len.
    max_concurrency N ("speculation will be disabled at batch sizes above this value") is the same as
    {N: max_draft_len}; the two are mutually exclusive. So a schedule of one k that ends in k = 0 becomes
    max_concurrency (the largest batch size with k > 0), any other the ranges up to the last with k > 0.
    """
    drafting = [entry for entry in schedule if entry.k > 0]
    kept = [entry for entry in schedule if entry.min_batch <= drafting[-1].min_batch]
    if len({entry.k for entry in kept}) > 1:
        return {"draft_len_schedule": {entry.max_batch: entry.k for entry in kept}}
    if kept[-1].max_batch < schedule[-1].max_batch:
        return {"max_concurrency": kept[-1].max_batch}
    return {}


def speculative_config(inputs: EngineInputs) -> dict[str, Any]:
    """The YAML speculative_config for the spec's method (and its schedule), then the keys of
    spec.speculation.extraConfig (fields of the method's decoding config the spec has no field for)."""
    spec = inputs.spec
    speculation = spec.speculation
    method = speculation.enabled_method
    if method == Method.EAGLE:
        # EagleDecodingConfig ("Eagle") runs the EAGLE-3 code path on the PyTorch backend (its
        # spec_dec_mode is EAGLE3 / EAGLE3_ONE_MODEL), so an EAGLE-1 head does not load.
        raise EngineRenderError(
            "TensorRT-LLM runs EAGLE heads only as EAGLE-3: set `spec.speculation.method` to eagle3 with "
            "an EAGLE-3 head, or use vllm or sglang for an EAGLE-1 head"
        )
    decoding_type = DECODING_TYPES.get(method)
    if decoding_type is None:
        raise EngineRenderError(
            f"`spec.speculation.method` {method.value} is not available in TensorRT-LLM; "
            f"use one of {', '.join(m.value for m in DECODING_TYPES)}"
        )
    k = inputs.max_k
    config: dict[str, Any] = {"decoding_type": decoding_type, "max_draft_len": k}
    if inputs.schedule is not None:
        config.update(schedule_config(inputs.schedule))
    if speculation.draft is not None:
        config["speculative_model"] = speculation.draft.name
    if speculation.method == Method.MTP:
        # Older releases size MTP by num_nextn_predict_layers; newer ones take max_draft_len and drop
        # the old key with a deprecation warning. Both say k.
        config["num_nextn_predict_layers"] = k
    if speculation.method == Method.NGRAM:
        config["max_matching_ngram_size"] = speculation.prompt_lookup_max
    return merge_extra_config(config, spec)


def llm_args(inputs: EngineInputs) -> dict[str, Any]:
    """The --config YAML: LlmArgs overrides (they win over the command-line values)."""
    spec = inputs.spec
    kv_cache: dict[str, Any] = {
        # KvCacheConfig.dtype (PyTorch backend): "auto" follows the checkpoint.
        "dtype": "fp8" if spec.serving.kv_cache_dtype != KvCacheDtype.AUTO else "auto",
    }
    if inputs.trtllm_free_gpu_memory_fraction is not None:
        kv_cache["free_gpu_memory_fraction"] = inputs.trtllm_free_gpu_memory_fraction
    config: dict[str, Any] = {
        "dtype": spec.model.dtype.value,
        "kv_cache_config": kv_cache,
        "return_perf_metrics": True,      # mounts /prometheus/metrics
        "enable_iter_perf_stats": True,   # iteration gauges and speculative-decoding counters
    }
    if inputs.speculating:
        config["speculative_config"] = speculative_config(inputs)
    return config


def render_yaml(config: Mapping[str, Any]) -> str:
    """YAML with sorted keys: the same config always gives the same ConfigMap text."""
    return yaml.safe_dump(dict(config), sort_keys=True, default_flow_style=False)


def render(inputs: EngineInputs) -> EngineCommand:
    """`trtllm-serve` for the spec's target, with a speculative_config when `inputs.speculating`.

    The weights' quantisation is read from the checkpoint (TensorRT-LLM has no --quantization on the
    PyTorch backend): an fp8 target means an FP8 checkpoint, e.g. a ModelOpt export.
    """
    spec = inputs.spec
    model, serving, resources = spec.model, spec.serving, spec.resources
    args: list[str] = [
        model.name,
        "--host", LISTEN_HOST,
        "--port", str(serving.port),
        "--backend", "pytorch",
        "--tp_size", str(resources.tensor_parallel_size),
        *(["--pp_size", str(resources.pipeline_parallel_size)] if resources.pipeline_parallel_size > 1 else []),
        "--max_seq_len", str(inputs.max_model_len),
        "--max_batch_size", str(serving.max_num_seqs),
        "--max_num_tokens", str(serving.max_num_batched_tokens),
        "--config", f"{CONFIG_MOUNT_PATH}/{CONFIG_FILE}",
    ]
    if model.revision:
        args += ["--revision", model.revision]
    args += spec.engine.extra_args
    return EngineCommand(
        command=COMMAND,
        args=tuple(args),
        env=user_env(spec),
        # trtllm-serve downloads a Hub id with huggingface_hub (tensorrt_llm/llmapi/utils.py): HF_TOKEN.
        secret_env=hub_token_env(spec),
        port=serving.port,
        health_path=HEALTH_PATH,
        metrics_path=METRICS_PATH,
        metrics=METRICS,
        config_files=MappingProxyType({CONFIG_FILE: render_yaml(llm_args(inputs))}),
    )


# --- profile ------------------------------------------------------------------------------------------------

# tensorrt_llm/commands/serve.py (`trtllm-serve` click options). The operator passes its own YAML (speculative_config
# and the KV cache settings) with --config.
MANAGED_FLAGS = {
    "--config": SPECULATION_FIELD,
    "--extra_llm_api_options": SPECULATION_FIELD,
    "--tp_size": TP_FIELD,
    "--tensor_parallel_size": TP_FIELD,
    "--pp_size": PP_FIELD,
    "--free_gpu_memory_fraction": UTILIZATION_FIELD,
    "--kv_cache_free_gpu_memory_fraction": UTILIZATION_FIELD,
    "--max_seq_len": MAX_MODEL_LEN_FIELD,
    "--max_batch_size": MAX_NUM_SEQS_FIELD,
    "--max_num_tokens": MAX_BATCHED_FIELD,
    "--revision": REVISION_FIELD,
    "--port": PORT_FIELD,
    "--host": HOST_REASON,
    "--backend": "speculation runs on TensorRT-LLM's PyTorch backend only",
}


def runs(argv: Sequence[str]) -> bool:
    """`trtllm-serve MODEL …` (or `trtllm-serve serve MODEL …`)."""
    return any(word.startswith("trtllm-serve") for word in command_head(argv))


def tree_verify_tokens(extra: Mapping[str, Any], k: int) -> int | None:
    """Tokens a tree in extraConfig verifies per step: `max_total_draft_tokens` + 1, or a static tree's
    `eagle_choices` (one token per choice) + 1 (tensorrt_llm/llmapi/llm_args.py EagleDecodingConfig); None for a
    chain of k."""
    total, choices = extra.get("max_total_draft_tokens"), extra.get("eagle_choices")
    if isinstance(total, int) and not isinstance(total, bool) and total > k:
        return total + 1
    if isinstance(choices, list) and len(choices) > k:
        return len(choices) + 1
    return None


def _decoding_config(method: Method) -> str | None:
    decoding_type = DECODING_TYPES.get(method)
    return None if decoding_type is None else f"TensorRT-LLM's {decoding_type} speculative_config"


_SCHEDULE_NOT_MODELLED = UnmodelledKey(
    Severity.INFO, "ExtraConfigScheduleNotModelled",
    "the speedup estimate and the acceptance floor assume `spec.speculation.numSpeculativeTokens` at every batch "
    "size, and while TensorRT-LLM drafts nothing its speculative counters stop, so acceptance samples are "
    "Inconclusive",
)

PROFILE = EngineProfile(
    kind=EngineKind.TRTLLM,
    methods=DECODING_TYPES,
    method_setting="speculative_config.decoding_type",
    # TensorRT-LLM docs: "decoding_type: Eagle is accepted as a backward-compatible alias for Eagle3, but EAGLE
    # (v1/v2) draft checkpoints are incompatible."
    method_refusals={Method.EAGLE: MethodRefusal(
        "TrtllmNeedsEagle3Checkpoint",
        "`spec.speculation.method` eagle must not be used with `spec.engine.kind` trtllm: TensorRT-LLM runs only "
        "EAGLE-3 heads (its decoding_type Eagle is an alias of Eagle3 and EAGLE-1/2 checkpoints are incompatible); "
        "set method eagle3 with an EAGLE-3 head trained for {target}, or use vllm or sglang for an EAGLE-1/2 head",
    )},
    # click does not take abbreviations.
    managed_flags=ManagedFlags(owned=MANAGED_FLAGS, owned_prefixes={}, removed={}, removed_prefixes={},
                               abbreviations=False, spelling=str),
    extra_config=SpeculativeConfigKeys(
        describe=_decoding_config,
        known=lambda method: TRTLLM_SPECULATIVE_CONFIG_KEYS.get(DECODING_TYPES.get(method, ""), frozenset()),
        managed=TRTLLM_MANAGED_KEYS,
        unsettable={},
        spelling=str,
        unmodelled={key: _SCHEDULE_NOT_MODELLED
                    for key in ("draft_len_schedule", "max_concurrency", "acceptance_rate_threshold")},
        method_only={},
        since_default_image=frozenset(),
        schedule_keys=("draft_len_schedule", "max_concurrency"),
        tree_verify_tokens=tree_verify_tokens,
    ),
    # The plan's budget is utilization × the GPU; kv_cache_config.free_gpu_memory_fraction, a share of what is free
    # after the weights, is computed from it (planning.budget.trtllm_free_gpu_memory_fraction).
    memory=MemoryAccounting(budget=MemoryBudget.SHARE_OF_GPU, start_needs_budget_free=False, fixed_kv_cache=False,
                            kv_fraction_of_free=True),
    schedules=ScheduleSupport(
        # draft_len_schedule gives batch sizes up to its smallest key max_draft_len, the most drafted anywhere.
        expression=ScheduleExpression.LARGEST_K_FIRST_TABLE,
        methods=frozenset(DECODING_TYPES),
        single_chain_only=False,
        limit="",
        # TensorRT-LLM skips the drafter for an iteration past `max_concurrency` or `draft_len_schedule`'s largest
        # threshold (tensorrt_llm/_torch/speculative/drafter.py, `should_use_spec_decode`).
        zero_k_speedup=1.0,
        zero_k_cost="",
        threshold_risk="",
    ),
    tree_drafting=False,
    draft_runs_at_own_tp=False,
    refuses_padded_vocabulary=False,
    # No --quantization on the PyTorch backend: the checkpoint's quantization_config decides.
    renders_quantization_flag=False,
    # docs/source/features/speculative-decoding.md documents MTP for DeepSeek models only.
    mtp_documented_for=("deepseek",),
    block_drafter_notes={},
    multi_node=MultiNode(
        # That trtllm-serve starts ranks on other nodes only under MPI is an assumption (not read in its source
        # here); the operator renders no MPI launcher.
        launch=NoMultiNodeLaunch(
            "trtllm-serve starts ranks on other nodes only under MPI (mpirun or trtllm-llmapi-launch), which the "
            "operator does not render"),
        # Refused for every method, on one node as well. NVIDIA/TensorRT-LLM docs/source/features/
        # feature-combination-matrix.md marks pipeline parallelism "No" with every speculative path: MTP and EAGLE-3
        # one- and two-model in its older form, "Linear", "Dynamic Trees" and "Legacy Path (NGram, user-provided)" in
        # its newer one (the columns of the 1.4.0rc1 docs page). PyExecutor.__init__ (tensorrt_llm/_torch/pyexecutor/
        # py_executor.py) raises "Drafting is not supported for selected executor loop" when pp_size > 1 selects
        # _executor_loop_pp and a drafter exists (NGram, two-model EAGLE-3 and draft-target: speculative/utils.py
        # get_spec_drafter), in every copy read, 2025 to a 2026 main; one-model MTP, EAGLE-3 and draft-target
        # pass that check but are the paths the matrix marks "No". Issue 9009 (1.2.0rc2, 2025-11) was still open.
        # The 1.3.0rc23 tag itself was not read (docs/decisions.md).
        pipeline_speculation_refusal=(
            "TensorRT-LLM does not speculate with pipeline stages (its feature combination matrix marks every "
            "speculative decoding path \"No\" with pipeline parallelism, and its executor raises \"Drafting is not "
            "supported for selected executor loop\" for NGram and two-model drafters, NVIDIA/TensorRT-LLM issue "
            "9009); set `spec.resources.pipelineParallelSize` to 1 with `spec.resources.tensorParallelSize` up to "
            "one node's GPUs, or use `spec.engine.kind` vllm, which drafts on the last stage"),
    ),
    acceptance=AcceptanceSignal.POSITION_COUNTERS,
    metrics=METRICS,
    metrics_path=METRICS_PATH,
    default_image=DEFAULT_IMAGE,
    runs=runs,
    render=render,
)
