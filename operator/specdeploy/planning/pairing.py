"""Does an EAGLE head belong to its target? Checked from the head's own config.json, never its name.

    findings = check_head_pairing(Method.EAGLE3, "meta-llama/Llama-3.1-8B-Instruct", target_arch,
                                  "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", head_config)

A head predicts from one target's hidden states and maps into that target's vocabulary; on any other
target it drafts tokens that are all rejected, and a name that mentions the same family proves
nothing. So a head that names the model it was trained for is held to it: the `speculators` format
(github.com/vllm-project/speculators) writes `speculators_config.verifier.name_or_path` into
config.json; a checkpoint in the EAGLE authors' format
(`LlamaForCausalLMEagle3`) names nothing, and then the catalog's list of trained-on targets, if it has
one, stands in. Findings: EagleHeadTargetMismatch (Error, naming both models), EagleHeadTargetUnknown
(Warning: nothing names a target), EagleHeadHiddenSizeMismatch (Error) and DraftVocabularyMismatch
(Error) when the head's shapes cannot fit the target's. The codes are compat.py's, so the findings
merge into the same `Compatibility`. A DFlash or DSpark drafter is held to its target the same way, with the
codes DrafterTargetMismatch and DrafterTargetUnknown.

Drafts of method draft_model are refused on vocabulary by `compat.vocabulary` from their resolved
architecture (now read from their own config.json); MTP layers are the target's own
(`compat.mtp_layers`, from the target's num_nextn_predict_layers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import Architecture, Method
from specdeploy.api.status import Finding, Severity

__all__ = ["HeadConfig", "check_head_pairing", "parser_view", "read_head_config", "same_model"]

_HEAD_METHODS = (Method.EAGLE, Method.EAGLE3)
# DFlash and DSpark drafters read target hidden states as heads do; their findings have codes of their own
# (planning.compat's DrafterTargetUnknown / DrafterTargetMismatch), so they replace the same findings there.
_BLOCK_DRAFTER_NAME = {Method.DFLASH: "DFlash drafter", Method.DSPARK: "DSpark drafter"}


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parser_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """A speculators-format config flattened to the keys `architecture_from_hf_config` reads.

    The layer's numbers live under `transformer_layer_config`; the head's `architectures` and
    `draft_vocab_size` stay at the top. Any other config comes back as it is.
    """
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, Mapping):
        return dict(config)
    flat = {**layer}
    for key in ("architectures", "draft_vocab_size"):
        if config.get(key) is not None:
            flat[key] = config[key]
    return flat


@dataclass(frozen=True)
class HeadConfig:
    """What a head's config.json says about the target it needs."""

    verifier: str | None                 # the model it was trained for, when the config names one
    target_hidden_size: int | None       # the width of the target hidden states it reads
    vocab_size: int | None               # the target vocabulary it maps into
    draft_vocab_size: int | None         # EAGLE-3: the reduced vocabulary it drafts from


def read_head_config(config: Mapping[str, Any]) -> HeadConfig:
    """The pairing facts of a head's config.json, in either format."""
    speculators = config.get("speculators_config")
    verifier = speculators.get("verifier") if isinstance(speculators, Mapping) else None
    verifier = verifier if isinstance(verifier, Mapping) else {}
    name = verifier.get("name_or_path")
    flat = parser_view(config)
    return HeadConfig(
        verifier=name.strip() if isinstance(name, str) and name.strip() else None,
        target_hidden_size=_positive(config.get("target_hidden_size")) or _positive(flat.get("hidden_size")),
        vocab_size=_positive(flat.get("vocab_size")),
        draft_vocab_size=_positive(flat.get("draft_vocab_size")),
    )


def _normalise(name: str) -> str:
    return name.strip().rstrip("/").lower()


