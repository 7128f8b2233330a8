"""Which source describes a model, in order, and the record of where its architecture came from.

    models = resolve_models(spec, hub=HubClient(cache_dir), target=Supplied(token=secret_token))
    models.target.info          # the ModelInfo that make_plan, memory and compat use
    models.target.origin        # Origin(source=Hub, name=..., requested_revision="main", commit_sha="3f2a…")
    head_findings(spec, models) # the pairing check of an EAGLE head against its target

The order, for the target, the draft and an EAGLE head alike (an MTP head is the target's own layers):

1. `architecture` written in the spec (as before): the user's numbers win over every file.
2. A config.json the caller has read for it: a ConfigMap's data (`Supplied.config_map`, already
   fetched; Kubernetes stays out of this module) or a path in the engine's model volume
   (`Supplied.config_path`). Given explicitly, so a file that cannot be read or parsed is an error,
   never skipped.
3. The Hugging Face Hub (`hub`, any object with `fetch_config`; `HubClient` in hub.py): config.json at
   the commit the requested revision (default main) resolves to. Skipped when `offline` (`specdeploy
   plan --offline`), when no hub is given, and for names that are not `owner/name` Hub ids (paths).
4. The built-in catalog, the offline fallback.

When the Hub fails and the catalog knows the model, the catalog stands in if the failure says
nothing against the model itself: the Hub unreachable, access refused (a gated model without a
token), or a config.json the parser does not understand. The catalog's numbers are the published
config.json's, so the plan is the same one it would have been, and refusing it would turn a Hub
outage into an outage of every catalog model. The Origin then says Catalog, without a commit sha,
and keeps the Hub error in `warnings`, so status can say why the revision is not pinned. A model or
revision the Hub says does not exist is not papered over: the engine would fail to download it too,
and a typo must not plan with a namesake's numbers. Without a catalog entry every Hub failure is
raised, typed (see `specdeploy.modelsource`), and the caller keeps its last good plan.

When a config.json describes a catalog model, its numbers are used, and the catalog adds what a
config.json does not carry (tokenizer family, trained-on targets, checkpoint bytes per parameter,
and the published parameter count when the shapes agree with the catalog's).

What a checkpoint stores is read from its own config.json's `quantization_config` (planning/checkpoint.py) into
`ModelInfo.stored_quantization`: with `quantization: none` the memory plan counts the stored size, and compat
refuses a spec quantization the checkpoint contradicts. The model whose weights a checkpoint holds is
`spec.model.baseModel`, else the Hub's `base_model:quantized:` tag (`HubConfig.base_model`), else the catalog's:
heads trained for that model pair with it, and with `baseModel` the catalog's entry for it describes a checkpoint
nothing else describes (what it stores is then the spec's word).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from specdeploy.api.spec import Architecture, SpeculativeDeploymentSpec
from specdeploy.api.status import ArchitectureSource, Finding
from specdeploy.modelsource import (
    ConfigNotUnderstood,
    ConfigUnreadable,
    HubAccessDenied,
    HubUnreachable,
    ModelNotResolvable,
)
from specdeploy.planning.catalog import (
    guess_family,
    lookup,
    lookup_through_base,
    near_names,
    with_stored_quantization,
)
from specdeploy.planning.checkpoint import read_checkpoint_quantization
from specdeploy.planning.hf_config import architecture_from_hf_config, head_kind, trained_block_tokens
from specdeploy.planning.modelinfo import ModelInfo, ModelKind, drafter_kind
from specdeploy.planning.pairing import check_head_pairing, parser_view, read_head_config

__all__ = [
    "ArchitectureSource", "ConfigMapConfig", "HubConfig", "HubConfigs", "is_hub_repo_id", "parse_config_json", "ModelRequest", "Origin", "ResolvedModel",
    "ResolvedModels", "Supplied", "draft_request", "head_findings", "missing_config_keys", "resolve_model",
    "resolve_models", "target_request",
]

MAX_CONFIG_BYTES = 2**20
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_CATALOG_STANDS_IN_FOR = (HubUnreachable, HubAccessDenied, ConfigNotUnderstood, ConfigUnreadable)
_READ_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
# Tokenizer families by config.json `model_type` (the catalog's family names); Llama's depends on the vocabulary.
_FAMILY_BY_MODEL_TYPE = {
    "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3", "mimo": "mimo", "deepseek_v3": "deepseek_v3",
    "gpt_oss": "gpt_oss", "mistral": "mistral", "mixtral": "mistral",
}
_LLAMA3_VOCAB = 128256


def is_hub_repo_id(name: str) -> bool:
    """`owner/name` (or a bare `name`) as the Hub spells repository ids; paths and URLs are not."""
    return bool(_REPO_ID.match(name)) and ".." not in name and "--" not in name


def parse_config_json(content: bytes, where: str) -> dict[str, Any]:
    """The JSON object in a config.json's bytes; `where` names the file in the messages."""
    if len(content) > MAX_CONFIG_BYTES:
        raise ConfigNotUnderstood(
            f"{where} is {len(content):,} bytes, more than the {MAX_CONFIG_BYTES:,} a model config holds, so it "
            "is not read; describe the model with an `architecture` in the spec instead"
        )
    try:
        config = json.loads(content)
    except ValueError as exc:
        raise ConfigNotUnderstood(
            f"{where} is not valid JSON ({exc.__class__.__name__} at {getattr(exc, 'pos', '?')}); describe the "
            "model with an `architecture` in the spec instead"
        ) from None
    if not isinstance(config, dict):
        raise ConfigNotUnderstood(f"{where} holds a JSON {type(config).__name__}, not an object; describe the "
                                  "model with an `architecture` in the spec instead")
    return config


