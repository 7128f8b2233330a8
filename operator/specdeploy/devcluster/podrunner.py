"""The pod runner: engine pods on kwok nodes come alive as simulator processes at their pod IPs.

    python -m specdeploy.devcluster.podrunner --state-dir DIR     # `dev-cluster up --monitoring` starts it

For every pod labelled `specdeploy.io/name` that kwok marks Running, it starts
`python -m specdeploy_engine.sim --seed S [$SPECDEPLOY_SIM_OPTIONS] --host IP --port P --config-dir D -- <the
engine container's command + args>` with the pod's ConfigMap files in D (the container's SPECDEPLOY_SIM_OPTIONS,
e.g. "--time-scale 8", as the engine image's launcher reads it), listening where a client of the pod connects in a
real cluster: IP is the pod's status.podIP (a loopback address, see nodes.py), P its containerPort. It registers
it as a Prometheus scrape target with the labels a PodMonitor gives, and lists it in
``<state>/podrunner/sims.json``. When the pod is deleted it stops the
process and removes the target. When the process exits on its own it does what a kubelet does: writes
the end into the pod's status (restartCount, lastState.terminated with exit code, reason and the log tail
as message, CrashLoopBackOff) and restarts it after a back-off of 1 s, 2 s, 4 s … at most 10 s.

With `--engine vllm` (`dev-cluster up --engine vllm`), a pod whose container runs `vllm serve` gets the real
`vllm serve` of vLLM's CPU build instead, from the pod's own command line with only what cannot exist on a CPU
machine translated (vllm_pods: stand-in models, no GPU memory flags, the pod's IP and port); crashes, scrape targets and
the registry work the same.

Why a watch and asyncio: two cores run the whole cluster. One list-then-watch stream tells the runner
about pods, process exits arrive through `Process.wait()`, and nothing polls while all is quiet. The
apiserver is spoken to through lightkube (its AsyncClient, from the dev cluster's kubeconfig), as the
operator does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import posixpath
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2
from lightkube import ALL_NS, AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap, Pod, PodStatus
from lightkube.types import PatchType

from specdeploy.devcluster import kubeletstatus, monitoring, processes, simregistry, vllm_env
from specdeploy.devcluster.enginepod import (
    GPU_HELD_ENV,
    LABEL_NAME,
    CacheVolume,
    EnginePod,
    config_files,
    engine_pod,
    safe_relative,
    wants_simulator,
)
from specdeploy.devcluster.errors import DevClusterError
from specdeploy.devcluster.nodes import GpuNodeShape
from specdeploy.devcluster.simregistry import (
    BACK_OFF,
    PENDING,
    RUNNING,
    STARTING,
    Registry,
    SimulatorEndpoint,
)
from specdeploy.devcluster.state import ENGINES
from specdeploy.devcluster.vllm_pods import RealVllm, cpu_serve, is_vllm_serve
from specdeploy.engines import CONFIG_MOUNT_PATH
from specdeploy.reconcile.children import PLAN_FILE

log = logging.getLogger("specdeploy.podrunner")
GPU_STANDIN = Path(__file__).resolve().parent / "gpu_standin"
"""Holds `torch` for a pod's GPU preflight run here: the node's GPUs as the pod's knobs make them."""

SIMULATOR_MODULE = "specdeploy_engine.sim"
#: What a group's worker runs: it holds its node as the engine's ranks would and serves nothing; killing it is a
#: worker's death.
IDLE = ("sleep", "infinity")
WATCH_SECONDS = 300          # the apiserver ends a watch after this; lightkube resumes it from the last version
STOP_GRACE_SECONDS = 5.0     # SIGTERM → SIGKILL for a simulator (a pod's 60 s grace is for real engines)
#: How long one start may hold a starting slot: a simulator answers within a second; real vLLM on two shared
#: cores takes one to three minutes (loading, then compiling its model), more while another one starts.
SIMULATOR_START_SLOT_SECONDS = 20.0
REAL_ENGINE_START_SLOT_SECONDS = 600.0
#: How long a Running pod may lack status.podIP before the runner says it gave up waiting (kwok's pod-ready stage
#: writes the IP in the same patch as phase Running, so it is normally there at once).
POD_IP_WAIT_SECONDS = 30.0
#: A pod's address taken by another process: how often to look again, and when to warn that it still is.
PORT_POLL_SECONDS = 0.2
PORT_TAKEN_WARNING_SECONDS = 30.0
#: Variables of the runner's own environment that would point real vLLM's Python at the operator's packages.
_OPERATOR_PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


