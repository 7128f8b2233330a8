"""Model architectures from their own config.json: the real huggingface_hub client against the fake Hub
on loopback (devcluster/fakehub.py), the resolution order, its record, and every failure typed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.spec import Architecture, SpeculativeDeploymentSpec
from specdeploy.api.status import Severity
from specdeploy.devcluster.fakehub import FakeHub, FakeRepo
from specdeploy.modelsource import (
    ConfigNotUnderstood,
    ConfigUnreadable,
    HubAccessDenied,
    HubUnreachable,
    ModelNotFound,
    ModelNotResolvable,
    RevisionNotFound,
)
from specdeploy.modelsource.hub import DOWN_SECONDS, ConfigCache, HubClient, RetryPolicy
from specdeploy.modelsource.resolve import (
    ArchitectureSource,
    ConfigMapConfig,
    ModelRequest,
    Supplied,
    head_findings,
    missing_config_keys,
    resolve_model,
    resolve_models,
)
from specdeploy.planning.catalog import lookup
from specdeploy.planning.compat import check_compatibility
from specdeploy.planning.modelinfo import ModelKind

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hub"
TOKEN = "hf_fixtureTokenThatMustNeverBeShown0123"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
THINKING = "Qwen/Qwen3-4B-Thinking-2507"
HERMES = "NousResearch/Hermes-3-Llama-3.1-8B"
GPT2_STYLE = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
              "vocab_size": 50257}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def no_server_left_running() -> Iterator[None]:
    yield
    assert not [t for t in threading.enumerate() if t.name == "fakehub"], "a fake hub was left running"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub.from_fixtures(FIXTURES, access_tokens={TOKEN}) as fake:
        yield fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(hub: FakeHub, tmp_path: Path, clock: Clock, sleeps: list[float]) -> HubClient:
    return HubClient(tmp_path / "configs", endpoint=hub.url, retry=RetryPolicy(attempts=3, first_delay_s=0.25),
                     clock=clock, sleep=sleeps.append)


def fixture_config(repo: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / repo / "config.json").read_text())
    return loaded


def request(name: str, revision: str | None = None, **supplied: Any) -> ModelRequest:
    return ModelRequest("spec.model", name, revision, supplied=Supplied(**supplied))


def spec_of(document: dict[str, Any]) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(document)


def error_chain_text(error: BaseException) -> str:
    texts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(f"{current!r} {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


# --- a model outside the catalog ------------------------------------------------------------------------


def test_a_model_outside_the_catalog_resolves_from_its_config_on_the_hub(hub: FakeHub, client: HubClient) -> None:
    assert lookup(THINKING) is None
    resolved = resolve_model(request(THINKING), hub=client)
    assert resolved.origin.source == ArchitectureSource.HUB
    assert resolved.origin.requested_revision == "main"
    assert resolved.origin.commit_sha == hub.sha(THINKING)
    assert resolved.origin.location.endswith(f"/{THINKING}/blob/{hub.sha(THINKING)}/config.json")
    arch = resolved.info.architecture
    assert (arch.num_layers, arch.hidden_size, arch.intermediate_size, arch.num_key_value_heads) == (36, 2560, 9728, 8)
    assert (arch.vocab_size, arch.max_position_embeddings, arch.tie_word_embeddings) == (151936, 262144, True)
    assert resolved.info.family == "qwen3" and resolved.info.kind == ModelKind.BASE
    assert resolved.origin.to_wire() == {
        "source": "Hub", "name": THINKING, "revision": "main", "commit": hub.sha(THINKING),
        "location": resolved.origin.location,
    }


def test_a_fine_tune_gets_its_family_from_its_config_not_its_name(client: HubClient) -> None:
    resolved = resolve_model(request(HERMES), hub=client)
    assert lookup(HERMES) is None
    assert resolved.info.family == "llama3"
    assert resolved.info.architecture.vocab_size == 128256


def test_a_catalog_model_from_the_hub_keeps_the_catalog_facts(hub: FakeHub, client: HubClient) -> None:
    resolved = resolve_model(request("Qwen/Qwen2.5-7B-Instruct"), hub=client)
    catalog = lookup("Qwen/Qwen2.5-7B-Instruct")
    assert catalog is not None
    assert resolved.origin.source == ArchitectureSource.HUB
    assert resolved.origin.commit_sha == hub.sha("Qwen/Qwen2.5-7B-Instruct")
    assert resolved.info.architecture.num_parameters == catalog.architecture.num_parameters == 7_615_616_512
    assert resolved.info.family == "qwen2"


def test_the_four_seed_launches_resolve_from_the_local_hub_and_are_compatible(hub: FakeHub, client: HubClient) -> None:
    seeds = [
        {"engine": {"kind": "vllm"}, "model": {"name": THINKING},
         "speculation": {"method": "draft_model", "draft": {"name": "Qwen/Qwen3-0.6B"}, "numSpeculativeTokens": 5}},
        {"engine": {"kind": "vllm"}, "model": {"name": "XiaomiMiMo/MiMo-7B-Base"},
         "speculation": {"method": "mtp", "numSpeculativeTokens": 1}},
        {"engine": {"kind": "sglang"}, "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
         "speculation": {"method": "draft_model", "draft": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
                         "numSpeculativeTokens": 4}},
        {"engine": {"kind": "trtllm"}, "model": {"name": LLAMA},
         "speculation": {"method": "eagle3", "draft": {"name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
                         "numSpeculativeTokens": 4}},
    ]
    for document in seeds:
        spec = spec_of(document)
        models = resolve_models(spec, hub=client, target=Supplied(token=TOKEN))
        assert models.target.origin.source == ArchitectureSource.HUB, document
        assert models.target.origin.commit_sha == hub.sha(spec.model.name)
        if models.draft is not None:
            assert models.draft.origin.source == ArchitectureSource.HUB
        draft_info = models.draft.info if models.draft else None
        findings = check_compatibility(spec, models.target.info, draft_info).findings + head_findings(spec, models)
        assert not [f for f in findings if f.severity == Severity.ERROR], (document, findings)
    mimo = resolve_model(request("XiaomiMiMo/MiMo-7B-Base"), hub=client)
    assert mimo.info.architecture.num_nextn_predict_layers == 1


def test_an_eagle_head_naming_another_verifier_is_refused_from_its_config(client: HubClient) -> None:
    spec = spec_of({"model": {"name": HERMES},
                    "speculation": {"method": "eagle3", "draft": {"name": "RedHatAI/Qwen3-8B-speculator.eagle3"}}})
    models = resolve_models(spec, hub=client)
    assert models.draft is not None and models.draft.info.kind == ModelKind.EAGLE3
    assert models.draft.info.targets == ("Qwen/Qwen3-8B",)
    assert ("EagleHeadTargetMismatch", Severity.ERROR) in [(f.code, f.severity) for f in head_findings(spec, models)]


# --- revisions pinned ------------------------------------------------------------------------------------


def test_a_branch_resolves_to_a_sha_and_the_sha_keeps_the_old_config(
    hub: FakeHub, client: HubClient, clock: Clock
) -> None:
    first = client.fetch_config(HERMES, "main")
    moved = {**fixture_config(HERMES), "num_hidden_layers": 40}
    new_sha = hub.commit(HERMES, {"config.json": json.dumps(moved).encode()})
    assert new_sha != first.commit_sha
    pinned = client.fetch_config(HERMES, first.commit_sha)
    assert pinned.config["num_hidden_layers"] == 32 and pinned.commit_sha == first.commit_sha
    assert client.fetch_config(HERMES, "main").commit_sha == first.commit_sha  # remembered for revision_ttl_s
    clock.now += client.revision_ttl_s + 1
    again = client.fetch_config(HERMES, "main")
    assert (again.commit_sha, again.config["num_hidden_layers"]) == (new_sha, 40)


def test_a_tag_or_branch_other_than_main_is_recorded_as_asked(hub: FakeHub, client: HubClient) -> None:
    sha = hub.sha(THINKING)
    hub.move_ref(THINKING, "v1.0", sha)
    resolved = resolve_model(request(THINKING, "v1.0"), hub=client)
    assert (resolved.origin.requested_revision, resolved.origin.commit_sha) == ("v1.0", sha)


# --- gated models and tokens -----------------------------------------------------------------------------


def test_a_gated_model_needs_a_token_and_the_token_is_never_shown(
    hub: FakeHub, client: HubClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(HubAccessDenied) as without:
        client.fetch_config(LLAMA)
    assert "HTTP 401" in str(without.value) and "licence" in str(without.value)
    with pytest.raises(HubAccessDenied) as refused:
        client.fetch_config(LLAMA, token=TOKEN[:-1] + "X")
    assert "HTTP 403" in str(refused.value) and "refused" in str(refused.value)
    fetched = client.fetch_config(LLAMA, token=TOKEN)
    assert fetched.commit_sha == hub.sha(LLAMA) and fetched.config["vocab_size"] == 128256
    for error in (without.value, refused.value):
        assert TOKEN[:-1] not in error_chain_text(error)
    assert TOKEN[:-1] not in caplog.text
    assert [r.with_token for r in hub.requests_for(f"/{LLAMA}/resolve/")] == [False, True, True, True]


def test_an_operator_level_token_is_used_when_the_request_has_none(hub: FakeHub, tmp_path: Path) -> None:
    client = HubClient(tmp_path, endpoint=hub.url, token=TOKEN, retry=RetryPolicy(attempts=1))
    assert client.fetch_config(LLAMA).commit_sha == hub.sha(LLAMA)
    assert repr(Supplied(token=TOKEN)).count(TOKEN) == 0


def test_a_gated_catalog_model_without_a_token_falls_back_to_the_catalog_with_the_reason(client: HubClient) -> None:
    resolved = resolve_model(request(LLAMA), hub=client)
    assert resolved.origin.source == ArchitectureSource.CATALOG
    assert resolved.origin.commit_sha is None
    assert resolved.origin.warnings and resolved.origin.warnings[0].startswith("ModelAccessDenied:")


def test_a_gated_model_outside_the_catalog_without_a_token_is_refused(tmp_path: Path) -> None:
    repo = FakeRepo.with_files(THINKING, {"config.json": (FIXTURES / THINKING / "config.json").read_bytes()},
                               gated=True)
    with FakeHub([repo]) as gated, pytest.raises(HubAccessDenied):
        resolve_model(request(THINKING), hub=HubClient(tmp_path, endpoint=gated.url))


# --- models and revisions that do not exist -------------------------------------------------------------


def test_a_model_that_does_not_exist(client: HubClient) -> None:
    with pytest.raises(ModelNotFound, match="no model 'acme/not-a-model'"):
        client.fetch_config("acme/not-a-model")
    with pytest.raises(ModelNotFound):
        resolve_model(request("acme/not-a-model"), hub=client)


def test_a_revision_that_does_not_exist_is_not_papered_over_by_the_catalog(client: HubClient) -> None:
    with pytest.raises(RevisionNotFound, match="no revision 'v9.9'"):
        client.fetch_config(THINKING, "v9.9")
    with pytest.raises(RevisionNotFound):
        resolve_model(request("Qwen/Qwen3-0.6B", "no-such-branch"), hub=client)


def test_a_path_is_not_sent_to_the_hub(hub: FakeHub, client: HubClient) -> None:
    resolved = resolve_model(request("/models/Qwen3-0.6B"), hub=client)
    assert resolved.origin.source == ArchitectureSource.CATALOG
    assert hub.requests == []


# --- the Hub unreachable ----------------------------------------------------------------------------------


def test_a_stopped_hub_is_unreachable_after_retries_with_backoff(
    hub: FakeHub, client: HubClient, sleeps: list[float]
) -> None:
    hub.stop()
    with pytest.raises(HubUnreachable) as unreachable:
        client.fetch_config(THINKING)
    assert unreachable.value.transient
    assert "after 3 attempts (ConnectError)" in str(unreachable.value)
    assert "retries with backoff" in str(unreachable.value)
    assert sleeps == [0.25, 0.5]
    with pytest.raises(HubUnreachable):
        resolve_model(request(THINKING), hub=client)  # no catalog entry to stand in


def test_a_stopped_hub_leaves_catalog_models_on_the_catalog_with_a_warning(hub: FakeHub, client: HubClient) -> None:
    hub.stop()
    resolved = resolve_model(request("Qwen/Qwen3-0.6B"), hub=client)
    assert resolved.origin.source == ArchitectureSource.CATALOG
    assert resolved.origin.warnings[0].startswith("HubUnreachable:")
    assert resolved.origin.to_wire()["warnings"] == list(resolved.origin.warnings)


def test_a_hub_answering_503_is_unreachable(hub: FakeHub, client: HubClient) -> None:
    hub.outage_status = 503
    with pytest.raises(HubUnreachable, match="HTTP 503"):
        client.fetch_config(THINKING)


def test_a_hub_stopped_mid_run_still_serves_what_was_cached(hub: FakeHub, client: HubClient) -> None:
    sha = client.fetch_config(THINKING).commit_sha
    hub.stop()
    assert client.fetch_config(THINKING, sha).config["hidden_size"] == 2560
    assert client.fetch_config(THINKING, "main").commit_sha == sha  # within revision_ttl_s


# --- config.json the parser does not understand ---------------------------------------------------------


def test_a_config_with_other_key_names_is_refused_naming_the_keys(hub: FakeHub, client: HubClient) -> None:
    hub.commit(HERMES, {"config.json": json.dumps(GPT2_STYLE).encode()}, branch="gpt2-style")
    with pytest.raises(ConfigNotUnderstood) as refused:
        resolve_model(request(HERMES, "gpt2-style"), hub=client)
    assert refused.value.keys == ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
    message = str(refused.value)
    assert "n_layer" in message and "n_embd" in message and "`spec.model.architecture`" in message


def test_a_config_that_is_not_json_is_refused_and_not_cached(hub: FakeHub, client: HubClient) -> None:
    hub.commit(HERMES, {"config.json": b"{not json"}, branch="broken")
    with pytest.raises(ConfigNotUnderstood, match="not valid JSON"):
        client.fetch_config(HERMES, "broken")
    assert client.cache.entries() == []


def test_missing_config_keys_reads_text_config_and_speculators_layers() -> None:
    assert missing_config_keys({"text_config": fixture_config(THINKING)}) == ()
    assert missing_config_keys(fixture_config("RedHatAI/Qwen3-8B-speculator.eagle3")) == ()
    assert missing_config_keys({"hidden_size": 0, "vocab_size": True}) == (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


# --- the cache -------------------------------------------------------------------------------------------


def test_a_second_resolution_of_a_sha_makes_no_request(hub: FakeHub, client: HubClient) -> None:
    sha = client.fetch_config(THINKING).commit_sha
    seen = len(hub.requests)
    fresh = HubClient(client.cache.directory, endpoint=hub.url)  # another process: only the disk is shared
    assert fresh.fetch_config(THINKING, sha).config == fixture_config(THINKING)
    assert len(hub.requests) == seen


def test_a_second_resolution_of_a_branch_within_its_ttl_makes_no_request(hub: FakeHub, client: HubClient) -> None:
    client.fetch_config(THINKING)
    seen = len(hub.requests)
    client.fetch_config(THINKING)
    assert len(hub.requests) == seen


def test_the_cache_holds_at_most_its_bound_least_recently_used_out(hub: FakeHub, tmp_path: Path) -> None:
    client = HubClient(tmp_path, endpoint=hub.url, max_cached_configs=2)
    thinking = client.fetch_config(THINKING).commit_sha
    client.fetch_config("Qwen/Qwen3-0.6B")
    client.cache.get(THINKING, thinking)  # used again: now the most recent
    client.fetch_config(HERMES)
    names = [path.name for path in client.cache.entries()]
    assert len(names) == 2 and not any("Qwen3-0.6B" in name for name in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no scratch left behind


def test_a_cache_must_hold_something(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        ConfigCache(tmp_path, max_entries=0)


# --- offline, spec, ConfigMap and path sources --------------------------------------------------------------


def test_offline_never_asks_the_hub(hub: FakeHub, client: HubClient) -> None:
    assert resolve_model(request("Qwen/Qwen3-0.6B"), hub=client, offline=True).origin.source == "Catalog"
    with pytest.raises(ModelNotResolvable, match="offline"):
        resolve_model(request(THINKING), hub=client, offline=True)
    assert hub.requests == []


def test_without_a_hub_an_unknown_model_names_every_way_out() -> None:
    with pytest.raises(ModelNotResolvable) as unknown:
        resolve_model(request(THINKING))
    message = str(unknown.value)
    assert "ConfigMap" in message and "Hub" in message and "`spec.model.architecture`" in message


def test_the_spec_architecture_wins_and_asks_nothing(hub: FakeHub, client: HubClient) -> None:
    architecture = Architecture(num_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                num_key_value_heads=4, vocab_size=1000, num_parameters=1_000_000,
                                max_position_embeddings=2048)
    resolved = resolve_model(ModelRequest("spec.model", THINKING, architecture=architecture), hub=client)
    assert resolved.origin.source == ArchitectureSource.SPEC and resolved.info.architecture == architecture
    assert hub.requests == []


def test_a_configmap_comes_before_the_hub(hub: FakeHub, client: HubClient) -> None:
    data = {"config.json": json.dumps(fixture_config(HERMES))}
    resolved = resolve_model(request(THINKING, config_map=ConfigMapConfig("thinking-config", data)), hub=client)
    assert resolved.origin.source == ArchitectureSource.CONFIG_MAP
    assert resolved.origin.location == "ConfigMap thinking-config key config.json"
    assert resolved.info.architecture.hidden_size == 4096
    assert hub.requests == []
    with pytest.raises(ConfigUnreadable, match="the ConfigMap has other.json"):
        resolve_model(request(THINKING, config_map=ConfigMapConfig("c", {"other.json": "{}"})), hub=client)


def test_a_path_in_the_model_volume_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(fixture_config("XiaomiMiMo/MiMo-7B-Base")))
    resolved = resolve_model(request("/models/MiMo-7B-Base", config_path=tmp_path))
    assert resolved.origin.source == ArchitectureSource.PATH
    assert resolved.info.architecture.num_nextn_predict_layers == 1
    with pytest.raises(ConfigUnreadable, match="cannot be read"):
        resolve_model(request("/models/x", config_path=tmp_path / "missing.json"))


def test_the_resolution_order_needs_no_hub_client_to_import() -> None:
    """`specdeploy plan --offline` and the catalog fallback work without huggingface_hub loaded."""
    code = ("import sys, specdeploy.modelsource.resolve; print(sorted(m for m in "
            "('huggingface_hub', 'httpx2', 'kopf', 'lightkube') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_hub_down_through_every_retry_fails_at_once_for_a_while_then_is_asked_again(
    hub: FakeHub, client: HubClient, clock: Clock, sleeps: list[float]
) -> None:
    hub.stop()
    with pytest.raises(HubUnreachable):
        client.fetch_config(THINKING)
    assert sleeps == [0.25, 0.5]
    with pytest.raises(HubUnreachable, match="asked again 30 s after that"):
        client.fetch_config(HERMES)                 # another model: no request, no sleeps
    assert sleeps == [0.25, 0.5]
    hub.start()
    clock.now += DOWN_SECONDS + 1
    assert client.fetch_config(THINKING).config["hidden_size"] == 2560
