"""Engine flags the operator sets itself, and the vLLM flags that no longer exist.

`spec.engine.extraArgs` is for tuning the operator does not model. A flag that the operator renders from
a spec field must not be set there too: the engine would see it twice (argparse keeps the last value,
click refuses), and the memory plan would describe a pod that does not exist. Each table maps a flag to
the spec field that owns it; the engine renderers import the same tables.

Flag names are the engines' own (read 2026-11):
- vLLM: `vllm/engine/arg_utils.py` (EngineArgs.add_cli_args); `--kv-cache-memory-bytes` is the full name,
  `--kv-cache-memory` its argparse abbreviation (vLLM CLI docs, `vllm serve`). `--spec-method`, `--spec-model`
  and `--spec-tokens` (vLLM 0.32 and 0.33) are shorthands for the method, model and num_speculative_tokens
  keys of --speculative-config (EngineArgs.create_speculative_config refuses them beside the same key).
- SGLang: `python/sglang/srt/server_args.py` (ServerArgs.add_cli_args).
- TensorRT-LLM: `tensorrt_llm/commands/serve.py` (`trtllm-serve` click options).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.api.spec import EngineKind

# Field paths, as a user writes them in YAML.
_MODEL = "spec.model.name"
_REVISION = "spec.model.revision"
_QUANTIZATION = "spec.model.quantization"
_DTYPE = "spec.model.dtype"
_SPECULATION = "spec.speculation"
_TP = "spec.resources.tensorParallelSize"
_UTILIZATION = "spec.resources.gpuMemoryUtilization"
_MAX_MODEL_LEN = "spec.serving.maxModelLen"
_MAX_NUM_SEQS = "spec.serving.maxNumSeqs"
_MAX_BATCHED = "spec.serving.maxNumBatchedTokens"
_KV_DTYPE = "spec.serving.kvCacheDtype"
_KV_MEMORY = "spec.serving.kvCacheMemoryGiB"
_PORT = "spec.serving.port"
# Flags the operator sets from no spec field: the reason is the "owner" in the tables.
_HOST = "the pod must listen on all interfaces for its Service and probes"
_SERVED_NAME = "clients and the engine's metrics use one model name the operator chooses"
_BACKEND = "speculation runs on TensorRT-LLM's PyTorch backend only"
_PP = "spec.resources.pipelineParallelSize"
_NODES = "the operator places a layout's ranks on nodes (a LeaderWorkerSet's leader and workers)"

MANAGED_FLAGS: dict[EngineKind, dict[str, str]] = {
    EngineKind.VLLM: {
        "--model": _MODEL,
        "--revision": _REVISION,
        "--speculative-config": _SPECULATION,
        "--spec-method": _SPECULATION,
        "--spec-model": _SPECULATION,
        "--spec-tokens": _SPECULATION,
        "--tensor-parallel-size": _TP,
        "-tp": _TP,
        "--pipeline-parallel-size": _PP,
        "-pp": _PP,
        "--nnodes": _NODES,
        "--node-rank": _NODES,
        "--master-addr": _NODES,
        "--master-port": _NODES,
        "--headless": _NODES,
        "--gpu-memory-utilization": _UTILIZATION,
        "--max-model-len": _MAX_MODEL_LEN,
        "--max-num-seqs": _MAX_NUM_SEQS,
        "--max-num-batched-tokens": _MAX_BATCHED,
        "--quantization": _QUANTIZATION,
        "-q": _QUANTIZATION,
        "--dtype": _DTYPE,
        "--kv-cache-dtype": _KV_DTYPE,
        "--kv-cache-memory-bytes": _KV_MEMORY,
        "--kv-cache-memory": _KV_MEMORY,
        "--port": _PORT,
        "--host": _HOST,
        "--served-model-name": _SERVED_NAME,
    },
    EngineKind.SGLANG: {
        "--model-path": _MODEL,
        "--model": _MODEL,
        "--revision": _REVISION,
        "--tp-size": _TP,
        "--tensor-parallel-size": _TP,
        "--tp": _TP,
        "--pp-size": _PP,
        "--pipeline-parallel-size": _PP,
        "--nnodes": _NODES,
        "--node-rank": _NODES,
        "--dist-init-addr": _NODES,
        "--nccl-init-addr": _NODES,
        "--mem-fraction-static": _UTILIZATION,
        "--context-length": _MAX_MODEL_LEN,
        "--max-running-requests": _MAX_NUM_SEQS,
        "--chunked-prefill-size": _MAX_BATCHED,
        "--quantization": _QUANTIZATION,
        "--dtype": _DTYPE,
        "--kv-cache-dtype": _KV_DTYPE,
        "--port": _PORT,
        "--host": _HOST,
        "--served-model-name": _SERVED_NAME,
    },
    EngineKind.TRTLLM: {
        # The operator passes its own YAML (speculative_config and the KV cache settings) with --config.
        "--config": _SPECULATION,
        "--extra_llm_api_options": _SPECULATION,
        "--tp_size": _TP,
        "--tensor_parallel_size": _TP,
        "--pp_size": _PP,
        "--free_gpu_memory_fraction": _UTILIZATION,
        "--kv_cache_free_gpu_memory_fraction": _UTILIZATION,
        "--max_seq_len": _MAX_MODEL_LEN,
        "--max_batch_size": _MAX_NUM_SEQS,
        "--max_num_tokens": _MAX_BATCHED,
        "--revision": _REVISION,
        "--port": _PORT,
        "--host": _HOST,
        "--backend": _BACKEND,
    },
}
"""Per engine: flag → the spec field that sets it (a `spec.` path), or why the operator sets it itself.
Exact spellings, aliases listed."""

MANAGED_FLAG_PREFIXES: dict[EngineKind, dict[str, str]] = {
    # Every SGLang speculative flag (--speculative-algorithm, -num-steps, -eagle-topk, -draft-model-path …)
    # is rendered from spec.speculation.
    EngineKind.SGLANG: {"--speculative-": _SPECULATION},
}
"""Per engine: flag prefix → the spec field that owns every flag starting with it."""

REMOVED_VLLM_FLAGS: dict[str, str] = {
    # Deprecated by vLLM PR #14434 and removed by PR #15466: one JSON --speculative-config replaced them.
    "--speculative-model": "the draft is `model` in --speculative-config",
    "--num-speculative-tokens": "`num_speculative_tokens` in --speculative-config",
    "--speculative-draft-tensor-parallel-size": "`draft_tensor_parallel_size` in --speculative-config",
    "--ngram-prompt-lookup-max": "`prompt_lookup_max` in --speculative-config",
    "--ngram-prompt-lookup-min": "`prompt_lookup_min` in --speculative-config",
    # V0's disable-by-batch-size (PR #5000) left with the V0 engine (PR #35060).
    "--speculative-disable-by-batch-size": "no replacement in the V1 engine",
    "--speculative-max-model-len": "`max_model_len` in --speculative-config",
    "--speculative-model-quantization": "`quantization` in --speculative-config",
    "--spec-decoding-acceptance-method": "no replacement in the V1 engine",
    "--typical-acceptance-sampler-posterior-threshold": "no replacement in the V1 engine",
    "--typical-acceptance-sampler-posterior-alpha": "no replacement in the V1 engine",
    "--disable-logprobs-during-spec-decoding": "no replacement in the V1 engine",
}
"""vLLM speculative flags that no longer exist, → what replaced them."""

# Every other vLLM flag starting with --speculative- is also gone: --speculative-config is the only one left.
_REMOVED_VLLM_PREFIX = "--speculative-"

# vLLM and SGLang parse with argparse, which accepts any unambiguous prefix of a long flag
# (allow_abbrev); trtllm-serve uses click, which does not.
_ARGPARSE_ENGINES = (EngineKind.VLLM, EngineKind.SGLANG)
_SHORTEST_ABBREVIATION = 4  # "--tp": shorter prefixes are ambiguous in every engine's flag set


@dataclass(frozen=True)
class FlagUse:
    """One flag found in extraArgs: where, as written, and what it is."""

    position: int       # index in spec.engine.extraArgs
    written: str        # the flag as the user wrote it (without any =value)
    flag: str           # the engine's own spelling that it resolves to
    owner: str          # spec field path, or why the operator sets it; "" for a removed flag
    replacement: str    # for a removed vLLM flag: what replaced it; "" otherwise


def flag_name(engine: EngineKind, argument: str) -> str | None:
    """The flag an argument sets, normalised as the engine's parser sees it; None for a value.

    `--flag=value` counts as `--flag`. vLLM also reads `--json-arg.key value` as part of `--json-arg` and
    treats `_` and `-` alike in long flags (vllm/utils FlexibleArgumentParser).
    """
    if not argument.startswith("-") or argument == "-" or _is_number(argument):
        return None
    name = argument.split("=", 1)[0]
    if engine == EngineKind.VLLM and name.startswith("--"):
        name = name.split(".", 1)[0].replace("_", "-")
    return name


def _is_number(argument: str) -> bool:
    try:
        float(argument)
    except ValueError:
        return False
    return True


def _expansions(engine: EngineKind, name: str, table: dict[str, str]) -> list[str]:
    """The table flags `name` can mean: itself, or those it abbreviates (argparse engines only)."""
    if name in table:
        return [name]
    if engine not in _ARGPARSE_ENGINES:
        return []
    if name.startswith("--"):
        if len(name) < _SHORTEST_ABBREVIATION:
            return []
        return sorted(flag for flag in table if flag.startswith(name))
    # argparse takes a one-letter short option's value glued on: "-qfp8" is "-q fp8".
    return [flag for flag in table if len(flag) == 2 and name.startswith(flag)]


def classify_flag(engine: EngineKind, name: str) -> tuple[str, str, str] | None:
    """(engine flag, owner, replacement) for a managed or removed flag `name`; None for a free flag.

    An abbreviation that could mean two managed flags with different owners is left alone: the engine
    refuses it as ambiguous before it could override anything.
    """
    if engine == EngineKind.VLLM and name in REMOVED_VLLM_FLAGS:
        # Exact names only: a removed flag has no abbreviations left in today's parser.
        return name, "", REMOVED_VLLM_FLAGS[name]
    managed = MANAGED_FLAGS[engine]
    flags = _expansions(engine, name, managed)
    if flags and len({managed[flag] for flag in flags}) == 1:
        return flags[0], managed[flags[0]], ""
    for prefix, owner in MANAGED_FLAG_PREFIXES.get(engine, {}).items():
        if name.startswith(prefix):
            return name, owner, ""
    if engine == EngineKind.VLLM and name.startswith(_REMOVED_VLLM_PREFIX):
        return name, "", "--speculative-config is the only speculative flag left"
    return None


def find_managed_flags(engine: EngineKind, extra_args: list[str]) -> list[FlagUse]:
    """Every argument in `extra_args` that sets a flag the operator manages or vLLM removed, in order."""
    found: list[FlagUse] = []
    for index, argument in enumerate(extra_args):
        name = flag_name(engine, argument)
        if name is None:
            continue
        classified = classify_flag(engine, name)
        if classified is not None:
            flag, owner, replacement = classified
            found.append(FlagUse(index, argument.split("=", 1)[0], flag, owner, replacement))
    return found