class RunnerBusy(DevClusterError):
    """Another pod runner already serves this state directory."""


@dataclass(frozen=True)
class BackOff:
    """Crash-loop back-off: the kubelet's 10 s doubling to 5 min, scaled down so tests see several restarts.

    A run that lasted `reset_after` seconds forgives the crashes before it (the kubelet: twice the cap).
    """

    initial: float = 1.0
    cap: float = 10.0
    reset_after: float = 20.0

    def delay(self, crashes: int) -> float:
        return float(min(self.initial * 2 ** max(crashes - 1, 0), self.cap))


@dataclass(frozen=True)
class RunnerPaths:
    """Files of the pod runner inside a dev cluster's state directory."""

    state_dir: Path

    @property
    def directory(self) -> Path:
        return self.state_dir / "podrunner"

    @property
    def registry(self) -> Path:
        return self.directory / "sims.json"

    @property
    def lock(self) -> Path:
        return self.directory / "runner.lock"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def targets(self) -> monitoring.MonitoringPaths:
        return monitoring.MonitoringPaths(self.state_dir / "monitoring")

    def config_dir(self, uid: str) -> Path:
        """What the pod's container sees at /etc/specdeploy."""
        return self.directory / "pods" / uid / "etc-specdeploy"

    def model_cache(self, engine: EnginePod, cache: CacheVolume) -> Path:
        """Where the pod's weight cache lives on this machine: a claim's is one per namespace and claim, a host
        path's one per node, an emptyDir's the pod's own (removed with it)."""
        if cache.source == "persistentVolumeClaim":
            return self.directory / "caches" / "claims" / engine.namespace / cache.name
        if cache.source == "hostPath":
            return self.directory / "caches" / "nodes" / engine.node / cache.name.lstrip("/")
        return self.directory / "pods" / engine.uid / "model-cache"

    def log(self, engine: EnginePod) -> Path:
        """The container's log, kept across restarts like /var/log/pods/<ns>_<pod>_<uid>/<container>/."""
        return self.state_dir / "logs" / "pods" / f"{engine.namespace}_{engine.name}_{engine.uid}" / f"{engine.container}.log"


def api_client(kubeconfig: Path, timeout: float = 10.0) -> AsyncClient:
    """A lightkube client for the apiserver of `kubeconfig`'s current context (client certificate or token)."""
    return AsyncClient(KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(timeout))


#: What one failed round of list-then-watch raises: the apiserver unreachable or answering an error
#: (httpx2 is lightkube's HTTP client; its ApiError is an HTTPStatusError), or an object that does not
#: decode (msgspec's DecodeError is a ValueError).
_WATCH_FAILURES: tuple[type[Exception], ...] = (httpx2.HTTPError, ValueError, KeyError)


def _status_code(error: httpx2.HTTPStatusError) -> int:
    """The HTTP status of a failed request (an ApiError from a watch's ERROR event carries it in its Status)."""
    if error.response is not None:
        return error.response.status_code
    return int(error.status.code or 0) if isinstance(error, ApiError) else 0


def _now() -> datetime:
    return datetime.now(UTC)


