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
    "image_for",
    "metric_names",
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


def render_engine(inputs: EngineInputs) -> EngineCommand:
    """The engine container for `inputs.spec.engine.kind`.

    Raises EngineRenderError when the engine cannot run what the spec asks (e.g. an EAGLE-1 head on
    TensorRT-LLM); planning.compat rejects the same specs earlier with a finding.
    """
    return _RENDERERS[inputs.spec.engine.kind](inputs)


def metric_names(kind: EngineKind) -> MetricNames:
    """The Prometheus metric-name table of an engine."""
    return _METRICS[kind]
