"""Acceptance: Leviathan's α, vLLM's acceptance rate, and the α assumed for each method.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", arXiv:2211.17192)
model each drafted token as accepted with the same probability α, independently, until the first
rejection. A step that drafts k tokens then yields on average

    E[tokens] = (1 − α^(k+1)) / (1 − α)        (k + 1 when α = 1)

tokens: the accepted prefix plus the one token the target always adds. vLLM's acceptance rate is not α:
it counts accepted ÷ drafted tokens (vllm:spec_decode_num_accepted_tokens_total ÷
vllm:spec_decode_num_draft_tokens_total), and a token after the first rejection is never accepted, so

    rate = (E[tokens] − 1) / k

which is below α for every k > 1 (α = 0.8, k = 5: rate 0.54). Its mean acceptance length is E[tokens].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specdeploy.api.spec import NGRAM_METHODS, Method, Quantization
from specdeploy.planning.modelinfo import ModelInfo

# α assumed per method when nothing was measured (greedy or low-temperature chat; higher temperature
# lowers every one of them). Each is solved from a published mean acceptance length with
# `alpha_from_acceptance_length`, or says why it is a prior.
DEFAULT_ALPHA: dict[Method, float] = {
    # A same-family draft at 1:8-1:12 of the target. vLLM's 2024-10-17 blog measured 1.5x for Llama3-70B
    # with a 0.5B vocabulary-transplanted draft (turboderp/Qwama-0.5B-Instruct), which this model
    # reproduces with α ≈ 0.5 (test_speedup.py); a draft of the target's own family agrees more often
    # (vLLM PR #24322: "acceptance rates in greedy decoding are great for Qwen3 models").
    Method.DRAFT_MODEL: 0.6,
    # EAGLE-1 head for Llama-3-8B-Instruct in vLLM V1 (vLLM PR #16035, MT-Bench): mean acceptance length
    # 1.89 at k=2 and 2.08 at k=4, i.e. α ≈ 0.52-0.56; later V1 fixes (issue #17812) raised it.
    Method.EAGLE: 0.6,
    # EAGLE-3 head yuhuili/EAGLE3-LLaMA3.1-Instruct-8B in vLLM (issue #26191, MT-Bench, T=0): mean
    # acceptance length 3.53 at k=7, i.e. α ≈ 0.745.
    Method.EAGLE3: 0.75,
    # DeepSeek-V3 technical report (arXiv:2412.19437, §5.4.3): "the acceptance rate of the second token
    # prediction ranges between 85% and 90%" with its one MTP module at k=1.
    Method.MTP: 0.85,
    # Prompt lookup accepts what the output copies from the prompt: 0.66-0.81 per position on code editing
    # (vLLM PR #24344), about 0.7 on summarisation (the 2.8x of vLLM's blog on CNN/DailyMail), much less
    # on open chat. 0.4 is a prior for chat, not a measurement.
    Method.NGRAM: 0.4,
    # Suffix decoding (Arctic Inference) drafts from prompt and earlier outputs alike; the same prior.
    Method.SUFFIX: 0.4,
    # The same prompt lookup, matched on the GPU (vLLM ngram_gpu): what it accepts does not change.
    Method.NGRAM_GPU: 0.4,
    # DFlash and DSpark drafters read target hidden states like an EAGLE-3 head and draft a block in one pass.
    # No acceptance measurement from a source this project has read is behind these: they are the EAGLE-3
    # prior, an assumption (docs/engines.md, "Block drafters"). A measured rate replaces them once the pods run.
    Method.DFLASH: 0.75,
    Method.DSPARK: 0.75,
}

# The same MTP module reused for later positions it was not trained for (vLLM warns: lower acceptance).
# nebius/MTP-DeepSeek-V3-0324 model card: the original module reused at K=7 reaches a mean acceptance
# length of 3.20 (MT-Bench, HumanEval, GSM8K, T=0), i.e. α ≈ 0.705.
MTP_REUSED_ALPHA = 0.70

# Multiplier on α for a quantised target or draft. Direction from public reports (a draft quantised
# to lower precision "will cause a drop in acceptance rate", TensorRT Edge-LLM docs; an int8 QuaRot
# target dropped EAGLE-3 acceptance, vllm-ascend issue #5974); the sizes are assumptions, not
# measurements: 8-bit weights keep the target's choices nearly intact, 4-bit ones less so.
QUANTIZATION_ALPHA_FACTOR: dict[Quantization, float] = {
    Quantization.NONE: 1.0,
    Quantization.FP8: 0.98,
    Quantization.INT8: 0.98,
    Quantization.AWQ: 0.93,
    Quantization.GPTQ: 0.93,
    Quantization.INT4: 0.93,
}

# A separate draft's α against its size (draft_model only; an EAGLE head or MTP module is trained on the target's
# own hidden states, so its size says nothing comparable). DEFAULT_ALPHA[DRAFT_MODEL] stands for a draft at
# DRAFT_SIZE_REFERENCE_RATIO (Llama-3.1-8B for Llama-3.1-70B, the middle of compat's 1:8-1:12); each doubling of
# target ÷ draft parameters beyond it lowers α by ALPHA_PER_SIZE_DOUBLING. The slope is Leviathan et al. 2023
# (arXiv:2211.17192), Table 3, T5-XXL (11B) target at T=0: T5-small (77M), T5-base (250M), T5-large (800M) drafts
# reached α 0.75 / 0.80 / 0.82 on EnDe and 0.62 / 0.68 / 0.71 on CNNDM, i.e. 0.021-0.027 per doubling of the
# ratio. With it Qwama-0.5B for Llama3-70B (1:150) gets α 0.50, where vLLM's measured 1.5x for that pair needs
# 0.56 in this model (blog 2024-10-17, test_speedup.py): cautious by 0.06 there. Assumption, stated: the slope
# measured on T5 holds for Llama-family drafts (uncertainty about ±0.01 per doubling, from the two tasks' spread),
# and it is log-linear outside the measured 1:14-1:143 (clamped to ALPHA_DRAFT_SIZE_BOUNDS).
DRAFT_SIZE_REFERENCE_RATIO = 8.8
ALPHA_PER_SIZE_DOUBLING = 0.025
ALPHA_DRAFT_SIZE_BOUNDS = (0.2, 0.9)

_BISECTION_STEPS = 60


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Leviathan's E[tokens] for one step drafting `k` tokens accepted with probability `alpha` each."""
    _check_alpha(alpha)
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def acceptance_rate_from_alpha(alpha: float, k: int) -> float:
    """vLLM's accepted ÷ drafted tokens for a per-token acceptance `alpha` at `k` drafted tokens."""
    return (expected_tokens_per_step(alpha, k) - 1.0) / k


