"""Engine renderers: what each spec field becomes on the engine's command line, in its YAML and its probes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.spec import EngineKind, Method, SpeculativeDeploymentSpec
from specdeploy.engines import (
    CONFIG_MOUNT_PATH,
    DEFAULT_IMAGES,
    EngineInputs,
    EngineRenderError,
    image_for,
    metric_names,
    render_engine,
)
from specdeploy.engines.sglang import num_draft_tokens

DRAFTS = {
    "draft_model": "meta-llama/Llama-3.2-1B-Instruct",
    "eagle": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    "eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    "dflash": "z-lab/Qwen3-8B-DFlash-b16",
    "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
}


def make_spec(method: str = "draft_model", *, engine: str | dict[str, Any] = "vllm", k: int = 3,
              model: dict[str, Any] | None = None, draft: dict[str, Any] | None = None,
              speculation: dict[str, Any] | None = None, **sections: Any) -> SpeculativeDeploymentSpec:
    spec: dict[str, Any] = {
        "engine": engine if isinstance(engine, dict) else {"kind": engine},
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", **(model or {})},
        "speculation": {"method": method, "numSpeculativeTokens": k, **(speculation or {})},
        **sections,
    }
    if method in DRAFTS:
        spec["speculation"]["draft"] = {"name": DRAFTS[method], **(draft or {})}
    return SpeculativeDeploymentSpec.model_validate(spec)


def render(spec: SpeculativeDeploymentSpec, *, speculate: bool = True, max_model_len: int = 8192,
           fraction: float | None = None) -> Any:
    return render_engine(EngineInputs(spec, served_model_name="served", max_model_len=max_model_len,
                                      speculate=speculate, trtllm_free_gpu_memory_fraction=fraction))


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after `flag`, None when absent; fails when the flag appears twice."""
    positions = [i for i, word in enumerate(argv) if word == flag]
    assert len(positions) <= 1, f"{flag} appears {len(positions)} times in {argv}"
    return argv[positions[0] + 1] if positions else None


def speculative_json(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    value = flag_value(render(spec).argv(), "--speculative-config")
    assert value is not None
    parsed: dict[str, Any] = json.loads(value)
    return parsed


def trtllm_yaml(spec: SpeculativeDeploymentSpec, **kwargs: Any) -> dict[str, Any]:
    command = render(spec, **kwargs)
    loaded: dict[str, Any] = yaml.safe_load(command.config_files["trtllm.yaml"])
    return loaded


# --- vLLM ------------------------------------------------------------------------------------------


def test_vllm_serves_the_target_with_the_planned_limits() -> None:
    spec = make_spec(resources={"tensorParallelSize": 2, "gpuMemoryUtilization": 0.85},
                     serving={"maxNumSeqs": 32, "maxNumBatchedTokens": 4096, "port": 9000})
    command = render(spec, max_model_len=16384)
    argv = command.argv()
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert flag_value(argv, "--gpu-memory-utilization") == "0.85"
    assert flag_value(argv, "--max-model-len") == "16384"
    assert flag_value(argv, "--max-num-seqs") == "32"
    assert flag_value(argv, "--max-num-batched-tokens") == "4096"
    assert flag_value(argv, "--served-model-name") == "served"
    assert flag_value(argv, "--port") == "9000" and command.port == 9000
    assert flag_value(argv, "--host") == "0.0.0.0"
    assert (command.health_path, command.metrics_path) == ("/health", "/metrics")


def test_vllm_draft_model_goes_into_one_speculative_config() -> None:
    spec = make_spec("draft_model", k=5, draft={"tensorParallelSize": 1, "quantization": "fp8", "revision": "v2"})
    assert speculative_json(spec) == {
        "method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5,
        "draft_tensor_parallel_size": 1, "quantization": "fp8", "revision": "v2",
    }


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_vllm_eagle_heads_are_named_by_method(method: str) -> None:
    config = speculative_json(make_spec(method, k=4))
    assert config == {"method": method, "model": DRAFTS[method], "num_speculative_tokens": 4}


def test_vllm_mtp_carries_only_method_and_k() -> None:
    assert speculative_json(make_spec("mtp", k=2)) == {"method": "mtp", "num_speculative_tokens": 2}


def test_vllm_ngram_carries_the_prompt_lookup_window() -> None:
    spec = make_spec("ngram", k=4, speculation={"promptLookupMin": 3, "promptLookupMax": 6})
    assert speculative_json(spec) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3, "prompt_lookup_max": 6,
    }


