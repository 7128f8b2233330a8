"""Will speculation pay, and up to what batch size? Leviathan's model on top of a roofline.

    estimate = estimate_speedup(spec, target, draft, find_gpu("H100-80GB"))
    estimate.speedup_at_batch_1, estimate.breakeven_batch_size, estimate.to_wire()

Leviathan et al. 2023 (arXiv:2211.17192): with acceptance α, k drafted tokens and a draft that costs c
target steps per drafted token, the speedup is

    speedup = (1 − α^(k+1)) / ((1 − α)(k·c + 1))

which assumes verifying k+1 tokens costs one ordinary step. That holds while a step is memory-bound
(small batches) and fails once it is compute-bound: the verify pass then costs k+1 steps and
speculation slows the engine down (vLLM's blog, 2024-10-17: 1.4x-1.8x slower at high QPS). So the
estimate times both kinds of step with planning.roofline at each batch size instead, and reports the
batch size above which the speedup falls below 1. See docs/speedup-model.md.

What the roofline is asked is the SD's own: the verify pass covers the tokens the engine verifies (a draft tree's
`verify_tokens`, not k + 1), every sequence holds the SD's context (`context_tokens_for`, or the pods' measured mean), and the prior acceptance
is the draft's (its size against the target, a quantised target; planning.acceptance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import (
    BLOCK_METHODS,
    NGRAM_METHODS,
    KvCacheDtype,
    Method,
    Quantization,
    SpeculativeDeploymentSpec,
)
from specdeploy.engines import engine_profile
from specdeploy.engines.profile import NoSpeculativeConfig
from specdeploy.planning.acceptance import (
    acceptance_quantization,
    acceptance_rate_from_alpha,
    alpha_from_acceptance_length,
    alpha_from_acceptance_rate,
    default_alpha,
    expected_tokens_per_step,
)
from specdeploy.planning.gpus import GPU_PRODUCTS, GpuProduct
from specdeploy.planning.modelinfo import ModelInfo, ModelKind
from specdeploy.planning.roofline import (
    DEFAULT_CONTEXT_TOKENS,
    ENGINE_STEP_OVERHEAD_S,
    LAYER_OVERHEAD_S,
    ForwardCost,
    decode_step_seconds,
    forward_seconds,
    model_forward_cost,
    mtp_forward_cost,
    pipeline_hop_seconds,
)

# The Leviathan and acceptance functions live in planning.acceptance and the step times in
# planning.roofline; they are re-exported here so that one import gives the whole model.
__all__ = [
    "SpeculationCost",
    "SpeedupEstimate",
    "acceptance_rate_from_alpha",
    "alpha_from_acceptance_length",
    "alpha_from_acceptance_rate",
    "batch_grid",
    "best_k",
    "context_tokens_for",
    "decode_step_seconds",
    "estimate_speedup",
    "expected_tokens_per_step",
    "knee",
    "speculation_breakeven_batch_size",
    "speculation_cost",
    "speedup",
    "verify_tokens_for",
]

K_MAX = 16
KNEE = 0.01
# Fixed cost of one drafting pass beyond its roofline time: choosing the drafted token over the draft's
# vocabulary and the proposer's bookkeeping between passes. Calibrated so that the EAGLE-3 and draft-model
# measurements in test_speedup.py are reproduced.
DRAFT_PASS_OVERHEAD_S = 0.25e-3
# Where no GPU product is known the estimate is made for this one, and says so.
REFERENCE_GPU = "H100-80GB"
_KV_ELEMENT_BYTES = {KvCacheDtype.AUTO: 2.0}  # every fp8 variant stores one byte
# The tokens a sequence holds in its KV cache while it decodes, until the pods' mean context is measured (then the
# plan takes that: schedule_cost's `context_tokens`). A decoding sequence holds its prompt and the output so far; a
# chat workload served with maxModelLen 8,192 averages well under 1,024 of them (ShareGPT-style turns are a few
# hundred tokens each way), so an eighth of maxModelLen, an assumption. Capped at twice the 1,024 the step-cost model
# was measured at: attention's growth beyond that is unmeasured here, and more context makes speculation look better
# (the KV cache read is shared by the verified tokens), so the prior does not assume more until the pods show it.
CONTEXT_SHARE_OF_MAX_MODEL_LEN = 1 / 8
MAX_ASSUMED_CONTEXT_TOKENS = 2048


def speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan's speedup of one step drafting `k` tokens at `c` target steps each (verify = 1 step)."""
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)


def best_k(alpha: float, c: float, k_max: int = K_MAX) -> int:
    """The k in 1..k_max with the highest Leviathan speedup, or the smallest k within 1% of it."""
    return knee(lambda k: speedup(alpha, k, c), k_max)


