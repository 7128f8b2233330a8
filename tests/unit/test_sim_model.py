"""The simulator's timing and acceptance model: its hardware profile's passes put together into mixed steps,
and the models behind a command line."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.spec import Method
from specdeploy.planning.acceptance import DEFAULT_ALPHA, acceptance_rate_from_alpha
from specdeploy.planning.catalog import lookup
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.modelinfo import ModelKind
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.hardware import DRAFT_PASS_OVERHEAD_S, ENGINE_STEP_OVERHEAD_S
from specdeploy_engine.sim.model import (
    TEMPERATURE_ALPHA_DECAY,
    ServedModel,
    StepShape,
    alpha_at,
    eagle_head_for,
    served_model,
)

H100 = find_gpu("H100-80GB")
assert H100 is not None
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def served(*argv: str, gpu: str = "H100-80GB") -> ServedModel:
    product = find_gpu(gpu)
    assert product is not None
    return served_model(parse_engine_argv(list(argv), gpu=product), product)


def test_a_decode_step_is_the_target_pass_then_k_drafting_passes() -> None:
    spec = served("vllm", "serve", LLAMA_8B, "--speculative-config",
                  '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":4}')
    plain = served("vllm", "serve", LLAMA_8B)
    timing = spec.timing
    assert timing.draft is not None and timing.draft.reference.name == "eagle3_8b"
    assert timing.target.reference.name == "llama8b"
    for batch in (1, 16, 256):
        shape = StepShape(decode_seqs=batch, verify_tokens=5, decode_kv_tokens=batch * 1024, drafting_seqs=batch)
        target = timing.target.seconds(tokens=batch * 5, tokens_per_sequence=5, kv_tokens=batch * 1024)
        draft = timing.draft.seconds(tokens=batch, kv_tokens=batch * 1024)
        expected = target + ENGINE_STEP_OVERHEAD_S + 4 * (draft + DRAFT_PASS_OVERHEAD_S)
        assert timing.step_seconds(shape) == pytest.approx(expected, rel=1e-9)
        plain_shape = StepShape(decode_seqs=batch, verify_tokens=1, decode_kv_tokens=batch * 1024)
        assert plain.timing.step_seconds(plain_shape) < timing.step_seconds(shape)
    assert plain.timing.draft is None


def test_prefill_tokens_make_a_step_longer_and_an_empty_step_is_free() -> None:
    timing = served("vllm", "serve", LLAMA_8B).timing
    decode_only = timing.step_seconds(StepShape(decode_seqs=8, decode_kv_tokens=8000))
    mixed = timing.step_seconds(StepShape(decode_seqs=8, decode_kv_tokens=8000, prefill_tokens=4096))
    assert mixed > 2 * decode_only
    assert timing.step_seconds(StepShape()) == 0.0


@given(st.floats(0.01, 0.99), st.integers(1, 8), st.floats(0.0, 2.0), st.floats(0.0, 2.0))
def test_alpha_falls_as_temperature_rises(rate: float, k: int, t1: float, t2: float) -> None:
    low, high = sorted((t1, t2))
    assert alpha_at(rate, k, high) <= alpha_at(rate, k, low)
    assert alpha_at(rate, k, 1.0) == pytest.approx(alpha_at(rate, k, 0.0) * math.exp(-TEMPERATURE_ALPHA_DECAY))


@given(st.floats(0.05, 0.95), st.integers(1, 8))
def test_alpha_at_temperature_zero_reproduces_the_vllm_rate(rate: float, k: int) -> None:
    assert acceptance_rate_from_alpha(alpha_at(rate, k, 0.0), k) == pytest.approx(rate, abs=2e-4)


def test_the_default_acceptance_is_the_planner_default() -> None:
    eagle = served("vllm", "serve", LLAMA_8B, "--speculative-config",
                   '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}')
    assert eagle.default_acceptance_rate == pytest.approx(acceptance_rate_from_alpha(DEFAULT_ALPHA[Method.EAGLE3], 3))
    assert served("vllm", "serve", LLAMA_8B).default_acceptance_rate is None


def test_kv_cache_comes_from_the_memory_planner_and_shrinks_with_a_draft() -> None:
    plain = served("vllm", "serve", LLAMA_8B, "--max-model-len", "8192")
    draft = served("vllm", "serve", LLAMA_8B, "--max-model-len", "8192", "--speculative-config",
                   '{"method":"draft_model","model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":4}')
    assert plain.kv_cache_tokens is not None and draft.kv_cache_tokens is not None
    assert 300_000 < draft.kv_cache_tokens < plain.kv_cache_tokens < 600_000
    assert plain.startup_error is None and plain.max_model_len == 8192


def test_a_model_that_does_not_fit_has_the_engines_startup_error() -> None:
    too_big = served("vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192")
    assert too_big.startup_error is not None and "CUDA out of memory" in too_big.startup_error
    long_context = served("vllm", "serve", LLAMA_8B, "--gpu-memory-utilization", "0.25")
    assert long_context.startup_error is not None and "max seq len (131072)" in long_context.startup_error


def test_unknown_models_are_timed_as_their_nearest_catalog_size() -> None:
    model = served("vllm", "serve", "acme/Widget-70B-Chat", "-tp", "4", "--max-model-len", "8192")
    assert model.target.name == "acme/Widget-70B-Chat"
    assert 60e9 < model.target.architecture.num_parameters < 80e9
    assert model.notes and "not in the catalog" in model.notes[0]
    draft = served("vllm", "serve", LLAMA_8B, "--speculative-config",
                   json.dumps({"method": "draft_model", "model": "turboderp/Qwama-0.5B-Instruct",
                               "num_speculative_tokens": 5}))
    assert draft.draft is not None and draft.draft.architecture.num_parameters < 1e9


def test_an_unknown_eagle3_head_takes_its_targets_shape() -> None:
    qwen = lookup("Qwen/Qwen3-32B")
    assert qwen is not None
    head = eagle_head_for(qwen, "RedHatAI/Qwen3-32B-speculator.eagle3", ModelKind.EAGLE3)
    # SpecForge's qwen3-32b-eagle3.json: one layer of hidden 5120, intermediate 25600, a 32000-row lm_head;
    # counted by hand that is about 0.78B parameters with the fused first layer.
    assert head.architecture.num_layers == 1 and head.draft_vocab_size == 32000
    assert 0.6e9 < head.architecture.num_parameters < 0.9e9
    timed = served("vllm", "serve", "Qwen/Qwen3-32B", "-tp", "2", "--speculative-config",
                   '{"method":"eagle3","model":"RedHatAI/Qwen3-32B-speculator.eagle3","num_speculative_tokens":3}',
                   gpu="H200")
    assert timed.draft is not None and timed.draft.kind == ModelKind.EAGLE3


def test_a_fixed_kv_cache_size_is_honoured() -> None:
    fixed = served("vllm", "serve", LLAMA_8B, "--max-model-len", "8192", "--kv-cache-memory-bytes", str(10 * 2**30))
    # Llama-3.1-8B stores 128 KiB per token (32 layers × 2 × 8 KV heads × 128 × 2 bytes): 10 GiB = 81,920.
    assert fixed.kv_cache_tokens == 81920
