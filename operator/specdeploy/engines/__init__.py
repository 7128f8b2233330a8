"""The engines: each one's renderer (a spec and the planner's numbers in, the engine container's command line out)
and its profile (engines/profile.py: everything else the operator knows about it), one module per engine.

    command = render_engine(EngineInputs(spec, served_model_name="llama", max_model_len=32768))
    command.argv()          # ["vllm", "serve", "meta-llama/…", "--host", "0.0.0.0", …]
    metric_names(EngineKind.SGLANG).acceptance_rate_gauge   # "sglang:spec_accept_rate"
    engine_profile(EngineKind.TRTLLM).schedules.zero_k_speedup   # 1.0: what the operator knows of an engine
    engine_of(["trtllm-serve", "meta-llama/…"])              # EngineKind.TRTLLM

Pure functions: no I/O, no Kubernetes. The operator places the result in a pod; the CLI prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.engines import sglang, trtllm, vllm
from specdeploy.engines.base import (
    CONFIG_MOUNT_PATH,
    EngineCommand,
    EngineInputs,
    EngineRenderError,
    MetricNames,
    NodeRank,
    probes,
)
from specdeploy.engines.profile import EngineProfile, NoMultiNodeLaunch

__all__ = [
    "CONFIG_MOUNT_PATH",
    "DEFAULT_IMAGES",
    "MULTI_NODE_ENGINES",
    "EngineCommand",
    "EngineInputs",
    "EngineRenderError",
    "EngineProfile",
    "MetricNames",
    "NodeRank",
    "engine_of",
    "engine_profile",
    "image_for",
    "metric_names",
    "node_args",
    "probes",
    "render_engine",
]

_PROFILES: MappingProxyType[EngineKind, EngineProfile] = MappingProxyType({
    EngineKind.VLLM: vllm.PROFILE,
    EngineKind.SGLANG: sglang.PROFILE,
    EngineKind.TRTLLM: trtllm.PROFILE,
})

DEFAULT_IMAGES: MappingProxyType[EngineKind, str] = MappingProxyType(
    {kind: profile.default_image for kind, profile in _PROFILES.items()})
"""Per engine: the image whose CLI and metric names its renderer was checked against (`spec.engine.image` wins)."""

# A model's name may follow the program word (`trtllm-serve sglang-org/…`), so the recognisers are asked most
# specific program first; vLLM, the spec's default engine, is also what a command no profile recognises runs.
_RECOGNITION_ORDER = (EngineKind.TRTLLM, EngineKind.SGLANG, EngineKind.VLLM)


MULTI_NODE_ENGINES: tuple[EngineKind, ...] = tuple(
    kind for kind, profile in _PROFILES.items() if not isinstance(profile.multi_node.launch, NoMultiNodeLaunch))
"""The engines whose launch across nodes the operator renders (each profile's `multi_node.launch`)."""


def node_args(kind: EngineKind, node: NodeRank) -> list[str]:
    """The flags that make engine `kind` one rank-group of a layout across nodes (its profile's `multi_node.launch`).

    Raises EngineRenderError for an engine without a multi-node launch the operator renders (TensorRT-LLM starts
    ranks on other nodes only under MPI); planning.topology rejects such specs earlier with a finding.
    """
    launch = _PROFILES[kind].multi_node.launch
    if isinstance(launch, NoMultiNodeLaunch):
        raise EngineRenderError(f"`spec.engine.kind` {kind.value} must not run a layout across nodes: {launch.why}; "
                                f"use {' or '.join(engine.value for engine in MULTI_NODE_ENGINES)}")
    return launch(node)


def render_engine(inputs: EngineInputs) -> EngineCommand:
    """The engine container for `inputs.spec.engine.kind`.

    Raises EngineRenderError when the engine cannot run what the spec asks (e.g. an EAGLE-1 head on
    TensorRT-LLM); planning.compat rejects the same specs earlier with a finding.
    """
    return _PROFILES[inputs.spec.engine.kind].render(inputs)


def engine_profile(kind: EngineKind) -> EngineProfile:
    """Everything the operator knows about an engine besides its command line (engines/profile.py)."""
    return _PROFILES[kind]


def image_for(spec: SpeculativeDeploymentSpec) -> str:
    """spec.engine.image, or the default image of the engine."""
    return spec.engine.image or _PROFILES[spec.engine.kind].default_image


def metric_names(kind: EngineKind) -> MetricNames:
    """The Prometheus metric-name table of an engine."""
    return _PROFILES[kind].metrics


def engine_of(argv: Sequence[str]) -> EngineKind:
    """The engine a container's command line starts (each profile's `runs`); vLLM when none recognises it."""
    return next((kind for kind in _RECOGNITION_ORDER if _PROFILES[kind].runs(argv)), EngineKind.VLLM)