def knee(speedup_at: Callable[[int], float], k_max: int) -> int:
    """The smallest k whose speedup is within KNEE of the best: more drafted tokens for under 1% more
    speed are not worth the compute they add once the engine is busy (a free drafter such as ngram
    would otherwise always ask for k_max)."""
    speedups = [speedup_at(k) for k in range(1, k_max + 1)]
    best = max(speedups)
    return next(k for k, value in enumerate(speedups, start=1) if value >= best * (1 - KNEE))


@dataclass(frozen=True)
class SpeculationCost:
    """What a target step, a drafting pass and a verify step cost on one GPU product."""

    target: ForwardCost
    draft: ForwardCost | None               # None: drafting takes no GPU time (ngram, suffix)
    gpu: GpuProduct
    context_tokens: int = DEFAULT_CONTEXT_TOKENS  # cached tokens per sequence
    draft_pass_overhead_s: float = DRAFT_PASS_OVERHEAD_S
    zero_k_speedup: float | None = None     # a schedule's k = 0 step ÷ no speculation; None: planning.schedule's
    largest_k_first: bool = False           # the engine's table drafts its largest k at batch 1 (planning.schedule)
    layer_overhead_s: float = LAYER_OVERHEAD_S  # kernel time per layer of every pass (planning.roofline)
    verify_tokens: int | None = None        # a draft tree's tokens verified per sequence, root included; None: k + 1
    draft_width: int = 1                    # candidates per sequence each drafting pass after the first (a tree's topk)
    draft_size_ratio: float | None = None   # target ÷ draft parameters of a separate draft, for its prior acceptance
    parallel_drafting: bool = False         # one pass over k + 1 query tokens drafts all k (DFlash, DSpark)
    sequential_selections: bool = False     # ...then picks the k tokens one by one over the vocabulary (DSpark)
    pipeline_stages: int = 1                # pipeline stages across nodes: a network hop between them each step
    hidden_size: int = 0                    # the target's, for the activations a hop carries

    def pipeline_hops_seconds(self, tokens: int) -> float:
        """The inter-node network of one step over `tokens` new tokens (planning.roofline.pipeline_hop_seconds)."""
        return pipeline_hop_seconds(self.pipeline_stages, tokens, self.hidden_size)

    def baseline_step_seconds(self, batch: int) -> float:
        """One engine step without speculation: one token per sequence."""
        return self.target_pass_seconds(batch, 1) + self.pipeline_hops_seconds(batch) + ENGINE_STEP_OVERHEAD_S

    def draft_pass_seconds(self, batch: int) -> float:
        """One drafting pass: one proposed token per sequence."""
        return self._drafting_pass_seconds(batch, 1)

    def tree_draft_pass_seconds(self, batch: int) -> float:
        """A tree's drafting pass after its first: `draft_width` candidates per sequence."""
        return self._drafting_pass_seconds(batch, self.draft_width)

    def _drafting_pass_seconds(self, batch: int, width: int) -> float:
        if self.draft is None:
            return 0.0
        pass_s = forward_seconds(self.draft, self.gpu, batch=batch, tokens_per_sequence=width,
                                 context_tokens=self.context_tokens, layer_overhead_s=self.layer_overhead_s)
        return pass_s + self.draft_pass_overhead_s

    def block_draft_seconds(self, batch: int, k: int) -> float:
        """A block drafter's k tokens: one pass over k + 1 query tokens per sequence (vLLM DFlashProposer: "one
        bonus query followed by K mask queries"; the context's hidden states enter as keys and values), then one
        selection of all k (DFlash) or k selections left to right (DSpark's Markov head samples each token after
        the one before, vllm/model_executor/models/qwen3_dspark.py). The pass is the one-token pass
        (`draft_pass_seconds`, so a fitted hardware factor applies to it too) times the roofline's ratio of a
        (k + 1)-token pass to a one-token pass."""
        if self.draft is None:
            return 0.0
        one, block = (forward_seconds(self.draft, self.gpu, batch=batch, tokens_per_sequence=width,
                                      context_tokens=self.context_tokens, layer_overhead_s=self.layer_overhead_s)
                      for width in (1, k + 1))
        pass_s = (self.draft_pass_seconds(batch) - self.draft_pass_overhead_s) * block / one
        return pass_s + (k if self.sequential_selections else 1) * self.draft_pass_overhead_s

    def target_pass_seconds(self, batch: int, tokens_per_sequence: int) -> float:
        """The target's forward pass over `tokens_per_sequence` new tokens of each of `batch` sequences."""
        return forward_seconds(
            self.target, self.gpu, batch=batch, tokens_per_sequence=tokens_per_sequence,
            context_tokens=self.context_tokens, layer_overhead_s=self.layer_overhead_s,
        )

    def speculative_step_seconds(self, batch: int, k: int) -> float:
        """k drafting passes (a tree's after the first `draft_width` wide), then one target pass verifying k+1
        tokens per sequence, or a tree's `verify_tokens`."""
        drafting = k * self.draft_pass_seconds(batch)
        if self.parallel_drafting:
            drafting = self.block_draft_seconds(batch, k)
        elif self.draft_width > 1:
            drafting = self.draft_pass_seconds(batch) + (k - 1) * self.tree_draft_pass_seconds(batch)
        verified = self.verified_tokens(k)
        return (drafting + self.target_pass_seconds(batch, verified) + self.pipeline_hops_seconds(batch * verified)
                + ENGINE_STEP_OVERHEAD_S)

    def verified_tokens(self, k: int) -> int:
        """Tokens the verify pass covers per sequence at `k`: k + 1 for a chain, the tree's for a tree."""
        return self.verify_tokens if self.verify_tokens is not None else k + 1

    def accepted_depth(self, k: int) -> int:
        """The chain whose expected tokens a step at `k` is credited with. A tree is credited with its top-1
        chain only, a lower bound: the tree holds that chain among its branches (SGLang and TensorRT-LLM keep the
        most likely path), and its other branches add what they add only where the top-1 candidate is rejected,
        which no published measurement lets this model size for a given draft (docs/speedup-model.md). A tree that
        verifies fewer tokens than k + 1 reaches no deeper than its tokens."""
        return min(k, self.verified_tokens(k) - 1)

    def draft_cost_ratio(self, batch: int = 1) -> float:
        """Leviathan's c: one drafting pass in target steps."""
        return self.draft_pass_seconds(batch) / self.baseline_step_seconds(batch)

    def speedup(self, batch: int, alpha: float, k: int) -> float:
        """Tokens per second with speculation ÷ without, at `batch` running sequences."""
        return self.speedup_for_tokens(batch, expected_tokens_per_step(alpha, self.accepted_depth(k)), k)

    def speedup_for_tokens(self, batch: int, tokens_per_step: float, k: int) -> float:
        """The same for a step drafting `k` tokens that yields `tokens_per_step` on average."""
        return tokens_per_step * self.baseline_step_seconds(batch) / self.speculative_step_seconds(batch, k)


