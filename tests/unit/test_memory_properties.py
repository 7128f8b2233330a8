"""Properties of the memory plan over generated deployments of catalog models on realistic GPUs.

The space: GPUs of 16 to 200 GiB used at 0.5 to 0.95, TP 1 to 8, any quantisation and engine, context
and batch limits from small to the model's maximum. (Below that — a 0.3 GiB model on a GPU whose
budget barely covers the sampler — one more TP rank's NCCL buffers can cost more than its weights
save, and "more TP never hurts" stops being true of real engines too.)
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import MemoryPlan, Verdict
from specdeploy.planning.catalog import CATALOG, resolve_draft, resolve_target
from specdeploy.planning.memory import plan_memory
from specdeploy.planning.modelinfo import ModelKind

GIB = 2**30

TARGETS = sorted(name for name, model in CATALOG.items() if model.kind == ModelKind.BASE)
DRAFTS_FOR = {
    name: sorted(
        other for other, candidate in CATALOG.items()
        if candidate.kind == ModelKind.BASE and candidate.family == model.family
        and candidate.architecture.vocab_size == model.architecture.vocab_size
        and candidate.architecture.num_parameters < model.architecture.num_parameters
    )
    for name, model in CATALOG.items() if model.kind == ModelKind.BASE
}
HEADS_FOR = {
    target: sorted(name for name, head in CATALOG.items() if target in head.targets) for target in TARGETS
}


@st.composite
def deployments(draw: st.DrawFn) -> dict[str, Any]:
    target = draw(st.sampled_from(TARGETS))
    arch = CATALOG[target].architecture
    options = ["ngram"]
    if DRAFTS_FOR[target]:
        options.append("draft_model")
    if HEADS_FOR[target]:
        options.append("eagle3")
    if arch.num_nextn_predict_layers:
        options.append("mtp")
    method = draw(st.sampled_from(options))
    speculation: dict[str, Any] = {"method": method, "numSpeculativeTokens": draw(st.integers(1, 8))}
    if method == "draft_model":
        speculation["draft"] = {"name": draw(st.sampled_from(DRAFTS_FOR[target])),
                                "quantization": draw(st.sampled_from(["none", "fp8"]))}
    elif method == "eagle3":
        speculation["draft"] = {"name": draw(st.sampled_from([h for h in HEADS_FOR[target]
                                                               if CATALOG[h].kind == ModelKind.EAGLE3]))}
    engine = draw(st.sampled_from(["vllm", "sglang", "trtllm"]))
    memory = draw(st.floats(16, 200))
    max_num_seqs = draw(st.integers(1, 1024))
    serving: dict[str, Any] = {
        "maxModelLen": draw(st.integers(256, arch.max_position_embeddings)),
        "maxNumSeqs": max_num_seqs,
        "maxNumBatchedTokens": draw(st.integers(max(max_num_seqs, 256), 16384)),
        "kvCacheDtype": draw(st.sampled_from(["auto", "fp8"])),
    }
    if engine == "vllm" and draw(st.booleans()):
        serving["kvCacheMemoryGiB"] = draw(st.floats(1, 0.4 * memory))
    return {
        "engine": {"kind": engine},
        "model": {"name": target, "quantization": draw(st.sampled_from(["none", "fp8", "int8", "awq", "int4"]))},
        "speculation": speculation,
        "resources": {
            "gpu": {"memoryGiB": memory},
            "tensorParallelSize": draw(st.sampled_from([1, 2, 4, 8])),
            "gpuMemoryUtilization": draw(st.floats(0.5, 0.95)),
        },
        "serving": serving,
    }


def plan(document: dict[str, Any], speculate: bool = True) -> MemoryPlan:
    spec = SpeculativeDeploymentSpec.model_validate(document)
    return plan_memory(spec, resolve_target(spec), resolve_draft(spec), speculate=speculate)


def changed(document: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    return {**document, section: {**document[section], **values}}


PROPERTY = settings(max_examples=150, deadline=None)


@PROPERTY
@given(deployments(), st.floats(1.0, 4.0))
def test_more_gpu_memory_never_turns_a_fit_into_a_rejection(document: dict[str, Any], factor: float) -> None:
    before = plan(document)
    gpu = document["resources"]["gpu"]
    after = plan(changed(document, "resources", gpu={**gpu, "memoryGiB": gpu["memoryGiB"] * factor}))
    assert not before.fits or after.fits


@PROPERTY
@given(deployments(), st.sampled_from([2, 4, 8]))
def test_a_larger_tensor_parallel_size_never_turns_a_fit_into_a_rejection(
    document: dict[str, Any], factor: int
) -> None:
    before = plan(document)
    after = plan(changed(document, "resources", tensorParallelSize=document["resources"]["tensorParallelSize"] * factor))
    assert not before.fits or after.fits


@PROPERTY
@given(deployments())
def test_adding_a_draft_never_increases_kv_tokens(document: dict[str, Any]) -> None:
    with_draft = plan(document)
    plain = plan(document, speculate=False)
    # Rounding capture sizes up to multiples of 1 + k merges some of them, so speculation can capture a few
    # CUDA graphs fewer than plain decoding (vLLM CudaGraphManager); only that memory may come back as KV
    # cache (0.001: the status rounds GiB to 3 decimals; 16: one block).
    freed = plain.per_gpu.cuda_graph_gib - with_draft.per_gpu.cuda_graph_gib
    slack = (freed + 0.001) * GIB / with_draft.kv_bytes_per_token + 16 if freed > 0 else 0
    assert with_draft.kv_cache_tokens <= plain.kv_cache_tokens + slack
    if "draft" in document["speculation"] or document["speculation"]["method"] == "mtp":
        ngram = changed(document, "speculation", method="ngram")
        ngram["speculation"].pop("draft", None)
        assert with_draft.kv_cache_tokens <= plan(ngram).kv_cache_tokens


@PROPERTY
@given(deployments())
def test_tokens_never_exceed_the_budget_over_bytes_per_token(document: dict[str, Any]) -> None:
    memory = plan(document)
    assert memory.kv_bytes_per_token > 0
    # budgetGiB is rounded to 3 decimals in the status; allow that rounding.
    assert memory.kv_cache_tokens <= (memory.per_gpu.budget_gib + 0.001) * GIB / memory.kv_bytes_per_token
    assert memory.kv_cache_tokens % 16 == 0


@PROPERTY
@given(deployments())
def test_every_rejection_carries_a_reason_and_a_suggestion(document: dict[str, Any]) -> None:
    memory = plan(document)
    assert memory.fits == (memory.verdict != Verdict.REJECTED)
    if memory.fits:
        assert memory.kv_cache_tokens >= memory.max_model_len
        assert not memory.suggestions
    else:
        assert memory.reasons and memory.suggestions
        assert any(reason.severity == "Error" for reason in memory.reasons)
