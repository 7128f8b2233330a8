"""What the simulator serves: the models behind a command line, how long a step takes, what is accepted.

    served = served_model(config, find_gpu("H100-80GB"))
    served.timing.step_seconds(StepShape(decode_seqs=8, verify_tokens=4, decode_kv_tokens=8 * 900))
    alpha_at(served.default_acceptance_rate, served.k, temperature=0.7)

Step times come from the simulator's hardware profile (sim/hardware.py: a measured H100 table, scaled), not
from the planner: one forward pass over every decoding sequence's verify tokens plus the prefill chunks
scheduled with them (vLLM V1 and SGLang batch both into one pass), then k drafting passes. Acceptance is Leviathan's: each drafted token is accepted with
probability α, independently, until the first rejection. See docs/simulator.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from specdeploy.api.spec import (
    BLOCK_METHODS,
    METHODS_WITH_DRAFT,
    NGRAM_METHODS,
    KvCacheDtype,
    Method,
    SpeculativeDeploymentSpec,
)
from specdeploy.api.units import GIB
from specdeploy.planning.acceptance import (
    acceptance_rate_from_alpha,
    alpha_from_acceptance_rate,
    default_alpha,
)
from specdeploy.planning.catalog import CATALOG, UnknownModel, resolve_draft, resolve_target
from specdeploy.planning.gpus import GpuProduct
from specdeploy.planning.memory import plan_memory
from specdeploy.planning.modelinfo import ModelInfo, ModelKind, drafter_kind
from specdeploy.planning.weights import block_drafter_parameters
from specdeploy_engine.sim.argv import EngineConfig
from specdeploy_engine.sim.engines import SIMULATED_ENGINES
from specdeploy_engine.sim.hardware import (
    DRAFT_PASS_OVERHEAD_S,
    ENGINE_STEP_OVERHEAD_S,
    PassCost,
    model_shape,
    pass_cost,
)

# α at temperature T is α(0)·exp(−TEMPERATURE_ALPHA_DECAY·T): 15% lower at T=1, 27% lower at T=2. The
# direction is reported (foundation-model-stack/fms-extras issue #12: "as temperature increases, acceptance
# rates go down"; ml-explore/mlx-lm PR #1709: speculation "loses most of its speedup as soon as sampling is
# turned on"); the size is an assumption, not a measurement. The `acceptance` knob sets the rate at T=0.
TEMPERATURE_ALPHA_DECAY = 0.16
# An EAGLE-3 head's reduced draft vocabulary (yuhuili/EAGLE3-* and RedHatAI speculators: 32000 rows).
EAGLE3_DRAFT_VOCAB = 32000
# A DFlash drafter the catalog lacks: 5 decoder layers reading 5 target layers (z-lab's Qwen3 DFlash drafters:
# num_hidden_layers 5, dflash_config.target_layer_ids of five layers); DSpark's Markov head rank 256 (DeepSeek-V4's
# dspark_markov_rank, and Qwen3 DSpark drafters' markov_rank).
BLOCK_DRAFTER_LAYERS = 5
DSPARK_MARKOV_RANK = 256


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes."""

    decode_seqs: int = 0              # sequences producing tokens this step
    verify_tokens: int = 1            # tokens each of them feeds the target: 1, or k + 1 when speculating
    decode_kv_tokens: int = 0         # Σ cached tokens they read (full-attention layers)
    decode_window_kv_tokens: int = 0  # Σ min(window, cached) for sliding-window layers
    prefill_tokens: int = 0           # prompt tokens of the prefill chunks in the same pass
    prefill_kv_tokens: int = 0        # cached tokens those chunks read (their earlier chunks)
    prefill_attention_pairs: int = 0  # Σ chunk × (earlier chunks + chunk/2): the chunks' attention work
    drafting_seqs: int = 0            # sequences the drafter proposes for (decoding + finishing prefill)
    draft_passes: int | None = None   # drafting passes (tokens proposed per sequence); None: the model's k


