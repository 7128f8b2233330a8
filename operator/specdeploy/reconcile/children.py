"""`desired_children`: the one function that decides what a SpeculativeDeployment runs.

Create, update, resume and rollback all render through here, from the resource (spec + status) and
its plan; nothing else builds a Deployment. Pure: manifests out, no API calls.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

from specdeploy.api import names
from specdeploy.api.resource import API_VERSION, KIND, SpeculativeDeployment
from specdeploy.api.spec import MODEL_CACHE_PATH, BaselineMode, SpeculativeDeploymentSpec
from specdeploy.engines import CONFIG_MOUNT_PATH, EngineCommand, EngineInputs, image_for, render_engine
from specdeploy.engines.base import MODEL_CACHE_ENV, default_host_requests, uses_launcher
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.plan import Plan
from specdeploy.reconcile import podsecurity
from specdeploy.reconcile.leaderworkerset import ANNOTATION_SPECULATING, leader_worker_set, leaders_only

LABEL_NAME = "specdeploy.io/name"
LABEL_VARIANT = "specdeploy.io/variant"
ANNOTATION_CONFIG_HASH = "specdeploy.io/config-hash"
ANNOTATION_REPLICAS = "specdeploy.io/replicas"
"""On each engine Deployment: the replicas the operator last rendered for it from the SD (`variant_replicas`).
While the SD still asks for that many, a count someone else set on the Deployment since is left to them
(`desired_children`'s `replicas_held`); a new count asked of the SD is applied."""
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
PLAN_FILE = "plan.json"
PREFLIGHT_FILE = "preflight.py"
PREFLIGHT_ENV = "SPECDEPLOY_PREFLIGHT"
"""on (default), warn or off in spec.engine.env: the launcher's variable, read by the init container too."""
MODEL_CACHE_VOLUME = "model-cache"


class Variant(StrEnum):
    SPECULATIVE = "speculative"
    CONTROL = "control"


@dataclass(frozen=True)
class PodMonitoring:
    """Whether the operator renders a PodMonitor per SD (the cluster has prometheus-operator's CRD, the operator is
    let write them and not told not to), with which labels besides its own (for a Prometheus that selects
    monitors by label: kube-prometheus-stack's `release`), and, when the CRD is there but it renders none, why
    (status.monitoring)."""

    render: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    not_rendered: str | None = None


@dataclass(frozen=True)
class Children:
    """Manifests to apply; `deployments` keyed by variant (LeaderWorkerSets for a layout across nodes:
    reconcile/leaderworkerset.py). Children not listed are deleted."""

    config_map: dict[str, Any]
    deployments: dict[Variant, dict[str, Any]]
    service: dict[str, Any]
    pod_monitor: dict[str, Any] | None

    def all(self) -> list[dict[str, Any]]:
        manifests = [self.config_map, *self.deployments.values(), self.service]
        return manifests + ([self.pod_monitor] if self.pod_monitor else [])

    def fingerprint(self, generation: int) -> str:
        """A hash of every manifest and the SD generation they come from: equal fingerprints, equal children.
        Stored on the Deployments, it lets an analysis cycle skip applying what is already applied."""
        text = json.dumps([generation, self.all()], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def speculation_decided(resource: SpeculativeDeployment) -> bool:
    """The pods are to speculate unless the spec turns it off or a rollback (in status) took it away."""
    if not resource.spec.speculation.enabled:
        return False
    status = resource.status
    if status is not None and status.speculation is not None:
        return status.speculation.decided
    return True


def common_labels(resource: SpeculativeDeployment, component: str) -> dict[str, str]:
    name = resource.metadata.name
    return {
        "app.kubernetes.io/name": "specdeploy-engine",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "specdeploy",
        "app.kubernetes.io/component": component,
        LABEL_NAME: name,
    }


def owner_references(resource: SpeculativeDeployment) -> list[dict[str, Any]]:
    if not resource.metadata.uid:
        return []  # rendered offline (`specdeploy render`): no owner yet
    return [{
        "apiVersion": API_VERSION, "kind": KIND, "name": resource.metadata.name,
        "uid": resource.metadata.uid, "controller": True, "blockOwnerDeletion": True,
    }]


def _metadata(resource: SpeculativeDeployment, name: str, labels: dict[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if resource.metadata.namespace:
        metadata["namespace"] = resource.metadata.namespace
    references = owner_references(resource)
    if references:
        metadata["ownerReferences"] = references
    return metadata


def variant_speculates(plan: Plan, variant: Variant, speculate: bool) -> bool:
    """Whether `variant`'s pods speculate; Control never does."""
    return speculate and variant == Variant.SPECULATIVE and plan.spec.speculation.enabled


def engine_command(plan: Plan, variant: Variant, speculate: bool) -> EngineCommand:
    """The engine command line of one variant."""
    speculating = variant_speculates(plan, variant, speculate)
    return render_engine(EngineInputs(
        spec=plan.spec,
        served_model_name=plan.spec.model.name,
        max_model_len=plan.max_model_len,
        speculate=speculating,
        trtllm_free_gpu_memory_fraction=plan.trtllm_free_gpu_memory_fraction(speculating),
        schedule=plan.engine_schedule,
    ))


def _config_key(variant: Variant, file_name: str) -> str:
    return f"{variant.value}.{file_name}"


def downloads(plan: Plan, speculating: bool) -> list[dict[str, Any]]:
    """The models a variant's pods download, at their pinned revisions, with the GiB of each checkpoint: the
    plan's per-GPU weights times the GPUs they are split over. A control pod downloads no draft; MTP layers
    are in the target's checkpoint."""
    spec = plan.spec
    per_gpu = plan.memory.per_gpu
    tp = spec.resources.tensor_parallel_size
    stages = spec.resources.pipeline_parallel_size   # per_gpu is the last stage's share of the layers
    models = [{"name": spec.model.name, "revision": spec.model.revision,
               "gib": round(per_gpu.target_weights_gib * tp * stages, 3)}]
    draft = spec.speculation.draft
    if speculating and draft is not None:
        models.append({"name": draft.name, "revision": draft.revision,
                       "gib": round(per_gpu.draft_weights_gib * (draft.tensor_parallel_size or tp), 3)})
    return models


def _variant_files(plan: Plan, command: EngineCommand, speculating: bool) -> dict[str, str]:
    """The files a variant's pods mount: the engine's config files, and the plan its preflight checks (with the
    pods, one per node, its GPUs are spread over) and the models it downloads."""
    memory = plan.memory if speculating else plan.memory_without_speculation
    files = dict(command.config_files)
    files[PLAN_FILE] = json.dumps({"memoryPlan": memory.to_wire(), "argv": command.argv(),
                                   "nodes": plan.layout.nodes, "downloads": downloads(plan, speculating)},
                                  indent=1) + "\n"
    return files


def model_cache_size_limit(plan: Plan) -> str:
    """The default emptyDir bound: twice the checkpoints' GiB (a checkpoint quantised online, BF16 to FP8, is
    twice what the plan loads) and 5 GiB for tokenizers, configs and a download's partial file."""
    gib = sum(model["gib"] for model in downloads(plan, speculating=True))
    return f"{math.ceil(2 * gib) + 5}Gi"


def _read_only(spec: SpeculativeDeploymentSpec) -> dict[str, bool]:
    """`readOnly: true` for a read-only claim (its mount and its volume), else nothing."""
    claim = spec.storage.model_cache.persistent_volume_claim
    return {"readOnly": True} if claim is not None and claim.read_only else {}


def _model_cache_volume(plan: Plan) -> dict[str, Any]:
    """The `model-cache` volume from spec.storage.modelCache (an emptyDir of the default size when unset)."""
    cache = plan.spec.storage.model_cache
    if cache.persistent_volume_claim is not None:
        claim = cache.persistent_volume_claim
        return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim.claim_name,
                                                                      **_read_only(plan.spec)}}
    if cache.host_path is not None:
        return {"name": MODEL_CACHE_VOLUME, "hostPath": {"path": cache.host_path.path, "type": "DirectoryOrCreate"}}
    size = cache.empty_dir.size_limit if cache.empty_dir is not None else None
    return {"name": MODEL_CACHE_VOLUME, "emptyDir": {
        "sizeLimit": f"{size:g}Gi" if size is not None else model_cache_size_limit(plan)}}


def _model_cache_env(spec: SpeculativeDeploymentSpec) -> tuple[tuple[str, str], ...]:
    """Where the engines download: HF_HOME in the cache (vLLM, SGLang and TensorRT-LLM all download with
    huggingface_hub, which keeps its hub cache under HF_HOME: huggingface_hub/constants.py); offline when the
    claim is read-only, so an engine fails at once on a model the claim lacks instead of trying to write."""
    offline = (("HF_HUB_OFFLINE", "1"),) if _read_only(spec) else ()
    return ((MODEL_CACHE_ENV, f"{MODEL_CACHE_PATH}/huggingface"), *offline)


def _config_hash(files: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def deployment_name(sd_name: str, variant: Variant) -> str:
    """The name of SD `sd_name`'s Deployment of `variant`."""
    return (names.engine_deployment_name if variant == Variant.SPECULATIVE else names.control_deployment_name)(sd_name)


def variant_replicas(spec: SpeculativeDeploymentSpec, variant: Variant) -> int:
    """The pods the SD asks of `variant`: spec.replicas speculative ones (what the scale subresource, and so
    `kubectl scale sd` and an HPA, sets), and controlReplicas control ones whatever the SD scales to — the
    control is a baseline to compare with, sized for the analysis, not for the load."""
    return spec.replicas if variant == Variant.SPECULATIVE else spec.analysis.baseline.control_replicas


def pod_selector(name: str, variant: Variant) -> dict[str, str]:
    """The labels that select SD `name`'s pods of `variant` (its Deployment's selector)."""
    return {LABEL_NAME: name, LABEL_VARIANT: variant.value}


@cache
def preflight_script() -> str:
    """The GPU preflight, one standard-library file (specdeploy_engine/preflight.py, installed with the operator)."""
    return resources.files("specdeploy_engine").joinpath(PREFLIGHT_FILE).read_text(encoding="utf-8")


def preflight_mode(spec: SpeculativeDeploymentSpec) -> str | None:
    """How an init container checks GPU memory before the engine: "on" (refuse), "warn" (report and start), or
    None — no init container, for SPECDEPLOY_PREFLIGHT=off in spec.engine.env and for specdeploy's engine
    images, whose launcher runs the same check itself."""
    if uses_launcher(image_for(spec)):
        return None
    mode = next((e.value.lower() for e in spec.engine.env if e.name == PREFLIGHT_ENV), "on")
    return None if mode == "off" else ("warn" if mode == "warn" else "on")


def _preflight_container(spec: SpeculativeDeploymentSpec, image: str, gpus: str) -> dict[str, Any] | None:
    """The init container that runs the preflight from the ConfigMap with the engine's own image (Python and
    torch): on the same GPUs (the kubelet hands an init container's devices on to the engine), exit 3 with its
    report as the termination message when they cannot hold the plan, so the engine never starts to fail
    minutes later."""
    mode = preflight_mode(spec)
    if mode is None:
        return None
    return {
        "name": "preflight",
        "image": image,
        "command": ["python3", f"{CONFIG_MOUNT_PATH}/{PREFLIGHT_FILE}", "--check", f"{CONFIG_MOUNT_PATH}/{PLAN_FILE}"],
        "env": [*podsecurity.writable_env(()), *([{"name": PREFLIGHT_ENV, "value": mode}] if mode == "warn" else [])],
        "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
        "volumeMounts": [{"name": "engine-config", "mountPath": CONFIG_MOUNT_PATH, "readOnly": True},
                         *podsecurity.writable_mounts()],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": podsecurity.container_security_context(),
    }


def _claim_ownership(spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    """fsGroup for a claim: the kubelet makes the volume's files the engine user's group (most drivers), so the
    non-root engine can write downloads; OnRootMismatch walks a large cache only when its top is not so already."""
    if spec.storage.model_cache.persistent_volume_claim is None:
        return {}
    return {"fsGroup": podsecurity.ENGINE_USER_ID, "fsGroupChangePolicy": "OnRootMismatch"}


def _set(fields: dict[str, Any]) -> dict[str, Any]:
    """The pod fields of `spec.podTemplate.spec` the user set (an unset one is left to Kubernetes' default)."""
    return {key: value for key, value in fields.items() if value not in (None, [])}


def _env(command: EngineCommand, cache_env: tuple[tuple[str, str], ...],
         template_env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine container's env: the operator's writable directories, the model cache's, the engine's with
    spec.engine.env (a user's HF_HOME wins over the cache's), the Hub token from its Secret, then `spec.podTemplate.engineContainer.env`, whose entries may refer to those
    before with $(NAME). One entry per name: the template's replaces a writable directory's default, and the CRD
    refuses it the names spec.engine.env and the token set."""
    template_names = {variable["name"] for variable in template_env}
    engine_names = {name for name, _ in command.env}
    engine_env = (*(pair for pair in cache_env if pair[0] not in engine_names), *command.env)
    return [
        *(v for v in podsecurity.writable_env(engine_env) if v["name"] not in template_names),
        *(variable.manifest() for variable in command.secret_env),
        *template_env,
    ]


def _weights_per_pod(plan: Plan, speculating: bool) -> float:
    """GiB of weights one pod loads: the plan's per-GPU weights over the pod's GPUs."""
    per_gpu = (plan.memory if speculating else plan.memory_without_speculation).per_gpu
    return (per_gpu.target_weights_gib + per_gpu.draft_weights_gib) * plan.layout.gpus_per_pod


def _resources(template: dict[str, Any], gpus: str, defaults: dict[str, str]) -> dict[str, Any]:
    """The engine container's resources: the user's requests and limits; the default request of each host
    resource the user sets neither a request nor a limit for (a limit alone makes Kubernetes request as much);
    the GPUs, always the operator's."""
    limits, requests = dict(template.get("limits") or {}), dict(template.get("requests") or {})
    for resource, amount in defaults.items():
        if resource not in limits and resource not in requests:
            requests[resource] = amount
    resources: dict[str, Any] = {"limits": {**limits, GPU_RESOURCE: gpus}, "requests": {**requests, GPU_RESOURCE: gpus}}
    if template.get("claims"):
        resources["claims"] = template["claims"]
    return resources


def _deployment(
    resource: SpeculativeDeployment, plan: Plan, variant: Variant, command: EngineCommand, files: dict[str, str],
    speculating: bool, replicas_held: bool,
) -> dict[str, Any]:
    spec = resource.spec
    name = deployment_name(resource.metadata.name, variant)
    selector = pod_selector(resource.metadata.name, variant)
    labels = {**common_labels(resource, "engine"), LABEL_VARIANT: variant.value}
    replicas = variant_replicas(spec, variant)
    gpu = find_gpu(spec.resources.gpu.product)
    gpus = str(plan.layout.gpus_per_pod)
    image = image_for(spec)
    template = spec.pod_template
    argv = (
        {"args": command.argv()} if uses_launcher(image)  # the image's launcher runs the preflight first
        else {"command": list(command.command), "args": list(command.args)}
    )
    container = {
        "name": "engine",
        "image": image,
        **argv,
        "env": _env(command, _model_cache_env(spec), template.engine_container.env),
        "ports": [{"name": "http", "containerPort": command.port, "protocol": "TCP"}],
        "resources": _resources(template.engine_container.resources or {}, gpus,
                                default_host_requests(plan.layout.gpus_per_pod, _weights_per_pod(plan, speculating))),
        **command.probes(),
        "volumeMounts": [
            {"name": "engine-config", "mountPath": CONFIG_MOUNT_PATH, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            *podsecurity.writable_mounts(),
            {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH, **_read_only(spec)},
            *template.engine_container.volume_mounts,
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": podsecurity.container_security_context(),
    }
    settings = template.spec
    preflight = _preflight_container(spec, image, gpus)
    pod_spec: dict[str, Any] = {
        **({"initContainers": [preflight]} if preflight is not None else {}),
        "containers": [container],
        "nodeSelector": {**settings.node_selector,
                         GPU_PRODUCT_LABEL: gpu.node_label if gpu else spec.resources.gpu.product},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}, *settings.tolerations],
        "volumes": [
            {"name": "engine-config", "configMap": {
                "name": names.config_map_name(resource.metadata.name),
                "items": [{"key": _config_key(variant, f), "path": f} for f in sorted(files)]
                + ([{"key": PREFLIGHT_FILE, "path": PREFLIGHT_FILE}] if preflight is not None else []),
            }},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            *podsecurity.writable_volumes(),
            _model_cache_volume(plan),
            *settings.volumes,
        ],
        **_set({"affinity": settings.affinity, "priorityClassName": settings.priority_class_name,
                "imagePullSecrets": settings.image_pull_secrets, "serviceAccountName": settings.service_account_name,
                "runtimeClassName": settings.runtime_class_name}),
        "securityContext": {**podsecurity.pod_security_context(), **_claim_ownership(spec)},
        # Engines call no Kubernetes API; and Service links would put e.g. VLLM_PORT=tcp://… (from a
        # Service named vllm) into the environment, which vLLM reads as its own setting.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
    }
    metadata = _metadata(resource, name, labels)
    metadata["annotations"] = {ANNOTATION_SPECULATING: "true" if speculating else "false",
                               ANNOTATION_REPLICAS: str(replicas)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            # Left out while someone else holds it: server-side apply then leaves the field to its owner.
            **({} if replicas_held else {"replicas": replicas}),
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable}},
            "template": {
                "metadata": {"labels": {**template.metadata.labels, **labels}, "annotations": {
                    **template.metadata.annotations, ANNOTATION_CONFIG_HASH: _config_hash(files)}},
                "spec": pod_spec,
            },
        },
    }


def variants(spec: SpeculativeDeploymentSpec) -> tuple[Variant, ...]:
    """The Deployments an accepted spec runs: the speculative one, and Control's when there is a baseline."""
    if spec.analysis.baseline.mode == BaselineMode.CONTROL and spec.speculation.enabled:
        return (Variant.SPECULATIVE, Variant.CONTROL)
    return (Variant.SPECULATIVE,)


def desired_children(resource: SpeculativeDeployment, plan: Plan, *, pod_monitoring: PodMonitoring = PodMonitoring(),
                     replicas_held: frozenset[Variant] = frozenset()) -> Children:
    """The manifests `resource` should run, given its plan (which must be accepted). The Deployments of the
    variants in `replicas_held` carry no replicas: another writer set them and the SD asks for nothing new
    (reconcile/decide.py `replicas_held`)."""
    spec = resource.spec
    name = resource.metadata.name
    speculate = speculation_decided(resource)
    deployments: dict[Variant, dict[str, Any]] = {}
    across_nodes = plan.layout.spans_nodes
    served = leaders_only if across_nodes else dict   # a worker of a group serves nothing
    config_data: dict[str, str] = {}
    first_command: EngineCommand | None = None
    for variant in variants(spec):
        command = engine_command(plan, variant, speculate)
        first_command = first_command or command
        speculating = variant_speculates(plan, variant, speculate)
        files = _variant_files(plan, command, speculating)
        config_data.update({_config_key(variant, f): content for f, content in files.items()})
        deployment = _deployment(resource, plan, variant, command, files, speculating, variant in replicas_held)
        deployments[variant] = leader_worker_set(deployment, plan) if across_nodes else deployment
    assert first_command is not None
    if preflight_mode(spec) is not None:
        config_data[PREFLIGHT_FILE] = preflight_script()   # not in the config hash: it restarts no engine
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(resource, names.config_map_name(name), common_labels(resource, "engine-config")),
        "data": dict(sorted(config_data.items())),
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(resource, names.service_name(name), common_labels(resource, "service")),
        "spec": {
            "selector": served({LABEL_NAME: name}),
            "ports": [{"name": "http", "port": spec.serving.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    monitor = None
    if pod_monitoring.render:
        labels = {**pod_monitoring.labels, **common_labels(resource, "monitoring")}   # the operator's own win
        monitor = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": _metadata(resource, names.service_name(name), labels),
            "spec": {
                "selector": {"matchLabels": served({LABEL_NAME: name})},
                "podTargetLabels": [LABEL_NAME, LABEL_VARIANT],
                "podMetricsEndpoints": [{"port": "http", "path": first_command.metrics_path, "interval": "15s"}],
            },
        }
    return Children(config_map, deployments, service, monitor)