def test_vllm_speculative_config_is_one_compact_word_with_sorted_keys() -> None:
    value = flag_value(render(make_spec("eagle3")).argv(), "--speculative-config")
    assert value is not None and " " not in value
    assert value == json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(("quantization", "expected"), [
    ("none", None), ("fp8", "fp8"), ("awq", "awq"), ("gptq", "gptq"), ("int8", None), ("int4", None),
])
def test_vllm_quantization_names_only_what_vllm_has_one_name_for(quantization: str, expected: str | None) -> None:
    argv = render(make_spec(model={"quantization": quantization})).argv()
    assert flag_value(argv, "--quantization") == expected


@pytest.mark.parametrize(("kv_dtype", "expected"), [
    ("auto", None), ("fp8", "fp8"), ("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"),
])
def test_vllm_kv_cache_dtype(kv_dtype: str, expected: str | None) -> None:
    argv = render(make_spec(serving={"kvCacheDtype": kv_dtype})).argv()
    assert flag_value(argv, "--kv-cache-dtype") == expected


def test_vllm_kv_cache_memory_is_passed_in_bytes() -> None:
    argv = render(make_spec(serving={"kvCacheMemoryGiB": "40Gi"})).argv()
    assert flag_value(argv, "--kv-cache-memory-bytes") == str(40 * 2**30)
    assert flag_value(render(make_spec()).argv(), "--kv-cache-memory-bytes") is None


def test_vllm_revision_and_extra_args_come_through_with_extra_args_last() -> None:
    spec = make_spec(model={"revision": "abc123"}, engine={"kind": "vllm", "extraArgs": ["--enable-prefix-caching"]})
    argv = render(spec).argv()
    assert flag_value(argv, "--revision") == "abc123"
    assert argv[-1] == "--enable-prefix-caching"


# --- speculation off: rollback and the Control variant ---------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_speculate_false_renders_the_same_target_without_speculation(engine: str) -> None:
    spec = make_spec("eagle3", engine=engine)
    without = render(spec, speculate=False).argv()
    assert not any(word.startswith("--speculative") for word in without)
    with_speculation = render(spec).argv()
    # Speculation adds its flags after the target's and changes nothing else.
    assert with_speculation[: len(without)] == without
    assert all(w.startswith("--speculative") for w in with_speculation[len(without):] if w.startswith("--"))


def test_speculation_disabled_in_spec_renders_no_speculation() -> None:
    spec = make_spec("eagle3", speculation={"enabled": False})
    assert "--speculative-config" not in render(spec).argv()


def test_trtllm_without_speculation_keeps_metrics_and_drops_speculative_config() -> None:
    config = trtllm_yaml(make_spec("eagle3", engine="trtllm"), speculate=False)
    assert "speculative_config" not in config
    assert config["return_perf_metrics"] is True and config["enable_iter_perf_stats"] is True


# --- SGLang ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "algorithm"), [
    ("draft_model", "STANDALONE"), ("eagle", "EAGLE"), ("eagle3", "EAGLE3"), ("mtp", "NEXTN"), ("ngram", "NGRAM"),
])
def test_sglang_algorithm_per_method(method: str, algorithm: str) -> None:
    argv = render(make_spec(method, engine="sglang")).argv()
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag_value(argv, "--speculative-algorithm") == algorithm


def test_sglang_eagle_chain_verifies_steps_plus_one_tokens() -> None:
    argv = render(make_spec("eagle3", engine="sglang", k=5)).argv()
    assert flag_value(argv, "--speculative-draft-model-path") == DRAFTS["eagle3"]
    assert flag_value(argv, "--speculative-num-steps") == "5"
    assert flag_value(argv, "--speculative-eagle-topk") == "1"
    assert flag_value(argv, "--speculative-num-draft-tokens") == "6"