@dataclass(frozen=True)
class TimingModel:
    """Seconds per engine step for a target, an optional drafter and k, on the simulated hardware."""

    target: PassCost
    draft: PassCost | None
    gpu: GpuProduct
    num_speculative_tokens: int = 0            # 0: no speculation
    step_overhead_s: float = ENGINE_STEP_OVERHEAD_S
    draft_pass_overhead_s: float = DRAFT_PASS_OVERHEAD_S
    parallel_drafting: bool = False      # DFlash, DSpark: one pass over k + 1 query tokens drafts all k
    sequential_selections: bool = False  # DSpark: the k tokens are then picked one by one (its Markov head)

    def step_seconds(self, shape: StepShape) -> float:
        """The target pass over decode and prefill tokens, then k drafting passes (the first one also
        reads the prefill chunks, as a draft model or EAGLE head must see the prompt); a k schedule gives
        the step's own number of passes (shape.draft_passes). A block drafter makes one pass instead, over
        k + 1 query tokens per sequence (the bonus token and k mask tokens) and the prefill chunks."""
        tokens = shape.decode_seqs * shape.verify_tokens + shape.prefill_tokens
        if tokens == 0:
            return 0.0
        pairs = shape.verify_tokens * shape.decode_kv_tokens + shape.prefill_attention_pairs
        seconds = self.target.seconds(
            tokens=tokens, tokens_per_sequence=shape.verify_tokens,
            kv_tokens=shape.decode_kv_tokens + shape.prefill_kv_tokens,
            window_kv_tokens=shape.decode_window_kv_tokens, attention_pairs=pairs,
        ) + self.step_overhead_s
        k = self.num_speculative_tokens if shape.draft_passes is None else shape.draft_passes
        if k and shape.drafting_seqs and self.draft is not None and self.parallel_drafting:
            block = self.draft.seconds(tokens=shape.drafting_seqs * (k + 1) + shape.prefill_tokens,
                                       tokens_per_sequence=k + 1,
                                       kv_tokens=shape.decode_kv_tokens + shape.prefill_kv_tokens,
                                       attention_pairs=(k + 1) * shape.decode_kv_tokens + shape.prefill_attention_pairs)
            seconds += block + (k if self.sequential_selections else 1) * self.draft_pass_overhead_s
        elif k and shape.drafting_seqs and self.draft is not None:
            one = self.draft.seconds(tokens=shape.drafting_seqs, kv_tokens=shape.decode_kv_tokens)
            first = self.draft.seconds(tokens=shape.drafting_seqs + shape.prefill_tokens,
                                       kv_tokens=shape.decode_kv_tokens + shape.prefill_kv_tokens,
                                       attention_pairs=shape.decode_kv_tokens + shape.prefill_attention_pairs)
            seconds += first + (k - 1) * one + k * self.draft_pass_overhead_s
        return seconds