def batch_grid(max_batch: int) -> list[int]:
    """1, 2, 3 … then about 25% apart, ending at max_batch."""
    grid, batch = [], 1
    while batch < max_batch:
        grid.append(batch)
        batch = max(batch + 1, int(batch * 1.25))
    grid.append(max_batch)
    return grid


def speculation_breakeven_batch_size(
    cost: SpeculationCost, alpha: float, k: int, max_batch: int
) -> int | None:
    """The smallest batch size in 1..max_batch at which speculation is slower than none; None if none is.

    Scans a grid about 25% apart, then bisects between the last paying and the first losing point, so the
    answer is exact wherever the speedup falls monotonically with the batch (dense models; MoE models can
    recover a little once every expert is read anyway).
    """
    paying = 0
    for batch in batch_grid(max_batch):
        if cost.speedup(batch, alpha, k) < 1.0:
            losing = batch
            break
        paying = batch
    else:
        return None
    while losing - paying > 1:
        middle = (paying + losing) // 2
        if cost.speedup(middle, alpha, k) < 1.0:
            losing = middle
        else:
            paying = middle
    return losing


@dataclass(frozen=True)
class SpeedupEstimate:
    """The predicted effect of speculation, for `specdeploy plan` and status."""

    method: Method
    k: int
    assumed_acceptance_rate: float          # vLLM's accepted ÷ drafted at k, measured or assumed
    acceptance_rate_measured: bool          # False: the method's documented default α
    alpha: float                            # Leviathan's per-token acceptance behind it
    expected_tokens_per_step: float         # = vLLM's mean acceptance length
    draft_cost_ratio: float                 # c: one drafting pass in target steps, at batch 1
    speedup_at_batch_1: float
    speedup_at_max_batch: float             # at spec.serving.maxNumSeqs running sequences
    max_batch_size: int
    breakeven_batch_size: int | None        # None: speculation pays at every batch up to max_batch_size
    best_k: int                             # the k with the highest speedup at batch 1 (see best_k)
    gpu: str
    context_tokens: int
    verified_tokens: int                    # per sequence in the verify pass: k + 1, or a draft tree's tokens

    def to_wire(self) -> dict[str, Any]:
        """The `speedup` object of `specdeploy plan -o json` (camelCase, floats to 3 decimals)."""
        return {
            "method": self.method.value,
            "k": self.k,
            "assumedAcceptanceRate": round(self.assumed_acceptance_rate, 3),
            "acceptanceRateSource": "measured" if self.acceptance_rate_measured else "assumed",
            "alpha": round(self.alpha, 3),
            "expectedTokensPerStep": round(self.expected_tokens_per_step, 3),
            "draftCostRatio": round(self.draft_cost_ratio, 3),
            "speedupAtBatch1": round(self.speedup_at_batch_1, 3),
            "speedupAtMaxBatch": round(self.speedup_at_max_batch, 3),
            "maxBatchSize": self.max_batch_size,
            "breakevenBatchSize": self.breakeven_batch_size,
            "bestK": self.best_k,
            "gpu": self.gpu,
            "contextTokens": self.context_tokens,
            "verifiedTokensPerSequence": self.verified_tokens,
        }


