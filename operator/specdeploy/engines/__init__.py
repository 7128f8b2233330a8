"""Engine renderers: a spec (and the planner's numbers) in, the engine container's command line out.

    command = render_engine(EngineInputs(spec, served_model_name="llama", max_model_len=32768))
    command.argv()          # ["vllm", "serve", "meta-llama/…", "--host", "0.0.0.0", …]
    metric_names(EngineKind.SGLANG).acceptance_rate_gauge   # "sglang:spec_accept_rate"

Pure functions: no I/O, no Kubernetes. The operator places the result in a pod; the CLI prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from specdeploy.api.spec import EngineKind
from specdeploy.engines import sglang, trtllm, vllm
from specdeploy.engines.base import (
    CONFIG_MOUNT_PATH,
    DEFAULT_IMAGES,
    EngineCommand,
    EngineInputs,
    EngineRenderError,
    MetricNames,
    NodeRank,
    image_for,
    probes,
)

__all__ = [
    "CONFIG_MOUNT_PATH",
    "DEFAULT_IMAGES",
    "EngineCommand",
    "EngineInputs",
    "EngineRenderError",
    "MetricNames",
    "NodeRank",
    "image_for",
    "metric_names",
    "node_args",
    "probes",
    "render_engine",
]

_RENDERERS: MappingProxyType[EngineKind, Callable[[EngineInputs], EngineCommand]] = MappingProxyType({
    EngineKind.VLLM: vllm.render,
    EngineKind.SGLANG: sglang.render,
    EngineKind.TRTLLM: trtllm.render,
})

_METRICS: MappingProxyType[EngineKind, MetricNames] = MappingProxyType({
    EngineKind.VLLM: vllm.METRICS,
    EngineKind.SGLANG: sglang.METRICS,
    EngineKind.TRTLLM: trtllm.METRICS,
})


_NODE_ARGS: MappingProxyType[EngineKind, Callable[[NodeRank], list[str]]] = MappingProxyType({
    EngineKind.VLLM: vllm.node_args,
    EngineKind.SGLANG: sglang.node_args,
})


def node_args(kind: EngineKind, node: NodeRank) -> list[str]:
    """The flags that make engine `kind` one rank-group of a layout across nodes.

    Raises EngineRenderError for an engine without a multi-node launch the operator renders (TensorRT-LLM starts
    ranks on other nodes only under MPI); planning.topology rejects such specs earlier with a finding.
    """
    if kind not in _NODE_ARGS:
        raise EngineRenderError(
            f"`spec.engine.kind` {kind.value} must not run a layout across nodes: its serve command starts ranks on "
            "other nodes only under MPI, which the operator does not render; use vllm or sglang")
    return _NODE_ARGS[kind](node)


def render_engine(inputs: EngineInputs) -> EngineCommand:
    """The engine container for `inputs.spec.engine.kind`.

    Raises EngineRenderError when the engine cannot run what the spec asks (e.g. an EAGLE-1 head on
    TensorRT-LLM); planning.compat rejects the same specs earlier with a finding.
    """
    return _RENDERERS[inputs.spec.engine.kind](inputs)


def metric_names(kind: EngineKind) -> MetricNames:
    """The Prometheus metric-name table of an engine."""
    return _METRICS[kind]
