"""`specdeploy plan` resolves each model where it is described, and the plan records and pins it: the real
huggingface_hub client against the fake Hub on loopback (devcluster/fakehub.py), never huggingface.co."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.cli import main
from specdeploy.devcluster.fakehub import FakeHub, FakeRepo
from specdeploy.modelsource.hub import HubClient, RetryPolicy
from specdeploy.modelsource.resolve import ArchitectureSource, resolve_models
from specdeploy.planning.catalog import lookup
from specdeploy.planning.plan import make_plan, plan_document

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hub"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOKEN = "hf_planTokenThatMustNeverBeShown98765"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3_HEAD = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
THINKING = "Qwen/Qwen3-4B-Thinking-2507"
HERMES = "NousResearch/Hermes-3-Llama-3.1-8B"
GATED_FINE_TUNE = "acme/gated-hermes"     # not on the real Hub: a gated model the catalog cannot stand in for
H100 = {"gpu": {"product": "H100-80GB", "count": 1}}


@pytest.fixture(autouse=True)
def no_server_left_running() -> Iterator[None]:
    yield
    assert not [t for t in threading.enumerate() if t.name == "fakehub"], "a fake hub was left running"


def fixture_repos(extra: tuple[FakeRepo, ...] = ()) -> list[FakeRepo]:
    index = json.loads((FIXTURES / "index.json").read_text())
    repos = [FakeRepo.with_files(repo_id, {"config.json": (FIXTURES / repo_id / "config.json").read_bytes()},
                                 gated=entry["gated"]) for repo_id, entry in index["repos"].items()]
    return [*repos, *extra]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    gated = FakeRepo.with_files(GATED_FINE_TUNE, {"config.json": (FIXTURES / HERMES / "config.json").read_bytes()},
                                gated=True)
    with FakeHub(fixture_repos((gated,)), access_tokens={TOKEN}) as fake:
        yield fake


def sd_file(tmp_path: Path, spec: dict[str, Any], name: str = "seed") -> Path:
    path = tmp_path / f"{name}.yaml"
    document = {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
                "metadata": {"name": name}, "spec": {"resources": H100, **spec}}
    path.write_text(yaml.safe_dump(document))
    return path


def plan_cli(hub: FakeHub, tmp_path: Path, *args: str, token: str | None = None) -> Result:
    """`specdeploy plan ARGS` with the environment a user would give it: the fake Hub as HF_ENDPOINT."""
    env = {"HF_HUB_OFFLINE": None, "HF_ENDPOINT": hub.url, "HF_TOKEN": token,
           "SPECDEPLOY_CACHE_DIR": str(tmp_path / "cache")}
    return CliRunner().invoke(main, ["plan", *args], env=env)


def plan_json(result: Result) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# --- the four seed launches, with configs from the local Hub ---------------------------------------------

VLLM_QWEN3 = {"model": {"name": THINKING},
              "speculation": {"method": "draft_model", "draft": {"name": "Qwen/Qwen3-0.6B"}, "numSpeculativeTokens": 5},
              "serving": {"maxModelLen": 32768, "maxNumSeqs": 32}}
VLLM_MIMO = {"model": {"name": "XiaomiMiMo/MiMo-7B-Base"},
             "speculation": {"method": "mtp", "numSpeculativeTokens": 1}, "serving": {"maxNumSeqs": 32}}
# SGLang STANDALONE with steps 4, topk 1 and 5 draft tokens: numSpeculativeTokens is the steps, and with
# topk 1 the draft tokens are steps + 1 (engines/sglang.py num_draft_tokens).
SGLANG_QWEN25 = {"engine": {"kind": "sglang"}, "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                 "speculation": {"method": "draft_model", "draft": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
                                 "numSpeculativeTokens": 4, "eagleTopk": 1},
                 "serving": {"maxModelLen": 32768, "maxNumSeqs": 32}}
TRTLLM_LLAMA = {"engine": {"kind": "trtllm"}, "model": {"name": LLAMA},
                "speculation": {"method": "eagle3", "draft": {"name": EAGLE3_HEAD}, "numSpeculativeTokens": 4},
                "serving": {"maxModelLen": 32768, "maxNumSeqs": 64}}


def test_vllm_qwen3_thinking_with_a_qwen3_draft_plans_from_the_hub_and_pins_both_commits(
        hub: FakeHub, tmp_path: Path) -> None:
    assert lookup(THINKING) is None   # outside the catalog: before the Hub, this plan exited 2
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, VLLM_QWEN3)))
    assert result.exit_code == 0, result.output
    document = plan_json(result)
    target_sha, draft_sha = hub.sha(THINKING), hub.sha("Qwen/Qwen3-0.6B")
    assert document["models"]["target"] == {
        "source": "Hub", "name": THINKING, "revision": "main", "commit": target_sha,
        "location": f"{hub.url}/{THINKING}/blob/{target_sha}/config.json",
    }
    assert document["models"]["draft"]["commit"] == draft_sha
    args = document["engineCommand"]["args"]
    assert document["engineCommand"]["command"] == ["vllm", "serve"] and args[0] == THINKING
    assert flag(args, "--revision") == target_sha
    assert json.loads(flag(args, "--speculative-config")) == {
        "method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5, "revision": draft_sha,
    }


def test_the_seed_pair_from_the_hub_has_an_acceptance_floor_from_its_resolved_models(
        hub: FakeHub, tmp_path: Path) -> None:
    """Neither Qwen model is in the catalog: the floor is priced from the configs the Hub served, as the plan
    resolved them (it was null while the floor looked the models up in the catalog again)."""
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, VLLM_QWEN3)))
    assert result.exit_code == 0, result.output
    floor = plan_json(result)["acceptanceFloor"]
    assert floor is not None and floor["source"] == "Auto" and floor["batchSize"] == 1
    assert 0.0 < floor["breakEven"] <= floor["rate"] < 1.0
    spec = SpeculativeDeploymentSpec.model_validate(VLLM_QWEN3)
    client = HubClient(tmp_path / "client", endpoint=hub.url, retry=RetryPolicy(attempts=1))
    plan = make_plan(spec, resolve_models(spec, hub=client))
    at_1, at_32 = plan.acceptance_floor(), plan.acceptance_floor(32)
    assert at_1 is not None and at_1.to_wire() == floor
    assert at_32 is not None and at_32.rate >= at_1.rate and "draft_model k=5" in at_32.describe()


def test_vllm_mimo_base_mtp_plans_from_its_config_with_one_mtp_layer(hub: FakeHub, tmp_path: Path) -> None:
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, VLLM_MIMO)))
    assert result.exit_code == 0, result.output
    document = plan_json(result)
    assert document["models"]["target"]["source"] == "Hub" and document["models"]["draft"] is None
    assert "ModelHasNoMTPLayers" not in {f["code"] for f in document["compatibility"]["findings"]}
    args = document["engineCommand"]["args"]
    assert document["engineCommand"]["command"] == ["vllm", "serve"] and args[0] == "XiaomiMiMo/MiMo-7B-Base"
    assert flag(args, "--revision") == hub.sha("XiaomiMiMo/MiMo-7B-Base")
    assert json.loads(flag(args, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 1}


def test_sglang_qwen25_standalone_renders_steps_topk_draft_tokens_and_both_revisions(
        hub: FakeHub, tmp_path: Path) -> None:
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, SGLANG_QWEN25)))
    assert result.exit_code == 0, result.output
    args = plan_json(result)["engineCommand"]["args"]
    expected = {
        "--model-path": "Qwen/Qwen2.5-7B-Instruct", "--revision": hub.sha("Qwen/Qwen2.5-7B-Instruct"),
        "--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": "Qwen/Qwen2.5-1.5B-Instruct",
        "--speculative-draft-model-revision": hub.sha("Qwen/Qwen2.5-1.5B-Instruct"),
        "--speculative-num-steps": "4", "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "5",
    }
    assert {name: flag(args, name) for name in expected} == expected


def test_trtllm_llama_with_its_eagle3_head_pins_the_target_and_writes_no_draft_revision(
        hub: FakeHub, tmp_path: Path) -> None:
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, TRTLLM_LLAMA)), token=TOKEN)
    assert result.exit_code == 0, result.output
    document = plan_json(result)
    assert TOKEN not in result.output
    assert document["models"]["target"]["commit"] == hub.sha(LLAMA)   # gated: read with HF_TOKEN
    assert document["models"]["draft"]["commit"] == hub.sha(EAGLE3_HEAD)
    command = document["engineCommand"]
    assert command["command"] == ["trtllm-serve"] and command["args"][0] == LLAMA
    assert flag(command["args"], "--revision") == hub.sha(LLAMA)
    speculative = yaml.safe_load(command["configFiles"]["trtllm.yaml"])["speculative_config"]
    # speculative_config has no revision for its speculative_model (docs/compatibility.md).
    assert speculative == {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": EAGLE3_HEAD}


def test_the_text_output_shows_each_model_source_and_commit(hub: FakeHub, tmp_path: Path) -> None:
    result = plan_cli(hub, tmp_path, str(sd_file(tmp_path, VLLM_QWEN3)))
    assert result.exit_code == 0, result.output
    assert "models" in result.stdout
    assert f"main → {hub.sha(THINKING)[:12]}" in result.stdout
    assert f"main → {hub.sha('Qwen/Qwen3-0.6B')[:12]}" in result.stdout
    assert list((tmp_path / "cache" / "hub-configs").glob("Qwen--*.json"))   # the bounded config cache


# --- heads paired from their own config.json -----------------------------------------------------------


def test_a_fine_tune_outside_the_catalog_plans_and_its_eagle_head_mismatch_is_reported_once(
        hub: FakeHub, tmp_path: Path) -> None:
    assert lookup(HERMES) is None
    alone = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(
        tmp_path, {"model": {"name": HERMES}, "speculation": {"method": "ngram"}, "serving": {"maxModelLen": 32768}})))
    assert alone.exit_code == 0, alone.output
    assert plan_json(alone)["models"]["target"]["source"] == "Hub"
    with_head = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, {
        "model": {"name": HERMES}, "speculation": {"method": "eagle3", "draft": {"name": EAGLE3_HEAD}},
        "serving": {"maxModelLen": 32768}})))
    assert with_head.exit_code == 1, with_head.output
    codes = [f["code"] for f in plan_json(with_head)["compatibility"]["findings"]]
    assert codes.count("EagleHeadTargetMismatch") == 1, codes


def test_a_speculators_head_for_another_verifier_is_refused_from_its_config(hub: FakeHub, tmp_path: Path) -> None:
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, {
        "model": {"name": THINKING},
        "speculation": {"method": "eagle3", "draft": {"name": "RedHatAI/Qwen3-8B-speculator.eagle3"}},
        "serving": {"maxModelLen": 32768}})))
    assert result.exit_code == 1, result.output
    findings = {f["code"]: f for f in plan_json(result)["compatibility"]["findings"]}
    assert "Qwen/Qwen3-8B" in findings["EagleHeadTargetMismatch"]["message"]
    assert findings["EagleHeadHiddenSizeMismatch"]["severity"] == "Error"   # 4096 wide, the target 2560


# --- offline, and the failure modes ----------------------------------------------------------------------


@pytest.mark.parametrize("how", [["--offline"], []], ids=["--offline", "HF_HUB_OFFLINE=1"])
def test_an_offline_plan_never_contacts_the_hub(hub: FakeHub, tmp_path: Path, how: list[str]) -> None:
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": None if how else "1"}
    result = CliRunner().invoke(main, ["plan", *how, "-o", "json", str(EXAMPLES / "qwen3-4b-draft.yaml")], env=env)
    assert result.exit_code == 0, result.output
    assert plan_json(result)["models"]["target"]["source"] == "Catalog"
    outside = CliRunner().invoke(main, ["plan", *how, str(sd_file(tmp_path, VLLM_QWEN3))], env=env)
    assert outside.exit_code == 2
    assert "planning offline, so the Hub was not asked" in outside.output
    assert hub.requests == []


def test_a_local_config_path_is_read_offline(tmp_path: Path) -> None:
    model_dir = tmp_path / "Qwen3-4B-Thinking-2507"
    model_dir.mkdir()
    (model_dir / "config.json").write_bytes((FIXTURES / THINKING / "config.json").read_bytes())
    spec = {**VLLM_QWEN3, "model": {"name": THINKING, "configPath": str(model_dir)}}
    result = CliRunner().invoke(main, ["plan", "--offline", "-o", "json", str(sd_file(tmp_path, spec))])
    assert result.exit_code == 0, result.output
    assert plan_json(result)["models"]["target"] == {
        "source": "Path", "name": THINKING, "location": str(model_dir / "config.json")}


def test_what_only_the_operator_can_read_is_noted_and_skipped(hub: FakeHub, tmp_path: Path) -> None:
    spec = {**VLLM_QWEN3, "model": {"name": THINKING, "configPath": "/models/nowhere", "configMapRef": "thinking-config",
                                    "tokenSecretRef": "hf-token"}}
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, spec)))
    assert result.exit_code == 0, result.output
    assert plan_json(result)["models"]["target"]["source"] == "Hub"
    for field in ("configPath` /models/nowhere", "configMapRef` thinking-config", "tokenSecretRef` hf-token"):
        assert f"note: `spec.model.{field}" in result.stderr


def test_a_model_the_hub_does_not_have_exits_2_with_its_message(hub: FakeHub, tmp_path: Path) -> None:
    missing = plan_cli(hub, tmp_path, str(sd_file(tmp_path, {**VLLM_MIMO, "model": {"name": "Qwen/Qwen3-4B-Typo"}})))
    assert missing.exit_code == 2
    assert "there is no model 'Qwen/Qwen3-4B-Typo'" in missing.output and "Traceback" not in missing.output
    revision = plan_cli(hub, tmp_path, str(sd_file(
        tmp_path, {**VLLM_MIMO, "model": {"name": "XiaomiMiMo/MiMo-7B-Base", "revision": "v9"}})))
    assert revision.exit_code == 2
    assert "has no revision 'v9'" in revision.output


@pytest.mark.parametrize("token", [None, TOKEN[:-1] + "X"], ids=["no token", "a refused token"])
def test_a_gated_model_without_access_exits_2_naming_the_fix_and_never_the_token(
        hub: FakeHub, tmp_path: Path, token: str | None) -> None:
    spec = {"model": {"name": GATED_FINE_TUNE}, "speculation": {"method": "ngram"}, "serving": {"maxModelLen": 32768}}
    path = sd_file(tmp_path, spec)
    refused = plan_cli(hub, tmp_path, str(path), token=token)
    assert refused.exit_code == 2
    assert "gated" in refused.output and "token" in refused.output
    assert ("accept the licence" if token is None else "request access") in refused.output
    allowed = plan_cli(hub, tmp_path, "-o", "json", str(path), token=TOKEN)
    assert allowed.exit_code == 0, allowed.output
    for result in (refused, allowed):
        assert TOKEN[:-1] not in result.output


def test_a_gated_catalog_model_without_a_token_falls_back_to_the_catalog_with_a_warning(
        hub: FakeHub, tmp_path: Path) -> None:
    result = plan_cli(hub, tmp_path, "-o", "json", str(sd_file(tmp_path, TRTLLM_LLAMA)))
    assert result.exit_code == 0, result.output
    assert f"warning: `spec.model.name` {LLAMA}: ModelAccessDenied:" in result.stderr
    target = plan_json(result)["models"]["target"]
    assert target["source"] == "Catalog" and "commit" not in target and target["warnings"]
    assert "--revision" not in plan_json(result)["engineCommand"]["args"]


def test_a_catalog_model_with_the_hub_stopped_falls_back_with_the_warning_line(hub: FakeHub, tmp_path: Path) -> None:
    hub.stop()
    result = plan_cli(hub, tmp_path, "-o", "json", str(EXAMPLES / "mimo-7b-mtp.yaml"))
    assert result.exit_code == 0, result.output
    assert "warning: `spec.model.name` XiaomiMiMo/MiMo-7B-RL: HubUnreachable:" in result.stderr
    assert "the built-in catalog's numbers are used, unpinned" in result.stderr
    assert plan_json(result)["models"]["target"]["source"] == "Catalog"
    outside = plan_cli(hub, tmp_path, str(sd_file(tmp_path, VLLM_MIMO | {"model": {"name": HERMES}})))
    assert outside.exit_code == 2 and "could not be reached" in outside.output


# --- the plan itself: pure, given resolved models ---------------------------------------------------------


def test_make_plan_without_models_resolves_from_spec_and_catalog_as_before() -> None:
    spec = SpeculativeDeploymentSpec.model_validate({**VLLM_MIMO, "model": {"name": "XiaomiMiMo/MiMo-7B-RL",
                                                                            "revision": "v1"}})
    plan = make_plan(spec)
    assert plan.spec == spec and plan.draft_origin is None
    assert plan_document(plan)["models"] == {"target": {
        "source": "Catalog", "name": "XiaomiMiMo/MiMo-7B-RL", "revision": "v1", "location": plan.target.source},
        "draft": None}


def test_make_plan_pins_the_resolved_commits_and_keeps_the_spec_otherwise(hub: FakeHub, tmp_path: Path) -> None:
    spec = SpeculativeDeploymentSpec.model_validate(VLLM_QWEN3)
    client = HubClient(tmp_path, endpoint=hub.url, retry=RetryPolicy(attempts=1))
    plan = make_plan(spec, resolve_models(spec, hub=client))
    assert plan.target_origin.source == ArchitectureSource.HUB
    assert plan.spec.model.revision == hub.sha(THINKING)
    assert plan.spec.speculation.draft is not None
    assert plan.spec.speculation.draft.revision == hub.sha("Qwen/Qwen3-0.6B")
    assert plan.spec.model_copy(update={"model": spec.model, "speculation": spec.speculation}) == spec


def test_head_findings_apply_only_while_speculation_is_enabled(hub: FakeHub, tmp_path: Path) -> None:
    document = {"model": {"name": THINKING}, "serving": {"maxModelLen": 32768},
                "speculation": {"method": "eagle3", "draft": {"name": "RedHatAI/Qwen3-8B-speculator.eagle3"}}}
    client = HubClient(tmp_path, endpoint=hub.url, retry=RetryPolicy(attempts=1))
    on = SpeculativeDeploymentSpec.model_validate(document)
    off = SpeculativeDeploymentSpec.model_validate({**document, "speculation": {**document["speculation"],
                                                                                 "enabled": False}})
    assert not make_plan(on, resolve_models(on, hub=client)).compatibility.compatible
    assert make_plan(off, resolve_models(off, hub=client)).compatibility.findings == []
