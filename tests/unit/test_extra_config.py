"""`spec.speculation.extraConfig`: the CRD keeps it as free-form JSON and refuses the keys the operator renders,
the renderers merge it into the engine's speculative config, and the plan refuses keys the engine has not got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from model_fixtures import EAGLE3_8B, LLAMA_1B, LLAMA_8B
from pydantic import BaseModel, JsonValue

from specdeploy.api.crd import crd, structural
from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, parse_resource
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.speculative_keys import (
    MANAGED_KEYS,
    MAX_EXTRA_CONFIG_KEYS,
    MAX_EXTRA_CONFIG_TEXT,
    TRTLLM_MANAGED_KEYS,
    TRTLLM_SPECULATIVE_CONFIG_KEYS,
    VLLM_KEYS_SINCE_0_33,
    VLLM_MANAGED_KEYS,
    VLLM_SPECULATIVE_CONFIG_KEYS,
    VLLM_UNSETTABLE_KEYS,
)
from specdeploy.api.status import Severity
from specdeploy.engines import EngineInputs, EngineRenderError, render_engine
from specdeploy.engines.trtllm import DECODING_TYPES
from specdeploy.planning.compat import check_compatibility
from specdeploy.planning.modelinfo import ModelInfo

INVENTORIES = Path(__file__).parent.parent / "data" / "engine-flags"
DRAFTS = {"draft_model": LLAMA_1B.name, "eagle3": EAGLE3_8B.name}
USEFUL = {"disable_padded_drafter_batch": True, "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 256, 2]]}


def document(extra: dict[str, Any] | None, *, engine: str = "vllm", method: str = "eagle3",
             **speculation: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": {"kind": engine},
        "model": {"name": LLAMA_8B.name},
        "speculation": {"method": method, **speculation},
    }
    if method in DRAFTS:
        spec["speculation"]["draft"] = {"name": DRAFTS[method]}
    if extra is not None:
        spec["speculation"]["extraConfig"] = extra
    return {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment", "metadata": {"name": "x"},
            "spec": spec}


def spec_of(extra: dict[str, Any] | None, **kwargs: Any) -> SpeculativeDeploymentSpec:
    return parse_resource(document(extra, **kwargs)).spec


def draft_info(spec: SpeculativeDeploymentSpec) -> ModelInfo | None:
    method = spec.speculation.method
    return {"draft_model": LLAMA_1B, "eagle3": EAGLE3_8B}.get(method.value if method else "")


def findings(spec: SpeculativeDeploymentSpec) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for finding in check_compatibility(spec, LLAMA_8B, draft_info(spec)).findings:
        found.setdefault(finding.code, []).append(finding)
    return found


def rendered(spec: SpeculativeDeploymentSpec, speculate: bool = True) -> Any:
    return render_engine(EngineInputs(spec, served_model_name="m", max_model_len=8192, speculate=speculate))


def vllm_config(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    argv = rendered(spec).argv()
    loaded: dict[str, Any] = json.loads(argv[argv.index("--speculative-config") + 1])
    return loaded


def trtllm_config(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(rendered(spec).config_files["trtllm.yaml"])
    return loaded


# --- the CRD --------------------------------------------------------------------------------------------

def _extra_config_node() -> dict[str, Any]:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node: dict[str, Any] = spec["properties"]["speculation"]["properties"]["extraConfig"]
    return node


def test_the_crd_keeps_extra_config_as_free_form_json_with_the_managed_keys_declared() -> None:
    node = _extra_config_node()
    assert node["type"] == "object" and node["x-kubernetes-preserve-unknown-fields"] is True
    assert node["maxProperties"] == MAX_EXTRA_CONFIG_KEYS
    assert "additionalProperties" not in node and "default" not in node
    # CEL sees only declared properties of such an object: every managed key of every engine is one, typed.
    declared = node["properties"]
    assert set(declared) == {key for keys in MANAGED_KEYS.values() for key in keys}
    assert {declared[key]["type"] for key in declared} == {"string", "integer"}


def test_each_engine_refuses_its_managed_keys_in_one_cel_rule() -> None:
    rules = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    for engine, keys in MANAGED_KEYS.items():
        [rule] = [r for r in rules if f"self.engine.kind != '{engine}'" in r["rule"] and "extraConfig" in r["rule"]]
        assert all(f"has(self.speculation.extraConfig.{key})" in rule["rule"] for key in keys)
        assert all(key in rule["message"] and managed.owner in rule["message"] for key, managed in keys.items())


class _Maps(BaseModel):
    free: dict[str, JsonValue]
    anything: dict[str, Any] | None = None
    typed: dict[str, int] = {}


def test_the_generator_turns_any_json_maps_into_preserved_objects_and_keeps_typed_maps() -> None:
    schema = structural(_Maps)
    assert schema["properties"]["free"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert schema["properties"]["anything"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert schema["properties"]["typed"]["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in schema   # a model's `additionalProperties: false` is the default anyway


# --- admission, as Python sees it ---------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_a_managed_key_is_refused_with_the_crd_message(engine: str) -> None:
    method = "eagle3"
    for key in MANAGED_KEYS[engine]:
        with pytest.raises(InvalidResource, match=r"extraConfig. must not set a key that the operator renders"):
            parse_resource(document({key: 1}, engine=engine, method=method))


def test_another_engines_managed_key_passes_admission_and_is_refused_by_the_plan() -> None:
    spec = spec_of({"max_draft_len": 2})   # TensorRT-LLM's, unknown to vLLM
    [finding] = findings(spec)["ExtraConfigKeyUnknown"]
    assert "max_draft_len" in finding.message


def test_more_keys_than_the_crd_allows_are_refused() -> None:
    with pytest.raises(InvalidResource, match="extraConfig"):
        parse_resource(document({f"k{i}": i for i in range(MAX_EXTRA_CONFIG_KEYS + 1)}))


def test_values_are_any_json_and_nulls_mean_the_engines_default() -> None:
    extra = {"a": True, "b": [[1, 2, 3]], "c": {"d": None, "e": 1.5}, "f": None, "g": "s"}
    from_file = parse_resource(document(extra)).spec.speculation.extra_config
    # The operator validates the apiserver's copy, which keeps nulls inside free-form JSON.
    stored = SpeculativeDeployment.model_validate(document(extra)).spec.speculation.extra_config
    assert from_file == stored == {"a": True, "b": [[1, 2, 3]], "c": {"e": 1.5}, "g": "s"}


def test_no_extra_config_is_absent_from_the_wire() -> None:
    assert "extraConfig" not in spec_of(None).to_wire()["speculation"]
    assert spec_of({}).to_wire()["speculation"]["extraConfig"] == {}


# --- the key tables ----------------------------------------------------------------------------------------

def test_vllm_keys_are_the_inventoried_speculative_config_fields() -> None:
    inventory = json.loads((INVENTORIES / "vllm.json").read_text())
    assert list(VLLM_SPECULATIVE_CONFIG_KEYS) == inventory["speculative_config"]["fields"]
    assert set(VLLM_MANAGED_KEYS) | set(VLLM_UNSETTABLE_KEYS) | VLLM_KEYS_SINCE_0_33 <= set(VLLM_SPECULATIVE_CONFIG_KEYS)


def test_trtllm_keys_cover_the_inventory_and_the_managed_keys() -> None:
    inventory = json.loads((INVENTORIES / "trtllm.json").read_text())
    assert set(TRTLLM_SPECULATIVE_CONFIG_KEYS) == set(inventory["decoding_types"]) == set(DECODING_TYPES.values())
    for decoding_type, keys in inventory["decoding_types"].items():
        assert set(keys) <= TRTLLM_SPECULATIVE_CONFIG_KEYS[decoding_type], decoding_type
    every = set().union(*TRTLLM_SPECULATIVE_CONFIG_KEYS.values())
    assert set(TRTLLM_MANAGED_KEYS) <= every


@pytest.mark.parametrize(("engine", "method"), [
    (engine, method) for engine in ("vllm", "trtllm") for method in ("draft_model", "eagle3", "mtp", "ngram")])
def test_every_key_a_renderer_writes_is_managed(engine: str, method: str) -> None:
    # The other direction: a key the operator renders must never be free for extraConfig.
    speculation: dict[str, Any] = {"numSpeculativeTokens": 4}
    spec_doc = document(None, engine=engine, method=method, **speculation)
    if method in DRAFTS:
        spec_doc["spec"]["speculation"]["draft"] |= {"revision": "main", "quantization": "fp8", "tensorParallelSize": 1}
    spec = parse_resource(spec_doc).spec
    config = vllm_config(spec) if engine == "vllm" else trtllm_config(spec)["speculative_config"]
    assert set(config) <= set(MANAGED_KEYS[engine]), set(config) - set(MANAGED_KEYS[engine])


# --- rendering ---------------------------------------------------------------------------------------------

def test_vllm_merges_extra_config_into_the_one_speculative_config_word() -> None:
    spec = spec_of(USEFUL)
    config = vllm_config(spec)
    assert config == {"method": "eagle3", "model": EAGLE3_8B.name, "num_speculative_tokens": 3, **USEFUL}
    argv = rendered(spec).argv()
    assert argv.count("--speculative-config") == 1
    assert " " not in argv[argv.index("--speculative-config") + 1]


def test_vllm_without_speculation_drops_extra_config() -> None:
    assert "--speculative-config" not in rendered(spec_of(USEFUL), speculate=False).argv()
    assert "--speculative-config" not in rendered(spec_of(USEFUL, enabled=False)).argv()


def test_vllm_refuses_to_render_a_managed_key_spelt_as_vllm_also_reads_it() -> None:
    with pytest.raises(EngineRenderError, match="num-speculative-tokens"):
        rendered(spec_of({"num-speculative-tokens": 7}))


def test_trtllm_merges_extra_config_into_speculative_config() -> None:
    spec = spec_of({"max_concurrency": 32, "acceptance_rate_window_size": 64, "acceptance_rate_threshold": 0.3},
                   engine="trtllm")
    assert trtllm_config(spec)["speculative_config"] == {
        "decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": EAGLE3_8B.name,
        "max_concurrency": 32, "acceptance_rate_window_size": 64, "acceptance_rate_threshold": 0.3,
    }
    assert "speculative_config" not in yaml.safe_load(rendered(spec, speculate=False).config_files["trtllm.yaml"])


def test_sglang_refuses_to_render_extra_config() -> None:
    with pytest.raises(EngineRenderError, match="SGLang has no speculative config"):
        rendered(spec_of({"x": 1}, engine="sglang"))
    assert rendered(spec_of({}, engine="sglang")).argv()   # an empty one asks for nothing


# --- the plan ---------------------------------------------------------------------------------------------

def test_useful_vllm_keys_are_compatible() -> None:
    found = findings(spec_of(USEFUL))
    assert not [f for fs in found.values() for f in fs if f.severity == Severity.ERROR], found
    [note] = found["ExtraConfigScheduleNotModelled"]
    assert note.severity == Severity.INFO and "num_speculative_tokens_per_batch_size" in note.message


def test_an_unknown_key_is_named_with_the_keys_that_exist() -> None:
    [finding] = findings(spec_of({"disable_padded_drafter": True}))["ExtraConfigKeyUnknown"]
    assert finding.severity == Severity.ERROR
    assert "`spec.speculation.extraConfig` must not set disable_padded_drafter:" in finding.message
    assert "did you mean disable_padded_drafter_batch?" in finding.message
    listed = finding.message.rsplit(" are ", 1)[1].split(", ")
    assert {"num_speculative_tokens_per_batch_size", "xpress_topc", "enforce_eager"} <= set(listed)
    assert not {"method", "model", "target_model_config", "tensor_parallel_size"} & set(listed)
    assert not check_compatibility(spec_of({"disable_padded_drafter": True}), LLAMA_8B, EAGLE3_8B).compatible


def test_a_managed_key_in_vllms_other_spelling_is_refused_by_the_plan() -> None:
    [finding] = findings(spec_of({"draft-tensor-parallel-size": 1}))["ExtraConfigKeyManaged"]
    assert "`spec.speculation.draft.tensorParallelSize`" in finding.message


def test_vllms_other_spelling_of_a_free_key_is_accepted() -> None:
    assert "ExtraConfigKeyUnknown" not in findings(spec_of({"disable-padded-drafter-batch": True}))


@pytest.mark.parametrize("key", sorted(VLLM_UNSETTABLE_KEYS))
def test_keys_vllm_fills_in_or_refuses_are_refused(key: str) -> None:
    [finding] = findings(spec_of({key: 2}))["ExtraConfigKeyNotSettable"]
    assert key in finding.message


def test_too_much_json_is_refused_by_the_plan() -> None:
    [finding] = findings(spec_of({"draft_load_config": {"x": "y" * MAX_EXTRA_CONFIG_TEXT}}))["ExtraConfigTooLarge"]
    assert str(MAX_EXTRA_CONFIG_TEXT) in finding.message


def test_trtllm_keys_depend_on_the_decoding_type() -> None:
    assert "ExtraConfigKeyUnknown" not in findings(spec_of({"eagle_choices": [[0], [1]]}, engine="trtllm"))
    [finding] = findings(spec_of({"eagle_choices": [[0]]}, engine="trtllm", method="ngram"))["ExtraConfigKeyUnknown"]
    assert "NGram" in finding.message and "is_keep_all" in finding.message
    assert "ExtraConfigKeyUnknown" in findings(spec_of({"disable_padded_drafter_batch": True}, engine="trtllm"))


def test_sglang_refuses_extra_config_in_the_plan() -> None:
    [finding] = findings(spec_of({"x": 1}, engine="sglang"))["ExtraConfigNotSupported"]
    assert finding.severity == Severity.ERROR and "SGLang has no speculative config" in finding.message
    assert "ExtraConfigNotSupported" not in findings(spec_of({}, engine="sglang"))


def test_extra_config_is_part_of_the_speculation_so_disabled_speculation_ignores_it() -> None:
    assert not [code for code in findings(spec_of({"bogus": 1}, enabled=False)) if code.startswith("ExtraConfig")]


def test_the_draft_kv_cache_dtype_is_a_warning_about_the_memory_plan() -> None:
    [finding] = findings(spec_of({"kv_cache_dtype": "fp8"}))["ExtraConfigChangesMemory"]
    assert finding.severity == Severity.WARNING


def test_a_key_new_in_vllm_0_33_warns_on_another_image() -> None:
    key = sorted(VLLM_KEYS_SINCE_0_33)[0]
    assert "ExtraConfigKeyNeedsNewerEngine" not in findings(spec_of({key: 1}))
    spec = parse_resource({**document({key: 1}), "spec": {**document({key: 1})["spec"],
                                                          "engine": {"kind": "vllm", "image": "vllm/vllm-openai:v0.30.0"}}}).spec
    assert "ExtraConfigKeyNeedsNewerEngine" in findings(spec)


def test_every_extra_config_code_is_documented() -> None:
    documented = (Path(__file__).parents[2] / "docs" / "compatibility.md").read_text()
    for code in ("ExtraConfigKeyUnknown", "ExtraConfigKeyManaged", "ExtraConfigKeyNotSettable", "ExtraConfigTooLarge",
                 "ExtraConfigNotSupported", "ExtraConfigChangesMemory", "ExtraConfigScheduleNotModelled",
                 "ExtraConfigKeyNeedsNewerEngine"):
        assert f"`{code}`" in documented, code