def same_model(named: str, candidates: Iterable[str]) -> bool:
    """`named` is one of `candidates`: the same Hub id in any case, or a path ending in its repo name."""
    wanted = _normalise(named)
    names = {_normalise(c) for c in candidates}
    if wanted in names:
        return True
    is_path = wanted.startswith(("/", ".")) or wanted.count("/") > 1
    tail = wanted.rsplit("/", 1)[-1]
    return is_path and any(name.rsplit("/", 1)[-1] == tail for name in names)


def _finding(code: str, severity: Severity, message: str) -> Finding:
    return Finding(code=code, severity=severity, message=message)


def check_head_pairing(
    method: Method | None,
    target_name: str,
    target: Architecture,
    head_name: str,
    head_config: Mapping[str, Any],
    *,
    target_aliases: Iterable[str] = (),
    catalog_targets: Iterable[str] = (),
) -> list[Finding]:
    """Findings about the head `head_name` (its config.json) on the target `target_name`.

    `target_aliases`: other names of the same target (the catalog's, or a resolved path);
    `catalog_targets`: the models the catalog says the head was trained for, used only when its
    config names none. Methods without a head give no findings.
    """
    if method not in _HEAD_METHODS and method not in _BLOCK_DRAFTER_NAME:
        return []
    block = _BLOCK_DRAFTER_NAME.get(method) if method is not None else None
    prefix, what = ("Drafter", f"a {block}") if block else ("EagleHead", "an EAGLE head")
    head = read_head_config(head_config)
    draft = "`spec.speculation.draft.name`"
    findings = []
    target_names = (target_name, *target_aliases)
    trained_for = (head.verifier,) if head.verifier else tuple(catalog_targets)
    if not trained_for:
        findings.append(_finding(
            f"{prefix}TargetUnknown", Severity.WARNING,
            f"{draft} {head_name} does not name the model it was trained for (its config.json has no "
            "`speculators_config.verifier.name_or_path`, and the catalog does not know it), so it cannot be "
            f"checked against the target {target_name}: {what} trained for another model drafts tokens the "
            "target rejects; make sure it was trained on this target, and watch `status.analysis.acceptanceRate`",
        ))
    elif not any(same_model(name, target_names) for name in trained_for):
        where = "its config.json's `speculators_config.verifier.name_or_path`" if head.verifier else "the catalog"
        findings.append(_finding(
            f"{prefix}TargetMismatch", Severity.ERROR,
            f"{draft} {head_name} was trained for {', '.join(trained_for)} ({where}), not for "
            f"`spec.model.name` {target_name}: {what} must belong to its target, because it predicts "
            "from that target's hidden states; name a head trained for this target, set `spec.model.baseModel` if "
            "`spec.model.name` is a quantised or local copy of the model the head was trained for, or use method "
            "draft_model, mtp or ngram",
        ))
    if head.target_hidden_size is not None and head.target_hidden_size != target.hidden_size:
        findings.append(_finding(
            "EagleHeadHiddenSizeMismatch", Severity.ERROR,
            f"{draft} {head_name} reads hidden states {head.target_hidden_size} wide but the target "
            f"{target_name} has hiddenSize {target.hidden_size}, so the engine cannot load it on this target; "
            "name a head trained for this target",
        ))
    if head.vocab_size is not None and head.vocab_size != target.vocab_size:
        findings.append(_finding(
            "DraftVocabularyMismatch", Severity.ERROR,
            f"{draft} {head_name} maps into a vocabulary of {head.vocab_size} tokens but the target "
            f"{target_name} has {target.vocab_size}: a head shares its target's tokenizer, embeddings and LM "
            "head; name a head trained for this target",
        ))
    if head.draft_vocab_size is not None and head.draft_vocab_size > target.vocab_size:
        findings.append(_finding(
            "DraftVocabularyMismatch", Severity.ERROR,
            f"{draft} {head_name} drafts from {head.draft_vocab_size} tokens but the target {target_name} has "
            f"only {target.vocab_size}: a reduced EAGLE-3 draft vocabulary maps back into the target's (d2t) "
            "and must not be larger; name a head trained for this target",
        ))
    return findings