def test_sglang_tree_verifies_a_token_per_branch_and_step() -> None:
    argv = render(make_spec("eagle", engine="sglang", k=3, speculation={"eagleTopk": 4})).argv()
    assert flag_value(argv, "--speculative-eagle-topk") == "4"
    assert flag_value(argv, "--speculative-num-draft-tokens") == "13"


def test_sglang_tree_verifies_the_draft_tokens_the_spec_sets() -> None:
    spec = make_spec("eagle3", engine="sglang", k=5, speculation={"eagleTopk": 8, "numDraftTokens": 32})
    argv = render(spec).argv()
    assert flag_value(argv, "--speculative-num-draft-tokens") == "32" == str(num_draft_tokens(spec.speculation, 5))


def test_sglang_ngram_sets_only_the_verify_width() -> None:
    argv = render(make_spec("ngram", engine="sglang", k=4)).argv()
    assert flag_value(argv, "--speculative-num-draft-tokens") == "5"
    assert flag_value(argv, "--speculative-num-steps") is None
    assert flag_value(argv, "--speculative-draft-model-path") is None


def test_sglang_memory_metrics_and_limits() -> None:
    spec = make_spec("draft_model", engine="sglang", draft={"quantization": "fp8"},
                     resources={"gpuMemoryUtilization": 0.8, "tensorParallelSize": 2},
                     serving={"maxNumSeqs": 48, "maxNumBatchedTokens": 4096, "kvCacheDtype": "fp8"})
    argv = render(spec, max_model_len=32768).argv()
    assert flag_value(argv, "--mem-fraction-static") == "0.8"
    assert flag_value(argv, "--tp-size") == "2"
    assert flag_value(argv, "--context-length") == "32768"
    assert flag_value(argv, "--max-running-requests") == "48"
    assert flag_value(argv, "--chunked-prefill-size") == "4096"
    assert flag_value(argv, "--kv-cache-dtype") == "fp8_e4m3"
    assert flag_value(argv, "--speculative-draft-model-quantization") == "fp8"
    assert "--enable-metrics" in argv


def test_sglang_refuses_a_method_it_does_not_have() -> None:
    # The CRD's CEL rule already refuses suffix for sglang; a spec built without validation still must not
    # render into a command SGLang would reject.
    spec = make_spec("ngram", engine="sglang")
    spec = spec.model_copy(update={"speculation": spec.speculation.model_copy(update={"method": Method.SUFFIX})})
    with pytest.raises(EngineRenderError, match="suffix is not available in SGLang"):
        render(spec)


# --- TensorRT-LLM ----------------------------------------------------------------------------------------


