"""What every engine renderer takes and gives: the inputs, the container command, probes and metric names.

A renderer is a pure function `EngineInputs -> EngineCommand`. The operator puts `command`/`args`/`env`
into the engine container, `config_files` into the SpeculativeDeployment's ConfigMap (mounted at
`CONFIG_MOUNT_PATH`), probes on `health_path`, and scrapes `metrics_path` with the names in `metrics`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from specdeploy.api.spec import (
    HUB_TOKEN_ENV,
    TOKEN_SECRET_KEY,
    Quantization,
    SpeculativeDeploymentSpec,
)

CONFIG_MOUNT_PATH = "/etc/specdeploy"
"""Where the operator mounts the ConfigMap holding `EngineCommand.config_files`."""

MODEL_CACHE_ENV = "HF_HOME"
"""Where every engine keeps what it downloads: vLLM, SGLang and TensorRT-LLM fetch models with huggingface_hub,
whose hub cache is $HF_HOME/hub (huggingface_hub/constants.py)."""

LISTEN_HOST = "0.0.0.0"
"""Engines listen on every pod address: kubelet probes and Prometheus come from outside the container."""

class EngineRenderError(ValueError):
    """The spec asks for something this engine cannot run; the message says what to change."""


@dataclass(frozen=True)
class NodeRank:
    """One pod of a layout that spans nodes, as its engine is told: `nodes` in the group, this pod's `rank` (0 on
    the leader) and the leader's address, each as the container expands them (e.g. "$(LWS_WORKER_INDEX)")."""

    nodes: int
    rank: str
    leader_address: str

    @property
    def leader(self) -> bool:
        return self.rank == "0"


@dataclass(frozen=True)
class MetricNames:
    """One engine's Prometheus names for the signals the analysis reads; None where the engine has none.

    Counters carry their exposed `_total` suffix. Acceptance rate is rate(accepted) / rate(draft tokens)
    where the engine counts tokens (vLLM, TensorRT-LLM); SGLang only exports gauges of both.
    """

    drafts_total: str | None
    draft_tokens_total: str | None
    accepted_tokens_total: str | None
    accepted_tokens_per_pos_total: str | None
    acceptance_rate_gauge: str | None
    acceptance_length_gauge: str | None
    time_to_first_token: str
    inter_token_latency: str
    time_per_output_token: str   # per token, per request: what the latency checks compare (see vllm.py)
    e2e_request_latency: str
    request_queue_time: str | None
    requests_running: str
    requests_waiting: str
    kv_cache_usage: str
    request_success_total: str
    model_label: str = "model_name"
    position_label: str | None = None    # label of the per-position counters that holds the position (from 0)
    # Drafts that proposed each position (TensorRT-LLM): the denominator of a position's acceptance when the
    # drafts of a window do not all propose the same number of tokens. None: only drafts_total (vLLM).
    drafted_tokens_per_pos_total: str | None = None
    generation_tokens_total: str | None = None   # output tokens: the Throughput objective's tokens per GPU
    # Time in the engine without the queue (scheduled → first token, scheduled → last token): the Latency
    # objective's TTFT and end-to-end sources. None: the analysis derives them as TTFT (E2E) − queue time.
    request_prefill_time: str | None = None
    request_inference_time: str | None = None

    def names(self) -> tuple[str, ...]:
        """Every metric name in the table (for checks that a simulator exports them all)."""
        values = (
            self.drafts_total, self.draft_tokens_total, self.accepted_tokens_total,
            self.accepted_tokens_per_pos_total, self.acceptance_rate_gauge, self.acceptance_length_gauge,
            self.time_to_first_token, self.inter_token_latency, self.time_per_output_token,
            self.e2e_request_latency,
            self.request_queue_time, self.requests_running, self.requests_waiting, self.kv_cache_usage,
            self.request_success_total, self.generation_tokens_total, self.request_prefill_time,
            self.request_inference_time, self.drafted_tokens_per_pos_total,
        )
        return tuple(v for v in values if v is not None)


class BatchK(NamedTuple):
    """k drafted tokens per step at every batch size from min_batch to max_batch, both included."""

    min_batch: int
    max_batch: int
    k: int


