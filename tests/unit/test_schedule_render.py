"""What a schedule becomes on each engine's command line or YAML: nothing for Fixed, the engine's own schedule
for Auto and Table — through the operator's path (plan → reconcile.children.engine_command)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from test_engine_flags import check_vllm_speculative_config, parse_argv

from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.api.speculative_keys import TRTLLM_SPECULATIVE_CONFIG_KEYS
from specdeploy.engines import CONFIG_MOUNT_PATH, EngineCommand, EngineInputs, render_engine
from specdeploy.engines.base import BatchK
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, engine_command

DRAFTS = {"draft_model": "meta-llama/Llama-3.2-1B-Instruct", "eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}


def make_spec(engine: str = "vllm", method: str = "eagle3", *, k: int = 4, schedule: dict[str, Any] | None = None,
              max_num_seqs: int = 256) -> SpeculativeDeploymentSpec:
    speculation: dict[str, Any] = {"method": method, "numSpeculativeTokens": k}
    if method in DRAFTS:
        speculation["draft"] = {"name": DRAFTS[method]}
    if schedule is not None:
        speculation["schedule"] = schedule
    return SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": engine}, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": speculation, "serving": {"maxModelLen": 8192, "maxNumSeqs": max_num_seqs},
    })


def table(*ranges: tuple[int, int, int]) -> dict[str, Any]:
    return {"mode": "Table", "table": [{"minBatch": lo, "maxBatch": hi, "k": k} for lo, hi, k in ranges]}


def command(spec: SpeculativeDeploymentSpec, *, speculate: bool = True) -> EngineCommand:
    """The speculative variant's engine command, as the reconciler renders it."""
    return engine_command(make_plan(spec), Variant.SPECULATIVE, speculate)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def vllm_config(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    value = flag(command(spec).argv(), "--speculative-config")
    assert value is not None
    parsed: dict[str, Any] = json.loads(value)
    return parsed


def trtllm_config(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    parsed: dict[str, Any] = yaml.safe_load(command(spec).config_files["trtllm.yaml"])["speculative_config"]
    return parsed


# --- Fixed: what every existing SpeculativeDeployment renders, unchanged ---------------------------------


def test_fixed_renders_what_a_spec_without_a_schedule_renders() -> None:
    for engine in ("vllm", "sglang", "trtllm"):
        plain, fixed = make_spec(engine), make_spec(engine, schedule={"mode": "Fixed"})
        assert command(plain) == command(fixed), engine


def test_fixed_vllm_config_has_no_table() -> None:
    assert vllm_config(make_spec()) == {
        "method": "eagle3", "model": DRAFTS["eagle3"], "num_speculative_tokens": 4}


def test_fixed_sglang_is_not_adaptive() -> None:
    argv = command(make_spec("sglang")).argv()
    assert "--speculative-adaptive" not in argv and flag(argv, "--speculative-num-steps") == "4"


def test_fixed_trtllm_has_no_schedule_keys() -> None:
    assert trtllm_config(make_spec("trtllm")) == {
        "decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": DRAFTS["eagle3"]}


# --- vLLM -------------------------------------------------------------------------------------------------


def test_vllm_table_goes_into_the_speculative_config() -> None:
    config = vllm_config(make_spec(schedule=table((1, 8, 4), (9, 64, 2), (65, 256, 0))))
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 2], [65, 256, 0]]
    assert config["num_speculative_tokens"] == 4


def test_vllm_starts_with_the_largest_k_of_the_schedule() -> None:
    config = vllm_config(make_spec(k=6, schedule=table((1, 16, 3), (17, 256, 1))))
    assert config["num_speculative_tokens"] == 3


def test_vllm_auto_renders_the_derived_schedule() -> None:
    spec = make_spec(method="draft_model", k=5, schedule={"mode": "Auto"})
    plan = make_plan(spec)
    assert plan.schedule is not None
    config = vllm_config(spec)
    assert config["num_speculative_tokens_per_batch_size"] == [
        [r.min_batch, r.max_batch, r.k] for r in plan.schedule.ranges]
    assert config["num_speculative_tokens"] == plan.schedule.largest_k


def test_a_rollback_renders_no_schedule() -> None:
    argv = command(make_spec(schedule={"mode": "Auto"}), speculate=False).argv()
    assert "--speculative-config" not in argv


# --- SGLang -----------------------------------------------------------------------------------------------


