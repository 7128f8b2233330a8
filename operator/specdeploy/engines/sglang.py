"""SGLang: `python3 -m sglang.launch_server --model-path MODEL …` with `--speculative-*` flags.

Flag names and value types are checked against SGLang's own parser by tests/unit/test_engine_flags.py
(inventory in tests/data/engine-flags/sglang.json, extracted from sglang 0.5.23: ServerArgs.add_cli_args,
fields in sglang/srt/arg_groups/fields/). SGLang exposes /metrics only with --enable-metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from specdeploy.api.spec import EngineKind, KvCacheDtype, Method, Speculation
from specdeploy.engines.base import (
    CONFIG_MOUNT_PATH,
    LISTEN_HOST,
    BatchK,
    EngineCommand,
    EngineInputs,
    EngineRenderError,
    MetricNames,
    NodeRank,
    compact_json,
    explicit_quantization,
    hub_token_env,
    user_env,
)
from specdeploy.engines.profile import (
    DTYPE_FIELD,
    HOST_REASON,
    KV_DTYPE_FIELD,
    MAX_BATCHED_FIELD,
    MAX_MODEL_LEN_FIELD,
    MAX_NUM_SEQS_FIELD,
    MODEL_FIELD,
    NODES_REASON,
    PORT_FIELD,
    PP_FIELD,
    QUANTIZATION_FIELD,
    REVISION_FIELD,
    SERVED_NAME_REASON,
    SPECULATION_FIELD,
    TP_FIELD,
    UTILIZATION_FIELD,
    AcceptanceSignal,
    BlockDrafterNote,
    EngineProfile,
    ManagedFlags,
    MemoryAccounting,
    MemoryBudget,
    MultiNode,
    NoSpeculativeConfig,
    ScheduleExpression,
    ScheduleSupport,
    command_head,
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

# The image whose CLI and metric names this module was checked against: the version in
# tests/data/engine-flags/sglang.json (extracted from the PyPI release).
DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"

COMMAND = ("python3", "-m", "sglang.launch_server")
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
DIST_INIT_PORT = 20000
"""The port of a multi-node group's `--dist-init-addr` on the leader: any free port (an assumption: SGLang takes
host:port and picks no default)."""
ADAPTIVE_CONFIG_FILE = "sglang-adaptive.json"   # --speculative-adaptive-config, mounted at CONFIG_MOUNT_PATH

# spec method -> --speculative-algorithm. NEXTN is SGLang's name for a model's own MTP layers (it runs
# them as EAGLE); STANDALONE is a separate small draft model (sglang/srt/arg_groups/speculative_hook.py).
SPECULATIVE_ALGORITHMS = {
    Method.DRAFT_MODEL: "STANDALONE",
    Method.EAGLE: "EAGLE",
    Method.EAGLE3: "EAGLE3",
    Method.MTP: "NEXTN",
    Method.NGRAM: "NGRAM",
    Method.DFLASH: "DFLASH",
    Method.DSPARK: "DSPARK",
}

# --speculative-adaptive runs these only, with eagleTopk 1 (sglang/srt/arg_groups/speculative_hook.py).
ADAPTIVE_METHODS = (Method.EAGLE, Method.EAGLE3)

# The block-size flag of each block drafter and the block it takes for k drafted tokens. SGLang 0.5.23
# (sglang/srt/server_args.py field help; sglang/srt/arg_groups/speculative_hook.py `_handle_dflash`):
# --speculative-dflash-block-size is "Block size (verify window length). Alias of --speculative-num-draft-tokens
# for DFLASH", the verify window counting the bonus token, so k + 1; --speculative-dspark-block-size is "Draft
# block size gamma (number of proposed draft tokens). The verify window is gamma + 1", so k. Both force
# --speculative-num-steps and --speculative-eagle-topk to 1 themselves, so neither is rendered.
BLOCK_SIZE_FLAGS = {
    Method.DFLASH: ("--speculative-dflash-block-size", 1),
    Method.DSPARK: ("--speculative-dspark-block-size", 0),
}

# spec kvCacheDtype -> --kv-cache-dtype (choices auto, fp8_e4m3, fp8_e5m2, …; SGLang has no plain "fp8",
# and its FP8 KV cache default elsewhere is e4m3).
KV_CACHE_DTYPES = {
    KvCacheDtype.FP8: "fp8_e4m3",
    KvCacheDtype.FP8_E4M3: "fp8_e4m3",
    KvCacheDtype.FP8_E5M2: "fp8_e5m2",
}


def num_draft_tokens(speculation: Speculation, steps: int) -> int:
    """--speculative-num-draft-tokens: the tokens verified per step, root included.

    With topk 1 the draft is a chain of `steps` tokens and SGLang forces steps + 1 itself; a wider tree verifies
    `spec.speculation.numDraftTokens`, by default 1 + steps × topk (`Speculation.tree_draft_tokens`).
    """
    tree = speculation.tree_draft_tokens(steps)
    return tree if tree is not None else steps + 1


def adaptive_steps(schedule: tuple[BatchK, ...]) -> list[int]:
    """SGLang's candidate_steps for a schedule: its distinct k above 0, ascending (SGLang's tiers draft at
    least one token, so the schedule's k = 0 ranges have no tier)."""
    return sorted({entry.k for entry in schedule if entry.k > 0})