def test_trtllm_command_points_at_the_mounted_yaml() -> None:
    spec = make_spec("eagle3", engine="trtllm", resources={"tensorParallelSize": 2},
                     serving={"maxNumSeqs": 16, "maxNumBatchedTokens": 2048})
    command = render(spec, max_model_len=4096)
    argv = command.argv()
    assert argv[:2] == ["trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert flag_value(argv, "--config") == f"{CONFIG_MOUNT_PATH}/trtllm.yaml"
    assert set(command.config_files) == {"trtllm.yaml"}
    assert flag_value(argv, "--backend") == "pytorch"
    assert flag_value(argv, "--tp_size") == "2"
    assert flag_value(argv, "--max_seq_len") == "4096"
    assert flag_value(argv, "--max_batch_size") == "16"
    assert flag_value(argv, "--max_num_tokens") == "2048"
    assert command.metrics_path == "/prometheus/metrics"


@pytest.mark.parametrize(("method", "expected"), [
    ("eagle3", {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": DRAFTS["eagle3"]}),
    ("draft_model", {"decoding_type": "DraftTarget", "max_draft_len": 3,
                     "speculative_model": DRAFTS["draft_model"]}),
    ("mtp", {"decoding_type": "MTP", "max_draft_len": 3, "num_nextn_predict_layers": 3}),
    ("ngram", {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 5}),
])
def test_trtllm_speculative_config_per_method(method: str, expected: dict[str, Any]) -> None:
    assert trtllm_yaml(make_spec(method, engine="trtllm"))["speculative_config"] == expected


def test_trtllm_kv_cache_takes_the_planned_fraction_and_fp8() -> None:
    spec = make_spec("ngram", engine="trtllm", serving={"kvCacheDtype": "fp8_e4m3"})
    assert trtllm_yaml(spec, fraction=0.62)["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.62}
    assert trtllm_yaml(make_spec("ngram", engine="trtllm"))["kv_cache_config"] == {"dtype": "auto"}


def test_trtllm_refuses_an_eagle1_head() -> None:
    # planning.compat rejects the spec first (TrtllmNeedsEagle3Checkpoint); the renderer must not guess.
    with pytest.raises(EngineRenderError, match="eagle3"):
        render(make_spec("eagle", engine="trtllm"))


def test_trtllm_yaml_is_the_same_text_every_time_with_sorted_keys() -> None:
    spec = make_spec("mtp", engine="trtllm")
    text = render(spec, fraction=0.5).config_files["trtllm.yaml"]
    assert text == render(spec, fraction=0.5).config_files["trtllm.yaml"]
    top_keys = [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")]
    assert top_keys == sorted(top_keys)


# --- dispatch, images, probes, metric tables ---------------------------------------------------------------


@pytest.mark.parametrize("kind", list(EngineKind))
def test_default_image_matches_the_engine_and_can_be_overridden(kind: EngineKind) -> None:
    method = "eagle3"
    assert image_for(make_spec(method, engine=kind.value)) == DEFAULT_IMAGES[kind]
    custom = make_spec(method, engine={"kind": kind.value, "image": "registry.local/engine:1"})
    assert image_for(custom) == "registry.local/engine:1"


@pytest.mark.parametrize(("kind", "prefix"), [
    (EngineKind.VLLM, "vllm:"), (EngineKind.SGLANG, "sglang:"), (EngineKind.TRTLLM, "trtllm_"),
])
def test_metric_tables_use_the_engine_namespace_and_counter_suffix(kind: EngineKind, prefix: str) -> None:
    table = metric_names(kind)
    assert all(name.startswith(prefix) for name in table.names())
    counters = [table.drafts_total, table.draft_tokens_total, table.accepted_tokens_total,
                table.accepted_tokens_per_pos_total, table.request_success_total]
    assert all(name.endswith("_total") for name in counters if name is not None)
    assert table.model_label == "model_name"
    # The analysis needs an acceptance signal from every engine: counters or a gauge.
    assert (table.accepted_tokens_total and table.draft_tokens_total) or table.acceptance_rate_gauge
    assert render(make_spec("ngram", engine=kind.value)).metrics == table


def test_vllm_metric_names_are_the_v1_names() -> None:
    table = metric_names(EngineKind.VLLM)
    assert table.accepted_tokens_total == "vllm:spec_decode_num_accepted_tokens_total"
    assert table.draft_tokens_total == "vllm:spec_decode_num_draft_tokens_total"
    assert table.drafts_total == "vllm:spec_decode_num_drafts_total"
    assert table.inter_token_latency == "vllm:inter_token_latency_seconds"
    assert table.kv_cache_usage == "vllm:kv_cache_usage_perc"


@pytest.mark.parametrize("kind", list(EngineKind))
def test_probes_wait_for_loading_then_watch_health(kind: EngineKind) -> None:
    command = render(make_spec("ngram", engine=kind.value, serving={"port": 8123}))
    probes = command.probes()
    assert set(probes) == {"startupProbe", "readinessProbe", "livenessProbe"}
    for probe in probes.values():
        assert probe["httpGet"] == {"path": command.health_path, "port": 8123}
    startup = probes["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    liveness = probes["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60


def test_user_env_is_passed_in_order() -> None:
    spec = make_spec(engine={"kind": "vllm", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]})
    assert render(spec).env == (("B", "2"), ("A", "1"))


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize(("target", "draft", "secret"), [
    ("hf-llama", None, "hf-llama"), (None, "hf-draft", "hf-draft"), ("hf-both", "hf-both", "hf-both"), (None, None, None),
])
def test_the_hub_token_comes_from_the_named_secret(kind: str, target: str | None, draft: str | None,
                                                   secret: str | None) -> None:
    spec = make_spec("draft_model", engine=kind, model={"tokenSecretRef": target} if target else None,
                     draft={"tokenSecretRef": draft} if draft else None)
    command = render(spec)
    assert [(v.name, v.secret, v.key) for v in command.secret_env] == ([("HF_TOKEN", secret, "token")] if secret else [])
    assert "HF_TOKEN" not in dict(command.env)


def test_two_different_token_secrets_or_a_plain_hf_token_beside_one_are_refused() -> None:
    with pytest.raises(ValueError, match="must be unset or name the same Secret"):
        make_spec("draft_model", model={"tokenSecretRef": "a"}, draft={"tokenSecretRef": "b"})
    with pytest.raises(ValueError, match="must not set HF_TOKEN when a `tokenSecretRef` is set"):
        make_spec("draft_model", model={"tokenSecretRef": "a"},
                  engine={"kind": "vllm", "env": [{"name": "HF_TOKEN", "value": "hf_x"}]})
    # without a Secret the variable is the user's to set
    assert render(make_spec(engine={"kind": "vllm", "env": [{"name": "HF_TOKEN", "value": "x"}]})).secret_env == ()


# --- properties ------------------------------------------------------------------------------------------

ENGINE_METHODS = {
    "vllm": ["draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix", "dflash", "dspark", "ngram_gpu"],
    "sglang": ["draft_model", "eagle", "eagle3", "mtp", "ngram", "dflash", "dspark"],
    "trtllm": ["draft_model", "eagle3", "mtp", "ngram"],
}


@st.composite
def renderable_specs(draw: st.DrawFn) -> SpeculativeDeploymentSpec:
    engine = draw(st.sampled_from(sorted(ENGINE_METHODS)))
    method = draw(st.sampled_from(ENGINE_METHODS[engine]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    serving: dict[str, Any] = {
        "maxNumSeqs": draw(st.integers(1, 512)),
        "kvCacheDtype": draw(st.sampled_from(["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])),
        "port": draw(st.integers(1024, 65535)),
    }
    serving["maxNumBatchedTokens"] = serving["maxNumSeqs"] + draw(st.integers(16, 16384))
    if engine == "vllm" and draw(st.booleans()):
        serving["kvCacheMemoryGiB"] = draw(st.integers(1, 140))
    return make_spec(
        method, engine=engine, k=draw(st.integers(1, 16)),
        model={"quantization": draw(st.sampled_from(["none", "fp8", "int8", "awq", "gptq", "int4"]))},
        draft={"quantization": draw(st.sampled_from(["none", "fp8"]))},
        speculation={"eagleTopk": draw(st.integers(1, 8))},
        resources={"tensorParallelSize": tp, "gpuMemoryUtilization": draw(st.floats(0.05, 1.0))},
        serving=serving,
    )


@given(renderable_specs(), st.integers(16, 1_000_000))
def test_no_flag_is_rendered_twice(spec: SpeculativeDeploymentSpec, max_model_len: int) -> None:
    flags = [word for word in render(spec, max_model_len=max_model_len).args if word.startswith("--")]
    assert len(flags) == len(set(flags))


@given(renderable_specs())
def test_speculation_off_only_removes_speculative_words(spec: SpeculativeDeploymentSpec) -> None:
    on, off = render(spec), render(spec, speculate=False)
    assert set(off.args) <= set(on.args)
    assert (on.port, on.health_path, on.metrics_path, on.env) == (off.port, off.health_path, off.metrics_path, off.env)
    if spec.engine.kind != EngineKind.TRTLLM:
        removed = [word for word in on.args if word not in off.args]
        assert removed and removed[0].startswith("--speculative")
