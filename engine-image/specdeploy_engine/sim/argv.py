"""Read an engine container's command line the way the engine would, or refuse it the way it would.

    config = parse_engine_argv(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                                "--speculative-config", '{"method":"eagle3","model":"…","num_speculative_tokens":3}'])
    config.kind, config.speculation.num_speculative_tokens      # EngineKind.VLLM, 3

Exceptions:

    ValueError
     └── EngineArgvError   the engine would not start: `stderr` is what it prints, `exit_code` its status

The engine is told by the command: `vllm serve …` (or `python3 -m vllm.entrypoints.openai.api_server`),
`python3 -m sglang.launch_server …`, `trtllm-serve MODEL …`. vLLM and SGLang options are checked against
their real flag tables (sim/flag_tables.py); TensorRT-LLM's speculative settings come from the YAML named
by `--config`, read from `config_dir` where the ConfigMap is mounted (`/etc/specdeploy` in a pod).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from specdeploy.api.spec import EngineKind, KvCacheDtype, Method, Quantization
from specdeploy.engines import CONFIG_MOUNT_PATH
from specdeploy.engines import sglang as sglang_engine
from specdeploy.engines import trtllm as trtllm_engine
from specdeploy.engines import vllm as vllm_engine
from specdeploy.planning.gpus import GpuProduct
from specdeploy_engine.sim import flag_tables
from specdeploy_engine.sim.options import OptionError, scan, table
from specdeploy_engine.sim.schedule import AdaptiveTiers, KSteps, trtllm_k_steps, vllm_k_steps


class EngineArgvError(ValueError):
    """The engine refuses this command line. `stderr` is its message, `exit_code` its exit status
    (2 for argument errors, as argparse and click exit; 1 for errors raised while building the config)."""

    def __init__(self, stderr: str, exit_code: int = 2) -> None:
        super().__init__(stderr)
        self.stderr = stderr
        self.exit_code = exit_code


@dataclass(frozen=True)
class SpeculationConfig:
    """Speculative decoding as the engine was told to run it."""

    method: Method               # the nearest spec method (the timing model's drafter)
    engine_method: str           # the engine's own name: "eagle3", "EAGLE3", "Eagle3"
    num_speculative_tokens: int  # k: tokens drafted per sequence per step
    verify_tokens: int           # tokens the target checks per sequence per step: k + 1 for a chain
    draft_model: str | None = None
    draft_tensor_parallel_size: int | None = None
    draft_quantization: Quantization = Quantization.NONE
    # k by batch size (vLLM num_speculative_tokens_per_batch_size, TensorRT-LLM draft_len_schedule or
    # max_concurrency) as (first batch size, k) steps; empty: always k. sim/schedule.py applies them.
    k_steps: KSteps = ()
    adaptive: AdaptiveTiers | None = None    # SGLang --speculative-adaptive; k is then its largest tier


@dataclass(frozen=True)
class EngineConfig:
    """What the engine would run: model, parallelism, scheduler limits, speculation, endpoints."""

    kind: EngineKind
    model: str
    served_model_name: str
    host: str
    port: int
    tensor_parallel_size: int
    max_model_len: int | None            # None: the model's maximum
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    quantization: Quantization
    kv_cache_dtype: KvCacheDtype
    speculation: SpeculationConfig | None
    health_path: str
    metrics_path: str | None             # None: these flags expose no Prometheus metrics
    kv_cache_memory_bytes: int | None = None   # vLLM --kv-cache-memory-bytes: a fixed KV cache per GPU
    # pipeline stages (vLLM --pipeline-parallel-size, SGLang --pp-size): each stage holds its share of the layers;
    # a layout across nodes runs one stage group per node, this process standing for the leader's
    pipeline_parallel_size: int = 1
    # vLLM --per-request-spec-decode-metrics: none, summary or detailed (metrics.speculative_decoding in
    # each response); "none" for the other engines
    per_request_spec_decode_metrics: str = "none"
    notes: tuple[str, ...] = ()          # warnings the engine prints while reading its configuration


def parse_engine_argv(
    argv: Sequence[str], *, config_dir: Path | None = None, gpu: GpuProduct | None = None
) -> EngineConfig:
    """The engine config of a full container command line (command then args).

    `config_dir` stands in for CONFIG_MOUNT_PATH; `gpu` decides the engines' hardware-dependent defaults.
    Raises EngineArgvError with the engine's own wording when the engine would refuse to start.
    """
    args = list(argv)
    program = os.path.basename(args[0]) if args else ""
    if program == "vllm" and args[1:2] == ["serve"]:
        return _vllm(args[2:], gpu)
    if program.startswith("python") and args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        return _vllm(args[3:], gpu)
    if program.startswith("python") and args[1:3] == ["-m", "sglang.launch_server"]:
        return _sglang(args[3:], config_dir)
    if program == "trtllm-serve":
        rest = args[2:] if args[1:2] == ["serve"] else args[1:]
        return _trtllm(rest, config_dir)
    shown = " ".join(args[:3]) or "(empty)"
    raise EngineArgvError(
        f"specdeploy-sim: cannot simulate the command {shown!r}: expected `vllm serve MODEL …`, "
        "`python3 -m sglang.launch_server …` or `trtllm-serve MODEL …`\n",
        exit_code=2,
    )


# --- shared -----------------------------------------------------------------------------------------------

# Engine --quantization values -> the planner's quantisation (weight bytes). Values that name no single
# width (compressed-tensors, modelopt …) leave the checkpoint's own, which the planner reads as `none`.
_QUANTIZATION = {
    "fp8": Quantization.FP8, "fbgemm_fp8": Quantization.FP8, "fp8_per_tensor": Quantization.FP8,
    "fp8_per_channel": Quantization.FP8, "fp8_per_block": Quantization.FP8, "w8a8_fp8": Quantization.FP8,
    "modelopt_fp8": Quantization.FP8, "awq": Quantization.AWQ, "awq_marlin": Quantization.AWQ,
    "auto_awq": Quantization.AWQ, "gptq": Quantization.GPTQ, "gptq_marlin": Quantization.GPTQ,
    "auto_gptq": Quantization.GPTQ, "w8a8_int8": Quantization.INT8, "experts_int8": Quantization.INT8,
}

_KV_CACHE_DTYPES = {
    "fp8": KvCacheDtype.FP8, "fp8_e4m3": KvCacheDtype.FP8_E4M3, "fp8_e5m2": KvCacheDtype.FP8_E5M2,
}


def _quantization(value: Any) -> Quantization:
    return _QUANTIZATION.get(str(value), Quantization.NONE) if value else Quantization.NONE


def _traceback(final: str, program: str) -> str:
    """The tail of the Python traceback an engine prints when its config is refused at start-up: from a
    console script (`vllm`, `trtllm-serve`) or from a module run with -m (`sglang.launch_server`)."""
    if "." in program:
        entry = '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
    else:
        entry = f'  File "/usr/local/bin/{program}", line 8, in <module>\n    sys.exit(main())\n'
    return f"Traceback (most recent call last):\n{entry}{final}\n"


def _argparse_error(usage: str, prog: str, message: str) -> EngineArgvError:
    return EngineArgvError(f"usage: {usage}\n{prog}: error: {message}\n", exit_code=2)


def _positive(value: int, name: str, program: str) -> int:
    if value < 1:
        raise EngineArgvError(_traceback(f"ValueError: {name} must be at least 1, got {value}.", program), 1)
    return value


# --- vLLM -------------------------------------------------------------------------------------------------

_VLLM_USAGE = "vllm serve [model_tag] [options]"
_VLLM_PROG = "vllm serve"
# vllm/entrypoints/cli/serve.py: `vllm serve` without a model serves this one.
VLLM_DEFAULT_MODEL = "Qwen/Qwen3-0.6B"

# vllm/config/speculative.py: method names that are one spec method under another name. The per-family MTP
# names (deepseek_mtp, qwen3_next_mtp, …: MTPModelTypes) are rewritten to mtp by SpeculativeConfig; any other
# method (extract_hidden_states, custom_class, medusa, …) is timed as an EAGLE-3 head.
_VLLM_METHODS = {
    "draft_model": Method.DRAFT_MODEL, "eagle": Method.EAGLE, "eagle3": Method.EAGLE3, "mtp": Method.MTP,
    "ngram": Method.NGRAM, "ngram_gpu": Method.NGRAM_GPU, "suffix": Method.SUFFIX,
    "dflash": Method.DFLASH, "dspark": Method.DSPARK,
}
# Methods whose proposer loads a drafter named in `model`.
_DRAFTER_METHODS = (Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.DFLASH, Method.DSPARK)


def _vllm_batch_defaults(gpu: GpuProduct | None) -> tuple[int, int]:
    """vLLM's max_num_seqs and max_num_batched_tokens for the OpenAI server when not given.

    vllm/engine/arg_utils.py (get_batch_defaults): GPUs with at least 70 GiB that are not A100s get
    1024 sequences and 8192 tokens; others 256 and 2048.
    """
    if gpu is not None and gpu.memory_gib >= 70 and "A100" not in gpu.name.upper():
        return 1024, 8192
    if gpu is None:
        return 1024, 8192       # the simulator's default GPU is an H100
    return 256, 2048


def _vllm(args: list[str], gpu: GpuProduct | None) -> EngineConfig:
    try:
        found = scan(args, table("vllm"), underscores_to_dashes=True)
    except OptionError as error:
        raise _argparse_error(_VLLM_USAGE, _VLLM_PROG, str(error)) from None
    extras = found.positionals[1:] + found.unrecognized
    if extras:
        raise _argparse_error(_VLLM_USAGE, _VLLM_PROG, "unrecognized arguments: " + " ".join(extras))
    values = found.values
    model = found.positionals[0] if found.positionals else values.get("model") or VLLM_DEFAULT_MODEL
    served = values.get("served_model_name") or [model]
    seqs_default, tokens_default = _vllm_batch_defaults(gpu)
    speculation = _vllm_speculation(values)
    notes: tuple[str, ...] = ()
    if speculation is not None and speculation.k_steps and (values.get("data_parallel_size") or 1) > 1:
        # vllm/config/vllm.py (_maybe_disable_dynamic_sd_for_data_parallel): a warning, then a fixed k.
        notes = ("Dynamic speculative decoding is not supported with data parallelism because data-parallel "
                 "ranks can select different speculative-token counts, causing DP divergence and deadlocks. "
                 "Disabling num_speculative_tokens_per_batch_size and falling back to static "
                 f"num_speculative_tokens={speculation.num_speculative_tokens}.",)
        speculation = replace(speculation, k_steps=())
    spec_metrics = values.get("per_request_spec_decode_metrics") or "none"
    if spec_metrics != "none" and speculation is None:
        # vllm/config/vllm.py (VllmConfig.__post_init__) refuses the flag without a speculative config.
        raise EngineArgvError(_traceback(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
            "  Value error, --per-request-spec-decode-metrics requires speculative decoding to be enabled "
            "(via --speculative-config). [type=value_error, input_value=ArgsKwargs((), {...}), "
            "input_type=ArgsKwargs]", "vllm"), 1)
    return EngineConfig(
        kind=EngineKind.VLLM,
        model=model,
        served_model_name=served[0],
        host=values.get("host") or "0.0.0.0",
        port=values.get("port") or 8000,
        tensor_parallel_size=_positive(values.get("tensor_parallel_size") or 1, "tensor_parallel_size", "vllm"),
        pipeline_parallel_size=_positive(values.get("pipeline_parallel_size") or 1, "pipeline_parallel_size",
                                         "vllm"),
        max_model_len=values.get("max_model_len"),
        max_num_seqs=_positive(values.get("max_num_seqs") or seqs_default, "max_num_seqs", "vllm"),
        max_num_batched_tokens=values.get("max_num_batched_tokens") or tokens_default,
        gpu_memory_utilization=values.get("gpu_memory_utilization") or 0.9,
        quantization=_quantization(values.get("quantization")),
        kv_cache_dtype=_KV_CACHE_DTYPES.get(str(values.get("kv_cache_dtype")), KvCacheDtype.AUTO),
        speculation=speculation,
        health_path=vllm_engine.HEALTH_PATH,
        metrics_path=vllm_engine.METRICS_PATH,
        kv_cache_memory_bytes=values.get("kv_cache_memory_bytes"),
        per_request_spec_decode_metrics=spec_metrics,
        notes=notes,
    )


def _pydantic_error(model: str, field: str, message: str, kind: str, value: Any) -> str:
    return (
        f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}\n{field}\n"
        f"  {message} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]"
    )


def _vllm_speculation(values: dict[str, Any]) -> SpeculationConfig | None:
    """--speculative-config (or the --spec-method/--spec-model/--spec-tokens shorthand), validated as
    vllm/config/speculative.py validates SpeculativeConfig."""
    text = values.get("speculative_config")
    if text is None and values.get("spec_method") in (None, "None"):
        return None
    if text is not None:
        try:
            config = json.loads(text)
        except json.JSONDecodeError:
            raise _argparse_error(
                _VLLM_USAGE, _VLLM_PROG, f"argument --speculative-config/-sc: invalid loads value: {text!r}"
            ) from None
        if not isinstance(config, dict):
            raise _argparse_error(
                _VLLM_USAGE, _VLLM_PROG, f"argument --speculative-config/-sc: invalid loads value: {text!r}"
            )
    else:
        config = {"method": values["spec_method"], "model": values.get("spec_model"),
                  "num_speculative_tokens": values.get("spec_tokens")}
        config = {key: value for key, value in config.items() if value is not None}
    fields = flag_tables.VLLM_SPECULATIVE_CONFIG_FIELDS
    for key in config:
        if key not in fields:
            raise EngineArgvError(_traceback(_pydantic_error(
                "SpeculativeConfig", key, "Extra inputs are not permitted", "extra_forbidden", config[key]), "vllm"), 1)
    if "tensor_parallel_size" in config:
        raise EngineArgvError(_traceback(
            "ValueError: tensor_parallel_size is not a speculative_config option: pass "
            "draft_tensor_parallel_size instead.", "vllm"), 1)
    model = config.get("model")
    method = config.get("method")
    if method is None:
        # SpeculativeConfig.__post_init__: without a method, the draft's name decides.
        lowered = str(model or "").lower()
        method = "eagle3" if "eagle3" in lowered else "eagle" if "eagle-" in lowered else "draft_model"
    methods = flag_tables.VLLM_SPECULATIVE_METHODS
    if method not in methods:
        listed = ", ".join(repr(name) for name in methods[:-1]) + f" or {methods[-1]!r}"
        raise EngineArgvError(_traceback(_pydantic_error(
            "SpeculativeConfig", "method", f"Input should be {listed}", "literal_error", method), "vllm"), 1)
    spec_method = _VLLM_METHODS.get(method, Method.MTP if method.endswith("_mtp") else Method.EAGLE3)
    k = config.get("num_speculative_tokens")
    if k is None:
        if spec_method != Method.MTP:
            raise EngineArgvError(_traceback(
                "ValueError: num_speculative_tokens must be provided with speculative model unless the draft "
                "model config contains an n_predict parameter.", "vllm"), 1)
        k = 1   # the model's own MTP layer count (one for the catalog's MTP models)
    if not isinstance(k, int) or k < 1:
        raise EngineArgvError(_traceback(_pydantic_error(
            "SpeculativeConfig", "num_speculative_tokens", "Input should be greater than 0", "greater_than", k),
            "vllm"), 1)
    if model is None and spec_method == Method.DSPARK:
        raise _bundled_dspark()
    if model is None and spec_method in _DRAFTER_METHODS:
        raise EngineArgvError(_traceback(
            "ValueError: num_speculative_tokens was provided but without speculative model.", "vllm"), 1)
    return SpeculationConfig(
        method=spec_method,
        engine_method=method,
        num_speculative_tokens=k,
        verify_tokens=k + 1,
        draft_model=model if spec_method in _DRAFTER_METHODS else None,
        draft_tensor_parallel_size=config.get("draft_tensor_parallel_size"),
        draft_quantization=_quantization(config.get("quantization")),
        k_steps=_vllm_k_steps(config.get("num_speculative_tokens_per_batch_size")),
    )


def _bundled_dspark() -> EngineArgvError:
    """vLLM and SGLang run DSpark without a drafter named when the target's checkpoint ships its stages
    (DeepSeek-V4); the simulator has no shapes for those, so it says so instead of guessing."""
    return EngineArgvError(
        "specdeploy-sim: cannot simulate DSpark stages inside the target's checkpoint: name the DSpark drafter "
        "(vLLM `model` in --speculative-config, SGLang --speculative-draft-model-path)\n", exit_code=2)


def _vllm_k_steps(table: Any) -> KSteps:
    """num_speculative_tokens_per_batch_size: pydantic checks the type (list[tuple[int, int, int]] in
    vllm/config/speculative.py), then the scheduler's lookup refuses a bad table while the engine starts
    (vllm/v1/spec_decode/dynamic/utils.py): a traceback and exit 1 either way."""
    if table is None:
        return ()
    if not isinstance(table, list):
        raise EngineArgvError(_traceback(_pydantic_error(
            "SpeculativeConfig", "num_speculative_tokens_per_batch_size", "Input should be a valid list",
            "list_type", table), "vllm"), 1)
    for index, entry in enumerate(table):
        items = entry if isinstance(entry, list) else []
        for position, item in enumerate(items[:3]):
            if isinstance(item, bool) or not isinstance(item, int):
                raise EngineArgvError(_traceback(_pydantic_error(
                    "SpeculativeConfig", f"num_speculative_tokens_per_batch_size.{index}.{position}",
                    "Input should be a valid integer", "int_type", item), "vllm"), 1)
    try:
        return vllm_k_steps(table)
    except ValueError as error:
        raise EngineArgvError(_traceback(f"ValueError: {error}", "vllm"), 1) from None


# --- SGLang -----------------------------------------------------------------------------------------------

_SGLANG_PROG = "launch_server.py"
_SGLANG_USAGE = "launch_server.py [-h] --model-path MODEL_PATH [options]"
# sglang/srt/speculative/spec_info.py names -> the nearest spec method.
_SGLANG_METHODS = {
    "EAGLE": Method.EAGLE, "EAGLE3": Method.EAGLE3, "NEXTN": Method.MTP, "FROZEN_KV_MTP": Method.MTP,
    "STANDALONE": Method.DRAFT_MODEL, "NGRAM": Method.NGRAM, "DFLASH": Method.DFLASH, "DSPARK": Method.DSPARK,
}
# Block sizes when the flags are absent: SGLang reads DFLASH's from the drafter's config and falls back to 16
# (sglang/srt/arg_groups/speculative_hook.py `_handle_dflash`); DSPARK reads gamma from the checkpoint (the
# simulator has none to read and takes 5, DeepSeek-V4's dspark_block_size).
SGLANG_DEFAULT_DFLASH_BLOCK = 16
SGLANG_DEFAULT_DSPARK_GAMMA = 5
# sglang/srt/server_args.py: defaults when the flags are absent. SGLang sizes max_running_requests from the
# KV pool when unset; 1024 stands in for that. Without --speculative-num-steps/-eagle-topk/-num-draft-tokens
# SGLang picks (3, 1, 4) for most models (auto_choose_speculative_params).
SGLANG_DEFAULT_PORT = 30000
SGLANG_DEFAULT_MAX_RUNNING_REQUESTS = 1024
SGLANG_DEFAULT_CHUNKED_PREFILL_SIZE = 8192
SGLANG_DEFAULT_SPECULATIVE = (3, 1, 4)


def _sglang(args: list[str], config_dir: Path | None) -> EngineConfig:
    try:
        found = scan(args, table("sglang"))
    except OptionError as error:
        raise _argparse_error(_SGLANG_USAGE, _SGLANG_PROG, str(error)) from None
    extras = found.positionals + found.unrecognized
    if extras:
        raise _argparse_error(_SGLANG_USAGE, _SGLANG_PROG, "unrecognized arguments: " + " ".join(extras))
    values = found.values
    model = values.get("model_path")
    if not model:
        raise _argparse_error(_SGLANG_USAGE, _SGLANG_PROG, "the following arguments are required: --model-path/--model")
    chunk = values.get("chunked_prefill_size") or SGLANG_DEFAULT_CHUNKED_PREFILL_SIZE
    speculation, notes = _sglang_adaptive(values, _sglang_speculation(values), config_dir)
    return EngineConfig(
        kind=EngineKind.SGLANG,
        model=model,
        served_model_name=values.get("served_model_name") or model,
        host=values.get("host") or "127.0.0.1",
        port=values.get("port") or SGLANG_DEFAULT_PORT,
        tensor_parallel_size=_positive(values.get("tp_size") or 1, "tp_size", "sglang.launch_server"),
        pipeline_parallel_size=_positive(values.get("pp_size") or 1, "pp_size", "sglang.launch_server"),
        max_model_len=values.get("context_length"),
        max_num_seqs=_positive(values.get("max_running_requests") or SGLANG_DEFAULT_MAX_RUNNING_REQUESTS,
                               "max_running_requests", "sglang.launch_server"),
        max_num_batched_tokens=chunk if chunk > 0 else 1 << 30,   # -1 turns chunking off
        gpu_memory_utilization=values.get("mem_fraction_static") or 0.9,
        quantization=_quantization(values.get("quantization")),
        kv_cache_dtype=_KV_CACHE_DTYPES.get(str(values.get("kv_cache_dtype")), KvCacheDtype.AUTO),
        speculation=speculation,
        health_path=sglang_engine.HEALTH_PATH,
        metrics_path=sglang_engine.METRICS_PATH if values.get("enable_metrics") else None,
        notes=notes,
    )


def _sglang_speculation(values: dict[str, Any]) -> SpeculationConfig | None:
    algorithm = values.get("speculative_algorithm")
    if algorithm is None:
        return None
    if algorithm not in flag_tables.SGLANG_SPECULATIVE_ALGORITHMS:
        # SpeculativeAlgorithm.from_string in sglang/srt/speculative/spec_info.py.
        raise EngineArgvError(_traceback(f"ValueError: Unknown speculative algorithm name: {algorithm}", "sglang.launch_server"), 1)
    method = _SGLANG_METHODS.get(algorithm, Method.EAGLE3)
    steps_default, topk_default, draft_default = SGLANG_DEFAULT_SPECULATIVE
    draft_tokens = values.get("speculative_num_draft_tokens")
    if method == Method.NGRAM:
        verify = draft_tokens or steps_default + 1
        steps = verify - 1
    elif method == Method.DFLASH:
        # --speculative-dflash-block-size is the verify window (bonus token included): k = block − 1.
        verify = values.get("speculative_dflash_block_size") or draft_tokens or SGLANG_DEFAULT_DFLASH_BLOCK
        steps = verify - 1
    elif method == Method.DSPARK:
        # --speculative-dspark-block-size is gamma, the drafted tokens; the verify window is gamma + 1.
        steps = values.get("speculative_dspark_block_size") or SGLANG_DEFAULT_DSPARK_GAMMA
        verify = steps + 1
    else:
        steps = values.get("speculative_num_steps") or steps_default
        topk = values.get("speculative_eagle_topk") or topk_default
        verify = draft_tokens or (steps + 1 if topk == 1 else draft_default)
    draft_model = values.get("speculative_draft_model_path")
    if method == Method.DSPARK and not draft_model:
        raise _bundled_dspark()
    if method in (Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.DFLASH) and not draft_model:
        raise EngineArgvError(_traceback(
            f"ValueError: --speculative-draft-model-path is required for --speculative-algorithm {algorithm}",
            "sglang.launch_server"), 1)
    return SpeculationConfig(
        method=method,
        engine_method=algorithm,
        num_speculative_tokens=max(1, steps),
        verify_tokens=max(2, verify),
        draft_model=draft_model,
        draft_quantization=_quantization(values.get("speculative_draft_model_quantization")),
    )


# sglang/srt/speculative/adaptive_spec_params.py (AdaptiveSpeculativeParams): tiers when the config names none.
SGLANG_DEFAULT_CANDIDATE_STEPS = (1, 3, 7)


def _sglang_unsupported_adaptive(values: dict[str, Any]) -> str | None:
    """Why SGLang turns --speculative-adaptive off (adaptive_unsupported_reason), or None."""
    algorithm = values.get("speculative_algorithm")
    if algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    topk = values.get("speculative_eagle_topk")
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    for flag, why in (("enable_dp_attention", "adaptive tier decisions are not synchronized across DP ranks"),
                      ("enable_two_batch_overlap", "adaptive state swap would discard the TboAttnBackend wrapper"),
                      ("enable_pdmux", "adaptive state swap does not update decode_attn_backend_group")):
        if values.get(flag):
            return f"{flag}=True is not supported ({why})"
    return None


def _sglang_adaptive(values: dict[str, Any], speculation: SpeculationConfig | None,
                     config_dir: Path | None) -> tuple[SpeculationConfig | None, tuple[str, ...]]:
    """--speculative-adaptive with --speculative-adaptive-config PATH (a JSON file, read as
    load_adaptive_config reads it). Where adaptive cannot run SGLang warns and keeps the static steps
    (_maybe_disable_adaptive); a --speculative-num-steps outside the tiers is refused, and without it the
    middle tier is the start (_init_adaptive_speculative_params). k is then the largest tier, which the
    drafter, CUDA graphs and memory are sized for."""
    if not values.get("speculative_adaptive"):
        return speculation, ()
    reason = _sglang_unsupported_adaptive(values)
    if reason is not None or speculation is None:
        return speculation, (f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.",)
    program = "sglang.launch_server"
    path = values.get("speculative_adaptive_config")
    document: Any = {}
    if path:
        try:
            document = json.loads(_local_path(path, config_dir).read_text())
        except FileNotFoundError:
            raise EngineArgvError(_traceback(
                f"FileNotFoundError: [Errno 2] No such file or directory: {path!r}", program), 1) from None
        except json.JSONDecodeError as error:
            raise EngineArgvError(_traceback(f"json.decoder.JSONDecodeError: {error}", program), 1) from None
        if not isinstance(document, dict):
            raise EngineArgvError(_traceback(
                f"ValueError: speculative_adaptive_config must be a JSON object, got {type(document).__name__}",
                program), 1)
    candidates = document.get("candidate_steps", list(SGLANG_DEFAULT_CANDIDATE_STEPS))
    if not isinstance(candidates, list) or any(isinstance(step, bool) or not isinstance(step, int) or step < 0
                                               for step in candidates):
        raise EngineArgvError(_traceback(
            f"ValueError: candidate_steps must be a list of step counts, got {candidates!r}", program), 1)
    steps = tuple(sorted(set(candidates)))
    if int(document.get("update_interval", 5)) < 1:
        raise EngineArgvError(_traceback("ZeroDivisionError: integer modulo by zero", program), 1)
    if len(steps) < 2:
        raise EngineArgvError(_traceback(
            "AssertionError: candidate_steps must have at least 2 distinct values", program), 1)
    initial = values.get("speculative_num_steps")
    if initial is None:
        initial = steps[len(steps) // 2]
    if initial not in steps:
        raise EngineArgvError(_traceback(
            f"ValueError: --speculative-num-steps={initial} is not in the adaptive config candidate_steps "
            f"{list(steps)}. Pass one of those values.", program), 1)
    tiers = AdaptiveTiers(
        candidate_steps=steps, initial_steps=initial,
        ema_alpha=float(document.get("ema_alpha", 0.2)), update_interval=int(document.get("update_interval", 5)),
        warmup_batches=int(document.get("warmup_batches", 10)),
        down_hysteresis=float(document.get("down_hysteresis", -0.25)),
        up_hysteresis=float(document.get("up_hysteresis", 0.0)),
    )
    return replace(speculation, num_speculative_tokens=steps[-1], verify_tokens=steps[-1] + 1, adaptive=tiers), ()


# --- TensorRT-LLM -----------------------------------------------------------------------------------------

_TRTLLM_USAGE = "Usage: trtllm-serve [OPTIONS] MODEL\nTry 'trtllm-serve --help' for help.\n\n"
# tensorrt_llm/llmapi/llm_args.py: decoding_type names (and aliases) -> the nearest spec method.
_TRTLLM_METHODS = {
    "Eagle3": Method.EAGLE3, "Eagle": Method.EAGLE3, "MTP": Method.MTP, "NGram": Method.NGRAM,
    "DraftTarget": Method.DRAFT_MODEL, "Draft_Target": Method.DRAFT_MODEL, "PARD": Method.DRAFT_MODEL,
    "DFlash": Method.DFLASH, "SA": Method.SUFFIX,
}
# tensorrt_llm/commands/serve.py defaults (BuildConfig): 2048 sequences, 8192 tokens per step.
TRTLLM_DEFAULT_MAX_BATCH_SIZE = 2048
TRTLLM_DEFAULT_MAX_NUM_TOKENS = 8192


def _click_error(message: str) -> EngineArgvError:
    return EngineArgvError(f"{_TRTLLM_USAGE}Error: {message}\n", exit_code=2)


def _trtllm_options(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """click's reading of trtllm-serve's options: option name -> value, and the positionals."""
    values: dict[str, Any] = {}
    positionals: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if not token.startswith("--"):
            positionals.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        flag = flag_tables.TRTLLM_FLAGS.get(name)
        if flag is None:
            raise _click_error(f"No such option: {name}")
        takes_value, kind, choices = flag
        if not takes_value:
            values[name] = True
            continue
        if has_inline:
            text = inline
        elif index < len(args):
            text, index = args[index], index + 1
        else:
            raise _click_error(f"Option '{name}' requires an argument.")
        if kind == "int":
            try:
                values[name] = int(text)
            except ValueError:
                raise _click_error(f"Invalid value for '{name}': {text!r} is not a valid integer.") from None
        elif kind == "float":
            try:
                values[name] = float(text)
            except ValueError:
                raise _click_error(f"Invalid value for '{name}': {text!r} is not a valid float.") from None
        else:
            if choices and text not in choices:
                listed = ", ".join(repr(choice) for choice in choices)
                raise _click_error(f"Invalid value for '{name}': {text!r} is not one of {listed}.")
            values[name] = text
    return values, positionals


def _local_path(path: str, config_dir: Path | None) -> Path:
    """A path inside the pod, mapped to `config_dir` when it lies under CONFIG_MOUNT_PATH."""
    if config_dir is not None and (path == CONFIG_MOUNT_PATH or path.startswith(CONFIG_MOUNT_PATH + "/")):
        return config_dir / path[len(CONFIG_MOUNT_PATH):].lstrip("/")
    return Path(path)


def _trtllm(args: list[str], config_dir: Path | None) -> EngineConfig:
    values, positionals = _trtllm_options(args)
    if not positionals:
        raise _click_error("Missing argument 'MODEL'.")
    if len(positionals) > 1:
        raise _click_error(f"Got unexpected extra argument ({positionals[1]})")
    model = positionals[0]
    config_path = values.get("--config") or values.get("--extra_llm_api_options")
    llm_args: dict[str, Any] = {}
    if config_path:
        local = _local_path(config_path, config_dir)
        try:
            loaded = yaml.safe_load(local.read_text())
        except FileNotFoundError:
            raise EngineArgvError(_traceback(
                f"FileNotFoundError: [Errno 2] No such file or directory: {config_path!r}", "trtllm-serve"), 1) from None
        llm_args = loaded if isinstance(loaded, dict) else {}
    tp = llm_args.get("tensor_parallel_size") or values.get("--tp_size") or values.get("--tensor_parallel_size") or 1
    kv_config = llm_args.get("kv_cache_config") or {}
    return EngineConfig(
        kind=EngineKind.TRTLLM,
        model=model,
        served_model_name=model,
        host=values.get("--host") or "localhost",
        port=values.get("--port") or 8000,
        tensor_parallel_size=_positive(int(tp), "tensor_parallel_size", "trtllm-serve"),
        max_model_len=llm_args.get("max_seq_len") or values.get("--max_seq_len"),
        max_num_seqs=llm_args.get("max_batch_size") or values.get("--max_batch_size") or TRTLLM_DEFAULT_MAX_BATCH_SIZE,
        max_num_batched_tokens=(llm_args.get("max_num_tokens") or values.get("--max_num_tokens")
                                or TRTLLM_DEFAULT_MAX_NUM_TOKENS),
        gpu_memory_utilization=0.9,
        quantization=Quantization.NONE,
        kv_cache_dtype=KvCacheDtype.FP8 if kv_config.get("dtype") == "fp8" else KvCacheDtype.AUTO,
        speculation=_trtllm_speculation(llm_args.get("speculative_config")),
        health_path=trtllm_engine.HEALTH_PATH,
        metrics_path=trtllm_engine.METRICS_PATH if llm_args.get("return_perf_metrics") else None,
    )


def _trtllm_speculation(config: Any) -> SpeculationConfig | None:
    if not config:
        return None
    if not isinstance(config, dict):
        raise EngineArgvError(_traceback(
            f"ValueError: speculative_config must be a mapping, got {config!r}", "trtllm-serve"), 1)
    decoding_type = config.get("decoding_type")
    method = _TRTLLM_METHODS.get(str(decoding_type))
    if method is None:
        # DecodingBaseConfig.from_dict looks the name up in its table of config classes.
        raise EngineArgvError(_traceback(f"ValueError: Invalid decoding type: {decoding_type}", "trtllm-serve"), 1)
    canonical = "Eagle3" if decoding_type == "Eagle" else "DraftTarget" if decoding_type == "Draft_Target" else str(decoding_type)
    for field in flag_tables.TRTLLM_REQUIRED.get(canonical, []):
        present = config.get(field) is not None or (
            field == "speculative_model" and config.get("speculative_model_dir") is not None)
        if not present:
            raise EngineArgvError(_traceback(
                f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {canonical}DecodingConfig\n"
                f"{field}\n  Field required [type=missing, input_value={config!r}, input_type=dict]", "trtllm-serve"), 1)
    k = config.get("max_draft_len") or config.get("num_nextn_predict_layers") or 1
    draft = config.get("speculative_model") or config.get("speculative_model_dir")
    return SpeculationConfig(
        method=method,
        engine_method=canonical,
        num_speculative_tokens=int(k),
        verify_tokens=int(k) + 1,
        draft_model=str(draft) if draft else None,
        k_steps=_trtllm_k_steps(config, canonical, int(k)),
    )


def _trtllm_k_steps(config: dict[str, Any], canonical: str, k: int) -> KSteps:
    """draft_len_schedule, or max_concurrency (DecodingBaseConfig turns `max_concurrency: N` into the
    schedule {N: max_draft_len}; the two together are refused), validated as tensorrt_llm/llmapi/llm_args.py
    validates them."""
    model = f"{canonical}DecodingConfig"
    schedule = config.get("draft_len_schedule")
    concurrency = config.get("max_concurrency")

    def refused(field: str | None, message: str, kind: str = "value_error") -> EngineArgvError:
        where = f"{field}\n" if field else ""
        value = config.get(field) if field else config
        return EngineArgvError(_traceback(
            f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}\n{where}"
            f"  {message} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]",
            "trtllm-serve"), 1)

    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise refused("max_concurrency", "Input should be greater than 0", "greater_than")
    if schedule is None:
        return ((1, k), (concurrency + 1, 0)) if concurrency is not None else ()
    try:
        table = {int(batch): int(length) for batch, length in schedule.items()}
    except (AttributeError, TypeError, ValueError):
        raise refused("draft_len_schedule", "Input should be a valid dictionary of integers", "dict_type") from None
    try:
        steps = trtllm_k_steps(table, k)     # an empty schedule fails there too (min() of nothing)
    except ValueError as error:
        raise refused("draft_len_schedule", f"Value error, {error}") from None
    if concurrency is not None:
        raise refused(None, "Value error, max_concurrency and draft_len_schedule are mutually exclusive. Use "
                      "max_concurrency for a simple speculation cutoff, or draft_len_schedule for dynamic "
                      "draft-length control.")
    return steps