def timing_model(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None, gpu: GpuProduct,
                 k: int) -> TimingModel:
    """The target's and the drafter's passes for `spec` on `gpu` (docs/simulator.md, "Hardware profile"):
    n-gram and suffix draft for free (ngram on the CPU; ngram_gpu's matching is not timed either); MTP (or a method
    without a draft model) runs one more decoder layer of the target with its lm_head; an EAGLE-1 head reads the
    target's lm_head each pass; a DFlash or DSpark drafter makes one pass over the block with the target's
    lm_head."""
    tp = spec.resources.tensor_parallel_size
    kv_bytes = 2.0 if spec.serving.kv_cache_dtype == KvCacheDtype.AUTO else 1.0
    quantization = spec.model.quantization
    target_pass = pass_cost(model_shape(target, tensor_parallel_size=tp, quantization=quantization,
                                        kv_element_bytes=kv_bytes), gpu)
    method = spec.speculation.method
    draft_spec = spec.speculation.draft
    drafter: PassCost | None = None
    if k == 0 or method in (*NGRAM_METHODS, Method.SUFFIX):
        drafter = None
    elif method in BLOCK_METHODS and draft is not None:
        # Its own layers (DSpark's Markov and confidence heads in its parameters) and the target's lm_head.
        draft_tp = draft_spec.tensor_parallel_size if draft_spec and draft_spec.tensor_parallel_size else tp
        draft_quantization = draft_spec.quantization if draft_spec is not None else quantization
        drafter = pass_cost(model_shape(draft, tensor_parallel_size=draft_tp, quantization=draft_quantization,
                                        kv_element_bytes=kv_bytes,
                                        extra_parameters=target.architecture.vocab_size * target.architecture.hidden_size,
                                        counts_input_embedding=False), gpu)
        return TimingModel(target_pass, drafter, gpu, k, parallel_drafting=True,
                           sequential_selections=method == Method.DSPARK)
    elif method == Method.MTP or draft is None:
        arch = target.architecture
        embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
        layer = (arch.num_parameters - embeddings) / arch.num_layers
        drafter = pass_cost(model_shape(target, tensor_parallel_size=tp, quantization=quantization,
                                        kv_element_bytes=kv_bytes, layers=1,
                                        parameters=layer + arch.vocab_size * arch.hidden_size), gpu)
    else:
        draft_tp = draft_spec.tensor_parallel_size if draft_spec and draft_spec.tensor_parallel_size else tp
        draft_quantization = draft_spec.quantization if draft_spec is not None else quantization
        borrowed = target.architecture.vocab_size * target.architecture.hidden_size if draft.kind == ModelKind.EAGLE else 0
        drafter = pass_cost(model_shape(draft, tensor_parallel_size=draft_tp, quantization=draft_quantization,
                                        kv_element_bytes=kv_bytes, extra_parameters=borrowed,
                                        counts_input_embedding=method == Method.DRAFT_MODEL), gpu)
    return TimingModel(target_pass, drafter, gpu, k)


@lru_cache(maxsize=4096)
def _alpha_for_rate(rate: float, k: int) -> float:
    return alpha_from_acceptance_rate(rate, k)


def alpha_at(acceptance_rate: float, k: int, temperature: float = 0.0) -> float:
    """Leviathan's α for a vLLM acceptance rate (accepted ÷ drafted at `k`, greedy) at `temperature`."""
    rate = min(1.0, max(0.0, round(acceptance_rate, 4)))
    return _alpha_for_rate(rate, k) * math.exp(-TEMPERATURE_ALPHA_DECAY * max(0.0, temperature))


@dataclass(frozen=True)
class ServedModel:
    """Everything the engine core needs about what it serves."""

    config: EngineConfig
    target: ModelInfo
    draft: ModelInfo | None
    gpu: GpuProduct
    timing: TimingModel
    max_model_len: int
    kv_cache_tokens: int | None                # None: unknown, not a limit
    default_acceptance_rate: float | None      # vLLM rate at k for greedy requests; None without speculation
    startup_error: str | None = None           # what the engine prints when the memory plan does not fit
    notes: tuple[str, ...] = field(default=())  # assumptions made (unknown models)

    @property
    def k(self) -> int:
        """Tokens drafted per sequence per step; 0 without speculation."""
        return self.timing.num_speculative_tokens

    @property
    def verify_tokens(self) -> int:
        speculation = self.config.speculation
        return speculation.verify_tokens if speculation is not None else 1


_SIZE_IN_NAME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


def _size_from_name(name: str) -> float | None:
    """The parameter count a name announces ("Llama-3.1-70B" -> 70e9), or None."""
    found = _SIZE_IN_NAME.findall(name.replace("_", "-").replace("/", "-"))
    return float(found[-1]) * 1e9 if found else None


def _nearest_catalog_model(name: str, fallback: str) -> tuple[ModelInfo, str]:
    """A catalog base model of about the size the name announces, for a model the catalog lacks."""
    size = _size_from_name(name)
    bases = [model for model in CATALOG.values() if model.kind == ModelKind.BASE]
    if size is None:
        chosen = CATALOG[fallback]
    else:
        chosen = min(bases, key=lambda model: abs(math.log(model.architecture.num_parameters / size)))
    note = f"{name} is not in the catalog; timed as {chosen.name} ({chosen.architecture.num_parameters / 1e9:.1f}B)"
    return replace(chosen, name=name), note