@dataclass(frozen=True)
class HubConfig:
    """A config.json as a Hub serves it at one commit (what `HubConfigs.fetch_config` returns)."""

    repo_id: str
    requested_revision: str
    commit_sha: str
    config: dict[str, Any]
    endpoint: str
    base_model: str = ""    # the model the Hub's model tree says this repository quantises ("" for none)

    @property
    def url(self) -> str:
        return f"{self.endpoint}/{self.repo_id}/blob/{self.commit_sha}/config.json"


@dataclass(frozen=True)
class Origin:
    """Where one model's architecture came from: what status records, and the args pin."""

    source: ArchitectureSource
    name: str
    requested_revision: str | None
    commit_sha: str | None = None        # only from the Hub: the commit the revision resolved to
    location: str = ""                   # the config.json's URL, path or ConfigMap
    warnings: tuple[str, ...] = ()       # e.g. the Hub error the catalog stood in for

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"source": self.source.value, "name": self.name}
        optional = {"revision": self.requested_revision, "commit": self.commit_sha, "location": self.location}
        wire.update({key: value for key, value in optional.items() if value})
        if self.warnings:
            wire["warnings"] = list(self.warnings)
        return wire


@dataclass(frozen=True)
class ConfigMapConfig:
    """A ConfigMap's data as the caller read it, and the key that holds config.json."""

    name: str
    data: Mapping[str, str]
    key: str = "config.json"


@dataclass(frozen=True)
class Supplied:
    """What the caller has for one model besides the spec: a config.json it read, a Hub token."""

    config_map: ConfigMapConfig | None = None
    config_path: Path | None = None
    token: str | None = field(default=None, repr=False)


class HubConfigs(Protocol):
    def fetch_config(self, repo_id: str, revision: str = "main", token: str | None = None) -> HubConfig: ...


@dataclass(frozen=True)
class ModelRequest:
    """One model to resolve: its spec fields (`spec_field` is their path, for messages) and what was supplied."""

    spec_field: str
    name: str
    revision: str | None = None
    architecture: Architecture | None = None
    kind: ModelKind = ModelKind.BASE     # what the spec's method expects of it
    supplied: Supplied = field(default_factory=Supplied)
    base_model: str | None = None        # `spec.model.baseModel`: the model whose weights it holds


@dataclass(frozen=True)
class ResolvedModel:
    info: ModelInfo
    origin: Origin
    config: Mapping[str, Any] | None = None   # the config.json it was read from (None: Spec or Catalog)


@dataclass(frozen=True)
class ResolvedModels:
    target: ResolvedModel
    draft: ResolvedModel | None


def target_request(spec: SpeculativeDeploymentSpec, supplied: Supplied | None = None) -> ModelRequest:
    model = spec.model
    return ModelRequest("spec.model", model.name, model.revision, model.architecture, ModelKind.BASE,
                        supplied or Supplied(), model.base_model)


def draft_request(spec: SpeculativeDeploymentSpec, supplied: Supplied | None = None) -> ModelRequest | None:
    """The draft or EAGLE head's request; None when the method drafts without one (ngram, suffix, mtp)."""
    draft = spec.speculation.draft
    if draft is None:
        return None
    kind = drafter_kind(spec.speculation.method)
    return ModelRequest("spec.speculation.draft", draft.name, draft.revision, draft.architecture, kind,
                        supplied or Supplied())


