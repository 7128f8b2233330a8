"""The built-in catalog of model architectures, and how a spec's target and draft are resolved without I/O.

Exceptions:

    ValueError
     └── UnknownModel   a model neither in the catalog nor described by `architecture`

A catalog model's numbers come from its config.json (`catalog_entries.py`); a spec's `architecture`
overrides them. `resolve_target`/`resolve_draft` know only these two; `specdeploy.modelsource` also reads
a model's own config.json (a ConfigMap, a path, the Hub) and falls back to this catalog.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from specdeploy.api.spec import Architecture, Quantization, SpeculativeDeploymentSpec
from specdeploy.planning.catalog_entries import ENTRIES, Entry
from specdeploy.planning.checkpoint import CheckpointQuantization, read_checkpoint_quantization
from specdeploy.planning.hf_config import architecture_from_hf_config, trained_block_tokens
from specdeploy.planning.modelinfo import ModelInfo, ModelKind, drafter_kind
from specdeploy.planning.weights import model_weight_bytes

__all__ = [
    "CATALOG", "UnknownModel", "architecture_from_hf_config", "guess_family", "lookup", "lookup_through_base",
    "quantised_checkpoints_of", "resolve_draft", "resolve_target", "with_stored_quantization",
]

_SIXTEEN_BIT = 2.0   # bytes of what a quantised checkpoint keeps unquantised (embeddings, LM head)


def with_stored_quantization(model: ModelInfo, stored: CheckpointQuantization | None) -> ModelInfo:
    """`model` as its checkpoint stores it: a quantised one loads at its scheme's bytes per parameter when
    `spec.model.quantization` is none (the engine reads the checkpoint's `quantization_config`). A size the
    model already has (DeepSeek-V3's FP8 blocks, gpt-oss's MXFP4) is kept."""
    if stored is None or not stored.quantised or stored.scheme in (None, Quantization.NONE) \
            or model.checkpoint_bytes_per_param is not None:
        return replace(model, stored_quantization=stored)
    assert stored.scheme is not None
    size = model_weight_bytes(model, stored.scheme, _SIXTEEN_BIT) / model.architecture.num_parameters
    return replace(model, stored_quantization=stored, checkpoint_bytes_per_param=size)


def _models(entry: Entry) -> list[ModelInfo]:
    arch = architecture_from_hf_config(entry.config)
    if entry.parameters is not None:
        arch = arch.model_copy(update={"num_parameters": entry.parameters})
    first = ModelInfo(
        name=entry.names[0], architecture=arch, kind=entry.kind, source=entry.source, family=entry.family,
        targets=entry.targets, draft_vocab_size=entry.draft_vocab_size,
        checkpoint_bytes_per_param=entry.checkpoint_bytes_per_param, base_model=entry.base_model,
        trained_block_tokens=trained_block_tokens(entry.config),
    )
    first = with_stored_quantization(first, read_checkpoint_quantization(entry.config))
    return [replace(first, name=name) for name in entry.names]


CATALOG: dict[str, ModelInfo] = {model.name: model for entry in ENTRIES for model in _models(entry)}
"""Every catalog model by its Hugging Face id (base and Instruct variants are entries of their own)."""

_BY_LOWER = {name.lower(): model for name, model in CATALOG.items()}
_BY_REPO: dict[str, list[ModelInfo]] = {}
for _model in CATALOG.values():
    _BY_REPO.setdefault(_model.name.rsplit("/", 1)[-1].lower(), []).append(_model)


def _normalise(name: str) -> str:
    return name.strip().rstrip("/").lower()


def lookup(name: str) -> ModelInfo | None:
    """The catalog model called `name`: a Hugging Face id in any case, or a path or bare repository
    name ending in one (`/models/Llama-3.1-8B-Instruct`) when only one catalog model has that name."""
    wanted = _normalise(name)
    model = _BY_LOWER.get(wanted)
    if model is not None:
        return model
    candidates = _BY_REPO.get(wanted.rsplit("/", 1)[-1], [])
    if len(candidates) != 1:
        return None
    # A path with the repository's name has its shapes; what its files store was not read.
    return replace(candidates[0], stored_quantization=None)


def lookup_through_base(name: str, base_model: str | None) -> ModelInfo | None:
    """The catalog model called `name`, else the one `base_model` names, as `name`: a local copy or a mirror
    has its base's shapes. Its checkpoint was not read, so what it stores is unknown (the spec says)."""
    known = lookup(name)
    if known is not None or not base_model:
        return known
    base = lookup(base_model)
    if base is None:
        return None
    return replace(base, name=name, base_model=base.name, stored_quantization=None,
                   source=f"{base.source} (the catalog's {base.name}, `spec.model.baseModel`)")


def quantised_checkpoints_of(base_model: str, scheme: Quantization) -> list[str]:
    """Catalog repositories that hold `base_model`'s weights quantised with `scheme`, for fixes."""
    wanted = _normalise(base_model)
    return [model.name for model in CATALOG.values()
            if _normalise(model.base_model) == wanted and model.stored_quantization is not None
            and model.stored_quantization.scheme == scheme]


def near_names(name: str, count: int = 3) -> list[str]:
    """Catalog ids that look like `name`, for error messages."""
    wanted = _normalise(name)
    lowered = list(_BY_LOWER)
    close = difflib.get_close_matches(wanted, lowered, n=count, cutoff=0.5)
    if not close:
        repo = wanted.rsplit("/", 1)[-1]
        close = [key for key in lowered if repo and repo[:6] in key][:count]
    return [_BY_LOWER[key].name for key in close] or list(CATALOG)[:count]


_FAMILY_HINTS = (
    ("gpt-oss", "gpt_oss"), ("deepseek-v3", "deepseek_v3"), ("deepseek-r1", "deepseek_v3"), ("mimo", "mimo"),
    ("qwen3", "qwen3"), ("qwen2", "qwen2"), ("mixtral", "mistral"), ("mistral", "mistral"),
    ("llama-3", "llama3"), ("llama3", "llama3"),
)


def guess_family(name: str) -> str:
    """The tokenizer family a model's name suggests ("" when it suggests none)."""
    lowered = name.lower()
    return next((family for hint, family in _FAMILY_HINTS if hint in lowered), "")


class UnknownModel(ValueError):
    """A model the planner has no numbers for: not in the catalog and no `architecture` given."""

    def __init__(self, name: str, name_field: str, architecture_field: str) -> None:
        self.name = name
        self.field = architecture_field
        self.near = near_names(name)
        super().__init__(
            f"`{name_field}` {name!r} is not in the built-in catalog, so the memory plan has no numbers "
            f"for it: add `{architecture_field}` (numLayers, hiddenSize, intermediateSize, "
            "numAttentionHeads, numKeyValueHeads, vocabSize, numParameters, maxPositionEmbeddings, from "
            f"the model's config.json), or pick a catalog model such as {', '.join(self.near)}"
        )


def _resolve(name: str, architecture: Architecture | None, source_field: str, kind: ModelKind,
             base_model: str | None = None) -> ModelInfo | None:
    known = lookup_through_base(name, base_model)
    if architecture is None:
        return known
    if known is not None:
        return replace(known, architecture=architecture, source=source_field)
    return ModelInfo(name=name, architecture=architecture, kind=kind, source=source_field, family=guess_family(name))


def resolve_target(spec: SpeculativeDeploymentSpec) -> ModelInfo:
    """The target's ModelInfo: the catalog's (or its `baseModel`'s), with `spec.model.architecture` overriding
    its numbers."""
    model = spec.model
    resolved = _resolve(model.name, model.architecture, "spec.model.architecture", ModelKind.BASE, model.base_model)
    if resolved is None:
        raise UnknownModel(model.name, "spec.model.name", "spec.model.architecture")
    return replace(resolved, base_model=model.base_model) if model.base_model else resolved


def resolve_draft(spec: SpeculativeDeploymentSpec) -> ModelInfo | None:
    """The draft's ModelInfo, or None when the spec names no draft (ngram, suffix, mtp).

    A draft described only by `spec.speculation.draft.architecture` is taken for an EAGLE head when
    the method is eagle or eagle3, for a DFlash or DSpark drafter with dflash or dspark, and for a draft model
    otherwise.
    """
    draft = spec.speculation.draft
    if draft is None:
        return None
    kind = drafter_kind(spec.speculation.method)
    resolved = _resolve(draft.name, draft.architecture, "spec.speculation.draft.architecture", kind)
    if resolved is None:
        raise UnknownModel(draft.name, "spec.speculation.draft.name", "spec.speculation.draft.architecture")
    return resolved