def _port_free(host: str, port: int) -> bool:
    """Whether a server could listen on `host`:`port` now (with SO_REUSEADDR, as HTTP servers bind: the old
    engine's connections in TIME_WAIT do not hold the address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _free_port(host: str) -> int:
    """A port nothing listens on at `host`, for a container that declares none (kept for the pod's life)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PodRunner:
    """Watches engine pods and keeps one simulator per Running pod; `run(stop)` until `stop` is set."""

    def __init__(self, state_dir: Path, python: str = sys.executable, back_off: BackOff | None = None,
                 max_starting: int = 2, simulator_module: str = SIMULATOR_MODULE,
                 real_vllm: RealVllm | None = None) -> None:
        self.paths = RunnerPaths(state_dir)
        self.python = python
        self.simulator_module = simulator_module
        self.real_vllm = real_vllm   # None: every pod gets the simulator
        self.back_off = back_off or BackOff()
        self.registry = Registry(runner_pid=os.getpid())
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Running pods seen without status.podIP, by uid: the timer that gives up waiting (None once it has).
        self._awaiting_ip: dict[str, asyncio.TimerHandle | None] = {}
        self._starting = asyncio.Semaphore(max_starting)  # a simulator's start costs about a CPU-second
        self._download_locks: dict[str, asyncio.Lock] = {}   # by a model's marker file in a cache
        self._api: AsyncClient | None = None

    # -- the registry -------------------------------------------------------------------------

    def _publish(self, sim: SimulatorEndpoint) -> None:
        self.registry.simulators[sim.uid] = sim
        self.registry.save(self.paths.registry)

    def _unpublish(self, uid: str) -> None:
        if self.registry.simulators.pop(uid, None) is not None:
            self.registry.save(self.paths.registry)

    def _stop_leftovers(self) -> None:
        """Stop simulators a previous runner (killed without cleaning up) left running, drop their targets."""
        previous = simregistry.load(self.paths.registry)
        leftovers = [(s.pid, s.started) for s in previous.simulators.values() if s.pid]
        if leftovers:
            log.info("stopping %d simulators left by a previous runner", len(leftovers))
            processes.stop_all(leftovers, grace=STOP_GRACE_SECONDS)
        for sim in previous.simulators.values():
            self._remove_target(sim.uid, _target_name(sim))
        self.registry.save(self.paths.registry)

    # -- scrape targets -------------------------------------------------------------------------

    def _monitoring(self) -> bool:
        return self.paths.targets.targets.is_dir()

    def _add_target(self, engine: EnginePod, address: str) -> None:
        if self._monitoring():
            monitoring.write_target(self.paths.targets, engine.target_name, address, engine.target_labels(),
                                    engine.metrics_path)

    def _remove_target(self, uid: str, name: str) -> None:
        if self._monitoring() and name:
            with contextlib.suppress(OSError, ValueError):
                monitoring.remove_target(self.paths.targets, name)

    # -- main loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._stop_leftovers()
        async with api_client(self.paths.kubeconfig) as api:
            self._api = api
            watcher = asyncio.create_task(self._watch_forever(api), name="watch")
            stopping = asyncio.create_task(stop.wait(), name="stop")
            done, _ = await asyncio.wait({watcher, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for task in (watcher, stopping):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self._stop_all()
        self.registry.synced = False
        self.registry.save(self.paths.registry)
        log.info("pod runner stopped")

    async def _watch_forever(self, api: AsyncClient) -> None:
        """List, then watch from the list's version; on any error or an expired version, list again."""
        failures = 0
        while True:
            try:
                version = await self._relist(api)
                failures = 0
                await self._watch(api, version)
            except _WATCH_FAILURES as exc:
                failures += 1
                delay = min(0.5 * 2 ** failures, 15.0)
                log.warning("watching pods failed (%s: %s); listing again in %.1fs", type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)

    async def _relist(self, api: AsyncClient) -> str:
        listing = api.list(Pod, namespace=ALL_NS, labels={LABEL_NAME: None})
        seen = set()
        async for item in listing:
            pod = item.to_dict()
            seen.add(pod["metadata"]["uid"])
            self._observe(pod)
        for uid in [uid for uid in [*self._tasks, *self._awaiting_ip] if uid not in seen]:
            self._forget(uid)
        if not self.registry.synced:
            self.registry.synced = True
            self.registry.save(self.paths.registry)
            log.info("watching pods labelled %s: %d found", LABEL_NAME, len(seen))
        return listing.resourceVersion

    async def _watch(self, api: AsyncClient, version: str) -> None:
        """Follow pod events from `version`; return when the apiserver ends the watch with an error, e.g. that
        the version is too old (410 Gone), so the caller lists again.

        lightkube opens the next watch from the last version seen whenever the apiserver closes one (after
        WATCH_SECONDS); every other failure is raised. Its own retry on 410 (a watch without a version) would
        miss the pods deleted meanwhile, which only a list tells.
        """
        events = api.watch(Pod, namespace=ALL_NS, labels={LABEL_NAME: None}, server_timeout=WATCH_SECONDS,
                           resource_version=version)
        try:
            async for kind, item in events:
                pod = item.to_dict()
                if kind == "DELETED":
                    self._forget(pod["metadata"]["uid"])
                elif kind in ("ADDED", "MODIFIED"):
                    self._observe(pod)
        except httpx2.HTTPStatusError as error:
            if isinstance(error, ApiError) and error.response is None:   # an ERROR event in the stream
                log.info("watch ended by the apiserver: %s", error.status.message)
            elif _status_code(error) == 410:
                log.info("watch ended by the apiserver: 410 Gone")
            else:
                raise
        finally:
            await events.aclose()   # type: ignore[attr-defined]  # an async generator: its response is closed

    def _observe(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._tasks:
            if not wants_simulator(pod):
                self._forget(uid)
            return
        if not wants_simulator(pod):
            self._stop_awaiting_ip(uid)
            return
        engine = engine_pod(pod)
        if engine is None:
            log.warning("pod %s/%s has no container with a command line; not simulated",
                        pod["metadata"].get("namespace"), pod["metadata"].get("name"))
            return
        if not engine.pod_ip:
            self._await_pod_ip(engine)
            return
        self._stop_awaiting_ip(uid)
        self._tasks[uid] = asyncio.create_task(self._supervise(engine), name=f"pod {engine.namespace}/{engine.name}")

    def _await_pod_ip(self, engine: EnginePod) -> None:
        """The engine listens at the pod's IP, so it starts with the pod event that carries status.podIP."""
        if engine.uid in self._awaiting_ip:
            return
        log.info("%s/%s: Running without status.podIP; waiting up to %gs for the pod event that sets it",
                 engine.namespace, engine.name, POD_IP_WAIT_SECONDS)
        self._awaiting_ip[engine.uid] = asyncio.get_running_loop().call_later(
            POD_IP_WAIT_SECONDS, self._pod_ip_missing, engine)

    def _pod_ip_missing(self, engine: EnginePod) -> None:
        self._awaiting_ip[engine.uid] = None
        log.warning("%s/%s: no status.podIP after %gs; not started until an event of the pod carries one (kwok's "
                    "pod-ready stage sets it with phase Running)", engine.namespace, engine.name, POD_IP_WAIT_SECONDS)

    def _stop_awaiting_ip(self, uid: str) -> None:
        timer = self._awaiting_ip.pop(uid, None)
        if timer is not None:
            timer.cancel()

    def _forget(self, uid: str) -> None:
        self._stop_awaiting_ip(uid)
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()

    async def _stop_all(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one pod --------------------------------------------------------------------------------

    async def _supervise(self, engine: EnginePod) -> None:
        """Run the pod's simulator at the pod's IP and port until the task is cancelled, restarting it there with
        back-off when it dies. A group's worker gets a process that holds its place and serves nothing (`IDLE`):
        its death is what a rank's would be, a crash the kubelet reports."""
        host = engine.pod_ip
        port = (engine.port or _free_port(host)) if engine.serves else 0
        log_path = self.paths.log(engine)
        sim = SimulatorEndpoint(namespace=engine.namespace, pod=engine.name, uid=engine.uid, sd=engine.sd,
                                variant=engine.variant, engine=engine.engine,
                                address=f"{host}:{port}" if engine.serves else "",
                                metrics_path=engine.metrics_path, health_path=engine.health_path, state=PENDING,
                                log=str(log_path), role=engine.role)
        self._publish(sim)
        config_dir = self.paths.config_dir(engine.uid)
        proc: asyncio.subprocess.Process | None = None
        try:
            await self._write_config(engine, config_dir, wait=True)
            await self._run_init_containers(engine, config_dir)
            await self._download(engine, config_dir, log_path)
            if engine.serves:
                self._add_target(engine, sim.address)
            crashes = 0
            while True:
                if engine.serves:
                    await self._until_port_free(engine, host, port)
                await self._write_config(engine, config_dir, wait=False)   # the kubelet keeps the files synced
                async with self._starting:
                    proc, offset, started_at = await self._spawn(engine, host, port, config_dir, log_path)
                    ran_since = time.monotonic()
                    sim = replace(sim, pid=proc.pid, started=processes.start_ticks(proc.pid), state=STARTING)
                    self._publish(sim)
                    slot = REAL_ENGINE_START_SLOT_SECONDS if self._runs_real(engine) else SIMULATOR_START_SLOT_SECONDS
                    healthy = await self._until_healthy(proc, engine, sim.address, slot_seconds=slot)
                if healthy is None:
                    healthy = await self._until_healthy(proc, engine, sim.address, slot_seconds=None)
                if healthy:
                    sim = replace(sim, state=RUNNING)
                    self._publish(sim)
                    await self._report(engine, functools.partial(_running_if_needed, engine=engine,
                                                                 started_at=started_at, pid=proc.pid))
                returncode = await proc.wait()
                finished_at = _now()
                _kill_group(proc.pid)   # a container ends with its main process: no child keeps the pod's port
                if time.monotonic() - ran_since >= self.back_off.reset_after:
                    crashes = 0
                crashes += 1
                delay = self.back_off.delay(crashes)
                ended = kubeletstatus.termination(returncode, _read_from(log_path, offset), started_at, finished_at,
                                                  engine.termination_message_policy)
                log.info("%s/%s: simulator pid %d exited %d (%s); restarting in %gs", engine.namespace, engine.name,
                         proc.pid, ended.exit_code, ended.reason, delay)
                container_id = _container_id(proc.pid)
                proc = None
                # The registry first: whoever reads the crash in the pod's status must not find the dead
                # process still listed as running.
                sim = replace(sim, pid=0, started=None, state=BACK_OFF, restarts=sim.restarts + 1)
                self._publish(sim)
                await self._report(engine, functools.partial(
                    kubeletstatus.crashed_status, container=engine.container, ended=ended, back_off=delay,
                    container_id=container_id, now=finished_at))
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            pass
        except Exception:   # noqa: BLE001 - one pod's trouble must not take the runner down
            log.exception("%s/%s: supervising the simulator failed", engine.namespace, engine.name)
        finally:
            if proc is not None and proc.returncode is None:
                await _terminate(proc)
            self._remove_target(engine.uid, engine.target_name)
            self._unpublish(engine.uid)
            shutil.rmtree(config_dir.parent, ignore_errors=True)
            log.info("%s/%s: simulator stopped", engine.namespace, engine.name)

    async def _write_config(self, engine: EnginePod, config_dir: Path, wait: bool) -> None:
        """Project the pod's ConfigMap into `config_dir`; with `wait`, until the ConfigMap exists (as the
        kubelet keeps a pod in ContainerCreating), else keep the files as they are when it cannot be read."""
        config_dir.mkdir(parents=True, exist_ok=True)
        volume = engine.config
        if volume is None:
            return
        assert self._api is not None
        delay = 0.5
        while True:
            try:
                found = await self._api.get(ConfigMap, volume.config_map, namespace=engine.namespace)
                files = config_files(volume, dict(found.data or {}))
            except (httpx2.HTTPError, KeyError, ValueError) as exc:
                if volume.optional and isinstance(exc, httpx2.HTTPStatusError) and _status_code(exc) == 404:
                    return
                if not wait:
                    return
                log.info("%s/%s: configmap %s not ready (%s); retrying in %.1fs", engine.namespace, engine.name,
                         volume.config_map, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            for relative, content in files.items():
                if not safe_relative(relative):
                    continue
                target = config_dir / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_text(content)
                tmp.replace(target)
            return

    async def _run_init_containers(self, engine: EnginePod, config_dir: Path) -> None:
        """Run the pod's init containers in order before the engine, as a kubelet does: one that fails is
        restarted after the back-off, its end written into the pod's initContainerStatuses (the termination
        message from its log: FallbackToLogsOnError), until it exits 0. The runner runs the Python ones (the
        operator's GPU preflight) with this machine's Python, the pod's paths under /etc/specdeploy mapped to its
        files here, and `torch` the stand-in of gpu_standin/: the pod's GPUs, of the node's memory, less the pod's
        SPECDEPLOY_DEV_GPU_HELD_MIB. Others are skipped (said in the runner's log)."""
        for init in engine.init_containers:
            if not init.argv or not posixpath.basename(init.argv[0]).startswith("python"):
                log.info("%s/%s: init container %s is not Python; not run", engine.namespace, engine.name, init.name)
                continue
            argv = [self.python, *(str(config_dir) + a[len(CONFIG_MOUNT_PATH):] if a.startswith(CONFIG_MOUNT_PATH)
                                   else a for a in init.argv[1:])]
            env = {**os.environ, **init.env, "PYTHONPATH": str(GPU_STANDIN), "SPECDEPLOY_DEV_GPUS": str(init.gpus),
                   "SPECDEPLOY_DEV_GPU_TOTAL_MIB": str(GpuNodeShape().gpu_memory_mib),
                   "SPECDEPLOY_DEV_GPU_HELD_MIB": engine.env.get(GPU_HELD_ENV, "0")}
            log_path = self.paths.log(engine).with_name(f"{init.name}.log")
            log_path.parent.mkdir(parents=True, exist_ok=True)
            crashes = 0
            while True:
                with log_path.open("ab") as handle:
                    offset = handle.seek(0, os.SEEK_END)
                    started = _now()
                    proc = await asyncio.create_subprocess_exec(
                        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=handle, stderr=asyncio.subprocess.STDOUT,
                        env=env, cwd=str(config_dir))
                    returncode = await proc.wait()
                ended = kubeletstatus.termination(returncode, _read_from(log_path, offset), started, _now())
                if returncode == 0:
                    if crashes:
                        await self._report(engine, functools.partial(
                            kubeletstatus.init_completed_status, container=init.name, ended=ended))
                    break
                crashes += 1
                delay = self.back_off.delay(crashes)
                log.info("%s/%s: init container %s exited %d; restarting in %gs", engine.namespace, engine.name,
                         init.name, ended.exit_code, delay)
                await self._report(engine, functools.partial(
                    kubeletstatus.init_crashed_status, container=init.name, app_container=engine.container,
                    ended=ended, back_off=delay))
                await asyncio.sleep(delay)

    async def _download(self, engine: EnginePod, config_dir: Path, log_path: Path) -> None:
        """What an engine does first in a real pod: fetch the weights its plan lists (`downloads` in plan.json)
        into its cache, each taking its GiB at the pod's SPECDEPLOY_DEV_HUB_MIBPS — unless the cache holds it
        already. One download of a model into one cache at a time: a second pod waits for it, as
        huggingface_hub's file locks make it. Said in the pod's log."""
        mibps = engine.hub_bandwidth_mibps
        if engine.cache is None or mibps is None:
            return
        cache = self.paths.model_cache(engine, engine.cache)
        cache.mkdir(parents=True, exist_ok=True)
        plan = json.loads((config_dir / PLAN_FILE).read_text())
        for model in plan.get("downloads", []):
            key = f"{model['name']}@{model.get('revision') or 'main'}"
            marker = cache / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".done")
            async with self._download_locks.setdefault(str(marker), asyncio.Lock()):
                if marker.exists():
                    _log_line(log_path, f"{key} is in the model cache ({engine.cache.source})")
                    continue
                seconds = float(model["gib"]) * 1024 / mibps
                _log_line(log_path, f"downloading {key}: {model['gib']} GiB at {mibps:g} MiB/s, {seconds:.1f}s")
                await asyncio.sleep(seconds)
                marker.write_text(json.dumps(model) + "\n")

    def _runs_real(self, engine: EnginePod) -> bool:
        """Whether this pod gets real vLLM: the runner was started with it and the pod serves with `vllm serve`."""
        return (self.real_vllm is not None and engine.serves and engine.engine == "vllm"
                and is_vllm_serve(engine.argv))

    async def _until_port_free(self, engine: EnginePod, host: str, port: int) -> None:
        """Wait until nothing listens at the pod's address: what can hold it is the pod's own previous run, or,
        when kwok gave this pod the IP of one just deleted, that pod's engine, still stopping. A pod's port cannot
        change, so the runner waits, and warns when that takes long."""
        if _port_free(host, port):
            return
        log.info("%s/%s: waiting for %s:%d to be released by the process that listens there",
                 engine.namespace, engine.name, host, port)
        began = time.monotonic()
        warned = False
        while not _port_free(host, port):
            if not warned and time.monotonic() - began >= PORT_TAKEN_WARNING_SECONDS:
                warned = True
                log.warning("%s/%s: %s:%d still taken after %gs (not by this pod's engine: it has exited)",
                            engine.namespace, engine.name, host, port, PORT_TAKEN_WARNING_SECONDS)
            await asyncio.sleep(PORT_POLL_SECONDS)
        log.info("%s/%s: %s:%d released after %.1fs", engine.namespace, engine.name, host, port,
                 time.monotonic() - began)

    def _simulator_command(self, engine: EnginePod, host: str, port: int,
                           config_dir: Path) -> tuple[list[str], dict[str, str]]:
        # The pod's own simulator options (e.g. --time-scale, --seed) first: where to listen and read the
        # config files is the runner's to say, so its options come last and win.
        argv = [self.python, "-m", self.simulator_module, "--seed", str(engine.seed), *engine.simulator_options,
                "--host", host, "--port", str(port), "--config-dir", str(config_dir)]
        if engine.gpu_product:
            argv += ["--gpu", engine.gpu_product]
        argv += ["--", *engine.argv]
        return argv, {**os.environ, **engine.env, "PYTHONUNBUFFERED": "1"}

    def _real_vllm_command(self, engine: EnginePod, host: str,
                           port: int) -> tuple[list[str], dict[str, str], tuple[str, ...]]:
        """The pod's `vllm serve` translated for this machine (vllm_pods), the pod's env over the CPU settings."""
        assert self.real_vllm is not None
        real = self.real_vllm
        serve = cpu_serve(engine.argv, vllm=real.vllm, port=port, standins=real.standins, host=host)
        runner_env = {k: v for k, v in os.environ.items() if k not in _OPERATOR_PYTHON_ENV}
        env = {**runner_env, **engine.env, **vllm_env.cpu_environment(real.kv_cache_gib, real.threads),
               "PYTHONUNBUFFERED": "1"}
        return list(serve.argv), env, serve.notes

    async def _spawn(self, engine: EnginePod, host: str, port: int, config_dir: Path,
                     log_path: Path) -> tuple[asyncio.subprocess.Process, int, datetime]:
        real = self._runs_real(engine)
        notes: tuple[str, ...] = ()
        if not engine.serves:
            argv, env = list(IDLE), dict(os.environ)
            notes = (f"a worker of its group, idle ({' '.join(IDLE)}) in place of its engine's ranks",)
        elif real:
            argv, env, notes = self._real_vllm_command(engine, host, port)
        else:
            argv, env = self._simulator_command(engine, host, port, config_dir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as handle:
            offset = handle.seek(0, os.SEEK_END)
            # What was translated, at the top of this run's output, as a launcher would print it.
            handle.write("".join(f"specdeploy dev-cluster: {note}\n" for note in notes).encode())
            handle.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=handle, stderr=asyncio.subprocess.STDOUT,
                env=env, cwd=str(config_dir), start_new_session=True)
        log.info("%s/%s: %s pid %d on %s:%d (%s)", engine.namespace, engine.name,
                 "idle worker" if not engine.serves else "real vLLM" if real else "simulator", proc.pid, host, port,
                 engine.engine)
        return proc, offset, _now()

    async def _until_healthy(self, proc: asyncio.subprocess.Process, engine: EnginePod, address: str,
                             slot_seconds: float | None) -> bool | None:
        """True once GET health answers 200 (at once for a worker: it has no probes), False when the process exits
        first, None after `slot_seconds`."""
        if not engine.serves:
            return proc.returncode is None
        url = f"http://{address}{engine.health_path}"
        deadline = None if slot_seconds is None else time.monotonic() + slot_seconds
        interval = 0.1
        exited = asyncio.ensure_future(proc.wait())
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                while not exited.done():
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(url)).status_code == 200:
                            return True
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    await asyncio.wait({exited}, timeout=interval)
                    interval = min(interval * 1.5, 2.0)
            return False
        finally:
            if not exited.done():
                exited.cancel()

    async def _report(self, engine: EnginePod, status_for: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Write `status_for(pod)` to the pod's status subresource, guarded by its resourceVersion."""
        assert self._api is not None
        try:
            for _attempt in range(5):
                try:
                    pod = (await self._api.get(Pod, engine.name, namespace=engine.namespace)).to_dict()
                except httpx2.HTTPStatusError as error:
                    if _status_code(error) == 404:
                        return
                    raise
                if pod["metadata"].get("uid") != engine.uid or pod["metadata"].get("deletionTimestamp"):
                    return
                status = status_for(pod)
                if status is None:
                    return
                body = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]}, "status": status}
                try:
                    await self._api.patch(PodStatus, engine.name, body, namespace=engine.namespace,
                                          patch_type=PatchType.MERGE)
                except httpx2.HTTPStatusError as error:
                    if _status_code(error) == 409:
                        continue
                    if _status_code(error) != 404:
                        raise
                return
            log.warning("%s/%s: status kept conflicting; not reported", engine.namespace, engine.name)
        except httpx2.HTTPError as exc:
            log.warning("%s/%s: reporting status failed: %s", engine.namespace, engine.name, exc)


def _running_if_needed(pod: dict[str, Any], engine: EnginePod, started_at: datetime,
                       pid: int) -> dict[str, Any] | None:
    """After a restart the container runs and is ready again; nothing to write when the status says so."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == engine.container and status.get("ready") and "running" in (status.get("state") or {}):
            return None
    return kubeletstatus.running_status(pod, engine.container, started_at, ready=True,
                                        container_id=_container_id(pid), now=_now())


def _log_line(path: Path, text: str) -> None:
    """A line in the container's log, as the engine's own output would be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(f"specdeploy dev-cluster: {text}\n")


def _container_id(pid: int) -> str:
    return f"sim://{pid}"


def _target_name(sim: SimulatorEndpoint) -> str:
    return EnginePod(sim.namespace, sim.pod, sim.uid, sim.sd, sim.variant, "", ()).target_name


def _read_from(path: Path, offset: int) -> bytes:
    """What the log gained since `offset`: this run's output only."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except OSError:
        return b""


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of an exited engine's process group (e.g. vLLM's EngineCore)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the simulator's process group, SIGKILL it after the grace period."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), wait)
            return
        except TimeoutError:
            continue


@contextlib.contextmanager
def exclusive(paths: RunnerPaths) -> Iterator[None]:
    """Hold the runner lock of this state directory: two runners would start every simulator twice."""
    paths.directory.mkdir(parents=True, exist_ok=True)
    with paths.lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise RunnerBusy(f"a pod runner already serves {paths.state_dir} (lock {paths.lock})") from exc
        yield


def serve(state_dir: Path, back_off: BackOff | None = None, simulator_module: str = SIMULATOR_MODULE,
          engine: str = "sim") -> None:
    """Run a pod runner in the foreground until SIGTERM or SIGINT. `engine`: "sim" simulates every engine pod;
    "vllm" runs real vLLM (CPU build, stand-in models) for pods that run `vllm serve`, the simulator for others."""
    paths = RunnerPaths(state_dir)
    if not paths.kubeconfig.exists():
        raise DevClusterError(f"no dev cluster kubeconfig at {paths.kubeconfig}; start the cluster first")
    real_vllm = vllm_env.ensure_real_vllm(progress=log.info) if engine == "vllm" else None
    # lightkube's HTTP client logs every request at INFO, as httpx does: the runner's log keeps its own lines.
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await PodRunner(state_dir, back_off=back_off, simulator_module=simulator_module, real_vllm=real_vllm).run(stop)

    with exclusive(paths):
        asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.devcluster.podrunner", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="The dev cluster's state directory.")
    parser.add_argument("--simulator-module", default=SIMULATOR_MODULE,
                        help="The module run with `python -m` for each pod (it takes the simulator's options).")
    parser.add_argument("--engine", choices=ENGINES, default="sim",
                        help="sim: the simulator for every engine pod; vllm: real vLLM for `vllm serve` pods.")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        serve(args.state_dir, simulator_module=args.simulator_module, engine=args.engine)
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
