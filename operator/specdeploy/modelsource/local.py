"""Model resolution where `specdeploy plan` runs: outside the cluster, with the Hub settings it is given.

    models, notes = resolve_here(spec, offline=False, cache_dir=Path("~/.cache/specdeploy/hub-configs"),
                                 endpoint=os.environ.get("HF_ENDPOINT"), token=os.environ.get("HF_TOKEN"))

Nothing here can read a ConfigMap or a Secret, so `configMapRef` and `tokenSecretRef` are left to the
operator and a note says so; a `configPath` is read when it exists on this machine (a model downloaded
here), and otherwise noted and skipped. Then the Hub, unless `offline`, and the catalog, in the order of
`resolve.py`. huggingface_hub is imported only when the Hub is asked, so an offline plan never loads it.
"""

from __future__ import annotations

from pathlib import Path

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.modelsource.resolve import ResolvedModels, Supplied, resolve_models

__all__ = ["is_true", "resolve_here", "supplied_here"]

_TRUE_WORDS = frozenset({"1", "ON", "YES", "TRUE"})   # huggingface_hub constants._is_true, for HF_HUB_OFFLINE


def is_true(value: str | None) -> bool:
    """An environment flag as huggingface_hub reads its own (HF_HUB_OFFLINE=1, =true, =yes, =on)."""
    return value is not None and value.strip().upper() in _TRUE_WORDS


def supplied_here(
    spec_field: str, config_path: str | None, config_map_ref: str | None, token_secret_ref: str | None
) -> tuple[Supplied, list[str]]:
    """What this machine can supply for one model (`spec_field` names it), and notes on what it cannot."""
    notes = []
    if config_map_ref:
        notes.append(f"`{spec_field}.configMapRef` {config_map_ref} is read by the operator in the cluster; "
                     "here the model is resolved without it")
    if token_secret_ref:
        notes.append(f"`{spec_field}.tokenSecretRef` {token_secret_ref} is read by the operator in the cluster; "
                     "here the token comes from HF_TOKEN")
    path = Path(config_path) if config_path else None
    if path is not None and not path.exists():
        notes.append(f"`{spec_field}.configPath` {config_path} is not on this machine; here the model is "
                     "resolved without it")
        path = None
    return Supplied(config_path=path), notes


def resolve_here(
    spec: SpeculativeDeploymentSpec,
    *,
    offline: bool,
    cache_dir: Path,
    endpoint: str | None = None,
    token: str | None = None,
) -> tuple[ResolvedModels, list[str]]:
    """The spec's models as `specdeploy plan` resolves them, and the notes to print.

    Raises a `ModelSourceError` (see `specdeploy.modelsource`) when a model cannot be resolved.
    """
    model, draft = spec.model, spec.speculation.draft
    target, notes = supplied_here("spec.model", model.config_path, model.config_map_ref, model.token_secret_ref)
    supplied_draft = None
    if draft is not None:
        supplied_draft, draft_notes = supplied_here(
            "spec.speculation.draft", draft.config_path, draft.config_map_ref, draft.token_secret_ref)
        notes += draft_notes
    hub = None
    if not offline:
        from specdeploy.modelsource.hub import HubClient  # loads huggingface_hub: only when the Hub is asked

        hub = HubClient(cache_dir, endpoint=endpoint or None, token=token or None)
    return resolve_models(spec, hub=hub, offline=offline, target=target, draft=supplied_draft), notes
