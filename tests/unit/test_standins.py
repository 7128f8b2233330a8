"""The stand-in models' construction, checked from the generated weights with numpy (no torch, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from specdeploy.devcluster import standins, vllm_env
from specdeploy.devcluster.standins import PREDICTABLE, UNPREDICTABLE, StandinSpec


def _ids(half: standins.Half) -> list[int]:
    return [standins.token_id(word) for word in standins.half_words(half)]


def _agreeing(draft: np.ndarray, target: np.ndarray, half: standins.Half) -> int:
    return sum(int(draft[i] == target[i]) for i in _ids(half))


@pytest.fixture(scope="module")
def target_next() -> np.ndarray:
    return standins.greedy_successors(standins.model_tensors(StandinSpec("target", 1.0, 30.0, 12)))


def test_target_follows_its_permutation_within_each_half(target_next: np.ndarray) -> None:
    successors = standins.target_successors(12)
    assert all(int(target_next[word]) == nxt for word, nxt in successors.items())
    for half in (PREDICTABLE, UNPREDICTABLE):
        ids = set(_ids(half))
        assert {successors[i] for i in ids} == ids  # a permutation of the half onto itself
        walked, word = set(), next(iter(ids))
        for _ in ids:
            walked.add(word)
            word = successors[word]
        assert walked == ids  # one cycle through the whole half


@pytest.mark.parametrize(("agreement", "agreed"), [(1.0, 256), (0.5, 128), (0.3, 76), (0.0, 0)])
def test_draft_agrees_on_exactly_the_chosen_fraction_of_the_predictable_half(
        target_next: np.ndarray, agreement: float, agreed: int) -> None:
    draft_next = standins.greedy_successors(standins.model_tensors(StandinSpec("draft", agreement, 30.0, 12)))
    assert _agreeing(draft_next, target_next, PREDICTABLE) == agreed
    assert _agreeing(draft_next, target_next, UNPREDICTABLE) == 0
    words = [standins.token_id(w) for w in standins.WORDS]
    assert sorted(int(draft_next[i]) for i in words) == words  # still a permutation of the words


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize(("agreement", "agreed"), [(1.0, 256), (0.5, 128), (0.0, 0)])
def test_eagle_heads_draft_what_a_draft_of_their_agreement_drafts(
        target_next: np.ndarray, kind: standins.Kind, agreement: float, agreed: int) -> None:
    target = standins.model_tensors(StandinSpec("target", 1.0, 30.0, 12))
    head_next = standins.head_successors(standins.model_tensors(StandinSpec(kind, agreement, 30.0, 12)), target)
    draft = standins.draft_successors(agreement, 12)
    assert all(int(head_next[word]) == nxt for word, nxt in draft.items())
    assert _agreeing(head_next, target_next, PREDICTABLE) == agreed
    assert _agreeing(head_next, target_next, UNPREDICTABLE) == 0


def test_eagle_head_has_the_names_vllm_loads_and_shares_the_targets_lm_head() -> None:
    tensors = standins.model_tensors(StandinSpec("eagle", 1.0, 30.0, 12))
    hidden = standins.HIDDEN_SIZE
    assert tensors["fc.weight"].shape == (hidden, 2 * hidden)
    assert tensors["embed_tokens.weight"].shape == (len(standins.VOCABULARY), hidden)
    assert not tensors["layers.0.self_attn.o_proj.weight"].any() and not tensors["layers.0.mlp.down_proj.weight"].any()
    # No lm_head or norm (EagleLlamaForCausalLM has neither), no input_layernorm (vLLM makes it the identity).
    assert not {"lm_head.weight", "norm.weight", "layers.0.input_layernorm.weight"} & set(tensors)
    assert not any(name.startswith("model.") for name in tensors)  # vLLM adds the prefix itself
    config = standins.config_for(StandinSpec("eagle", 1.0, 30.0, 12))
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1


def test_eagle3_head_has_a_reduced_vocabulary_its_own_lm_head_and_self_attention() -> None:
    tensors = standins.model_tensors(StandinSpec("eagle3", 1.0, 30.0, 12))
    config = standins.config_for(StandinSpec("eagle3", 1.0, 30.0, 12))
    hidden, vocab = standins.HIDDEN_SIZE, config["draft_vocab_size"]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2] and config["norm_before_residual"] is True
    assert vocab == standins.WORD_COUNT and config["vocab_size"] == len(standins.VOCABULARY)
    assert tensors["fc.weight"].shape == (hidden, 3 * hidden)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (hidden, 2 * hidden)
    assert tensors["lm_head.weight"].shape == (vocab, hidden)
    assert tensors["d2t"].dtype == np.int64 and tensors["d2t"].shape == (vocab,)
    assert int(tensors["t2d"].sum()) == vocab and not tensors["t2d"][: standins.FIRST_WORD_ID].any()
    assert not tensors["midlayer.hidden_norm.weight"].any()   # the target's hidden states are dropped
    assert "embed_tokens.weight" not in tensors                # vLLM shares the target's
    # Each position attends to itself: over 25 above any other word in every head (softmax leak < 2048 e^-25).
    assert standins.attention_margin(tensors) > 20


def test_agreed_words_are_spread_along_the_cycle() -> None:
    cycle = standins.target_cycle(PREDICTABLE)
    agreed = standins.agreed_ids(0.5)
    assert [word in agreed for word in cycle[:6]] == [False, True, False, True, False, True]


def test_agreement_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        standins.agreed_ids(1.5)


def test_layers_add_nothing_and_weights_have_llama_names() -> None:
    tensors = standins.model_tensors(StandinSpec("target", 1.0, 30.0, 12))
    config = standins.model_config(standins.TARGET_LAYERS)
    for layer in range(standins.TARGET_LAYERS):
        assert not tensors[f"model.layers.{layer}.self_attn.o_proj.weight"].any()
        assert not tensors[f"model.layers.{layer}.mlp.down_proj.weight"].any()
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], config["hidden_size"])
    assert tensors["lm_head.weight"].shape == (config["vocab_size"], config["hidden_size"])
    assert f"model.layers.{standins.TARGET_LAYERS}.mlp.up_proj.weight" not in tensors


def test_config_is_a_small_llama_with_cpu_attention_head_dim() -> None:
    config = standins.model_config(2)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2
    assert config["head_dim"] == 64  # CPU attention refuses 16
    assert config["num_attention_heads"] * config["head_dim"] == config["hidden_size"] == 256
    assert config["vocab_size"] == len(standins.SPECIAL_TOKENS) + 512
    assert config["tie_word_embeddings"] is False


def test_tokenizer_round_trips_the_words() -> None:
    tokenizer = standins.tokenizer()
    text = " ".join(standins.WORDS)
    ids = tokenizer.encode(text).ids
    assert ids == [standins.token_id(word) for word in standins.WORDS]
    assert tokenizer.decode(ids) == text
    assert tokenizer.token_to_id(standins.EOS) == standins.model_config(1)["eos_token_id"]


def test_prompt_words_come_from_their_half_and_repeat_with_the_seed() -> None:
    words = standins.prompt_words(UNPREDICTABLE, length=20, seed=3)
    assert len(words) == 20
    assert set(words) <= set(standins.half_words(UNPREDICTABLE))
    assert words == standins.prompt_words(UNPREDICTABLE, length=20, seed=3)


def test_ensure_standin_writes_eagle_heads(tmp_path: Path) -> None:
    for kind in ("eagle", "eagle3"):
        directory = standins.ensure_standin(kind, kind, agreement=0.5, root=tmp_path)
        weights = load_file(str(directory / "model.safetensors"))
        assert set(weights) == set(standins.model_tensors(StandinSpec(kind, 0.5, 30.0, 12)))
        assert json.loads((directory / "config.json").read_text()) == standins.head_config(kind)
        assert json.loads((directory / "standin.json").read_text())["agreement"] == 0.5
    with pytest.raises(ValueError, match="not an EAGLE head"):
        standins.head_config("draft")


def test_ensure_standin_writes_a_loadable_model_once(tmp_path: Path) -> None:
    directory = standins.ensure_standin("draft", "draft", agreement=0.5, root=tmp_path)
    assert {p.name for p in directory.iterdir()} >= {"config.json", "tokenizer.json", "tokenizer_config.json",
                                                     "model.safetensors"}
    assert json.loads((directory / "config.json").read_text())["num_hidden_layers"] == 1
    assert Tokenizer.from_file(str(directory / "tokenizer.json")).encode("w3 w300").ids == [6, 303]
    written = (directory / "model.safetensors").stat().st_mtime_ns
    assert standins.ensure_standin("draft", "draft", agreement=0.5, root=tmp_path) == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == written
    weights = load_file(str(directory / "model.safetensors"))
    assert set(weights) == set(standins.model_tensors(StandinSpec("draft", 0.5, 30.0, 12)))
    standins.ensure_standin("draft", "draft", agreement=1.0, root=tmp_path)  # other parameters: regenerated
    assert (directory / "model.safetensors").stat().st_mtime_ns != written
    assert [p.name for p in tmp_path.iterdir()] == ["draft"]


def test_vllm_requirements_drop_the_torch_family_and_pin_pypi_torch() -> None:
    requires = [
        "numpy",
        'torch==2.13.0+cpu; platform_machine == "x86_64"',
        'torchvision; platform_machine != "riscv64"',
        'six>=1.16.0; python_version > "3.99"',
        'pandas; extra == "bench"',
        "transformers<5.20.0,>=5.16.1",
    ]
    assert vllm_env.runtime_requirements(requires, torch="2.13.0") == [
        "torch==2.13.0", "numpy", "transformers<5.20.0,>=5.16.1"]


def test_cpu_environment_is_offline_and_sizes_the_kv_cache() -> None:
    env = vllm_env.cpu_environment(kv_cache_gib=2, threads=1)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["OMP_NUM_THREADS"] == "1"
    with pytest.raises(ValueError, match="at least 1"):
        vllm_env.cpu_environment(kv_cache_gib=0)


def test_version_shim_carries_the_cpu_suffix_vllm_looks_for() -> None:
    assert "Name: vllm\nVersion: 0.32.0+cpu\n" in vllm_env.version_shim_metadata("0.32.0")


def test_repeating_prompt_walks_the_target_cycle_and_returns_to_its_start() -> None:
    words = standins.repeating_prompt_words(PREDICTABLE, length=10, seed=4)
    successors = standins.target_successors()
    ids = [standins.token_id(word) for word in words]
    assert all(successors[a] == b for a, b in zip(ids[:9], ids[1:10], strict=True))
    assert words[10:] == words[:2]