@dataclass(frozen=True)
class EngineInputs:
    """What a renderer needs beyond the spec, already decided by the planner.

    spec: the resource's spec, as the user wrote it.
    served_model_name: the name clients send in `model` and the engine puts in its metrics' model label.
    max_model_len: the context length to serve (spec.serving.maxModelLen or the model's maximum).
    speculate: False renders the same target without speculation (rollback, the Control variant);
        speculation also stays off when spec.speculation.enabled is false.
    trtllm_free_gpu_memory_fraction: TensorRT-LLM's kv_cache_config.free_gpu_memory_fraction, computed
        by the memory planner (TensorRT-LLM takes a fraction of the memory left after weights, not of
        the whole GPU); None leaves TensorRT-LLM's default.
    schedule: k per batch range covering 1..maxNumSeqs in ascending order (planning.schedule, modes Auto and
        Table); None drafts spec.speculation.numSpeculativeTokens at every batch size (mode Fixed).
    """

    spec: SpeculativeDeploymentSpec
    served_model_name: str
    max_model_len: int
    speculate: bool = True
    trtllm_free_gpu_memory_fraction: float | None = None
    schedule: tuple[BatchK, ...] | None = None

    @property
    def max_k(self) -> int:
        """The tokens the engine is started to draft at most: the schedule's largest k, else the spec's."""
        if self.schedule is None:
            return self.spec.speculation.num_speculative_tokens
        return max(entry.k for entry in self.schedule)

    @property
    def speculating(self) -> bool:
        """Whether the rendered command speculates."""
        return self.speculate and self.spec.speculation.enabled


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable the kubelet fills from a Secret's key: the manifest names the Secret, never
    holds its value."""

    name: str
    secret: str
    key: str

    def manifest(self) -> dict[str, Any]:
        """The container env entry (`valueFrom.secretKeyRef`; not optional: a pod without it does not start)."""
        return {"name": self.name, "valueFrom": {"secretKeyRef": {"name": self.secret, "key": self.key}}}


@dataclass(frozen=True)
class EngineCommand:
    """The engine container: command line, environment, port, endpoints, config files and metric names."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    port: int
    health_path: str
    metrics_path: str
    metrics: MetricNames
    config_files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    secret_env: tuple[SecretEnv, ...] = ()   # after `env`; the CRD refuses an `env` of the same name

    def argv(self) -> list[str]:
        """The whole command line: command then args."""
        return [*self.command, *self.args]

    def probes(self) -> dict[str, dict[str, Any]]:
        """startupProbe, readinessProbe and livenessProbe for the engine container."""
        return probes(self.port, self.health_path)


STARTUP_TIMEOUT_SECONDS = 3600
"""How long a pod may take to download and load weights before kubelet restarts it (70B BF16 is
~140 GB; at a few hundred MB/s from a model hub that alone is several minutes, more on slower links)."""