def test_sglang_auto_renders_adaptive_tiers_from_the_distinct_k() -> None:
    spec = make_spec("sglang", k=7, schedule={"mode": "Auto"})
    plan = make_plan(spec)
    assert plan.schedule is not None
    steps = sorted({r.k for r in plan.schedule.ranges if r.k > 0})
    assert len(steps) > 1
    rendered = command(spec)
    argv = rendered.argv()
    assert "--speculative-adaptive" in argv
    assert flag(argv, "--speculative-adaptive-config") == f"{CONFIG_MOUNT_PATH}/sglang-adaptive.json", "a file path"
    assert json.loads(rendered.config_files["sglang-adaptive.json"]) == {"candidate_steps": steps}
    assert flag(argv, "--speculative-num-steps") == str(max(steps)), "SGLang wants it among the tiers"
    assert flag(argv, "--speculative-num-draft-tokens") == str(max(steps) + 1)


def test_sglang_table_tiers_leave_out_zero() -> None:
    rendered = command(make_spec("sglang", schedule=table((1, 8, 4), (9, 64, 2), (65, 256, 0))))
    assert json.loads(rendered.config_files["sglang-adaptive.json"]) == {"candidate_steps": [2, 4]}


def test_sglang_one_tier_is_a_fixed_k() -> None:
    rendered = command(make_spec("sglang", schedule=table((1, 32, 3), (33, 256, 0))))
    argv = rendered.argv()
    assert "--speculative-adaptive" not in argv and flag(argv, "--speculative-num-steps") == "3"
    assert dict(rendered.config_files) == {}


def test_sglang_rollback_mounts_no_adaptive_config() -> None:
    rendered = command(make_spec("sglang", k=7, schedule={"mode": "Auto"}), speculate=False)
    assert "--speculative-adaptive" not in rendered.argv() and dict(rendered.config_files) == {}


# --- TensorRT-LLM -----------------------------------------------------------------------------------------


def test_trtllm_one_k_then_zero_is_max_concurrency() -> None:
    config = trtllm_config(make_spec("trtllm", schedule=table((1, 32, 4), (33, 256, 0))))
    assert config["max_concurrency"] == 32 and "draft_len_schedule" not in config
    assert config["max_draft_len"] == 4


def test_trtllm_several_k_are_a_draft_len_schedule_keyed_by_each_ranges_largest_batch() -> None:
    config = trtllm_config(make_spec("trtllm", schedule=table((1, 8, 4), (9, 64, 2), (65, 256, 0))))
    assert config["draft_len_schedule"] == {8: 4, 64: 2}, "33 and up: 0, implicit past the largest key"
    assert "max_concurrency" not in config, "TensorRT-LLM refuses both together"


def test_trtllm_a_schedule_that_always_drafts_keeps_its_last_range() -> None:
    config = trtllm_config(make_spec("trtllm", schedule=table((1, 8, 4), (9, 256, 2))))
    assert config["draft_len_schedule"] == {8: 4, 256: 2}


def test_trtllm_auto_renders_the_derived_schedule() -> None:
    spec = make_spec("trtllm", k=7, schedule={"mode": "Auto"})
    plan = make_plan(spec)
    assert plan.schedule is not None and plan.compatibility.compatible
    config = trtllm_config(spec)
    drafting = [r for r in plan.schedule.ranges if r.k > 0]
    assert config["draft_len_schedule"] == {r.max_batch: r.k for r in drafting}
    assert config["max_draft_len"] == plan.schedule.largest_k


def test_renderers_take_the_schedule_from_engine_inputs() -> None:
    spec = make_spec()
    inputs = EngineInputs(spec, served_model_name="m", max_model_len=8192, schedule=(BatchK(1, 256, 2),))
    assert inputs.max_k == 2
    value = flag(render_engine(inputs).argv(), "--speculative-config")
    assert value is not None and json.loads(value)["num_speculative_tokens_per_batch_size"] == [[1, 256, 2]]


# --- the engines' own names -------------------------------------------------------------------------------


def test_rendered_schedules_use_only_names_the_engines_have() -> None:
    """vLLM's and SGLang's inventories (tests/data/engine-flags, test_engine_flags.py) hold the flags and keys a
    schedule adds; TensorRT-LLM's keys are checked against api/speculative_keys.py, read from llm_args.py (the
    hand-written trtllm.json lists no DecodingBaseConfig schedule keys)."""
    schedules = [{"mode": "Auto"}, table((1, 8, 4), (9, 64, 2), (65, 256, 0)), table((1, 32, 4), (33, 256, 0))]
    for schedule in schedules:
        vllm = parse_argv(EngineKind.VLLM, command(make_spec("vllm", k=7, schedule=schedule)))
        check_vllm_speculative_config(str(vllm["--speculative-config"]))
        parse_argv(EngineKind.SGLANG, command(make_spec("sglang", k=7, schedule=schedule)))
        speculative = trtllm_config(make_spec("trtllm", k=7, schedule=schedule))
        decoding_type = speculative.pop("decoding_type")
        assert set(speculative) <= TRTLLM_SPECULATIVE_CONFIG_KEYS[decoding_type]