def adaptive_config(schedule: tuple[BatchK, ...]) -> dict[str, Any] | None:
    """The --speculative-adaptive-config file for a schedule of two tiers or more; None for one.

    SGLang's adaptive speculation (`--speculative-adaptive`, EAGLE and EAGLE3 with topk 1 only) reads that flag
    as the path of a JSON file (sglang/srt/speculative/adaptive_spec_params.py `load_adaptive_config`) and moves
    between its candidate_steps by the acceptance it measures (an EMA over update_interval batches after
    warmup_batches, with hysteresis), not by the batch size; it captures CUDA graphs for every tier and refuses
    fewer than two. Only candidate_steps is written; SGLang's defaults keep the rest.
    """
    steps = adaptive_steps(schedule)
    return {"candidate_steps": steps} if len(steps) > 1 else None


def speculative_args(inputs: EngineInputs) -> list[str]:
    """The --speculative-* flags for the spec's method; with a schedule, --speculative-num-steps is its largest k."""
    spec = inputs.spec
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
    k = inputs.max_k
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
    if method in BLOCK_SIZE_FLAGS:
        flag, verified_beyond_k = BLOCK_SIZE_FLAGS[method]
        return [*args, flag, str(k + verified_beyond_k)]
    args += [
        "--speculative-num-steps", str(k),
        "--speculative-eagle-topk", str(speculation.eagle_topk),
        "--speculative-num-draft-tokens", str(num_draft_tokens(speculation, k)),
    ]
    if _adaptive(inputs) is not None:
        args += ["--speculative-adaptive", "--speculative-adaptive-config", f"{CONFIG_MOUNT_PATH}/{ADAPTIVE_CONFIG_FILE}"]
    return args


def _adaptive(inputs: EngineInputs) -> dict[str, Any] | None:
    """The adaptive config the speculating command runs with, if any: EAGLE and EAGLE-3 only (SGLang refuses it
    for the others; planning.compat says so with ScheduleNotSupportedByEngine)."""
    if (not inputs.speculating or inputs.schedule is None
            or inputs.spec.speculation.method not in ADAPTIVE_METHODS):
        return None
    return adaptive_config(inputs.schedule)


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
        *(["--pp-size", str(resources.pipeline_parallel_size)] if resources.pipeline_parallel_size > 1 else []),
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
        args += speculative_args(inputs)
    args += spec.engine.extra_args
    adaptive = _adaptive(inputs)
    return EngineCommand(
        command=COMMAND,
        args=tuple(args),
        env=user_env(spec),
        # SGLang downloads the target and the draft with huggingface_hub (sglang/srt/model_loader): HF_TOKEN.
        secret_env=hub_token_env(spec),
        port=serving.port,
        health_path=HEALTH_PATH,
        metrics_path=METRICS_PATH,
        metrics=METRICS,
        config_files=MappingProxyType({} if adaptive is None else {ADAPTIVE_CONFIG_FILE: compact_json(adaptive) + "\n"}),
    )


def node_args(node: NodeRank) -> list[str]:
    """SGLang's multi-node launch (`--nnodes`, `--node-rank`, `--dist-init-addr` in the flag inventory,
    tests/data/engine-flags/sglang.json): every pod runs the same launch_server with its rank; the HTTP server and
    the metrics are the rank-0 pod's (an assumption from SGLang's multi-node docs, not read in its source here)."""
    return ["--nnodes", str(node.nodes), "--node-rank", node.rank,
            "--dist-init-addr", f"{node.leader_address}:{DIST_INIT_PORT}"]


# --- profile ------------------------------------------------------------------------------------------------

# python/sglang/srt/server_args.py (ServerArgs.add_cli_args).
MANAGED_FLAGS = {
    "--model-path": MODEL_FIELD,
    "--model": MODEL_FIELD,
    "--revision": REVISION_FIELD,
    "--tp-size": TP_FIELD,
    "--tensor-parallel-size": TP_FIELD,
    "--tp": TP_FIELD,
    "--pp-size": PP_FIELD,
    "--pipeline-parallel-size": PP_FIELD,
    "--nnodes": NODES_REASON,
    "--node-rank": NODES_REASON,
    "--dist-init-addr": NODES_REASON,
    "--nccl-init-addr": NODES_REASON,
    "--mem-fraction-static": UTILIZATION_FIELD,
    "--context-length": MAX_MODEL_LEN_FIELD,
    "--max-running-requests": MAX_NUM_SEQS_FIELD,
    "--chunked-prefill-size": MAX_BATCHED_FIELD,
    "--quantization": QUANTIZATION_FIELD,
    "--dtype": DTYPE_FIELD,
    "--kv-cache-dtype": KV_DTYPE_FIELD,
    "--port": PORT_FIELD,
    "--host": HOST_REASON,
    "--served-model-name": SERVED_NAME_REASON,
}