def eagle_head_for(target: ModelInfo, name: str, kind: ModelKind) -> ModelInfo:
    """An EAGLE head of `target`'s shape, for a head the catalog lacks: one decoder layer of the target,
    plus (EAGLE-3) the fc that fuses three hidden states and a 32000-row lm_head."""
    arch = target.architecture
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    layer = (arch.num_parameters - embeddings) / arch.num_layers
    extra = 3 * arch.hidden_size**2 + EAGLE3_DRAFT_VOCAB * arch.hidden_size if kind == ModelKind.EAGLE3 else 0
    head_arch = arch.model_copy(update={"num_layers": 1, "num_parameters": int(layer + extra)})
    return ModelInfo(name=name, architecture=head_arch, kind=kind, family=target.family, targets=(target.name,),
                     draft_vocab_size=EAGLE3_DRAFT_VOCAB if kind == ModelKind.EAGLE3 else None)


def block_drafter_for(target: ModelInfo, name: str, kind: ModelKind) -> ModelInfo:
    """A DFlash (or DSpark) drafter of `target`'s shape, for one the catalog lacks: BLOCK_DRAFTER_LAYERS decoder
    layers of the target reading as many of its layers' hidden states (and, for DSpark, a Markov head of rank
    DSPARK_MARKOV_RANK over the target's vocabulary)."""
    arch = target.architecture
    drafter_arch = arch.model_copy(update={"num_layers": BLOCK_DRAFTER_LAYERS, "sliding_window": None,
                                           "sliding_window_layers": None, "num_nextn_predict_layers": 0})
    rank = DSPARK_MARKOV_RANK if kind == ModelKind.DSPARK else 0
    parameters = block_drafter_parameters(drafter_arch, BLOCK_DRAFTER_LAYERS, rank)
    return ModelInfo(name=name, architecture=drafter_arch.model_copy(update={"num_parameters": parameters}),
                     kind=kind, family=target.family, targets=(target.name,))


def spec_for(config: EngineConfig, gpu: GpuProduct) -> SpeculativeDeploymentSpec:
    """The SpeculativeDeployment spec this command line would have been rendered from (as far as the
    planner cares: models, quantisation, parallelism, memory and scheduler limits)."""
    speculation: dict[str, Any] = {"enabled": False, "method": Method.NGRAM.value}
    if config.speculation is not None:
        s = config.speculation
        speculation = {"method": s.method.value, "numSpeculativeTokens": min(16, s.num_speculative_tokens)}
        if s.draft_model and s.method in METHODS_WITH_DRAFT:
            draft: dict[str, Any] = {"name": s.draft_model, "quantization": s.draft_quantization.value}
            if s.draft_tensor_parallel_size:
                draft["tensorParallelSize"] = s.draft_tensor_parallel_size
            speculation["draft"] = draft
    seqs = max(1, config.max_num_seqs)
    return SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": config.kind.value},
        "model": {"name": config.model, "quantization": config.quantization.value},
        "speculation": speculation,
        "resources": {
            "tensorParallelSize": config.tensor_parallel_size,
            "pipelineParallelSize": config.pipeline_parallel_size,
            "gpu": {"product": gpu.name, "count": config.tensor_parallel_size},
            "gpuMemoryUtilization": min(1.0, max(0.01, config.gpu_memory_utilization)),
        },
        "serving": {
            "maxModelLen": config.max_model_len,
            "maxNumSeqs": seqs,
            "maxNumBatchedTokens": max(seqs, config.max_num_batched_tokens),
            "kvCacheDtype": config.kv_cache_dtype.value,
            "kvCacheMemoryGiB": config.kv_cache_memory_bytes / GIB if config.kv_cache_memory_bytes else None,
        },
    })