def speculation_cost(
    spec: SpeculativeDeploymentSpec,
    target: ModelInfo,
    draft: ModelInfo | None,
    gpu: GpuProduct,
    *,
    context_tokens: int | None = None,
) -> SpeculationCost:
    """The target's and the drafter's pass costs for `spec` on `gpu`, every sequence holding `context_tokens` (the
    pods' measured mean context; None: the assumption from maxModelLen, `context_tokens_for`)."""
    tp = spec.resources.tensor_parallel_size
    kv_bytes = _KV_ELEMENT_BYTES.get(spec.serving.kv_cache_dtype, 1.0)
    target_cost = model_forward_cost(
        target, tensor_parallel_size=tp, quantization=_weight_quantization(spec, target), kv_element_bytes=kv_bytes
    )
    method = spec.speculation.method
    draft_spec = spec.speculation.draft
    draft_quantization = draft_spec.quantization if draft_spec is not None else spec.model.quantization
    drafter: ForwardCost | None
    if method in (*NGRAM_METHODS, Method.SUFFIX):
        drafter = None
    elif method in BLOCK_METHODS and draft is not None:
        # A DFlash or DSpark drafter: its own layers (and DSpark's Markov and confidence heads, in its parameters)
        # with the target's lm_head, which it reads each pass (vLLM shares it when the checkpoint has none).
        draft_tp = draft_spec.tensor_parallel_size if draft_spec and draft_spec.tensor_parallel_size else tp
        drafter = model_forward_cost(
            draft, tensor_parallel_size=draft_tp, quantization=draft_quantization, kv_element_bytes=kv_bytes,
            extra_parameters=target.architecture.vocab_size * target.architecture.hidden_size,
        )
    elif method == Method.MTP or draft is None:
        drafter = mtp_forward_cost(target, tensor_parallel_size=tp, quantization=spec.model.quantization,
                                   kv_element_bytes=kv_bytes)
    else:
        draft_tp = draft_spec.tensor_parallel_size if draft_spec and draft_spec.tensor_parallel_size else tp
        # An EAGLE-1/2 head has no lm_head of its own: it reads the target's on every pass.
        borrowed = target.architecture.vocab_size * target.architecture.hidden_size if draft.kind == ModelKind.EAGLE else 0
        drafter = model_forward_cost(
            draft, tensor_parallel_size=draft_tp, quantization=draft_quantization, kv_element_bytes=kv_bytes,
            extra_parameters=borrowed, counts_input_embedding=method == Method.DRAFT_MODEL,
        )
    tree_width = spec.speculation.eagle_topk if engine_profile(spec.engine.kind).tree_drafting else 1
    return SpeculationCost(
        target_cost, drafter, gpu, context_tokens if context_tokens is not None else context_tokens_for(spec, target),
        verify_tokens=verify_tokens_for(spec), draft_width=tree_width,
        draft_size_ratio=(target.architecture.num_parameters / draft.architecture.num_parameters
                          if method == Method.DRAFT_MODEL and draft is not None else None),
        parallel_drafting=method in BLOCK_METHODS and drafter is not None,
        sequential_selections=method == Method.DSPARK,
        pipeline_stages=spec.resources.pipeline_parallel_size, hidden_size=target.architecture.hidden_size,
    )


