"""The plan's predictions beside published end-to-end measurements (docs/speedup-model.md, "The plan beside
published end-to-end measurements").

The model's stated interval is ±10% of its prediction at the acceptance a measurement ran at: its error against the
measured H100 table at the schedule's own k (tests/unit/test_step_cost_table.py). Each comparison below is either
inside that interval or outside it with its explanation written beside it; each prediction is pinned (±3%), so a
model change that moves one shows here and in the document together.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.planning.acceptance import alpha_from_acceptance_length
from specdeploy.planning.catalog import lookup
from specdeploy.planning.catalog_entries import _eagle3_head
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.hf_config import architecture_from_hf_config
from specdeploy.planning.modelinfo import ModelInfo, ModelKind
from specdeploy.planning.schedule import schedule_cost
from specdeploy.planning.speedup import SpeculationCost, speculation_breakeven_batch_size

MODEL_INTERVAL = 0.10
PINNED = 0.03
H100, H200 = find_gpu("H100-80GB"), find_gpu("H200")
LLAMA_8B, EAGLE3_8B = lookup("meta-llama/Llama-3.1-8B-Instruct"), lookup("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
QWEN3_32B = lookup("Qwen/Qwen3-32B")
# The EAGLE-3 speculator llm-d #2074 served is not in the catalog: one EAGLE-3 decoder layer at Qwen3-32B's width.
QWEN3_32B_EAGLE3 = ModelInfo("RedHatAI/Qwen3-32B-speculator.eagle3",
                             architecture_from_hf_config(_eagle3_head(5120, 25600, 64, 151936, 40960)),
                             kind=ModelKind.EAGLE3, family="qwen3", draft_vocab_size=32000)
# vLLM issue #26191: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, MT-Bench, T=0, mean acceptance length 3.53 at k 7.
EAGLE3_8B_ALPHA = alpha_from_acceptance_length(3.53, 7)


def eagle3_cost(target: ModelInfo | None, head: ModelInfo | None, k: int, *, engine: str = "vllm", tp: int = 1,
                gpu: str = "H100-80GB", context_tokens: int, **speculation: Any) -> SpeculationCost:
    assert target is not None and head is not None
    spec = SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": engine}, "model": {"name": target.name},
        "speculation": {"method": "eagle3", "numSpeculativeTokens": k, "draft": {"name": head.name}, **speculation},
        "resources": {"tensorParallelSize": tp, "gpu": {"product": gpu}}, "serving": {"maxNumSeqs": 256},
    })
    return schedule_cost(spec, target, head, find_gpu(gpu), context_tokens=context_tokens)


def within_model_interval(predicted: float, measured: float) -> bool:
    return abs(predicted - measured) <= MODEL_INTERVAL * predicted


def test_eagle3_paper_sglang_batch_1_is_inside_the_interval() -> None:
    # SGLang docs: Llama-3.1-8B + EAGLE-3, one H100, batch 1: 158.34 → 373.25 tok/s = 2.36× (5 steps). MT-Bench
    # turns: 512 cached tokens.
    cost = eagle3_cost(LLAMA_8B, EAGLE3_8B, 5, engine="sglang", context_tokens=512)
    predicted = cost.speedup(1, EAGLE3_8B_ALPHA, 5)
    assert predicted == pytest.approx(2.26, rel=PINNED)
    assert within_model_interval(predicted, 2.36)


def test_eagle3_paper_sglang_batch_64_is_outside_by_a_per_step_cost_the_model_does_not_hold() -> None:
    # EAGLE-3 paper (arXiv:2503.01840), SGLang on an H100, Llama-3.1-8B, batch 64: 1.38×, k 3. Predicted 1.78× at
    # the head's measured acceptance: outside. SGLang ran speculation without its overlap scheduler while the
    # baseline kept it, so every speculative step pays its CPU scheduling in series; about 3 ms more per
    # speculative step at batch 64 reproduces the measurement.
    cost = eagle3_cost(LLAMA_8B, EAGLE3_8B, 3, engine="sglang", context_tokens=512)
    predicted = cost.speedup(64, EAGLE3_8B_ALPHA, 3)
    assert predicted == pytest.approx(1.78, rel=PINNED)
    assert not within_model_interval(predicted, 1.38)
    serial = dataclasses.replace(cost, draft_pass_overhead_s=cost.draft_pass_overhead_s + 1e-3)   # 3 passes: +3 ms
    assert serial.speedup(64, EAGLE3_8B_ALPHA, 3) == pytest.approx(1.38, rel=0.05)


def test_vllm_eagle3_pr_batch_1_is_inside_at_the_acceptance_that_pr_ran_at() -> None:
    # vLLM PR #16937 (EAGLE-3 in V1): 1.65× at k 2, batch 1, Llama-3.1-8B, one H100. The PR states no acceptance;
    # at #26191's later α 0.743 the plan predicts 1.95× (outside); α 0.60 (mean acceptance length 1.96 at k 2),
    # what V1's first EAGLE-3 plausibly reached, reproduces it. The prior does not follow the PR: #26191 is the
    # later, measured acceptance of the same head.
    cost = eagle3_cost(LLAMA_8B, EAGLE3_8B, 2, context_tokens=512)
    assert cost.speedup(1, EAGLE3_8B_ALPHA, 2) == pytest.approx(1.95, rel=PINNED)
    assert not within_model_interval(cost.speedup(1, EAGLE3_8B_ALPHA, 2), 1.65)
    assert within_model_interval(cost.speedup(1, 0.60, 2), 1.65)


def test_llm_d_qwen3_32b_is_outside_and_optimistic_at_load() -> None:
    # llm-d #2074: Qwen3-32B + an EAGLE-3 speculator, 2×H200 (taken as TP 2), ~1.36× at 1 QPS, parity at 2–4 QPS,
    # a loss beyond 4–8 QPS. k and acceptance are not stated (k 3 taken). At the prior α 0.75 the plan predicts
    # 2.41× at batch 1 and a break-even past 256 sequences: outside. 1.36× at batch 1 needs α ≈ 0.35; and the
    # loss at a few QPS is prefill sharing the steps, which the model does not hold (docs/speedup-model.md,
    # "Known limits").
    cost = eagle3_cost(QWEN3_32B, QWEN3_32B_EAGLE3, 3, tp=2, gpu="H200", context_tokens=1024)
    predicted = cost.speedup(1, 0.75, 3)
    assert predicted == pytest.approx(2.41, rel=PINNED)
    assert not within_model_interval(predicted, 1.36)
    assert within_model_interval(cost.speedup(1, 0.35, 3), 1.36)
    breakeven = speculation_breakeven_batch_size(cost, 0.75, 3, 512)
    assert breakeven is not None and breakeven > 256


def test_an_sglang_tree_is_priced_at_the_tokens_it_verifies() -> None:
    # The case: eagleTopk 8 at 5 steps verifies 41 tokens per sequence, 1,312 at batch 32. Priced as a chain
    # of 5 the plan said 2.35×; the tree's verify pass and its 8-wide drafting passes make it a loss there, with the
    # tree credited with its top-1 chain's acceptance (a lower bound).
    tree = eagle3_cost(LLAMA_8B, EAGLE3_8B, 5, engine="sglang", context_tokens=1024, eagleTopk=8)
    chain = eagle3_cost(LLAMA_8B, EAGLE3_8B, 5, engine="sglang", context_tokens=1024)
    assert tree.verified_tokens(5) == 41 and chain.verified_tokens(5) == 6
    assert tree.speedup(32, 0.75, 5) == pytest.approx(0.66, rel=PINNED)
    assert chain.speedup(32, 0.75, 5) > 2.0
    smaller = eagle3_cost(LLAMA_8B, EAGLE3_8B, 5, engine="sglang", context_tokens=1024, eagleTopk=8, numDraftTokens=32)
    assert smaller.verified_tokens(5) == 32 and tree.speedup(32, 0.75, 5) < smaller.speedup(32, 0.75, 5)