def missing_config_keys(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys the planner needs that `config` lacks or gives as something other than a positive integer."""
    view = parser_view(config)
    text = view.get("text_config")
    flat = {**view, **text} if isinstance(text, Mapping) else view

    def usable(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    return tuple(key for key in _READ_KEYS if not usable(flat.get(key)))


def _not_understood(request: ModelRequest, where: str, config: Mapping[str, Any], exc: Exception) -> ConfigNotUnderstood:
    missing = missing_config_keys(config)
    if missing:
        numeric = sorted(k for k, v in parser_view(config).items() if isinstance(v, int) and not isinstance(v, bool))
        has = f"; it has {', '.join(numeric[:12])}" if numeric else "; it has no numeric keys at all"
        what, keys = f"lacks {', '.join(missing)} (positive whole numbers the memory plan needs){has}", missing
    elif isinstance(exc, ValidationError):
        keys = tuple(".".join(str(part) for part in error["loc"]) for error in exc.errors())
        what = f"gives values out of range for {', '.join(keys)}"
    else:
        what, keys = f"cannot be read as a model config ({exc})", ()
    return ConfigNotUnderstood(
        f"{where} for `{request.spec_field}.name` {request.name} {what}; add `{request.spec_field}.architecture` with the "
        "model's numbers, or supply a config.json that uses the transformers key names", keys,
    )


def _family(view: Mapping[str, Any], name: str) -> str:
    """The config's model_type says more than the name (a fine-tune's name may mention another family)."""
    model_type = view.get("model_type")
    if model_type == "llama" and view.get("vocab_size") == _LLAMA3_VOCAB:
        return "llama3"
    return _FAMILY_BY_MODEL_TYPE.get(str(model_type), "") or guess_family(name)


def _from_config(request: ModelRequest, config: Mapping[str, Any], origin: Origin, where: str,
                 hub_base_model: str = "") -> ResolvedModel:
    """`hub_base_model`: what the Hub says the repository quantises; the spec's `baseModel` wins over it."""
    request = replace(request, base_model=request.base_model or hub_base_model or None)
    view = parser_view(config)
    try:
        architecture = architecture_from_hf_config(view)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise _not_understood(request, where, config, exc) from None
    known = lookup_through_base(request.name, request.base_model)
    declared = head_kind(view)
    if known is not None:
        same_shapes = architecture.model_copy(update={"num_parameters": known.architecture.num_parameters})
        if same_shapes == known.architecture:
            architecture = known.architecture  # keeps the published parameter count
        kind = declared if declared != ModelKind.BASE else known.kind
        info = replace(known, name=request.name, architecture=architecture, kind=kind, source=where,
                       trained_block_tokens=trained_block_tokens(view) or known.trained_block_tokens)
    else:
        verifier = read_head_config(config).verifier
        info = ModelInfo(
            name=request.name, architecture=architecture, kind=declared, source=where,
            family=_family(view, request.name), targets=(verifier,) if verifier else (),
            draft_vocab_size=view.get("draft_vocab_size"), trained_block_tokens=trained_block_tokens(view),
        )
    info = with_stored_quantization(replace(info, checkpoint_bytes_per_param=_own_size(known, info)),
                                    read_checkpoint_quantization(config))
    return ResolvedModel(_with_base(info, request), origin, config)


def _own_size(known: ModelInfo | None, info: ModelInfo) -> float | None:
    """A catalog size of the model itself (DeepSeek-V3's FP8 blocks) stays; a base model's is not this file's."""
    return info.checkpoint_bytes_per_param if known is not None and lookup(info.name) is not None else None


def _with_base(info: ModelInfo, request: ModelRequest) -> ModelInfo:
    return replace(info, base_model=request.base_model) if request.base_model else info


def _supplied_config(request: ModelRequest) -> ResolvedModel | None:
    supplied, revision = request.supplied, request.revision
    if supplied.config_map is not None:
        config_map = supplied.config_map
        where = f"ConfigMap {config_map.name} key {config_map.key}"
        text = config_map.data.get(config_map.key)
        if text is None:
            raise ConfigUnreadable(
                f"{where} is not there: the ConfigMap has {', '.join(sorted(config_map.data)) or 'no keys'}; put "
                f"the model's config.json under the key {config_map.key!r}"
            )
        config = parse_config_json(text.encode(), where)
        origin = Origin(ArchitectureSource.CONFIG_MAP, request.name, revision, location=where)
        return _from_config(request, config, origin, where)
    if supplied.config_path is not None:
        path = supplied.config_path / "config.json" if supplied.config_path.is_dir() else supplied.config_path
        where = f"config.json at {path}"
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise ConfigUnreadable(
                f"{where} cannot be read ({exc.strerror or exc.__class__.__name__}): check that the path names "
                "the model's config.json or its directory in the engine's model volume"
            ) from None
        config = parse_config_json(content, where)
        origin = Origin(ArchitectureSource.PATH, request.name, revision, location=str(path))
        return _from_config(request, config, origin, where)
    return None


