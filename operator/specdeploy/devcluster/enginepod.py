"""An engine pod as the pod runner sees it: what to run, with which files, scraped where and labelled how.

    engine = engine_pod(pod)          # None for a pod without an engine container to simulate
    engine.argv                       # the container's command + args, exactly as in the pod spec
    engine.pod_ip, engine.port        # where a client of the pod connects: status.podIP, the containerPort
    engine.target_labels()            # {"namespace": …, "pod": …, "specdeploy_io_name": …, …}

Pure functions of the Pod object (JSON as the apiserver returns it), so the runner's decisions can be
tested without a cluster.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from specdeploy.engines import CONFIG_MOUNT_PATH, engine_of, engine_profile
from specdeploy.reconcile.leaderworkerset import LABEL_ROLE, Role

LABEL_NAME = "specdeploy.io/name"
LABEL_VARIANT = "specdeploy.io/variant"
ENGINE_CONTAINER = "engine"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
FALLBACK_TO_LOGS = "FallbackToLogsOnError"
#: Extra simulator options from the engine container's environment, shell-quoted ("--time-scale 8"): the
#: engine image's launcher (specdeploy_engine.launch) reads the same variable.
SIM_OPTIONS_ENV = "SPECDEPLOY_SIM_OPTIONS"
#: The Hub bandwidth the runner models for this pod's downloads, MiB/s; unset: weights take no time to arrive.
HUB_BANDWIDTH_ENV = "SPECDEPLOY_DEV_HUB_MIBPS"
MODEL_CACHE_VOLUME = "model-cache"
#: MiB of each of the pod's GPUs another process holds, as its GPU preflight sees them; unset: none.
GPU_HELD_ENV = "SPECDEPLOY_DEV_GPU_HELD_MIB"

#: Environment variables of the pod that would break the local Python running the simulator.
_HOST_ENV = frozenset({"PATH", "HOME", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD"})
_TARGET_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_VARIABLE_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def prometheus_label(kubernetes_label: str) -> str:
    """A pod label as Prometheus' relabelling writes it (`specdeploy.io/name` → `specdeploy_io_name`)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", kubernetes_label)


@dataclass(frozen=True)
class ConfigVolume:
    """The ConfigMap mounted at /etc/specdeploy: which keys land at which relative paths."""

    config_map: str
    items: tuple[tuple[str, str], ...]   # (key, path); empty = every key under its own name
    optional: bool = False


@dataclass(frozen=True)
class CacheVolume:
    """The pod's weight cache (the operator's `model-cache` volume): which pods share it is told by its source."""

    source: str       # persistentVolumeClaim, hostPath or emptyDir
    name: str = ""    # the claim's name or the node's path; empty for an emptyDir


@dataclass(frozen=True)
class InitContainer:
    """An init container the runner runs before the engine (the operator's GPU preflight)."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    gpus: int


@dataclass(frozen=True)
class EnginePod:
    """Everything the runner needs from one engine pod."""

    namespace: str
    name: str
    uid: str
    sd: str
    variant: str
    container: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    config: ConfigVolume | None = None
    gpu_product: str | None = None
    health_path: str = "/health"
    port_name: str = "http"
    port: int | None = None       # the containerPort named `port_name`; None when the container declares none
    pod_ip: str = ""              # status.podIP: kwok sets it with phase Running (its pod-ready stage)
    termination_message_policy: str = "File"
    node: str = ""                # spec.nodeName
    cache: CacheVolume | None = None
    init_containers: tuple[InitContainer, ...] = ()
    role: str = ""                # specdeploy.io/role: leader or worker of a LeaderWorkerSet's group; "" otherwise

    @property
    def serves(self) -> bool:
        """Whether the pod runs an engine that serves: a group's worker holds ranks and serves nothing."""
        return self.role != Role.WORKER

    @property
    def hub_bandwidth_mibps(self) -> float | None:
        """The container's SPECDEPLOY_DEV_HUB_MIBPS (ValueError when not a positive number)."""
        value = self.env.get(HUB_BANDWIDTH_ENV)
        if value is None:
            return None
        mibps = float(value)
        if mibps <= 0:
            raise ValueError(f"{HUB_BANDWIDTH_ENV} must be positive, got {value!r}")
        return mibps

    @property
    def engine(self) -> str:
        """vllm, sglang or trtllm, told by the command (the engine profiles' recognisers)."""
        return engine_of(self.argv).value

    @property
    def metrics_path(self) -> str:
        """Where the real engine serves Prometheus text (TRT-LLM: /prometheus/metrics)."""
        return engine_profile(engine_of(self.argv)).metrics_path

    @property
    def seed(self) -> int:
        """A seed stable for this pod (same namespace and name, same randomness), below 2**31."""
        digest = hashlib.sha256(f"{self.namespace}/{self.name}".encode()).hexdigest()
        return int(digest[:8], 16) & 0x7FFFFFFF

    @property
    def simulator_options(self) -> tuple[str, ...]:
        """The container's SPECDEPLOY_SIM_OPTIONS, split as a shell would (ValueError on bad quoting)."""
        return tuple(shlex.split(self.env.get(SIM_OPTIONS_ENV, "")))

    @property
    def target_name(self) -> str:
        """The scrape target's file name: `<namespace>.<pod>`, shortened with the uid when too long."""
        name = _TARGET_NAME_UNSAFE.sub("-", f"{self.namespace}.{self.name}")
        if len(name) > 128:
            name = f"{name[:110]}.{self.uid[:8]}"
        return name

    def target_labels(self) -> dict[str, str]:
        """The labels a PodMonitor with podTargetLabels [specdeploy.io/name, specdeploy.io/variant] adds."""
        labels = {
            "namespace": self.namespace,
            "pod": self.name,
            "container": self.container,
            "endpoint": self.port_name,
            prometheus_label(LABEL_NAME): self.sd,
        }
        if self.variant:
            labels[prometheus_label(LABEL_VARIANT)] = self.variant
        return labels

    @property
    def kubelet_name(self) -> str:
        """How the kubelet names a pod in messages (`format.Pod`): name_namespace(uid)."""
        return f"{self.name}_{self.namespace}({self.uid})"