def context_tokens_for(spec: SpeculativeDeploymentSpec, target: ModelInfo) -> int:
    """The cached tokens per sequence assumed before the pods' mean context is measured: an eighth of maxModelLen
    (the model's longest context when unset, as the engines do), at most MAX_ASSUMED_CONTEXT_TOKENS."""
    max_model_len = spec.serving.max_model_len or target.architecture.max_position_embeddings
    return max(1, min(MAX_ASSUMED_CONTEXT_TOKENS, int(max_model_len * CONTEXT_SHARE_OF_MAX_MODEL_LEN)))


def verify_tokens_for(spec: SpeculativeDeploymentSpec) -> int | None:
    """Tokens a draft tree verifies per sequence each step, root included; None for a chain (k + 1).

    An engine that drafts trees from eagleTopk (SGLang): `--speculative-num-draft-tokens`
    (`Speculation.tree_draft_tokens`); one whose speculative config can hold a tree (TensorRT-LLM): what its profile
    reads from extraConfig (`SpeculativeConfigKeys.tree_verify_tokens`).
    """
    speculation = spec.speculation
    profile = engine_profile(spec.engine.kind)
    if profile.tree_drafting and speculation.method not in (Method.NGRAM, *BLOCK_METHODS):
        return speculation.tree_draft_tokens(speculation.num_speculative_tokens)
    if not isinstance(profile.extra_config, NoSpeculativeConfig) and speculation.extra_config:
        return profile.extra_config.tree_verify_tokens(speculation.extra_config, speculation.num_speculative_tokens)
    return None


def _weight_quantization(spec: SpeculativeDeploymentSpec, target: ModelInfo) -> Quantization:
    """The target's weights as the engine reads them: the spec's quantisation, or with none the checkpoint's own."""
    stored = target.stored_quantization
    if spec.model.quantization == Quantization.NONE and stored is not None and stored.scheme is not None:
        return stored.scheme
    return spec.model.quantization


def estimate_speedup(
    spec: SpeculativeDeploymentSpec,
    target: ModelInfo,
    draft: ModelInfo | None,
    gpu: GpuProduct | None,
    *,
    acceptance_rate: float | None = None,
    context_tokens: int | None = None,
) -> SpeedupEstimate:
    """The predicted speedup of `spec`'s speculation over the same target without it.

    `acceptance_rate` is a measured vLLM acceptance rate (accepted ÷ drafted, as in
    status.analysis.acceptanceRate) at the spec's k; without one the method's default α is assumed,
    for a separate draft by its size, lowered for a quantised target or draft. `gpu` None means the product is
    unknown: the estimate is made for REFERENCE_GPU and names it. `context_tokens`: see `speculation_cost`.
    """
    product = gpu if gpu is not None else GPU_PRODUCTS[REFERENCE_GPU]
    method, k = spec.speculation.enabled_method, spec.speculation.num_speculative_tokens
    cost = speculation_cost(spec, target, draft, product, context_tokens=context_tokens)
    alpha_at = _alpha_for(spec, target, cost, acceptance_rate)
    alpha = alpha_at(k)
    max_batch = spec.serving.max_num_seqs
    return SpeedupEstimate(
        method=method,
        k=k,
        assumed_acceptance_rate=acceptance_rate if acceptance_rate is not None else acceptance_rate_from_alpha(alpha, k),
        acceptance_rate_measured=acceptance_rate is not None,
        alpha=alpha,
        expected_tokens_per_step=expected_tokens_per_step(alpha, cost.accepted_depth(k)),
        draft_cost_ratio=cost.draft_cost_ratio(),
        speedup_at_batch_1=cost.speedup(1, alpha, k),
        speedup_at_max_batch=cost.speedup(max_batch, alpha, k),
        max_batch_size=max_batch,
        breakeven_batch_size=speculation_breakeven_batch_size(cost, alpha, k, max_batch),
        best_k=knee(lambda n: cost.speedup(1, alpha_at(n), n), K_MAX),
        gpu=product.name,
        context_tokens=cost.context_tokens,
        verified_tokens=cost.verified_tokens(k),
    )


def _alpha_for(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, cost: SpeculationCost, acceptance_rate: float | None
) -> Callable[[int], float]:
    """α as a function of k: measured at the spec's k and held, or the method's default for each k."""
    if acceptance_rate is not None:
        measured = alpha_from_acceptance_rate(acceptance_rate, spec.speculation.num_speculative_tokens)
        return lambda _k: measured
    draft_spec = spec.speculation.draft
    return lambda k: default_alpha(
        spec.speculation.enabled_method,
        k,
        target_quantization=acceptance_quantization(spec.model.quantization, target),
        draft_quantization=draft_spec.quantization if draft_spec is not None else Quantization.NONE,
        mtp_layers=target.architecture.num_nextn_predict_layers,
        draft_size_ratio=cost.draft_size_ratio,
    )
