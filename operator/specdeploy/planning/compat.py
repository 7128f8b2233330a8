"""Do target, draft, method and engine work together? Findings, each with its reason and source.

    compatibility = check_compatibility(spec, target, draft, head_findings)
    compatibility.compatible      # False when any finding is an Error

`target` and `draft` are the resolved models (the catalog's, or read from their config.json by
`specdeploy.modelsource`); `draft` is None for methods that draft without a separate model.
`head_findings` are planning.pairing's, from an EAGLE head's own config.json: they replace this module's
findings of the same codes (`head_belongs_to_target` and `vocabulary` judge a head from its resolved
numbers and catalog entry; its own config says more, and one problem is reported once). Codes are stable CamelCase words that
status, Events and docs/compatibility.md use; messages follow the Kubernetes API conventions (fields in
backquotes, must / must not, what to do).

When `spec.speculation.enabled` is false the engine runs the target alone, so only the extraArgs rules
apply: a spec that is incompatible only in its speculation can still serve without it (`extraConfig` is
part of the speculation).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Sequence

from specdeploy.api.spec import (
    BLOCK_METHODS,
    NGRAM_METHODS,
    EngineKind,
    Method,
    Quantization,
    ScheduleMode,
    SpeculativeDeploymentSpec,
)
from specdeploy.api.speculative_keys import MAX_EXTRA_CONFIG_TEXT, ManagedKey
from specdeploy.api.status import Compatibility, Finding, Severity
from specdeploy.engines import engine_profile
from specdeploy.engines.base import explicit_quantization
from specdeploy.engines.profile import NoSpeculativeConfig, ScheduleExpression
from specdeploy.planning.acceptance import (
    DEFAULT_ALPHA,
    DRAFT_SIZE_REFERENCE_RATIO,
    acceptance_rate_from_alpha,
    draft_size_alpha,
)
from specdeploy.planning.catalog import quantised_checkpoints_of
from specdeploy.planning.checkpoint import contradiction
from specdeploy.planning.managed_flags import MANAGED_FLAGS, find_managed_flags
from specdeploy.planning.modelinfo import ModelInfo, ModelKind, drafter_kind
from specdeploy.planning.schedule import ZERO_K_SPEEDUP, ScheduleRange, SpeculationSchedule
from specdeploy.planning.topology import layout_findings, tensor_parallel_fits, valid_tensor_parallel_sizes

# MANAGED_FLAGS is re-exported for the renderers; it lives in planning.managed_flags with its parsing.
__all__ = ["MANAGED_FLAGS", "SUPPORTED_METHODS", "check_compatibility", "draft_size_ratio"]

SUPPORTED_METHODS: dict[EngineKind, frozenset[Method]] = {kind: frozenset(engine_profile(kind).methods)
                                                          for kind in EngineKind}
"""Per engine: the speculation methods it can run (its profile's `methods`)."""

# The rule of thumb for a separate draft model: 1/8 to 1/12 of the target's parameters.
DRAFT_RATIO_MIN = 8.0
DRAFT_RATIO_MAX = 12.0
# An EAGLE head is one or two decoder layers; a catalog-less "draft" that small is taken for a head.
_MAX_HEAD_LAYERS = 2

_EAGLE_METHODS = (Method.EAGLE, Method.EAGLE3)
# Block drafters (DFlash, DSpark) read the target's hidden states like an EAGLE head, so they too belong to one
# target: vLLM's SpeculativeConfig treats them as EAGLE-style drafters (`use_eagle()` covers dflash and dspark).
_BLOCK_NAME = {Method.DFLASH: "DFlash", Method.DSPARK: "DSpark"}
_HEAD_KINDS = (ModelKind.EAGLE, ModelKind.EAGLE3)
_HEAD_KIND_FOR_METHOD = {Method.EAGLE: ModelKind.EAGLE, Method.EAGLE3: ModelKind.EAGLE3}
_METHOD_FOR_HEAD_KIND = {ModelKind.EAGLE: "eagle", ModelKind.EAGLE3: "eagle3"}
_HEAD_NAME = {ModelKind.EAGLE: "EAGLE-1/2", ModelKind.EAGLE3: "EAGLE-3"}

Rule = Callable[[SpeculativeDeploymentSpec, ModelInfo, ModelInfo | None], Iterable[Finding]]


def _error(code: str, message: str) -> Finding:
    return Finding(code=code, severity=Severity.ERROR, message=message)


def _warning(code: str, message: str) -> Finding:
    return Finding(code=code, severity=Severity.WARNING, message=message)


def _info(code: str, message: str) -> Finding:
    return Finding(code=code, severity=Severity.INFO, message=message)


def _params(model: ModelInfo) -> str:
    billions = model.architecture.num_parameters / 1e9
    return f"{billions:.1f}B" if billions >= 1 else f"{billions * 1000:.0f}M"


def _is_head_like(draft: ModelInfo) -> bool:
    return draft.kind in _HEAD_KINDS or draft.architecture.num_layers <= _MAX_HEAD_LAYERS


# --- method and engine ---------------------------------------------------------------------------------


def method_supported(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """The engine must implement the method at all."""
    engine, method = spec.engine.kind, spec.speculation.method
    if method is None or method in SUPPORTED_METHODS[engine]:   # no method: nothing is proposed
        return
    refusal = engine_profile(engine).method_refusals.get(method)
    if refusal is not None:
        yield _error(refusal.code, refusal.message.format(target=target.name))
        return
    supported = ", ".join(sorted(m.value for m in SUPPORTED_METHODS[engine]))
    yield _error(
        "MethodNotSupportedByEngine",
        f"`spec.speculation.method` {method.value} is not supported by `spec.engine.kind` {engine.value}, "
        f"which supports {supported}; choose one of those or another engine",
    )


def draft_kind(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """eagle/eagle3 need a head of their own version; draft_model needs a full model."""
    method = spec.speculation.method
    if draft is None:
        return
    if method == Method.DRAFT_MODEL and draft.kind in _HEAD_KINDS:
        yield _error(
            "DraftIsAnEagleHead",
            f"`spec.speculation.draft.name` {draft.name} is an EAGLE head, not a language model, so it must "
            "not be used with `spec.speculation.method` draft_model: a head drafts from the target's hidden "
            f"states; set method {_METHOD_FOR_HEAD_KIND[draft.kind]}",
        )
    if method in BLOCK_METHODS:
        yield from _block_drafter_kind(method, target, draft)
        return
    if method not in _EAGLE_METHODS:
        return
    if draft.kind == ModelKind.BASE and draft.architecture.num_layers > _MAX_HEAD_LAYERS:
        yield _error(
            "DraftNotAnEagleHead",
            f"`spec.speculation.draft.name` {draft.name} is a full language model "
            f"({draft.architecture.num_layers} layers), not an EAGLE head, so it must not be used with "
            f"`spec.speculation.method` {method.value}; set method draft_model for a small model, or name "
            f"an EAGLE head trained for {target.name}",
        )
    wanted = _HEAD_KIND_FOR_METHOD[method]
    if draft.kind in _HEAD_KINDS and draft.kind != wanted:
        yield _error(
            "EagleVersionMismatch",
            f"`spec.speculation.draft.name` {draft.name} is an {_HEAD_NAME[draft.kind]} head but "
            f"`spec.speculation.method` is {method.value}: the two versions read different target hidden "
            f"states and load differently; set method {_METHOD_FOR_HEAD_KIND[draft.kind]}",
        )


def _block_drafter_kind(method: Method, target: ModelInfo, draft: ModelInfo) -> Iterable[Finding]:
    """dflash and dspark need a drafter of their own kind: vLLM builds the proposer from the method and loads the
    checkpoint by its architectures (DFlashDraftModel, Qwen3DSparkModel, …), so another model does not load."""
    if draft.kind == drafter_kind(method):
        return
    what = {ModelKind.BASE: "a full language model", ModelKind.EAGLE: "an EAGLE-1/2 head",
            ModelKind.EAGLE3: "an EAGLE-3 head", ModelKind.DFLASH: "a DFlash drafter",
            ModelKind.DSPARK: "a DSpark drafter"}[draft.kind]
    # A drafter kind's method has its name (eagle, eagle3, dflash, dspark); a full model drafts as draft_model.
    fix = "set method draft_model for a small model" if draft.kind == ModelKind.BASE else f"set method {draft.kind.value}"
    yield _error(
        "DraftNotABlockDrafter",
        f"`spec.speculation.draft.name` {draft.name} is {what}, not a {_BLOCK_NAME[method]} drafter, so it must not "
        f"be used with `spec.speculation.method` {method.value}: the engine loads a {_BLOCK_NAME[method]} drafter by "
        f"its architecture; {fix}, or name a {_BLOCK_NAME[method]} drafter trained for {target.name}",
    )


# --- draft and target ------------------------------------------------------------------------------------


def head_belongs_to_target(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None
) -> Iterable[Finding]:
    """An EAGLE head predicts from one target's hidden states; on any other target it drafts noise.

    Equivalent targets (base and Instruct, Llama-3.1-70B and 3.3-70B) count only when the head's own
    `targets` list names them: a head's card says what it was trained on, nothing else does.
    """
    method = spec.speculation.method
    if draft is None or method is None:
        return
    if method in BLOCK_METHODS:
        yield from _block_drafter_belongs_to_target(spec, method, target, draft)
        return
    if method not in _EAGLE_METHODS or not _is_head_like(draft):
        return
    names = _target_names(spec, target)
    trained_on = {name.strip().rstrip("/").lower() for name in draft.targets}
    if not trained_on:
        yield _warning(
            "EagleHeadTargetUnknown",
            f"`spec.speculation.draft.name` {draft.name} is not a catalog EAGLE head, so it cannot be "
            f"checked against the target {target.name}: a head trained for another model drafts tokens "
            "the target rejects; make sure it was trained on this target, and watch "
            "`status.analysis.acceptanceRate`",
        )
        return
    if names.isdisjoint(trained_on):
        yield _error(
            "EagleHeadTargetMismatch",
            f"`spec.speculation.draft.name` {draft.name} was trained for {', '.join(draft.targets)}, not "
            f"for `spec.model.name` {spec.model.name}: an EAGLE head must belong to its target, because it "
            "predicts from that target's hidden states; name a head trained for this target, set "
            "`spec.model.baseModel` if `spec.model.name` is a quantised or local copy of the model the head was "
            "trained for, or use method draft_model, mtp or ngram",
        )


def _target_names(spec: SpeculativeDeploymentSpec, target: ModelInfo) -> set[str]:
    """The names a drafter's list of trained-on targets may give the spec's target: its own, the catalog's, and
    the base model a quantised or local copy holds."""
    names = {target.name, spec.model.name, *([target.base_model] if target.base_model else [])}
    return {name.strip().rstrip("/").lower() for name in names}


def _block_drafter_belongs_to_target(
    spec: SpeculativeDeploymentSpec, method: Method, target: ModelInfo, draft: ModelInfo
) -> Iterable[Finding]:
    """A DFlash or DSpark drafter conditions on hidden states of chosen target layers (`target_layer_ids`): it is
    trained for one target, and the catalog or its config's verifier says which. A drafter nothing names a target
    for is a finding (DrafterTargetUnknown), never a refusal: the spec may be right."""
    name = _BLOCK_NAME[method]
    trained_on = {t.strip().rstrip("/").lower() for t in draft.targets}
    if not trained_on:
        yield _warning(
            "DrafterTargetUnknown",
            f"`spec.speculation.draft.name` {draft.name} is a {name} drafter whose target is not known (the catalog "
            "does not list it and its config names no verifier), so it cannot be checked against the target "
            f"{target.name}: a drafter trained for another model reads the wrong hidden states and drafts tokens the "
            "target rejects; make sure it was trained for this target, and watch `status.analysis.acceptanceRate`",
        )
        return
    if _target_names(spec, target).isdisjoint(trained_on):
        yield _error(
            "DrafterTargetMismatch",
            f"`spec.speculation.draft.name` {draft.name} is a {name} drafter trained for {', '.join(draft.targets)}, "
            f"not for `spec.model.name` {spec.model.name}: it reads that model's hidden states; name a {name} "
            "drafter trained for this target, set `spec.model.baseModel` if `spec.model.name` is a quantised or "
            "local copy of the model it was trained for, or use method draft_model, mtp or ngram",
        )


def vocabulary(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """Draft and target must share one tokenizer: token ids are compared one for one."""
    if draft is None or spec.speculation.method not in (Method.DRAFT_MODEL, *_EAGLE_METHODS, *BLOCK_METHODS):
        return
    target_vocab, draft_vocab = target.architecture.vocab_size, draft.architecture.vocab_size
    if draft.draft_vocab_size is not None and draft.draft_vocab_size > target_vocab:
        yield _error(
            "DraftVocabularyMismatch",
            f"`spec.speculation.draft.name` {draft.name} drafts from {draft.draft_vocab_size} tokens but the "
            f"target {target.name} has only {target_vocab}: a reduced EAGLE-3 draft vocabulary maps back "
            "into the target's (d2t) and must not be larger; name a head trained for this target",
        )
    if draft_vocab != target_vocab:
        same_family = bool(draft.family) and draft.family == target.family
        severity_is_error = engine_profile(spec.engine.kind).refuses_padded_vocabulary or not same_family
        message = (
            f"`spec.speculation.draft.name` {draft.name} has a vocabulary of {draft_vocab} tokens but the "
            f"target {target.name} has {target_vocab}: draft and target must share one tokenizer (vLLM "
            'refuses to start with "Target and draft model should have the same vocabulary size"); '
        )
        if same_family:
            message += (
                f"both are {target.family} models whose embeddings are padded differently, which only "
                "vLLM refuses; choose a draft with the same vocabulary size, or use sglang or trtllm"
            )
        else:
            message += "choose a draft from the target's own family, or use method eagle3, mtp or ngram"
        if severity_is_error:
            yield _error("DraftVocabularyMismatch", message)
        else:
            yield _warning("DraftVocabularyPaddingDiffers", message)
    elif draft.family and target.family and draft.family != target.family:
        yield _warning(
            "DraftTokenizerFamilyDiffers",
            f"`spec.speculation.draft.name` {draft.name} is a {draft.family} model and the target "
            f"{target.name} a {target.family} model: their vocabularies have the same size "
            f"({target_vocab}) but the tokenizers may still differ, and then almost every drafted token "
            "is rejected; prefer a draft from the target's own family",
        )


def draft_size_ratio(target: ModelInfo, draft: ModelInfo) -> float:
    """Target parameters per draft parameter (8.8 for Llama-3.1-70B with an 8B draft)."""
    return target.architecture.num_parameters / draft.architecture.num_parameters


def draft_size(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """A separate draft pays best at about 1/8 to 1/12 of the target's size."""
    if draft is None or spec.speculation.method != Method.DRAFT_MODEL:
        return
    ratio = draft_size_ratio(target, draft)
    k = spec.speculation.num_speculative_tokens
    alpha, reference = draft_size_alpha(ratio), DEFAULT_ALPHA[Method.DRAFT_MODEL]
    rate = acceptance_rate_from_alpha(alpha, k)
    if ratio > DRAFT_RATIO_MAX:
        yield _warning(
            "DraftTooSmall",
            f"`spec.speculation.draft.name` {draft.name} ({_params(draft)}) is 1:{ratio:.0f} of the target "
            f"{target.name} ({_params(target)}), far smaller than 1:{DRAFT_RATIO_MIN:.0f} to "
            f"1:{DRAFT_RATIO_MAX:.0f}: a draft that small agrees with the target less often; the speedup "
            f"estimate assumes α {alpha:.2f} per token against {reference:.2f} for a 1:{DRAFT_SIZE_REFERENCE_RATIO} "
            f"draft ({rate:.0%} of drafted tokens accepted at k {k}), and a small draft's cheaper passes can still "
            "make it the faster choice: compare `specdeploy plan`'s speedup with a larger draft of the same family "
            "or method eagle3",
        )
    elif ratio < DRAFT_RATIO_MIN:
        yield _warning(
            "DraftTooLarge",
            f"`spec.speculation.draft.name` {draft.name} ({_params(draft)}) is 1:{ratio:.1f} of the target "
            f"{target.name} ({_params(target)}), larger than 1:{DRAFT_RATIO_MIN:.0f}: each drafted token "
            "then costs a large share of a target step, and the draft's weights and KV cache take memory "
            "from the target's concurrent sequences; consider a smaller draft",
        )


def draft_tensor_parallel(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None
) -> Iterable[Finding]:
    """vLLM runs a draft at TP 1 or the target's TP; SGLang and TensorRT-LLM only at the target's."""
    draft_spec = spec.speculation.draft
    if draft_spec is None or draft_spec.tensor_parallel_size is None:
        return
    draft_tp, target_tp = draft_spec.tensor_parallel_size, spec.resources.tensor_parallel_size
    if engine_profile(spec.engine.kind).draft_runs_at_own_tp:
        if draft_tp not in (1, target_tp):
            yield _error(
                "DraftTensorParallelInvalid",
                f"`spec.speculation.draft.tensorParallelSize` must be 1 or `spec.resources.tensorParallelSize` "
                f"({target_tp}), got {draft_tp}: vLLM accepts no other draft_tensor_parallel_size; set 1 "
                "for a small draft, or remove it to use the target's",
            )
    elif draft_tp != target_tp:
        yield _warning(
            "DraftTensorParallelIgnored",
            f"`spec.speculation.draft.tensorParallelSize` {draft_tp} is ignored by `spec.engine.kind` "
            f"{spec.engine.kind.value}, which runs the draft at the target's tensor parallelism "
            f"({target_tp}); remove it",
        )


# --- method-specific -----------------------------------------------------------------------------------


def mtp_layers(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """MTP drafts with layers shipped inside the target's checkpoint; a model without them cannot."""
    if spec.speculation.method != Method.MTP:
        return
    layers = target.architecture.num_nextn_predict_layers
    k = spec.speculation.num_speculative_tokens
    if layers == 0:
        yield _error(
            "ModelHasNoMTPLayers",
            f"`spec.speculation.method` mtp must not be used with `spec.model.name` {target.name}, which has "
            "no multi-token-prediction layers (num_nextn_predict_layers is 0): setting method mtp does not "
            "give a model MTP layers; use method eagle3 with a head trained for this model, draft_model "
            "with a small model of its family, or ngram",
        )
        return
    if k > layers > 1 and k % layers:
        # vllm/config/speculative.py: "num_speculative_tokens ... must be divisible by n_predict".
        yield _error(
            "MTPTokensNotDivisible",
            f"`spec.speculation.numSpeculativeTokens` must be a multiple of the model's {layers} MTP layers "
            f"when it is larger, got {k}: vLLM reuses the layers in whole rounds; set {layers} or "
            f"{layers * (k // layers + 1)}",
        )
    if k > layers:
        # vLLM warns: "Enabling num_speculative_tokens > 1 will run multiple times of forward on same MTP
        # layer, which may result in lower acceptance rate".
        yield _info(
            "MTPLayerReused",
            f"`spec.speculation.numSpeculativeTokens` {k} is more than the model's {layers} MTP "
            f"layer{'s' if layers > 1 else ''}, so the same layer drafts several positions it was not "
            "trained for and acceptance falls with each one (vLLM warns the same); "
            f"{layers} token{'s' if layers > 1 else ''} per step is the setting it was trained for",
        )
    families = engine_profile(spec.engine.kind).mtp_documented_for
    if families and not any(family in f"{target.family} {target.name}".lower() for family in families):
        yield _warning(
            "TrtllmMtpDeepSeekOnly",
            f"`spec.speculation.method` mtp on `spec.engine.kind` trtllm is documented for DeepSeek models "
            f"only, and {target.name} is not one: TensorRT-LLM may refuse to load its MTP layers; use vllm "
            "or sglang for this model",
        )


def sglang_topk(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """SGLang's overlap scheduler (spec v2) drafts one chain; a tree (topk > 1) turns it off."""
    topk, method = spec.speculation.eagle_topk, spec.speculation.method
    if topk == 1 or method in (*NGRAM_METHODS, Method.SUFFIX):
        return
    tree_drafting = engine_profile(spec.engine.kind).tree_drafting
    if tree_drafting and method in BLOCK_METHODS:
        # sglang/srt/arg_groups/speculative_hook.py: "DFLASH only supports speculative_eagle_topk == 1; overriding".
        yield _info(
            "EagleTopkIgnored",
            f"`spec.speculation.eagleTopk` {topk} is ignored with `spec.speculation.method` {method.value}: SGLang "
            "drafts one block, not a tree, and sets eagleTopk to 1 itself; remove it",
        )
    elif tree_drafting:
        # sglang server_args.py: topk > 1 sets disable_overlap_schedule with the reason
        # "spec v2 currently only supports topk = 1" and logs that spec v1 is used.
        yield _warning(
            "OverlapSchedulerDisabled",
            f"`spec.speculation.eagleTopk` {topk} turns SGLang's overlap scheduler off (SGLang: \"spec v2 "
            "currently only supports topk = 1\"), so CPU scheduling no longer hides behind GPU work and "
            "every step gets slower; set `spec.speculation.eagleTopk` to 1 unless a measured gain in "
            "acceptance pays for it",
        )
    else:
        yield _info(
            "EagleTopkIgnored",
            f"`spec.speculation.eagleTopk` {topk} is an SGLang setting and `spec.engine.kind` "
            f"{spec.engine.kind.value} ignores it: it drafts a single chain of tokens; remove it",
        )


def block_drafter_k(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """A block drafter drafts the positions of the block it was trained on; k past it asks mask positions it never
    learned (an inference from its training block, as MTPLayerReused is for MTP; the engines do not refuse it)."""
    method, k = spec.speculation.method, spec.speculation.num_speculative_tokens
    if method not in BLOCK_METHODS or draft is None or draft.trained_block_tokens is None:
        return
    trained = draft.trained_block_tokens
    if k > trained:
        yield _warning(
            "BlockLongerThanTrained",
            f"`spec.speculation.numSpeculativeTokens` {k} is more than the {trained} tokens a block of "
            f"`spec.speculation.draft.name` {draft.name} was trained to draft: the positions past {trained} were "
            f"never trained and are rarely accepted, while each costs verification; set it to {trained} or less",
        )


def block_drafter_notes(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None
) -> Iterable[Finding]:
    """What the engine changes for a block drafter (its profile's `block_drafter_notes`, e.g. SGLang's overlap
    scheduler off for DFlash)."""
    method = spec.speculation.method
    note = engine_profile(spec.engine.kind).block_drafter_notes.get(method) if method is not None else None
    if note is not None:
        yield _info(note.code, note.message)


def quantization(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """A quantised target (or draft) agrees less with a drafter trained against full precision: the spec's
    quantisation, or a quantised copy of another model (its config.json's `quantization_config`)."""
    stored = target.stored_quantization
    quant, said = spec.model.quantization, f"`spec.model.quantization` is {spec.model.quantization.value}"
    estimate = "the speedup estimate assumes a lower rate"
    if quant == Quantization.NONE and stored is not None and stored.scheme and target.base_model:
        quant = stored.scheme
        said = (f"`spec.model.name` {spec.model.name} is {target.base_model} {stored.describe()}, and the memory "
                f"plan counts it as {quant.value}")
        estimate = "the speedup estimate assumes a lower rate, as for the same `spec.model.quantization`"
    if quant != Quantization.NONE and spec.speculation.method not in NGRAM_METHODS:
        strength = (
            "a little (8-bit weights stay close to the original)"
            if quant in (Quantization.FP8, Quantization.INT8)
            else "more than fp8 or int8 would (4-bit weights move the target's choices further)"
        )
        yield _info(
            "TargetQuantized",
            f"{said}: the drafter was trained against the unquantised "
            f"target, so acceptance drops {strength}; {estimate}, and "
            "`spec.analysis.checks.minAcceptanceRate` catches a larger drop",
        )
    draft_spec = spec.speculation.draft
    if draft_spec is not None and draft_spec.quantization != Quantization.NONE:
        # TensorRT Edge-LLM docs (speculative decoding): "quantizing the draft model will cause a drop in
        # acceptance rate compared to running it in FP16".
        yield _info(
            "DraftQuantized",
            f"`spec.speculation.draft.quantization` is {draft_spec.quantization.value}: a quantised draft "
            "is cheaper per token but agrees less with the target, so acceptance drops; keep the draft "
            "unquantised unless memory is short",
        )


def checkpoint_quantization(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None
) -> Iterable[Finding]:
    """`spec.model.quantization` must be what the checkpoint stores (its config.json's `quantization_config`)."""
    stored, written = target.stored_quantization, spec.model.quantization
    if stored is None:
        return
    why = contradiction(written, stored, flag_rendered=explicit_quantization(written) is not None
                        and engine_profile(spec.engine.kind).renders_quantization_flag)
    if why is None:
        return
    if stored.quantised:
        fix = ("set `spec.model.quantization` to none: the engine then reads the checkpoint's quantization_config "
               "and the plan counts what it stores")
    else:
        base = target.base_model or target.name
        repositories = quantised_checkpoints_of(base, written)
        named = f" (such as {', '.join(repositories)})" if repositories else ""
        fix = (f"name a checkpoint quantised with {written.value} in `spec.model.name`{named}, or set "
               "`spec.model.quantization` to none or fp8")
    yield _error(
        "QuantizationContradictsCheckpoint",
        f"`spec.model.quantization` must not be {written.value} for `spec.model.name` {spec.model.name}, which is "
        f"{stored.describe()}: {why}; {fix}",
    )


def tensor_parallel_topology(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None
) -> Iterable[Finding]:
    """The engine shards attention by heads, and the ranks are placed on nodes (planning/topology.py)."""
    tp = spec.resources.tensor_parallel_size
    yield from layout_findings(spec)
    arch = target.architecture
    if not tensor_parallel_fits(arch, tp):
        sizes = ", ".join(str(size) for size in valid_tensor_parallel_sizes(arch))
        yield _error(
            "TensorParallelSizeInvalid",
            f"`spec.resources.tensorParallelSize` must divide `spec.model.name` {target.name}'s "
            f"{arch.num_attention_heads} attention heads, and its {arch.num_key_value_heads} KV heads must divide "
            f"by it or it by them, got {tp}: the engine splits attention by heads and refuses the rest (vLLM: "
            f"\"Total number of attention heads ({arch.num_attention_heads}) must be divisible by tensor parallel "
            f"size ({tp})\"); set one of {sizes}",
        )
    draft_spec = spec.speculation.draft
    if not spec.speculation.enabled or draft is None or draft_spec is None:
        return
    own_tp = engine_profile(spec.engine.kind).draft_runs_at_own_tp
    draft_tp = (draft_spec.tensor_parallel_size or tp) if own_tp else tp
    if (draft_tp == tp and not tensor_parallel_fits(arch, tp)) or tensor_parallel_fits(draft.architecture, draft_tp):
        return   # fits, or already reported for the target
    both = [size for size in valid_tensor_parallel_sizes(arch) if tensor_parallel_fits(draft.architecture, size)]
    draft_fix = "`spec.speculation.draft.tensorParallelSize` to 1, or " if own_tp else ""
    yield _error(
        "DraftTensorParallelSizeInvalid",
        f"the draft {draft.name} must run at a tensor-parallel size that divides its "
        f"{draft.architecture.num_attention_heads} attention heads (its {draft.architecture.num_key_value_heads} KV "
        f"heads dividing by it or it by them), got {draft_tp}: the engine refuses the rest; set {draft_fix}"
        f"`spec.resources.tensorParallelSize` to one of {', '.join(map(str, both))}",
    )


# --- extraConfig ---------------------------------------------------------------------------------------

def _key_list(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def _unknown_key(where: str, key: str, settable: set[str], engine_config: str) -> Finding:
    # Matched with `-` read as `_`, the engines' own spelling of their keys.
    close = difflib.get_close_matches(key.replace("-", "_"), sorted(settable), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}? " if close else ""
    return _error(
        "ExtraConfigKeyUnknown",
        f"{where} must not set {key}: {engine_config} has no such key and the engine would refuse to start; "
        f"{hint}the keys it has, besides those the operator renders, are {_key_list(settable)}",
    )


def _managed_key(where: str, key: str, name: str, managed: ManagedKey, engine_config: str) -> Finding:
    return _error(
        "ExtraConfigKeyManaged",
        f"{where} must not set {key}: the engine reads it as {name}, which the operator renders into "
        f"{engine_config} from `{managed.owner}` (and makes the memory plan from); remove the key and set "
        f"`{managed.owner}` instead",
    )


def extra_config(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """`spec.speculation.extraConfig` keys must exist in the engine's speculative config, and be the user's to set.

    The CRD already refuses the managed keys by their exact names; this catches the spellings the engine also
    reads (vLLM: `-` for `_`), the keys the engine has not got, and SGLang, which has no config to merge into.
    """
    extra = spec.speculation.extra_config
    if not extra:
        return
    engine = spec.engine.kind
    keys = engine_profile(engine).extra_config
    if isinstance(keys, NoSpeculativeConfig):
        others = " or ".join(kind.value for kind in EngineKind
                             if not isinstance(engine_profile(kind).extra_config, NoSpeculativeConfig))
        yield _error(
            "ExtraConfigNotSupported",
            f"`spec.speculation.extraConfig` must not be set with `spec.engine.kind` {engine.value}: {keys.why}; "
            f"remove it, or use {others}",
        )
        return
    size = len(json.dumps(extra, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_EXTRA_CONFIG_TEXT:
        yield _error(
            "ExtraConfigTooLarge",
            f"`spec.speculation.extraConfig` must be at most {MAX_EXTRA_CONFIG_TEXT} characters as JSON, got "
            f"{size}: the operator copies it into every engine pod's configuration; keep large settings in the "
            "image or a mounted file",
        )
    method = spec.speculation.enabled_method
    engine_config = keys.describe(method)
    if engine_config is None:   # method_supported reports the method
        return
    known, managed, unsettable = set(keys.known(method)), keys.managed, keys.unsettable
    settable = known - set(managed) - set(unsettable)
    for key in sorted(extra):
        where = f"`spec.speculation.extraConfig.{key}`"
        name = keys.spelling(key)
        if name in managed:
            yield _managed_key("`spec.speculation.extraConfig`", key, name, managed[name], engine_config)
        elif name in unsettable:
            yield _error(
                "ExtraConfigKeyNotSettable",
                f"`spec.speculation.extraConfig` must not set {key}: it is not a user setting of {engine_config}, "
                f"{unsettable[name]}; remove it",
            )
        elif name not in known:
            yield _unknown_key("`spec.speculation.extraConfig`", key, settable, engine_config)
        else:
            if name in keys.unmodelled:
                severity, code, note = keys.unmodelled[name]
                yield Finding(code=code, severity=severity, message=f"{where} is passed to the engine as set, but {note}")
            method_only = keys.method_only.get(name)
            if method_only is not None and spec.speculation.method != method_only:
                yield _error(
                    "ExtraConfigKeyNeedsMethod",
                    f"{where} must not be set with `spec.speculation.method` {spec.speculation.enabled_method.value}: "
                    f"vLLM refuses it for any method but {method_only.value} (\"{name} is only supported by "
                    f"DSpark\"); remove it, or set method {method_only.value}",
                )
            default_image = engine_profile(engine).default_image
            if (name in keys.since_default_image and spec.engine.image
                    and spec.engine.image != default_image):
                yield _warning(
                    "ExtraConfigKeyNeedsNewerEngine",
                    f"{where} exists in vLLM's SpeculativeConfig since 0.33 only: an older image than "
                    f"{default_image} refuses to start with it; check `spec.engine.image`",
                )


# --- schedule ------------------------------------------------------------------------------------------

def schedule_support(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """A schedule (mode Auto or Table) needs an engine that changes k per step for the spec's method."""
    speculation = spec.speculation
    mode, engine = speculation.schedule_mode, spec.engine.kind
    if mode == ScheduleMode.FIXED:
        return
    profile = engine_profile(engine)
    schedules = profile.schedules
    if schedules.limit and (speculation.method not in schedules.methods
                            or (schedules.single_chain_only and speculation.eagle_topk != 1)):
        others = " or ".join(kind.value for kind in EngineKind if not engine_profile(kind).schedules.limit)
        yield _error(
            "ScheduleNotSupportedByEngine",
            f"`spec.speculation.schedule.mode` {mode.value} must not be used with `spec.engine.kind` {engine.value} "
            f"and `spec.speculation.method` {speculation.enabled_method.value} at `spec.speculation.eagleTopk` "
            f"{speculation.eagle_topk}: {schedules.limit}; use one of those, {others}, or "
            "mode Fixed",
        )
    keys = profile.extra_config
    if isinstance(keys, NoSpeculativeConfig):
        return
    extra = {keys.spelling(key) for key in speculation.extra_config or {}}
    for key in keys.schedule_keys:
        if key in extra:
            yield _error(
                "ScheduleSetTwice",
                f"`spec.speculation.extraConfig.{key}` must not be set with `spec.speculation.schedule.mode` "
                f"{mode.value}: the operator renders {key} from the schedule; remove the key, or set mode Fixed "
                "to pass it as written",
            )


def expressible_on(engine: EngineKind, ranges: Sequence[ScheduleRange]) -> bool:
    """Whether `engine` can run a table: one that drafts its largest k first (ScheduleExpression.LARGEST_K_FIRST_TABLE,
    TensorRT-LLM) cannot draft more at a larger batch than at batch 1. Auto never derives such a table; a Table can."""
    return (engine_profile(engine).schedules.expression != ScheduleExpression.LARGEST_K_FIRST_TABLE
            or ranges[0].k == max(r.k for r in ranges))


def schedule_findings(spec: SpeculativeDeploymentSpec, schedule: SpeculationSchedule) -> Iterable[Finding]:
    """What the derived (or written) schedule means on the spec's engine: where it cannot be rendered, and
    what it costs where it drafts 0."""
    mode, engine = spec.speculation.schedule_mode, spec.engine.kind
    if mode == ScheduleMode.FIXED:
        return
    first, largest = schedule.ranges[0], schedule.largest_k
    if largest == 0:
        yield _error(
            "ScheduleNeverPays",
            "`spec.speculation.schedule.mode` Auto finds no batch size at which drafting pays: the best k is "
            f"predicted at no more than the {ZERO_K_SPEEDUP:.2f}× of a step drafting 0 tokens, even at batch 1; "
            "set `spec.speculation.enabled` to false, or a Table if measurements disagree with the model",
        )
        return
    zero = [r for r in schedule.ranges if r.k == 0]
    if not expressible_on(engine, schedule.ranges):
        yield _error(
            "ScheduleNotExpressible",
            f"`spec.speculation.schedule` drafts {first.k} at batch size 1 but {largest} at a larger batch: "
            "TensorRT-LLM's draft_len_schedule must give its smallest batch sizes max_draft_len, the most "
            "drafted anywhere; draft the most at the smallest batch, or use vllm",
        )
    schedules = engine_profile(engine).schedules
    tiers = schedules.expression == ScheduleExpression.ACCEPTANCE_TIERS
    if tiers:
        steps = sorted({r.k for r in schedule.ranges if r.k > 0})
        rendered = (f"--speculative-adaptive with candidate_steps {steps}" if len(steps) > 1
                    else f"a fixed {steps[0]} tokens per step")
        yield _info(
            "ScheduleFollowsAcceptance",
            f"`spec.speculation.schedule` becomes {rendered}: SGLang moves between its tiers by the acceptance "
            "it measures, not by the batch size, so the batch ranges are not enforced"
            + (" and the ranges that draft 0 have no tier (SGLang drafts at least 1)" if zero else ""),
        )
    if schedules.threshold_risk and len(schedule.ranges) > 1:
        edges = ", ".join(str(r.min_batch) for r in schedule.ranges[1:])
        yield _info(
            "ScheduleThresholds",
            f"`spec.speculation.schedule` changes k at batch sizes {edges}: {schedules.threshold_risk}; watch the "
            "tokens per second there",
        )
    if zero and not tiers:   # acceptance tiers never draft 0
        cost = f"{schedules.zero_k_cost}; " if schedules.zero_k_cost else ""
        yield _info(
            "ScheduleDraftsZero",
            f"`spec.speculation.schedule` drafts 0 tokens from batch size {zero[0].min_batch}: {cost}the "
            "speculative counters stop there, so acceptance samples are Inconclusive while the load stays in "
            "those ranges",
        )


# --- extraArgs -----------------------------------------------------------------------------------------


def extra_args(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None) -> Iterable[Finding]:
    """Flags the operator renders must come from the spec, never from extraArgs; removed flags never."""
    engine = spec.engine.kind
    for use in find_managed_flags(engine, spec.engine.extra_args):
        where = f"`spec.engine.extraArgs[{use.position}]`"
        named = use.written if use.written == use.flag else f"{use.written} ({use.flag})"
        if use.replacement:
            yield _error(
                "RemovedFlagInExtraArgs",
                f"{where} must not set {named}: vLLM removed it (PR #15466) and no longer starts with it; "
                f"speculation is configured with --speculative-config ({use.replacement}), which the "
                "operator renders from `spec.speculation`; set that and remove the argument",
            )
        elif not use.owner.startswith("spec."):
            yield _error(
                "ManagedFlagInExtraArgs",
                f"{where} must not set {named}: the operator sets it for every pod ({use.owner}); "
                "remove the argument",
            )
        else:
            yield _error(
                "ManagedFlagInExtraArgs",
                f"{where} must not set {named}: the operator renders it from `{use.owner}` and the memory plan "
                f"is made from that field; set `{use.owner}` instead and remove the argument",
            )


SPECULATION_RULES: tuple[Rule, ...] = (
    method_supported,
    draft_kind,
    head_belongs_to_target,
    vocabulary,
    draft_size,
    draft_tensor_parallel,
    mtp_layers,
    sglang_topk,
    block_drafter_k,
    block_drafter_notes,
    quantization,
    extra_config,
    schedule_support,
)
ALWAYS_RULES: tuple[Rule, ...] = (extra_args, checkpoint_quantization, tensor_parallel_topology)


def check_compatibility(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None,
    head_findings: Iterable[Finding] = (), schedule: SpeculationSchedule | None = None,
) -> Compatibility:
    """Every finding about `spec` with its resolved target and draft; compatible when none is an Error.

    `head_findings` (planning.pairing, from the head's config.json) stand in for this module's findings
    of the same codes; like every speculation rule they apply only while speculation is enabled.
    `schedule`: the spec's schedule as planning.schedule derived it, judged for the engine (`schedule_findings`).
    """
    findings: list[Finding] = []
    if spec.speculation.enabled:
        from_head = list(head_findings)
        replaced = {finding.code for finding in from_head}
        findings += [finding for rule in SPECULATION_RULES for finding in rule(spec, target, draft)
                     if finding.code not in replaced]
        findings += from_head
        if schedule is not None:
            findings += schedule_findings(spec, schedule)
    findings += [finding for rule in ALWAYS_RULES for finding in rule(spec, target, draft)]
    return Compatibility(
        compatible=not any(f.severity == Severity.ERROR for f in findings),
        findings=findings,
    )