def probes(port: int, health_path: str, startup_timeout_s: int = STARTUP_TIMEOUT_SECONDS) -> dict[str, dict[str, Any]]:
    """Kubernetes probe objects for an engine serving `health_path` on `port`.

    Loading a model takes minutes, so a startupProbe with a long failureThreshold × periodSeconds holds
    the other two back until the engine first answers; after that readiness takes a stuck pod out of the
    Service within ~15 s and liveness restarts one that has stopped answering for a minute.
    """
    get = {"path": health_path, "port": port}
    period = 10
    return {
        "startupProbe": {
            "httpGet": dict(get), "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": max(1, startup_timeout_s // period),
        },
        "readinessProbe": {
            "httpGet": dict(get), "periodSeconds": 5, "timeoutSeconds": 3,
            "failureThreshold": 3, "successThreshold": 1,
        },
        "livenessProbe": {
            "httpGet": dict(get), "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4,
        },
    }


HOST_MEMORY_OVERHEAD_GIB = 8
"""Host memory of an engine besides the weights: the Python processes, CUDA's host side, tokenizers, the
HTTP server (a round figure, not measured per engine)."""


def default_host_requests(gpus: int, weights_gib: float) -> dict[str, str]:
    """The engine container's CPU and memory requests when `spec.podTemplate` sets none (docs/operator.md
    "Pod settings").

    CPU: one core per GPU and two more. Each engine runs one busy process per GPU (vLLM's multiproc workers,
    SGLang's schedulers, TensorRT-LLM's MPI ranks) and, beside them, the HTTP server with the tokenizer and
    the scheduling loop (vLLM's API server and EngineCore, SGLang's tokenizer manager and detokenizer,
    TensorRT-LLM's executor). Memory: the weights one pod loads, which pass through host memory (safetensors
    are read through the page cache), plus HOST_MEMORY_OVERHEAD_GIB. Requests only: a memory limit would
    kill a pod at a loading peak, so limits are the user's to set. The three engines share the rule."""
    return {"cpu": str(gpus + 2), "memory": f"{math.ceil(weights_gib) + HOST_MEMORY_OVERHEAD_GIB}Gi"}


def uses_launcher(image: str) -> bool:
    """Whether `image` is one of specdeploy's engine images (engine-image/Dockerfile*), whose ENTRYPOINT is
    the launcher (GPU preflight, then the engine): the engine argv then goes in `args` only."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return name.startswith("specdeploy-engine")


def user_env(spec: SpeculativeDeploymentSpec) -> tuple[tuple[str, str], ...]:
    """spec.engine.env as (name, value) pairs, in the user's order."""
    return tuple((variable.name, variable.value) for variable in spec.engine.env)


def hub_token_env(spec: SpeculativeDeploymentSpec) -> tuple[SecretEnv, ...]:
    """HF_TOKEN from the spec's token Secret (`hub_token_secret`), for engines that download from the Hugging Face
    Hub with huggingface_hub, which reads the token from HF_TOKEN (huggingface_hub/utils/_auth.py `get_token`);
    nothing without a Secret."""
    secret = spec.hub_token_secret
    return (SecretEnv(HUB_TOKEN_ENV, secret, TOKEN_SECRET_KEY),) if secret else ()


# spec quantization -> the --quantization value vLLM and SGLang share; None lets the engine read the
# checkpoint's quantization_config from config.json.
_EXPLICIT_QUANTIZATION = {Quantization.FP8: "fp8", Quantization.AWQ: "awq", Quantization.GPTQ: "gptq"}


def explicit_quantization(quantization: Quantization) -> str | None:
    """The --quantization value to pass (vLLM, SGLang), or None to let the engine read the checkpoint's.

    fp8 runs an FP8 checkpoint or quantises a BF16 one online. awq and gptq name checkpoint formats;
    passing them makes a BF16 checkpoint fail at start-up instead of silently loading at twice the planned
    size, and costs no speed (vLLM 0.33 upgrades a user's awq/gptq to its auto_awq/auto_gptq kernels in
    override_quantization_method). int8 and int4 have no single engine name (compressed-tensors W8A8 or
    W4A16, GPTQ, AWQ …): the checkpoint's quantization_config decides.
    """
    return _EXPLICIT_QUANTIZATION.get(quantization)


def merge_extra_config(
    rendered: Mapping[str, Any], spec: SpeculativeDeploymentSpec, engine_key: Callable[[str], str] = str,
) -> dict[str, Any]:
    """The speculative config `rendered` from the typed fields with `spec.speculation.extraConfig` added.

    `engine_key` maps a key to the one the engine reads (vLLM replaces `-` by `_`). A key that means one the
    operator rendered is refused: the CRD refuses the exact names and the plan the other spellings, so this
    only stops a spec that skipped both from overriding what the memory plan was made from.
    """
    extra = spec.speculation.extra_config or {}
    rendered_keys = {engine_key(key) for key in rendered}
    clashes = sorted(key for key in extra if engine_key(key) in rendered_keys)
    if clashes:
        raise EngineRenderError(
            f"`spec.speculation.extraConfig` must not set {', '.join(clashes)}: the operator renders "
            "them from the spec's fields; remove them and set those fields"
        )
    return {**extra, **rendered}


def compact_json(value: Mapping[str, Any]) -> str:
    """JSON with sorted keys and no spaces: one shell word, the same text for the same config."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
