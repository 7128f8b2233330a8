"""Every engine answers every question of its profile (engines/profile.py), and the command lines its renderer
writes are recognised as that engine's wherever a command line is read: the operator's `engine_of`, the preflight
(standard library only, so it keeps its own reading), the pod runner and the simulator."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specdeploy.api.spec import METHODS_WITH_DRAFT, EngineKind, Method, SpeculativeDeploymentSpec
from specdeploy.api.speculative_keys import MANAGED_KEYS
from specdeploy.engines import (
    MULTI_NODE_ENGINES,
    EngineInputs,
    MetricNames,
    NodeRank,
    engine_of,
    engine_profile,
    render_engine,
)
from specdeploy.engines.profile import (
    NODES_REASON,
    AcceptanceSignal,
    EngineProfile,
    MultiNode,
    NoMultiNodeLaunch,
    NoSpeculativeConfig,
    ScheduleExpression,
)
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.schedule import ZERO_K_SPEEDUP
from specdeploy.planning.topology import layout_findings
from specdeploy_engine.preflight import engine_of as preflight_engine_of
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.engines import SIMULATED_ENGINES

# Answers that must not be empty: an engine runs some method, the operator renders some flags, exports metrics,
# and says why it has no launch across nodes when it has none.
NON_EMPTY = ("methods", "method_setting", "managed_flags.owned", "schedules.methods", "multi_node.launch.why",
             "metrics_path", "default_image")


def unanswered(value: Any, path: str = "") -> list[str]:
    """The fields of a profile (and of the dataclasses in it) that are None, or empty where NON_EMPTY says."""
    missing: list[str] = []
    for field in dataclasses.fields(value):
        answer, where = getattr(value, field.name), f"{path}{field.name}"
        if answer is None or (where in NON_EMPTY and not answer):
            missing.append(where)
        elif dataclasses.is_dataclass(answer) and not isinstance(answer, MetricNames):   # its None: no such metric
            missing += unanswered(answer, f"{where}.")
    return missing


@pytest.mark.parametrize("kind", list(EngineKind))
def test_every_engine_has_a_profile_that_answers_every_field(kind: EngineKind) -> None:
    profile = engine_profile(kind)
    assert profile.kind == kind
    assert unanswered(profile) == []
    assert profile.metrics.names()


def test_a_profile_without_an_answer_is_caught() -> None:
    profile = engine_profile(EngineKind.VLLM)
    assert unanswered(dataclasses.replace(profile, default_image="")) == ["default_image"]
    blank = dataclasses.replace(profile.schedules, methods=frozenset())
    assert unanswered(dataclasses.replace(profile, schedules=blank, runs=None)) == ["schedules.methods", "runs"]
    no_launch = MultiNode(launch=NoMultiNodeLaunch(why=""), pipeline_speculation_refusal="")
    assert unanswered(dataclasses.replace(profile, multi_node=no_launch)) == ["multi_node.launch.why"]
    with pytest.raises(TypeError):   # no field has a default: an engine that leaves one out does not construct
        EngineProfile(kind=EngineKind.VLLM)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        MultiNode(launch=NoMultiNodeLaunch(why="no launcher"))  # type: ignore[call-arg]


def test_only_methods_an_engine_runs_can_be_scheduled() -> None:
    for kind in EngineKind:
        profile = engine_profile(kind)
        assert profile.schedules.methods <= set(profile.methods)


def test_a_drafter_that_runs_at_k_0_costs_what_the_schedule_assumes() -> None:
    """vLLM runs the drafter at k = 0 (planning.schedule.ZERO_K_SLOWDOWN); SGLang's tiers never reach 0 and keep that
    figure; TensorRT-LLM skips the drafter."""
    assert engine_profile(EngineKind.VLLM).schedules.zero_k_speedup == ZERO_K_SPEEDUP
    assert engine_profile(EngineKind.SGLANG).schedules.zero_k_speedup == ZERO_K_SPEEDUP
    assert engine_profile(EngineKind.TRTLLM).schedules.zero_k_speedup == 1.0


@pytest.mark.parametrize("kind", list(EngineKind))
def test_an_engine_launched_across_nodes_renders_only_flags_the_operator_owns(kind: EngineKind) -> None:
    """Every flag of a rank's launch is one the profile's managed flags give to the node layout, so extraArgs cannot
    set it; an engine without a launch is left out of the multi-node engines, and every other engine is in them."""
    profile = engine_profile(kind)
    launch = profile.multi_node.launch
    assert (kind in MULTI_NODE_ENGINES) == (not isinstance(launch, NoMultiNodeLaunch))
    if isinstance(launch, NoMultiNodeLaunch):
        return
    for rank in ("0", "$(LWS_WORKER_INDEX)"):
        flags = [word for word in launch(NodeRank(2, rank, "leader")) if word.startswith("--")]
        assert flags and all(profile.managed_flags.owned.get(flag) == NODES_REASON for flag in flags), flags


def _layout_codes(kind: EngineKind, pp: int, speculating: bool) -> list[str]:
    spec = SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": kind.value}, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "resources": {"tensorParallelSize": 8, "pipelineParallelSize": pp, "gpu": {"product": "H100-80GB"}},
        "speculation": {"method": "ngram", "numSpeculativeTokens": 3, "enabled": speculating},
    })
    return [finding.code for finding in layout_findings(spec)]


@pytest.mark.parametrize("kind", list(EngineKind))
def test_the_node_layout_follows_the_profiles_multi_node_answers(kind: EngineKind) -> None:
    """planning/topology.py asks the profile, not the engine's name: a layout across nodes is refused exactly where
    the profile has no launch, pipeline stages with speculation exactly where it gives a refusal."""
    multi_node = engine_profile(kind).multi_node
    no_launch = ["MultiNodeUnsupported"] if isinstance(multi_node.launch, NoMultiNodeLaunch) else []
    stages_refused = ["PipelineWithSpeculationUnsupported"] if multi_node.pipeline_speculation_refusal else []
    assert _layout_codes(kind, pp=2, speculating=False) == no_launch
    assert _layout_codes(kind, pp=2, speculating=True) == stages_refused + no_launch
    assert _layout_codes(kind, pp=1, speculating=True) == []


def _rendered(kind: EngineKind) -> list[str]:
    spec = SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": kind.value}, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "ngram", "numSpeculativeTokens": 3},
    })
    return render_engine(EngineInputs(spec, served_model_name="served", max_model_len=8192)).argv()


@pytest.mark.parametrize("kind", list(EngineKind))
def test_every_reader_of_a_command_line_recognises_the_rendered_engine(kind: EngineKind, tmp_path: Path) -> None:
    argv = _rendered(kind)
    assert engine_of(argv) == kind
    assert engine_profile(kind).runs(argv)
    assert preflight_engine_of(argv) == kind.value
    (tmp_path / "trtllm.yaml").write_text("{}\n")
    assert parse_engine_argv(argv, config_dir=tmp_path, gpu=find_gpu("H100-80GB")).kind == kind


@pytest.mark.parametrize("argv", [
    ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
    ["/usr/local/bin/trtllm-serve", "serve", "sglang-org/model"],
    ["python3", "-m", "sglang.launch_server", "--model-path", "vllm-project/model"],
    ["/opt/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"],
    ["specdeploy-launch"],
    [],
])
def test_the_preflight_reads_a_command_line_as_the_profiles_do(argv: list[str]) -> None:
    assert preflight_engine_of(argv) == engine_of(argv).value


def _admitted(kind: EngineKind, method: Method, **serving: Any) -> bool:
    speculation: dict[str, Any] = {"method": method.value, "numSpeculativeTokens": 3}
    if method in METHODS_WITH_DRAFT:
        speculation["draft"] = {"name": "some/drafter"}
    try:
        SpeculativeDeploymentSpec.model_validate({"engine": {"kind": kind.value}, "model": {"name": "some/model"},
                                                  "speculation": speculation, "serving": serving})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("kind", list(EngineKind))
def test_the_crd_admits_what_the_profile_runs_or_refuses_with_a_reason(kind: EngineKind) -> None:
    """The API models cannot import the engines (the engines import them), so their rules say the same in their own
    words: a method the profile neither runs nor refuses with a finding of its own is refused at apply, and so is a
    fixed KV cache size on an engine that does not take one."""
    profile = engine_profile(kind)
    for method in Method:
        assert _admitted(kind, method) == (method in profile.methods or method in profile.method_refusals), method
    assert _admitted(kind, Method.NGRAM, kvCacheMemoryGiB=10) == profile.memory.fixed_kv_cache
    keys = profile.extra_config
    assert MANAGED_KEYS.get(kind.value) == (None if isinstance(keys, NoSpeculativeConfig) else keys.managed)


@pytest.mark.parametrize("kind", list(EngineKind))
def test_the_acceptance_signal_is_what_the_metric_names_export(kind: EngineKind) -> None:
    profile = engine_profile(kind)
    names = profile.metrics
    counters = names.draft_tokens_total is not None and names.accepted_tokens_total is not None
    expected = (AcceptanceSignal.POSITION_COUNTERS if counters and names.drafted_tokens_per_pos_total is not None
                else AcceptanceSignal.TOKEN_COUNTERS if counters
                else AcceptanceSignal.GAUGES if names.acceptance_rate_gauge is not None else None)
    assert profile.acceptance == expected


@pytest.mark.parametrize("kind", list(EngineKind))
def test_the_simulator_plays_each_engine_as_its_profile_describes_it(kind: EngineKind) -> None:
    """The simulator keeps its own table (sim/engines.py); where it answers a question the profile answers too, the
    two agree."""
    simulated, profile = SIMULATED_ENGINES[kind], engine_profile(kind)
    assert simulated.drafter_runs_at_zero_k == bool(profile.schedules.zero_k_cost)
    assert simulated.batch_table_drafts_ahead == (profile.schedules.expression == ScheduleExpression.BATCH_TABLE)
    assert simulated.sizes_kv_after_loading == profile.memory.kv_fraction_of_free
