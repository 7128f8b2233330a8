"""The simulator reads an engine command line as the engine would, and refuses what the engine refuses,
with the engine's own wording and exit status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.resource import load_resource
from specdeploy.api.spec import EngineKind, KvCacheDtype, Method, Quantization, SpeculativeDeploymentSpec
from specdeploy.engines import EngineInputs, render_engine
from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.sim import flag_tables
from specdeploy_engine.sim.argv import EngineArgvError, parse_engine_argv
from specdeploy_engine.sim.flag_gen import render_module

ROOT = Path(__file__).parent.parent.parent
INVENTORIES = ROOT / "tests" / "data" / "engine-flags"
EAGLE3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'


def rejected(argv: list[str], **kwargs: Any) -> EngineArgvError:
    with pytest.raises(EngineArgvError) as caught:
        parse_engine_argv(argv, **kwargs)
    return caught.value


def test_flag_tables_match_the_engine_inventories() -> None:
    inventories = {name: json.loads((INVENTORIES / f"{name}.json").read_text()) for name in ("vllm", "sglang")}
    trtllm = json.loads((INVENTORIES / "trtllm.json").read_text())
    expected = render_module(inventories, trtllm)
    actual = Path(flag_tables.__file__).read_text()
    assert actual == expected, (
        "sim/flag_tables.py is stale: python -m specdeploy_engine.sim.flag_gen tests/data/engine-flags > "
        "engine-image/specdeploy_engine/sim/flag_tables.py")


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda path: path.stem)
@pytest.mark.parametrize("speculate", [True, False])
def test_every_rendered_example_parses_to_what_the_spec_says(example: Path, speculate: bool, tmp_path: Path) -> None:
    spec = load_resource(example.read_text()).spec
    command = render_engine(EngineInputs(spec, served_model_name="served", max_model_len=8192, speculate=speculate))
    for name, text in command.config_files.items():
        (tmp_path / name).write_text(text)
    config = parse_engine_argv(command.argv(), config_dir=tmp_path)
    assert config.kind == spec.engine.kind
    assert config.model == spec.model.name
    assert config.tensor_parallel_size == spec.resources.tensor_parallel_size
    assert config.max_model_len == 8192
    assert config.max_num_seqs == spec.serving.max_num_seqs
    assert config.max_num_batched_tokens == spec.serving.max_num_batched_tokens
    assert config.port == spec.serving.port
    assert config.metrics_path == command.metrics_path
    if speculate and spec.speculation.enabled:
        assert config.speculation is not None
        assert config.speculation.method == spec.speculation.method
        assert config.speculation.num_speculative_tokens == spec.speculation.num_speculative_tokens
        assert config.speculation.draft_model == (spec.speculation.draft.name if spec.speculation.draft else None)
    else:
        assert config.speculation is None
    if spec.engine.kind != EngineKind.TRTLLM:
        assert config.served_model_name == "served"


def test_vllm_reads_every_speculative_field_it_uses() -> None:
    config = parse_engine_argv([
        "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "-tp", "4", "--max_num_seqs=32", "--quantization", "fp8",
        "--kv-cache-dtype", "fp8_e5m2", "--served-model-name", "llama", "other-name",
        "--speculative-config", '{"method":"draft_model","model":"meta-llama/Llama-3.2-1B-Instruct",'
        '"num_speculative_tokens":5,"draft_tensor_parallel_size":1,"quantization":"fp8"}',
    ])
    assert (config.tensor_parallel_size, config.max_num_seqs) == (4, 32)
    assert config.quantization == Quantization.FP8 and config.kv_cache_dtype == KvCacheDtype.FP8_E5M2
    assert config.served_model_name == "llama"
    speculation = config.speculation
    assert speculation is not None
    assert (speculation.method, speculation.num_speculative_tokens, speculation.verify_tokens) == (
        Method.DRAFT_MODEL, 5, 6)
    assert speculation.draft_tensor_parallel_size == 1 and speculation.draft_quantization == Quantization.FP8


def test_vllm_shorthand_flags_and_method_aliases() -> None:
    config = parse_engine_argv(["vllm", "serve", "m", "--spec-method", "eagle3", "--spec-model", "head",
                                "--spec-tokens", "4"])
    assert config.speculation is not None and config.speculation.method == Method.EAGLE3
    assert config.speculation.num_speculative_tokens == 4
    mtp = parse_engine_argv(["vllm", "serve", "m", "--speculative-config", '{"method":"deepseek_mtp"}'])
    assert mtp.speculation is not None and mtp.speculation.method == Method.MTP
    assert mtp.speculation.num_speculative_tokens == 1


def test_vllm_defaults_follow_the_gpu() -> None:
    h100 = parse_engine_argv(["vllm", "serve", "m"], gpu=find_gpu("H100-80GB"))
    a100 = parse_engine_argv(["vllm", "serve", "m"], gpu=find_gpu("A100-80GB"))
    assert (h100.max_num_seqs, h100.max_num_batched_tokens) == (1024, 8192)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    assert parse_engine_argv(["vllm", "serve"]).model == "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize("removed", [
    ["--speculative-model", "meta-llama/Llama-3.2-1B-Instruct", "--num-speculative-tokens", "5"],
    ["--ngram-prompt-lookup-max", "4"],
    ["--speculative-draft-tensor-parallel-size", "1"],
])
def test_removed_vllm_speculative_flags_are_unrecognized_arguments(removed: list[str]) -> None:
    error = rejected(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", *removed])
    assert error.exit_code == 2
    assert error.stderr == ("usage: vllm serve [model_tag] [options]\n"
                            f"vllm serve: error: unrecognized arguments: {' '.join(removed)}\n")


@pytest.mark.parametrize(("args", "message"), [
    (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value: 'many'"),
    (["--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64' (choose from 'auto', 'bfloat16'"),
    (["--port"], "argument --port: expected one argument"),
    (["--speculative-config", "{bad"], "argument --speculative-config/-sc: invalid loads value: '{bad'"),
    (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
])
def test_vllm_argument_errors_read_like_argparse(args: list[str], message: str) -> None:
    error = rejected(["vllm", "serve", "m", *args])
    assert error.exit_code == 2
    assert message in error.stderr


@pytest.mark.parametrize(("config", "message"), [
    ('{"method":"medusa2","num_speculative_tokens":3}', "Input should be"),
    ('{"method":"eagle3","model":"h","num_speculative_tokens":3,"k":3}', "Extra inputs are not permitted"),
    ('{"method":"eagle3","model":"h","num_speculative_tokens":3,"tensor_parallel_size":1}',
     "draft_tensor_parallel_size"),
    ('{"method":"eagle3","model":"h"}', "num_speculative_tokens must be provided"),
    ('{"method":"eagle3","num_speculative_tokens":3}', "without speculative model"),
])
def test_vllm_refuses_speculative_configs_it_cannot_build(config: str, message: str) -> None:
    error = rejected(["vllm", "serve", "m", "--speculative-config", config])
    assert error.exit_code == 1
    assert message in error.stderr
    assert error.stderr.startswith("Traceback (most recent call last):")


def test_unknown_vllm_method_is_a_pydantic_literal_error() -> None:
    error = rejected(["vllm", "serve", "m", "--speculative-config", '{"method":"lookahead","num_speculative_tokens":2}'])
    assert "1 validation error for SpeculativeConfig\nmethod\n" in error.stderr
    assert "'eagle3'" in error.stderr and "[type=literal_error, input_value='lookahead'" in error.stderr


SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"]


def test_sglang_speculation_steps_topk_and_draft_tokens() -> None:
    config = parse_engine_argv([*SGLANG, "--enable-metrics", "--speculative-algorithm", "EAGLE3",
                                "--speculative-draft-model-path", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                "--speculative-num-steps", "5", "--speculative-eagle-topk", "4",
                                "--speculative-num-draft-tokens", "16"])
    assert config.speculation is not None
    assert (config.speculation.num_speculative_tokens, config.speculation.verify_tokens) == (5, 16)
    assert config.metrics_path == "/metrics" and config.port == 30000
    ngram = parse_engine_argv([*SGLANG, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"])
    assert ngram.speculation is not None and ngram.speculation.num_speculative_tokens == 5
    assert ngram.metrics_path is None        # no --enable-metrics: SGLang exports nothing


def test_sglang_refusals() -> None:
    unknown = rejected([*SGLANG, "--speculative-algorithm", "MEDUSA"])
    assert unknown.exit_code == 1 and "ValueError: Unknown speculative algorithm name: MEDUSA" in unknown.stderr
    flag = rejected([*SGLANG, "--num-speculative-tokens", "3"])
    assert flag.exit_code == 2
    assert "launch_server.py: error: unrecognized arguments: --num-speculative-tokens 3" in flag.stderr
    missing = rejected(["python3", "-m", "sglang.launch_server", "--port", "30000"])
    assert "the following arguments are required: --model-path" in missing.stderr
    no_draft = rejected([*SGLANG, "--speculative-algorithm", "EAGLE3"])
    assert "--speculative-draft-model-path is required" in no_draft.stderr


def _trtllm_yaml(tmp_path: Path, speculative: dict[str, Any] | None) -> Path:
    document: dict[str, Any] = {"return_perf_metrics": True, "kv_cache_config": {"dtype": "fp8"}}
    if speculative is not None:
        document["speculative_config"] = speculative
    (tmp_path / "trtllm.yaml").write_text(json.dumps(document))   # JSON is YAML
    return tmp_path


TRTLLM = ["trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct", "--backend", "pytorch", "--tp_size", "2",
          "--config", "/etc/specdeploy/trtllm.yaml"]


def test_trtllm_reads_speculation_from_the_mounted_yaml(tmp_path: Path) -> None:
    folder = _trtllm_yaml(tmp_path, {"decoding_type": "Eagle", "max_draft_len": 4,
                                     "speculative_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"})
    config = parse_engine_argv(TRTLLM, config_dir=folder)
    assert config.kind == EngineKind.TRTLLM and config.tensor_parallel_size == 2
    assert config.speculation is not None and config.speculation.method == Method.EAGLE3
    assert config.speculation.num_speculative_tokens == 4 and config.speculation.engine_method == "Eagle3"
    assert config.kv_cache_dtype == KvCacheDtype.FP8 and config.metrics_path == "/prometheus/metrics"


def test_trtllm_refusals(tmp_path: Path) -> None:
    option = rejected([*TRTLLM, "--speculative_model", "x"], config_dir=_trtllm_yaml(tmp_path, None))
    assert option.exit_code == 2 and option.stderr.endswith("Error: No such option: --speculative_model\n")
    assert option.stderr.startswith("Usage: trtllm-serve [OPTIONS] MODEL\n")
    bad_type = rejected(TRTLLM, config_dir=_trtllm_yaml(tmp_path, {"decoding_type": "Lookahead", "max_draft_len": 2}))
    assert bad_type.exit_code == 1 and "ValueError: Invalid decoding type: Lookahead" in bad_type.stderr
    required = rejected(TRTLLM, config_dir=_trtllm_yaml(tmp_path, {"decoding_type": "Eagle3", "max_draft_len": 2}))
    assert "validation error for Eagle3DecodingConfig\nspeculative_model\n  Field required" in required.stderr
    missing = rejected(TRTLLM, config_dir=tmp_path / "nowhere")
    assert "FileNotFoundError" in missing.stderr and "/etc/specdeploy/trtllm.yaml" in missing.stderr
    not_int = rejected(["trtllm-serve", "m", "--tp_size", "two"])
    assert "Error: Invalid value for '--tp_size': 'two' is not a valid integer." in not_int.stderr


def test_an_unknown_program_is_refused() -> None:
    error = rejected(["text-generation-launcher", "--model-id", "m"])
    assert error.exit_code == 2 and "cannot simulate" in error.stderr


def _spec(kind: str, method: str, **speculation: Any) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {"engine": {"kind": kind}, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                                "speculation": {"method": method, **speculation}}
    return SpeculativeDeploymentSpec.model_validate(document)


@pytest.mark.parametrize(("kind", "method", "draft"), [
    ("vllm", "suffix", None), ("vllm", "mtp", None), ("sglang", "ngram", None),
    ("sglang", "eagle", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"), ("trtllm", "ngram", None), ("trtllm", "mtp", None),
    ("trtllm", "draft_model", "meta-llama/Llama-3.2-1B-Instruct"),
])
def test_each_engine_method_round_trips(kind: str, method: str, draft: str | None, tmp_path: Path) -> None:
    extra = {"draft": {"name": draft}} if draft else {}
    command = render_engine(EngineInputs(_spec(kind, method, numSpeculativeTokens=4, **extra), served_model_name="s",
                                         max_model_len=4096))
    for name, text in command.config_files.items():
        (tmp_path / name).write_text(text)
    config = parse_engine_argv(command.argv(), config_dir=tmp_path)
    assert config.speculation is not None
    assert config.speculation.method == Method(method)
    assert config.speculation.num_speculative_tokens == 4
