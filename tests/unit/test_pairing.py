"""EAGLE heads checked against their target from the head's own config.json (planning/pairing.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.spec import Method
from specdeploy.api.status import Severity
from specdeploy.planning.catalog import CATALOG, lookup
from specdeploy.planning.hf_config import architecture_from_hf_config, head_kind
from specdeploy.planning.modelinfo import ModelKind
from specdeploy.planning.pairing import check_head_pairing, parser_view, read_head_config, same_model

HUB = Path(__file__).parent.parent / "fixtures" / "hub"
SPECULATOR = "RedHatAI/Qwen3-8B-speculator.eagle3"
EAGLE3_LLAMA = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def config(repo: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HUB / repo / "config.json").read_text())
    return loaded


def with_verifier(head: dict[str, Any], name: str) -> dict[str, Any]:
    return {**head, "speculators_config": {**head["speculators_config"], "verifier": {"name_or_path": name}}}


def codes(findings: list[Any]) -> list[tuple[str, Severity]]:
    return [(f.code, f.severity) for f in findings]


def test_a_speculators_head_names_its_verifier_and_its_shapes() -> None:
    head = read_head_config(config(SPECULATOR))
    assert head.verifier == "Qwen/Qwen3-8B"
    assert (head.target_hidden_size, head.vocab_size, head.draft_vocab_size) == (4096, 151936, 32000)


def test_the_flattened_speculators_config_parses_as_an_eagle3_head() -> None:
    view = parser_view(config(SPECULATOR))
    assert head_kind(view) == ModelKind.EAGLE3
    architecture = architecture_from_hf_config(view)
    assert (architecture.num_layers, architecture.hidden_size, architecture.vocab_size) == (1, 4096, 151936)


def test_a_head_on_the_verifier_it_names_has_no_findings() -> None:
    target = CATALOG["Qwen/Qwen3-8B"]
    findings = check_head_pairing(Method.EAGLE3, target.name, target.architecture, SPECULATOR, config(SPECULATOR))
    assert findings == []


def test_a_head_naming_another_verifier_is_an_error_that_names_both() -> None:
    target = CATALOG["meta-llama/Llama-3.1-8B-Instruct"]
    findings = check_head_pairing(Method.EAGLE3, target.name, target.architecture, SPECULATOR, config(SPECULATOR))
    assert ("EagleHeadTargetMismatch", Severity.ERROR) in codes(findings)
    mismatch = next(f for f in findings if f.code == "EagleHeadTargetMismatch")
    assert "Qwen/Qwen3-8B" in mismatch.message and "meta-llama/Llama-3.1-8B-Instruct" in mismatch.message
    assert ("DraftVocabularyMismatch", Severity.ERROR) in codes(findings)  # 151,936 tokens vs 128,256


def test_only_the_name_differs_still_an_error_a_family_name_proves_nothing() -> None:
    target = CATALOG["Qwen/Qwen3-8B"]
    head = with_verifier(config(SPECULATOR), "Qwen/Qwen3-8B-Base-finetune-elsewhere")
    findings = check_head_pairing(Method.EAGLE3, target.name, target.architecture, SPECULATOR, head)
    assert codes(findings) == [("EagleHeadTargetMismatch", Severity.ERROR)]


@pytest.mark.parametrize("verifier", ["qwen/qwen3-8b", "Qwen/Qwen3-8B/", "/models/Qwen3-8B", "./Qwen3-8B"])
def test_a_verifier_named_in_another_case_or_by_a_local_path_matches(verifier: str) -> None:
    target = CATALOG["Qwen/Qwen3-8B"]
    head = with_verifier(config(SPECULATOR), verifier)
    assert check_head_pairing(Method.EAGLE3, target.name, target.architecture, SPECULATOR, head) == []


def test_same_model_does_not_match_another_owner_by_repo_name() -> None:
    assert not same_model("someone/Qwen3-8B", ["Qwen/Qwen3-8B"])
    assert same_model("/mnt/models/Qwen3-8B", ["Qwen/Qwen3-8B"])


def test_a_head_that_names_nothing_is_a_warning() -> None:
    target = CATALOG["meta-llama/Llama-3.1-8B-Instruct"]
    findings = check_head_pairing(Method.EAGLE3, target.name, target.architecture, "someone/unknown-eagle3",
                                  config(EAGLE3_LLAMA))
    assert codes(findings) == [("EagleHeadTargetUnknown", Severity.WARNING)]


def test_the_catalog_stands_in_for_a_head_config_that_names_nothing() -> None:
    target = CATALOG["meta-llama/Llama-3.1-8B-Instruct"]
    trained_for = lookup(EAGLE3_LLAMA).targets  # type: ignore[union-attr]
    matching = check_head_pairing(Method.EAGLE3, target.name, target.architecture, EAGLE3_LLAMA,
                                  config(EAGLE3_LLAMA), catalog_targets=trained_for)
    assert matching == []
    hermes = "NousResearch/Hermes-3-Llama-3.1-8B"  # the same shapes, another model
    other = check_head_pairing(Method.EAGLE3, hermes, target.architecture, EAGLE3_LLAMA, config(EAGLE3_LLAMA),
                               catalog_targets=trained_for)
    assert codes(other) == [("EagleHeadTargetMismatch", Severity.ERROR)]


def test_target_aliases_count_as_the_target() -> None:
    target = CATALOG["Qwen/Qwen3-8B"]
    findings = check_head_pairing(Method.EAGLE3, "/models/my-copy", target.architecture, SPECULATOR,
                                  config(SPECULATOR), target_aliases=["Qwen/Qwen3-8B"])
    assert findings == []


def test_a_head_reading_hidden_states_of_another_width_is_an_error() -> None:
    target = architecture_from_hf_config(config("Qwen/Qwen3-4B-Thinking-2507"))  # hidden 2560
    head = with_verifier(config(SPECULATOR), "Qwen/Qwen3-4B-Thinking-2507")
    findings = check_head_pairing(Method.EAGLE3, "Qwen/Qwen3-4B-Thinking-2507", target, SPECULATOR, head)
    assert codes(findings) == [("EagleHeadHiddenSizeMismatch", Severity.ERROR)]
    assert "4096" in findings[0].message and "2560" in findings[0].message


def test_target_hidden_size_wins_over_the_layer_width() -> None:
    target = architecture_from_hf_config(config("Qwen/Qwen3-4B-Thinking-2507"))
    head = {**with_verifier(config(SPECULATOR), "Qwen/Qwen3-4B-Thinking-2507"), "target_hidden_size": 2560}
    assert check_head_pairing(Method.EAGLE3, "Qwen/Qwen3-4B-Thinking-2507", target, SPECULATOR, head) == []


def test_a_draft_vocabulary_larger_than_the_target_is_an_error() -> None:
    target = CATALOG["Qwen/Qwen3-8B"]
    head = {**config(SPECULATOR), "draft_vocab_size": 200_000}
    findings = check_head_pairing(Method.EAGLE3, target.name, target.architecture, SPECULATOR, head)
    assert codes(findings) == [("DraftVocabularyMismatch", Severity.ERROR)]


@pytest.mark.parametrize("method", [Method.DRAFT_MODEL, Method.MTP, Method.NGRAM, None])
def test_methods_without_a_head_give_no_findings(method: Method | None) -> None:
    target = CATALOG["meta-llama/Llama-3.1-8B-Instruct"]
    assert check_head_pairing(method, target.name, target.architecture, SPECULATOR, config(SPECULATOR)) == []


def test_the_module_is_pure() -> None:
    """Planning code: no HTTP client, Hub client or Kubernetes import."""
    code = ("import sys, specdeploy.planning.pairing; print(sorted(m for m in "
            "('huggingface_hub', 'httpx', 'httpx2', 'kopf', 'lightkube') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