def _asks_hub(name: str) -> bool:
    return "/" in name and is_hub_repo_id(name)


def resolve_model(request: ModelRequest, *, hub: HubConfigs | None = None, offline: bool = False) -> ResolvedModel:
    """The model's ModelInfo and Origin, from the first source that has it (module docstring: the order).

    Raises a `ModelSourceError`: ConfigNotUnderstood / ConfigUnreadable for a supplied or fetched
    config.json, a HubError the catalog cannot stand in for, or ModelNotResolvable.
    """
    known = lookup_through_base(request.name, request.base_model)
    if request.architecture is not None:
        where = f"{request.spec_field}.architecture"
        origin = Origin(ArchitectureSource.SPEC, request.name, request.revision, location=where)
        if known is not None:
            return ResolvedModel(_with_base(replace(known, name=request.name, architecture=request.architecture,
                                                    source=where), request), origin)
        info = ModelInfo(name=request.name, architecture=request.architecture, kind=request.kind, source=where,
                         family=guess_family(request.name))
        return ResolvedModel(_with_base(info, request), origin)
    supplied = _supplied_config(request)
    if supplied is not None:
        return supplied
    warnings: tuple[str, ...] = ()
    if hub is not None and not offline and _asks_hub(request.name):
        revision = request.revision or "main"
        try:
            fetched = hub.fetch_config(request.name, revision, request.supplied.token)
            origin = Origin(ArchitectureSource.HUB, request.name, revision, fetched.commit_sha, fetched.url)
            return _from_config(request, fetched.config, origin, f"config.json of {request.name}@{fetched.commit_sha}",
                                fetched.base_model)
        except _CATALOG_STANDS_IN_FOR as error:
            if known is None:
                raise
            warnings = (f"{error.reason}: {error}; the built-in catalog's numbers are used, unpinned",)
    if known is not None:
        origin = Origin(ArchitectureSource.CATALOG, request.name, request.revision, location=known.source,
                        warnings=warnings)
        return ResolvedModel(_with_base(replace(known, name=request.name), request), origin)
    raise ModelNotResolvable(_unresolvable_message(request, hub, offline))


def _unresolvable_message(request: ModelRequest, hub: HubConfigs | None, offline: bool) -> str:
    if offline:
        why = "planning offline, so the Hub was not asked"
    elif not _asks_hub(request.name):
        why = "it is not an owner/name Hub id, so the Hub was not asked"
    elif hub is None:
        why = "no Hub is configured"
    else:
        why = "the Hub did not describe it"
    return (
        f"`{request.spec_field}.name` {request.name!r} is not in the built-in catalog and no config.json describes it "
        f"({why}): supply its config.json (a ConfigMap in `{request.spec_field}.configMapRef`, or a path in the "
        f"model volume in `.configPath`), let specdeploy read it from the Hub, or add "
        f"`{request.spec_field}.architecture` (numLayers, hiddenSize, intermediateSize, "
        "numAttentionHeads, numKeyValueHeads, vocabSize, numParameters, maxPositionEmbeddings); catalog models "
        f"with similar names: {', '.join(near_names(request.name))}"
    )


def resolve_models(
    spec: SpeculativeDeploymentSpec,
    *,
    hub: HubConfigs | None = None,
    offline: bool = False,
    target: Supplied | None = None,
    draft: Supplied | None = None,
) -> ResolvedModels:
    """The target and the draft (or head) of `spec`, each through `resolve_model`."""
    resolved_target = resolve_model(target_request(spec, target), hub=hub, offline=offline)
    request = draft_request(spec, draft)
    resolved_draft = resolve_model(request, hub=hub, offline=offline) if request is not None else None
    return ResolvedModels(resolved_target, resolved_draft)


def head_findings(spec: SpeculativeDeploymentSpec, models: ResolvedModels) -> list[Finding]:
    """Pairing findings for an EAGLE head read from its own config.json (none for other drafts)."""
    draft = models.draft
    if draft is None or draft.config is None:
        return []
    catalog_target, catalog_head = lookup(spec.model.name), lookup(draft.info.name)
    aliases = {catalog_target.name} if catalog_target else set()
    if models.target.info.base_model:
        aliases.add(models.target.info.base_model)   # a quantised or local copy pairs with its base's heads
    return check_head_pairing(
        spec.speculation.method, spec.model.name, models.target.info.architecture, draft.info.name, draft.config,
        target_aliases=sorted(aliases),
        catalog_targets=catalog_head.targets if catalog_head else (),
    )