def _resolve(spec: SpeculativeDeploymentSpec) -> tuple[ModelInfo, ModelInfo | None, list[str]]:
    notes: list[str] = []
    try:
        target = resolve_target(spec)
    except UnknownModel:
        target, note = _nearest_catalog_model(spec.model.name, "meta-llama/Llama-3.1-8B-Instruct")
        notes.append(note)
    try:
        draft = resolve_draft(spec)
    except UnknownModel:
        assert spec.speculation.draft is not None
        name = spec.speculation.draft.name
        if spec.speculation.method == Method.DRAFT_MODEL:
            draft, note = _nearest_catalog_model(name, "Qwen/Qwen3-0.6B")
            notes.append(note)
        elif spec.speculation.method in BLOCK_METHODS:
            draft = block_drafter_for(target, name, drafter_kind(spec.speculation.method))
            notes.append(f"{name} is not in the catalog; timed as a {draft.kind.value} drafter of "
                         f"{BLOCK_DRAFTER_LAYERS} layers of {target.name}'s shape "
                         f"({draft.architecture.num_parameters / 1e9:.2f}B)")
        else:
            kind = ModelKind.EAGLE3 if spec.speculation.method == Method.EAGLE3 else ModelKind.EAGLE
            draft = eagle_head_for(target, name, kind)
            notes.append(f"{name} is not in the catalog; timed as an EAGLE head of {target.name}'s shape "
                         f"({draft.architecture.num_parameters / 1e9:.2f}B)")
    return target, draft, notes


def _startup_error(config: EngineConfig, kv_cache_tokens: int, max_model_len: int, weights_fit: bool) -> str:
    """What vLLM prints when the memory plan does not fit (vllm/v1/core/kv_cache_utils.py wording)."""
    if not weights_fit:
        return ("torch.OutOfMemoryError: CUDA out of memory while loading the model weights: the weights of "
                f"{config.model} do not fit in the GPU memory the engine may use.")
    return (f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"the KV cache needs {max_model_len} tokens, which is larger than the available KV cache "
            f"({kv_cache_tokens} tokens). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine.")


def served_model(config: EngineConfig, gpu: GpuProduct) -> ServedModel:
    """Resolve the models of `config`, time them on `gpu`, and size the KV cache with the memory planner."""
    spec = spec_for(config, gpu)
    target, draft, notes = _resolve(spec)
    speculating = config.speculation is not None
    k = config.speculation.num_speculative_tokens if config.speculation is not None else 0
    timing = timing_model(spec, target, draft, gpu, k)
    max_model_len = config.max_model_len or target.architecture.max_position_embeddings
    memory = plan_memory(spec, target, draft, speculate=speculating)
    kv_tokens = memory.kv_cache_tokens if memory.kv_cache_tokens and memory.kv_cache_tokens > 0 else None
    startup_error = None
    codes = {reason.code for reason in memory.reasons}
    if "WeightsDoNotFit" in codes:
        startup_error = _startup_error(config, 0, max_model_len, weights_fit=False)
    elif "KVCacheTooSmall" in codes and not SIMULATED_ENGINES[config.kind].sizes_kv_after_loading:
        # An engine that sizes its cache after loading (TensorRT-LLM) is refused only when the weights do not fit.
        startup_error = _startup_error(config, memory.kv_cache_tokens or 0, max_model_len, weights_fit=True)
    rate = None
    if config.speculation is not None:
        s = config.speculation
        alpha = default_alpha(
            s.method, k, target_quantization=spec.model.quantization, draft_quantization=s.draft_quantization,
            mtp_layers=target.architecture.num_nextn_predict_layers,
        )
        rate = acceptance_rate_from_alpha(alpha, k)
    return ServedModel(
        config=config, target=target, draft=draft, gpu=gpu, timing=timing, max_model_len=max_model_len,
        kv_cache_tokens=kv_tokens, default_acceptance_rate=rate, startup_error=startup_error,
        notes=config.notes + tuple(notes),
    )