def runs(argv: Sequence[str]) -> bool:
    """`python3 -m sglang.launch_server …`."""
    return any(word.startswith("sglang") for word in command_head(argv))


PROFILE = EngineProfile(
    kind=EngineKind.SGLANG,
    methods=SPECULATIVE_ALGORITHMS,
    method_setting="--speculative-algorithm",
    method_refusals={},
    managed_flags=ManagedFlags(
        owned=MANAGED_FLAGS,
        # Every SGLang speculative flag (--speculative-algorithm, -num-steps, -eagle-topk, -draft-model-path …) is
        # rendered from spec.speculation.
        owned_prefixes={"--speculative-": SPECULATION_FIELD},
        removed={}, removed_prefixes={}, abbreviations=True, spelling=str,
    ),
    extra_config=NoSpeculativeConfig(
        "SGLang has no speculative config object to merge it into (its speculative settings are separate "
        "--speculative-* flags, which the operator renders from `spec.speculation`)"
    ),
    # --mem-fraction-static of the memory free after the CUDA context holds weights and KV cache
    # (model_runner_kv_cache_mixin.py `profile_max_num_token`); the draft's weights come out of the rest.
    memory=MemoryAccounting(budget=MemoryBudget.SHARE_OF_FREE_FOR_WEIGHTS_AND_KV, start_needs_budget_free=False,
                            fixed_kv_cache=False, kv_fraction_of_free=False),
    schedules=ScheduleSupport(
        expression=ScheduleExpression.ACCEPTANCE_TIERS,
        methods=frozenset(ADAPTIVE_METHODS),
        single_chain_only=True,
        limit="SGLang changes the draft length only with --speculative-adaptive, which runs eagle and eagle3 with "
              "eagleTopk 1",
        # Its tiers never reach k = 0 (`adaptive_steps`); planning.schedule's k = 0 cost is kept for the derivation.
        zero_k_speedup=0.80,
        zero_k_cost="",
        threshold_risk="",
    ),
    tree_drafting=True,
    draft_runs_at_own_tp=False,
    refuses_padded_vocabulary=False,
    renders_quantization_flag=True,
    mtp_documented_for=(),
    # sglang/srt/arg_groups/speculative_hook.py `_handle_dflash`: "Overlap scheduler is disabled when using DFLASH
    # speculative decoding (spec v2 is not supported yet)". sglang/srt/server_args.py,
    # --speculative-dspark-sps-table-path: without a profiled cost table "the budget degenerates to verify-all", so
    # DSpark's confidence head schedules nothing and every drafted token is verified.
    block_drafter_notes={
        Method.DFLASH: BlockDrafterNote(
            "DFlashDisablesOverlapScheduler",
            "`spec.speculation.method` dflash turns SGLang's overlap scheduler off (SGLang: \"spec v2 is not "
            "supported yet\"), so CPU scheduling no longer hides behind GPU work; the speedup estimate does not "
            "price that, so compare with eagle3 on the same target where a head exists",
        ),
        Method.DSPARK: BlockDrafterNote(
            "DSparkVerifiesWholeBlock",
            "`spec.speculation.method` dspark on SGLang runs without a profiled cost table "
            "(--speculative-dspark-sps-table-path, which the operator does not render), so SGLang verifies every "
            "drafted token and the confidence head chooses nothing: acceptance and cost are those of the whole "
            "block, as the plan assumes",
        ),
    },
    multi_node=MultiNode(
        launch=node_args,
        # sgl-project/sglang: server_args' validation asserts "Pipeline parallelism is not compatible with overlap
        # schedule, speculative decoding" (quoted in PR 37154, 2026-08); PR 30775 lifts it only behind the
        # experimental SGLANG_ENABLE_PP_SPEC=1, which the operator does not set.
        pipeline_speculation_refusal=(
            "SGLang refuses pipeline parallelism with speculative decoding (\"Pipeline parallelism is not compatible "
            "with overlap schedule, speculative decoding\"); use `spec.engine.kind` vllm, which drafts on the last "
            "stage, or fit the model in one node (`spec.model.quantization`)"),
    ),
    acceptance=AcceptanceSignal.GAUGES,
    metrics=METRICS,
    metrics_path=METRICS_PATH,
    default_image=DEFAULT_IMAGE,
    runs=runs,
    render=render,
)