def alpha_from_acceptance_length(length: float, k: int) -> float:
    """The α whose E[tokens] at `k` is `length` (a mean acceptance length in [1, k+1]); by bisection.

    E[tokens] rises strictly with α on [0, 1], from 1 to k+1, so the root is unique.
    """
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"a mean acceptance length at k={k} must be between 1 and {k + 1}, got {length!r}")
    low, high = 0.0, 1.0
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        if expected_tokens_per_step(middle, k) < length:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def alpha_from_acceptance_rate(rate: float, k: int) -> float:
    """The α behind a measured vLLM acceptance rate (accepted ÷ drafted) at `k` drafted tokens."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"an acceptance rate must be between 0 and 1, got {rate!r}")
    return alpha_from_acceptance_length(1.0 + rate * k, k)


def default_alpha(
    method: Method,
    k: int,
    *,
    target_quantization: Quantization = Quantization.NONE,
    draft_quantization: Quantization = Quantization.NONE,
    mtp_layers: int = 1,
    draft_size_ratio: float | None = None,
) -> float:
    """The α assumed for `method` when no acceptance rate was measured (see DEFAULT_ALPHA), for a separate draft
    `draft_size_ratio` times smaller than its target (target ÷ draft parameters; None: the reference size)."""
    alpha = DEFAULT_ALPHA[method]
    if method == Method.MTP and k > max(mtp_layers, 1):
        alpha = MTP_REUSED_ALPHA
    if method == Method.DRAFT_MODEL and draft_size_ratio is not None:
        alpha = draft_size_alpha(draft_size_ratio)
    if method not in (*NGRAM_METHODS, Method.SUFFIX):
        alpha *= QUANTIZATION_ALPHA_FACTOR[target_quantization] * QUANTIZATION_ALPHA_FACTOR[draft_quantization]
    return alpha


def draft_size_alpha(draft_size_ratio: float) -> float:
    """The α assumed for a separate draft `draft_size_ratio` times smaller than its target, before quantisation
    (DRAFT_SIZE_REFERENCE_RATIO, ALPHA_PER_SIZE_DOUBLING)."""
    shift = ALPHA_PER_SIZE_DOUBLING * math.log2(draft_size_ratio / DRAFT_SIZE_REFERENCE_RATIO)
    low, high = ALPHA_DRAFT_SIZE_BOUNDS
    return min(high, max(low, DEFAULT_ALPHA[Method.DRAFT_MODEL] - shift))


def acceptance_quantization(written: Quantization, target: ModelInfo) -> Quantization:
    """The target quantisation that lowers the prior: `spec.model.quantization`, or with none written the scheme a
    quantised copy of another model stores (`stored_quantization` with a `base_model`; a checkpoint released
    quantised by its own authors, with no base, is what its drafters were trained against)."""
    stored = target.stored_quantization
    if written == Quantization.NONE and stored is not None and stored.scheme is not None and target.base_model:
        return stored.scheme
    return written


def expected_tokens_from_positions(position_acceptance: Sequence[float], k: int) -> float:
    """E[tokens] of a step drafting `k` tokens, from the acceptance of each draft position.

    `position_acceptance[i]` is the share of drafts whose position i+1 was accepted: vLLM's
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i} ÷ vllm:spec_decode_num_drafts_total, which
    counts position i+1 only when every position before it was accepted too. So a step yields the one token the
    target always adds plus the accepted positions: 1 + Σ of the first k entries (Leviathan's α^i is the case
    of one α for every position).
    """
    if not 0 <= k <= len(position_acceptance):
        raise ValueError(f"k must be between 0 and the {len(position_acceptance)} positions given, got {k!r}")
    for rate in position_acceptance:
        _check_alpha(rate)
    return 1.0 + sum(position_acceptance[:k])


def prior_position_acceptance(
    method: Method,
    k_max: int,
    *,
    target_quantization: Quantization = Quantization.NONE,
    draft_quantization: Quantization = Quantization.NONE,
    mtp_layers: int = 1,
    draft_size_ratio: float | None = None,
) -> tuple[float, ...]:
    """The acceptance assumed for draft positions 1..k_max when none was measured.

    Position i is accepted when it and every position before it are: the product of each position's own α,
    `default_alpha` of a chain that long. For every method but mtp that is α^i; an MTP module reused past the
    positions it was trained for accepts less from there on (MTP_REUSED_ALPHA).
    """
    rates, accepted = [], 1.0
    for position in range(1, k_max + 1):
        accepted *= default_alpha(method, position, target_quantization=target_quantization,
                                  draft_quantization=draft_quantization, mtp_layers=mtp_layers,
                                  draft_size_ratio=draft_size_ratio)
        rates.append(accepted)
    return tuple(rates)


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"an acceptance probability must be between 0 and 1, got {alpha!r}")