def wants_simulator(pod: dict[str, Any]) -> bool:
    """A labelled pod that kwok has marked Running and that is not being deleted."""
    metadata = pod.get("metadata") or {}
    return (LABEL_NAME in (metadata.get("labels") or {}) and not metadata.get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") == "Running")


def engine_container(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The container named `engine`, else the first one."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == ENGINE_CONTAINER:
            return dict(container)
    return dict(containers[0]) if containers else None


def engine_pod(pod: dict[str, Any]) -> EnginePod | None:
    """The engine pod described by `pod`, or None when it has no container with a command line."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels = metadata.get("labels") or {}
    container = engine_container(pod)
    if container is None:
        return None
    env = _literal_env(container)
    argv = tuple(expand(str(a), env) for a in [*(container.get("command") or []), *(container.get("args") or [])])
    if not argv:
        return None
    probe = (container.get("readinessProbe") or container.get("startupProbe") or {}).get("httpGet") or {}
    ports = container.get("ports") or []
    container_port = ports[0].get("containerPort") if ports else None
    return EnginePod(
        namespace=str(metadata.get("namespace", "default")),
        name=str(metadata["name"]),
        uid=str(metadata.get("uid", "")),
        sd=str(labels.get(LABEL_NAME, "")),
        variant=str(labels.get(LABEL_VARIANT, "")),
        container=str(container.get("name", ENGINE_CONTAINER)),
        argv=argv,
        env=env,
        config=config_volume(spec, container),
        gpu_product=(spec.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL),
        health_path=str(probe.get("path") or "/health"),
        port_name=str(ports[0].get("name", "http")) if ports else "http",
        port=int(container_port) if container_port else None,
        pod_ip=str((pod.get("status") or {}).get("podIP") or ""),
        termination_message_policy=str(container.get("terminationMessagePolicy") or "File"),
        node=str(spec.get("nodeName") or ""),
        cache=cache_volume(spec),
        init_containers=tuple(_init_container(c) for c in spec.get("initContainers") or []),
        role=str(labels.get(LABEL_ROLE, "")),
    )


def expand(argument: str, env: dict[str, str]) -> str:
    """`$(VAR)` in a command or argument replaced by the container's variable, as the kubelet does: `$$` is a
    literal `$`, a variable the container does not define stays as written (LeaderWorkerSet's webhook defines
    LWS_LEADER_ADDRESS and LWS_WORKER_INDEX, which the operator's multi-node flags name)."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VARIABLE_REFERENCE.sub(replace, argument)


def _literal_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in container.get("env") or []
            if "name" in e and "valueFrom" not in e and e["name"] not in _HOST_ENV}


def _init_container(container: dict[str, Any]) -> InitContainer:
    gpus = ((container.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE, 0)
    return InitContainer(str(container.get("name", "")),
                         tuple(str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]),
                         _literal_env(container), int(gpus))


def cache_volume(spec: dict[str, Any]) -> CacheVolume | None:
    """The pod's `model-cache` volume, or None (a pod the operator did not render)."""
    for volume in spec.get("volumes") or []:
        if volume.get("name") != MODEL_CACHE_VOLUME:
            continue
        if "persistentVolumeClaim" in volume:
            return CacheVolume("persistentVolumeClaim", str(volume["persistentVolumeClaim"].get("claimName", "")))
        if "hostPath" in volume:
            return CacheVolume("hostPath", str(volume["hostPath"].get("path", "")))
        return CacheVolume("emptyDir")
    return None


def config_volume(spec: dict[str, Any], container: dict[str, Any]) -> ConfigVolume | None:
    """The configMap volume the container mounts at /etc/specdeploy (what the engine reads there)."""
    mounted = {m.get("name") for m in container.get("volumeMounts") or []
               if str(m.get("mountPath", "")).rstrip("/") == CONFIG_MOUNT_PATH}
    for volume in spec.get("volumes") or []:
        source = volume.get("configMap")
        if volume.get("name") in mounted and source:
            items = tuple((str(i["key"]), str(i["path"])) for i in source.get("items") or [])
            return ConfigVolume(str(source.get("name", "")), items, bool(source.get("optional", False)))
    return None


def config_files(volume: ConfigVolume, data: dict[str, str]) -> dict[str, str]:
    """Relative path → content, as the kubelet projects a ConfigMap (listed items only, when listed).

    Raises KeyError naming a listed key the ConfigMap lacks (the kubelet refuses to mount it).
    """
    if not volume.items:
        return dict(data)
    files = {}
    for key, path in volume.items:
        if key not in data:
            raise KeyError(f"configmap {volume.config_map!r} has no key {key!r}")
        files[path] = data[key]
    return files


def safe_relative(path: str) -> bool:
    """A projected path stays inside the mount (the apiserver already refuses `..` and absolute paths)."""
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")
