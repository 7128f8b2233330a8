"""Every rendered engine command against the engines' real CLI flag inventories.

tests/data/engine-flags/vllm.json and sglang.json were extracted from the engines' own argparse parsers
by scripts/engine-flag-inventory.py (vllm 0.33.0, sglang 0.5.23); trtllm.json is written by hand from
TensorRT-LLM's source, which cannot be installed here. A flag the engine does not have, a value its type
or choices refuse, a --speculative-config key that is not a SpeculativeConfig field, or one of vLLM's
removed speculative flags fails here, before a pod would crash-loop on it.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.engines import DEFAULT_IMAGES, EngineCommand, EngineInputs, render_engine
from specdeploy.engines.sglang import SPECULATIVE_ALGORITHMS
from specdeploy.engines.vllm import SPECULATIVE_METHODS
from specdeploy.planning.compat import SUPPORTED_METHODS

INVENTORIES = Path(__file__).parent.parent / "data" / "engine-flags"
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml when present: the matrix has ~800 files

# FACTS.md: deprecated by vLLM PR #14434, removed by PR #15466; speculative_disable_by_batch_size left with V0
# (PR #35060). Kept here, not imported from the planner, so the check does not trust the code it checks.
REMOVED_VLLM_FLAGS = (
    "--speculative-model", "--num-speculative-tokens", "--ngram-prompt-lookup-max", "--ngram-prompt-lookup-min",
    "--speculative-draft-tensor-parallel-size", "--speculative-disable-by-batch-size",
)

DRAFTS = {
    "draft_model": "meta-llama/Llama-3.2-1B-Instruct",
    "eagle": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    "eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    "dflash": "z-lab/Qwen3-8B-DFlash-b16",
    "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
}
METHODS = {
    EngineKind.VLLM: ("draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix", "dflash", "dspark", "ngram_gpu"),
    EngineKind.SGLANG: ("draft_model", "eagle", "eagle3", "mtp", "ngram", "dflash", "dspark"),
    EngineKind.TRTLLM: ("draft_model", "eagle3", "mtp", "ngram"),
}
QUANTIZATIONS = ("none", "fp8", "int8", "awq", "gptq", "int4")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
TENSOR_PARALLEL = (1, 2, 4)


@cache
def inventory(kind: EngineKind) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((INVENTORIES / f"{kind.value}.json").read_text())
    return loaded


def spec_for(kind: EngineKind, method: str, quantization: str, tp: int, kv_dtype: str, variant: int) -> (
        SpeculativeDeploymentSpec):
    """One spec of the matrix; `variant` turns on the optional fields (revisions, draft TP, KV memory, topk)."""
    serving: dict[str, Any] = {"kvCacheDtype": kv_dtype, "maxNumSeqs": 64, "maxNumBatchedTokens": 8192}
    speculation: dict[str, Any] = {"method": method, "numSpeculativeTokens": 1 + 2 * variant}
    model: dict[str, Any] = {"name": "meta-llama/Llama-3.1-70B-Instruct", "quantization": quantization}
    if method in DRAFTS:
        speculation["draft"] = {"name": DRAFTS[method], "quantization": "fp8" if variant else "none"}
        if variant:
            speculation["draft"] |= {"revision": "main", "tensorParallelSize": 1}
    if variant:
        model["revision"] = "main"
        speculation["eagleTopk"] = 1 if kind == EngineKind.SGLANG and method == "eagle3" else 2
        if kind == EngineKind.VLLM:
            serving["kvCacheMemoryGiB"] = 30.5
    return SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": kind.value},
        "model": model,
        "speculation": speculation,
        "resources": {"tensorParallelSize": tp, "gpu": {"count": tp}, "gpuMemoryUtilization": 0.88},
        "serving": serving,
    })


def rendered_commands(kind: EngineKind) -> list[tuple[str, EngineCommand]]:
    """Each method × quantisation × TP × KV-cache dtype × optional fields, with and without speculation."""
    out = []
    for method, quantization, tp, kv_dtype, variant in itertools.product(
            METHODS[kind], QUANTIZATIONS, TENSOR_PARALLEL, KV_CACHE_DTYPES, (0, 1)):
        spec = spec_for(kind, method, quantization, tp, kv_dtype, variant)
        for speculate in (True, False):
            inputs = EngineInputs(spec, served_model_name="llama-70b", max_model_len=32768, speculate=speculate,
                                  trtllm_free_gpu_memory_fraction=0.7)
            label = f"{method}/{quantization}/tp{tp}/kv-{kv_dtype}/v{variant}/{'spec' if speculate else 'plain'}"
            out.append((label, render_engine(inputs)))
    return out


def value_fits(value: str, kind: str | None) -> bool:
    """Whether `value` is what a flag of value class `kind` (from the inventory) accepts."""
    if kind == "int":
        return value.lstrip("-").isdigit()
    if kind == "float":
        try:
            float(value)
        except ValueError:
            return False
        return True
    if kind == "json":
        try:
            json.loads(value)
        except ValueError:
            return False
        return True
    return kind == "str"


def parse_argv(kind: EngineKind, command: EngineCommand) -> dict[str, str | None]:
    """flag -> value (None for switches), checking each flag and value against the inventory."""
    table = inventory(kind)
    assert list(command.command) == table["command"]
    words = list(command.args)
    if table["positionals"]:
        assert not words[0].startswith("-"), f"expected the model first, got {words[0]}"
        words = words[1:]
    seen: dict[str, str | None] = {}
    while words:
        flag = words.pop(0)
        assert flag in table["flags"], f"{kind.value} {table['version']} has no flag {flag}"
        entry = table["flags"][flag]
        assert not entry.get("deprecated"), f"{flag} is deprecated in {kind.value} {table['version']}"
        value = None
        if entry["takes_value"]:
            value = words.pop(0)
            assert value_fits(value, entry["value"]), f"{flag} {value!r}: {kind.value} wants {entry['value']}"
            if entry["choices"] is not None:
                assert value in entry["choices"], f"{flag} {value!r} is not one of {entry['choices']}"
        seen[flag] = value
    return seen


def check_vllm_speculative_config(text: str) -> None:
    spec_table = inventory(EngineKind.VLLM)["speculative_config"]
    config = json.loads(text)
    unknown = set(config) - set(spec_table["fields"])
    assert not unknown, f"--speculative-config keys {unknown} are not SpeculativeConfig fields"
    assert config["method"] in spec_table["method"]
    assert isinstance(config["num_speculative_tokens"], int) and config["num_speculative_tokens"] > 0
    assert "tensor_parallel_size" not in config   # vLLM refuses it: "pass draft_tensor_parallel_size"
    if "quantization" in config:
        assert config["quantization"] in inventory(EngineKind.VLLM)["quantization_methods"]


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.SGLANG, EngineKind.TRTLLM])
def test_default_image_is_the_inventoried_version(kind: EngineKind) -> None:
    version = inventory(kind)["version"]
    tag = DEFAULT_IMAGES[kind].rsplit(":", 1)[1]
    assert tag.lstrip("v") in version


def test_vllm_commands_use_only_vllm_flags_and_values() -> None:
    table = inventory(EngineKind.VLLM)
    commands = rendered_commands(EngineKind.VLLM)
    assert len(commands) > 500
    for label, command in commands:
        flags = parse_argv(EngineKind.VLLM, command)
        assert not set(flags) & set(REMOVED_VLLM_FLAGS), label
        if flags.get("--quantization") is not None:
            assert flags["--quantization"] in table["quantization_methods"], label
        if flags.get("--kv-cache-dtype") is not None:
            assert flags["--kv-cache-dtype"] in table["kv_cache_dtypes"], label
        if "--speculative-config" in flags:
            check_vllm_speculative_config(str(flags["--speculative-config"]))


def test_sglang_commands_use_only_sglang_flags_and_values() -> None:
    table = inventory(EngineKind.SGLANG)
    commands = rendered_commands(EngineKind.SGLANG)
    assert len(commands) > 400
    for label, command in commands:
        flags = parse_argv(EngineKind.SGLANG, command)
        assert "--enable-metrics" in flags, label
        if "--speculative-algorithm" in flags:
            assert flags["--speculative-algorithm"] in table["speculative_algorithms"], label


def test_every_method_the_operator_renders_is_one_the_engine_has() -> None:
    vllm_methods = set(inventory(EngineKind.VLLM)["speculative_config"]["method"])
    assert set(SPECULATIVE_METHODS.values()) <= vllm_methods
    assert set(SPECULATIVE_ALGORITHMS.values()) <= set(inventory(EngineKind.SGLANG)["speculative_algorithms"])
    assert set(SUPPORTED_METHODS[EngineKind.VLLM]) == set(SPECULATIVE_METHODS)
    assert set(SUPPORTED_METHODS[EngineKind.SGLANG]) == set(SPECULATIVE_ALGORITHMS)


@pytest.mark.parametrize(("method", "flag", "block"), [("dflash", "--speculative-dflash-block-size", "8"),
                                                       ("dspark", "--speculative-dspark-block-size", "7")])
def test_sglang_block_drafters_render_their_own_block_size_flag(method: str, flag: str, block: str) -> None:
    # SGLang 0.5.23 server_args: the DFLASH block is the verify window (k + 1), the DSPARK block is gamma (k).
    spec = SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": "sglang"}, "model": {"name": "Qwen/Qwen3-8B"},
        "speculation": {"method": method, "draft": {"name": DRAFTS[method]}, "numSpeculativeTokens": 7},
    })
    flags = parse_argv(EngineKind.SGLANG, render_engine(EngineInputs(spec=spec, served_model_name="m",
                                                                     max_model_len=4096)))
    assert flags["--speculative-algorithm"] == method.upper()
    assert flags["--speculative-draft-model-path"] == DRAFTS[method]
    assert flags[flag] == block
    # SGLang forces one step and topk 1 for block drafters and refuses a num-draft-tokens beside the block.
    assert not {"--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"} & set(flags)


@pytest.mark.parametrize("method", ["dflash", "dspark", "ngram_gpu"])
def test_vllm_renders_the_2026_drafters_by_their_own_method_names(method: str) -> None:
    speculation: dict[str, Any] = {"method": method, "numSpeculativeTokens": 5}
    if method in DRAFTS:
        speculation["draft"] = {"name": DRAFTS[method]}
    spec = SpeculativeDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, "speculation": speculation})
    flags = parse_argv(EngineKind.VLLM, render_engine(EngineInputs(spec=spec, served_model_name="m",
                                                                   max_model_len=4096)))
    config = json.loads(str(flags["--speculative-config"]))
    check_vllm_speculative_config(str(flags["--speculative-config"]))
    assert config["method"] == method and config["num_speculative_tokens"] == 5
    assert config.get("model") == DRAFTS.get(method)
    if method == "ngram_gpu":   # SpeculativeConfig reads the same prompt-lookup window for ngram_gpu
        assert (config["prompt_lookup_min"], config["prompt_lookup_max"]) == (2, 5)


def test_trtllm_commands_and_yaml_use_only_trtllm_names() -> None:
    table = inventory(EngineKind.TRTLLM)
    for label, command in rendered_commands(EngineKind.TRTLLM):
        flags = parse_argv(EngineKind.TRTLLM, command)
        assert flags["--config"] == "/etc/specdeploy/trtllm.yaml", label
        config = yaml.load(command.config_files["trtllm.yaml"], Loader=YAML_LOADER)
        assert set(config) <= set(table["llm_args"]), label
        assert set(config["kv_cache_config"]) <= set(table["kv_cache_config"]), label
        assert config["kv_cache_config"]["dtype"] in table["kv_cache_dtypes"], label
        speculative = config.get("speculative_config")
        if speculative is not None:
            decoding_type = speculative.pop("decoding_type")
            assert decoding_type in table["decoding_types"], label
            assert set(speculative) <= set(table["decoding_types"][decoding_type]), label
            assert set(table["required"][decoding_type]) <= set(speculative), label


def test_removed_vllm_flags_are_really_gone_from_the_inventory() -> None:
    # The check above is only meaningful if vLLM indeed no longer has them.
    assert not set(REMOVED_VLLM_FLAGS) & set(inventory(EngineKind.VLLM)["flags"])


@pytest.mark.parametrize("flag", ["--enable-prefix-caching", "--speculative-config", "--max-model-len"])
def test_inventory_knows_flags_every_vllm_release_since_0_9_has(flag: str) -> None:
    assert flag in inventory(EngineKind.VLLM)["flags"]


def test_the_checker_catches_a_wrong_flag_and_a_wrong_value() -> None:
    # A checker that accepts everything would pass every test above.
    spec = spec_for(EngineKind.VLLM, "ngram", "none", 1, "auto", 0)
    good = render_engine(EngineInputs(spec, served_model_name="m", max_model_len=1024))
    bad_flag = EngineCommand(good.command, (*good.args, "--speculative-model", "x"), good.env, good.port,
                             good.health_path, good.metrics_path, good.metrics)
    with pytest.raises(AssertionError, match="no flag --speculative-model"):
        parse_argv(EngineKind.VLLM, bad_flag)
    bad_value = EngineCommand(good.command, (*good.args, "--max-num-seqs", "lots"), good.env, good.port,
                              good.health_path, good.metrics_path, good.metrics)
    with pytest.raises(AssertionError, match="wants int"):
        parse_argv(EngineKind.VLLM, bad_value)
    with pytest.raises(AssertionError, match="not SpeculativeConfig fields"):
        check_vllm_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "speculative_model": "x"}')
