"""`DevCluster`: a real control plane on loopback, with kwok GPU nodes and, optionally, monitoring.

Usage::

    cluster = DevCluster(state_dir, nodes=4, monitoring=True).up()
    cluster.kubectl("get", "nodes")
    cluster.add_scrape_target("sim-0", "127.0.0.1:8000", {"namespace": "demo"})
    cluster.down()

Why a class over a state directory: every caller (CLI, pytest session fixture, demo) names the same
state directory and gets the same cluster; `up` on a running one returns it as it is.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
from lightkube import KubeConfig
from lightkube.config import client_adapter

from specdeploy.devcluster import audit, build, certs, monitoring, processes, simregistry, versions, vllm_env
from specdeploy.devcluster import leaderworkersets as lws
from specdeploy.devcluster import nodes as gpu_nodes
from specdeploy.devcluster.errors import ClusterNotRunning, DevClusterError, KubectlError, ProcessFailed
from specdeploy.devcluster.kubeconfig import write_cert_kubeconfig, write_token_kubeconfig
from specdeploy.devcluster.simregistry import SimulatorEndpoint
from specdeploy.devcluster.state import ENGINES, ClusterState, ComponentRecord, default_state_dir
from specdeploy.devcluster.wait import wait_for

Progress = Callable[[str], None]

SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

#: Start order, and the order `status` lists them in.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "lws-controller",
              "prometheus", "alertmanager", "pod-runner")

#: The monitoring components: Prometheus, Alertmanager, and the pod runner whose simulators they scrape.
MONITORING_COMPONENTS = ("prometheus", "alertmanager", "pod-runner")

#: What `stop_component` can take away and `start_component` bring back (an outage, in a test).
RESTARTABLE_COMPONENTS = ("kube-apiserver", "prometheus", "alertmanager")


#: Everything `up` creates inside the state directory (and `down` removes).
_STATE_ENTRIES = ("state.json", "state.tmp", "kubeconfig", "kubeconfig.tmp", "kubeconfigs", "pki", "etcd",
                  "kcm-certs", "kwok-home", "lws", "monitoring", "podrunner", "logs", "audit-policy.yaml")


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    running: bool
    address: str
    log: str


@dataclass(frozen=True)
class ClusterStatus:
    """What `status` reports: per component whether it runs and where, plus the URLs."""

    state_dir: Path
    components: tuple[ComponentStatus, ...]
    kubeconfig: str
    apiserver_url: str
    prometheus_url: str
    alertmanager_url: str
    nodes: tuple[str, ...]

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.running for c in self.components)


class DevCluster:
    """A dev cluster rooted at `state_dir` (default: ``~/.local/state/specdeploy/dev-cluster``)."""

    def __init__(self, state_dir: Path | str | None = None, nodes: int = 4, monitoring: bool = False,
                 progress: Progress | None = None, scrape_interval: str = "2s",
                 gpu_shape: gpu_nodes.GpuNodeShape | None = None, engine: str = "sim", audit: bool = False,
                 leader_worker_sets: bool = False) -> None:
        if nodes < 0:
            raise ValueError(f"nodes must be 0 or more, got {nodes!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if engine != "sim" and not monitoring:
            raise ValueError(f"engine {engine!r} needs monitoring: the pod runner that runs engines starts with it")
        self.engine = engine
        self.audit_enabled = audit   # the apiserver keeps `audit_log` (tests count writes; benchmarks leave it off)
        self.leader_worker_sets = leader_worker_sets   # runs the LeaderWorkerSet controller (devcluster/leaderworkersets)
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.node_count = nodes
        self.monitoring = monitoring
        self.scrape_interval = scrape_interval
        self.gpu_shape = gpu_shape or gpu_nodes.GpuNodeShape()
        self._say: Progress = progress or (lambda _msg: None)
        self._binaries: build.Binaries | None = None

    # -- paths and addresses -------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user `kubernetes-admin`, group `system:masters`)."""
        return self.state_dir / "kubeconfig"

    @property
    def simulator_registry(self) -> Path:
        """The pod runner's list of simulators (``<state>/podrunner/sims.json``)."""
        return self.state_dir / "podrunner" / "sims.json"

    @property
    def pki(self) -> certs.Pki:
        return certs.Pki(self.state_dir / "pki")

    @property
    def monitoring_paths(self) -> monitoring.MonitoringPaths:
        return monitoring.MonitoringPaths(self.state_dir / "monitoring")

    def _state(self) -> ClusterState:
        state = ClusterState.load(self.state_file)
        if state is None or not state.ready:
            raise ClusterNotRunning(f"no dev cluster is running in {self.state_dir}; "
                                    f"start one with `specdeploy dev-cluster up --state-dir {self.state_dir}`")
        return state

    @property
    def server(self) -> str:
        """The apiserver URL, e.g. https://127.0.0.1:43121."""
        return self._state().apiserver_url

    @property
    def prometheus_url(self) -> str:
        """Prometheus' base URL ("" when the cluster runs without monitoring)."""
        return self._state().prometheus_url

    @property
    def alertmanager_url(self) -> str:
        """Alertmanager's base URL ("" when the cluster runs without monitoring)."""
        return self._state().alertmanager_url

    @property
    def node_names(self) -> list[str]:
        return list(self._state().nodes)

    @property
    def binaries(self) -> build.Binaries:
        """Paths of the built binaries (building the missing ones; the LeaderWorkerSet controller only for a
        cluster that runs it)."""
        if self._binaries is None:
            names = (*build.NAMES, *build.LEADER_WORKER_SET) if self.leader_worker_sets else build.NAMES
            self._binaries = build.ensure_binaries(self._say, names=names)
        return self._binaries

    @property
    def kubectl_path(self) -> Path:
        return self.binaries["kubectl"]

    @property
    def helm_path(self) -> Path:
        return self.binaries["helm"]

    # -- lifecycle -------------------------------------------------------------------------------

    def running(self) -> bool:
        """True when a ready cluster is recorded here and all its processes are alive."""
        state = ClusterState.load(self.state_file)
        return bool(state and state.ready and state.components and all(
            processes.alive(c.pid) for c in state.components.values()))

    def up(self, timeout: float = 180.0) -> DevCluster:
        """Start everything and wait until it is usable; a running, matching cluster is returned as is.

        Ready means: apiserver /readyz ok, every node Ready and untainted, the `default` ServiceAccount
        exists, controller-manager and scheduler healthy, Prometheus and Alertmanager ready.
        On failure everything started is stopped again (logs are kept) and the error names the culprit.
        """
        state = ClusterState.load(self.state_file)
        if state is not None:
            if self.running() and self._matches(state):
                self._say(f"dev cluster already running in {self.state_dir}")
                return self
            self._say(f"stopping the previous dev cluster in {self.state_dir}")
            self.down()
        started = time.monotonic()
        binaries = self.binaries
        stage_dir = build.kwok_stage_dir()
        if self.engine == "vllm":
            vllm_env.ensure_real_vllm(self._say)   # installs on first use, with progress; the runner reuses it
        state = ClusterState(kubernetes_version=versions.KUBERNETES, engine=self.engine)
        deadline = time.monotonic() + timeout
        try:
            self._start_all(state, binaries, stage_dir, deadline)
        except BaseException:
            self.down(keep_logs=True)
            raise
        state.ready = True
        state.save(self.state_file)
        self._say(f"dev cluster ready in {time.monotonic() - started:.1f}s; "
                  f"export KUBECONFIG={self.kubeconfig}")
        return self

    def _matches(self, state: ClusterState) -> bool:
        has_monitoring = all(name in state.components for name in MONITORING_COMPONENTS)
        return (len(state.nodes) == self.node_count and (has_monitoring or not self.monitoring)
                and state.engine == self.engine
                and ("lws-controller" in state.components or not self.leader_worker_sets))

    def down(self, keep_logs: bool = False) -> None:
        """Stop every recorded process (by pid, whole process group) and remove the state directory."""
        state = ClusterState.load(self.state_file)
        if state is not None:
            # Clients first, then the apiserver, then etcd: an apiserver whose etcd vanished under it
            # takes its whole grace period to stop, a drained one about a second.
            last = ("kube-apiserver", "etcd")
            tiers = [[n for n in state.components if n not in last], ["kube-apiserver"], ["etcd"]]
            for index, tier in enumerate(tiers):
                processes.stop_all([(state.components[n].pid, state.components[n].started)
                                    for n in tier if n in state.components])
                if index == 0:
                    self._stop_simulators()
        if not self.state_dir.exists():
            return
        # Only what `up` creates is removed: a --state-dir pointing somewhere unlucky loses nothing else.
        for name in _STATE_ENTRIES:
            entry = self.state_dir / name
            if keep_logs and name == "logs":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        if not keep_logs:
            with contextlib.suppress(OSError):
                self.state_dir.rmdir()

    def _stop_simulators(self) -> None:
        """Stop simulators the pod runner could not stop itself (it was killed): pids from its registry."""
        left = [(s.pid, s.started) for s in simregistry.load(self.simulator_registry).simulators.values() if s.pid]
        if left:
            processes.stop_all(left, grace=5.0)

    def status(self) -> ClusterStatus:
        state = ClusterState.load(self.state_file) or ClusterState()
        rows = tuple(
            ComponentStatus(r.name, r.pid, processes.alive(r.pid), r.address, r.log)
            for name in COMPONENTS if (r := state.components.get(name)) is not None
        )
        return ClusterStatus(self.state_dir, rows, state.kubeconfig, state.apiserver_url, state.prometheus_url,
                             state.alertmanager_url, tuple(state.nodes))

    def env(self) -> dict[str, str]:
        """The environment a client needs: KUBECONFIG, and PROMETHEUS_URL/ALERTMANAGER_URL with monitoring."""
        state = self._state()
        result = {"KUBECONFIG": state.kubeconfig}
        if state.prometheus_url:
            result["PROMETHEUS_URL"] = state.prometheus_url
            result["ALERTMANAGER_URL"] = state.alertmanager_url
        return result

    # -- using the cluster ------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                kubeconfig: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run our kubectl against this cluster (admin unless `kubeconfig` is given); raise KubectlError."""
        argv = [str(self.kubectl_path), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(list(args), proc.returncode, proc.stdout, proc.stderr)
        return proc

    def api_client(self) -> httpx2.Client:
        """An HTTP client for raw REST calls as admin (caller closes it), set up by lightkube from the admin
        kubeconfig: for what its typed clients cannot ask (reads from the watch cache with resourceVersion=0,
        server-side applies with fieldValidation=Strict, bodies sent byte for byte). Typed calls:
        `lightkube.Client(KubeConfig.from_file(cluster.kubeconfig))`."""
        self._state()   # ClusterNotRunning when there is no cluster to talk to
        return _admin_client(self.kubeconfig)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path | None = None,
                                   duration: str = "1h") -> Path:
        """A kubeconfig that acts as ServiceAccount `namespace/name`, with a TokenRequest token."""
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        target = path or self.state_dir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig"
        return write_token_kubeconfig(target, self.server, self.pki.ca_cert, token,
                                      f"system:serviceaccount:{namespace}:{name}", namespace)

    def add_scrape_target(self, name: str, address: str, labels: dict[str, str] | None = None,
                          metrics_path: str = "/metrics") -> Path:
        """Have Prometheus scrape `address` (host:port) with `labels`; picked up within ~1 s."""
        self._require_monitoring()
        return monitoring.write_target(self.monitoring_paths, name, address, labels, metrics_path)

    def remove_scrape_target(self, name: str) -> bool:
        """Stop scraping target `name`; True when it was registered."""
        self._require_monitoring()
        return monitoring.remove_target(self.monitoring_paths, name)

    def scrape_targets(self) -> dict[str, list[dict[str, Any]]]:
        self._require_monitoring()
        return monitoring.list_targets(self.monitoring_paths)

    def simulators(self, namespace: str | None = None, sd: str | None = None,
                   variant: str | None = None) -> list[SimulatorEndpoint]:
        """The pod runner's engine simulators matching every filter given (see `SimulatorEndpoint.ready`)."""
        return simregistry.load(self.simulator_registry).select(namespace, sd, variant)

    def add_alert_rules(self, name: str, groups: list[dict[str, Any]]) -> Path:
        """Install Prometheus rule groups as `<name>.yml` and reload Prometheus."""
        self._require_monitoring()
        path = monitoring.write_rules(self.monitoring_paths, name, groups)
        httpx.post(f"{self.prometheus_url}/-/reload", timeout=10).raise_for_status()
        return path

    def stop_component(self, name: str, crash: bool = False) -> None:
        """Stop one of `RESTARTABLE_COMPONENTS` as an outage would: SIGTERM (SIGKILL after 10 s), or with
        `crash` SIGKILL at once (kill -9: no shutdown, a Prometheus WAL left to replay).

        Its data directory stays, so `start_component` brings it back with what it had stored (the
        kube-apiserver keeps everything in etcd, which keeps running). While a component is stopped
        `running()` is False, and `up` would replace the whole cluster.
        """
        record = self._restartable(name)
        if crash and processes.alive(record.pid) and processes.start_ticks(record.pid) == record.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
        processes.stop(record.pid, started=record.started)

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        """Start a component `stop_component` stopped: same port, config and data; returns once it is ready
        (the kube-apiserver: /readyz).

        A component that is running is left as it is.
        """
        state = self._state()
        record = self._restartable(name, state)
        if processes.alive(record.pid) and processes.start_ticks(record.pid) == record.started:
            return
        port = int(record.address.rsplit(":", 1)[1])
        deadline = time.monotonic() + timeout
        if name == "kube-apiserver":
            etcd_url = state.components["etcd"].address
            started = self._launch(state, name, self._apiserver_argv(self.binaries["kube-apiserver"], etcd_url, port,
                                                                     self.pki), record.address)
            with _admin_client(self.kubeconfig) as api:
                self._await(started, lambda: api.get("/readyz").status_code == 200, deadline, "kube-apiserver /readyz")
            return
        paths = self.monitoring_paths
        argv = (monitoring.prometheus_argv(paths, port) if name == "prometheus"
                else monitoring.alertmanager_argv(paths, port))
        started = self._launch(state, name, argv, record.address)
        self._await(started, functools.partial(_answers, f"{record.address}/-/ready"), deadline,
                    f"{record.address}/-/ready")

    def _restartable(self, name: str, state: ClusterState | None = None) -> ComponentRecord:
        if name not in RESTARTABLE_COMPONENTS:
            raise ValueError(f"component must be one of {', '.join(RESTARTABLE_COMPONENTS)}, got {name!r}")
        if name != "kube-apiserver":
            self._require_monitoring()
        record = (state or self._state()).components.get(name)
        if record is None:
            raise ClusterNotRunning(f"the dev cluster in {self.state_dir} has no {name}")
        return record

    def _require_monitoring(self) -> None:
        if not self._state().prometheus_url:
            raise ClusterNotRunning(f"the dev cluster in {self.state_dir} runs without monitoring; "
                                    "start it with `specdeploy dev-cluster up --monitoring`")

    # -- starting -------------------------------------------------------------------------------

    def _launch(self, state: ClusterState, name: str, argv: Sequence[str], address: str,
                env: dict[str, str] | None = None) -> ComponentRecord:
        log = self.logs_dir / f"{name}.log"
        pid = processes.start(name, argv, log, env=env, cwd=self.state_dir)
        record = ComponentRecord(name, pid, processes.start_ticks(pid), str(log), address)
        state.components[name] = record
        state.save(self.state_file)  # saved at once, so `down` finds it even if `up` dies next line
        return record

    def _await(self, record: ComponentRecord, probe: Callable[[], object], deadline: float, what: str) -> None:
        log = Path(record.log)

        def ready() -> object:
            if not processes.alive(record.pid):
                raise processes.failure(record.name, log, "exited before it became ready")
            return probe()

        began = time.monotonic()
        try:
            wait_for(ready, max(deadline - time.monotonic(), 1.0), what, interval=0.1, fatal=(ProcessFailed,))
        except TimeoutError as exc:
            raise processes.failure(record.name, log, f"was not ready in time ({exc})") from exc
        self._say(f"  {record.name:<24} {what}: ok ({time.monotonic() - began:.1f}s)")

    def _start_all(self, state: ClusterState, binaries: build.Binaries, stage_dir: Path, deadline: float) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        pki = certs.generate(self.pki.directory)
        names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "prometheus", "alertmanager")
        ports = dict(zip(names, processes.free_ports(len(names)), strict=True))
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        state.apiserver_url = server
        state.kubeconfig = str(self.kubeconfig)
        kubeconfigs = self.state_dir / "kubeconfigs"
        write_cert_kubeconfig(self.kubeconfig, server, pki.ca_cert, pki.client_cert("admin"),
                              pki.client_key("admin"))
        for component in ("controller-manager", "scheduler", "lws-controller"):
            write_cert_kubeconfig(kubeconfigs / f"{component}.kubeconfig", server, pki.ca_cert,
                                  pki.client_cert(component), pki.client_key(component), user_name=component)

        monitors: list[tuple[ComponentRecord, str]] = []
        if self.monitoring:
            monitors = self._start_monitoring(state, ports["prometheus"], ports["alertmanager"])

        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        etcd = self._launch(state, "etcd", self._etcd_argv(binaries["etcd"], etcd_url, ports["etcd-peer"]), etcd_url)
        self._await(etcd, lambda: httpx.get(f"{etcd_url}/health", timeout=2).json().get("health") == "true",
                    deadline, "etcd /health")

        apiserver = self._launch(state, "kube-apiserver",
                                 self._apiserver_argv(binaries["kube-apiserver"], etcd_url,
                                                      ports["kube-apiserver"], pki), server)
        with _admin_client(self.kubeconfig) as api:
            self._await(apiserver, lambda: api.get("/readyz").status_code == 200, deadline, "kube-apiserver /readyz")
            kcm = self._launch(state, "kube-controller-manager",
                               self._kcm_argv(binaries["kube-controller-manager"],
                                              kubeconfigs / "controller-manager.kubeconfig",
                                              ports["kube-controller-manager"], pki),
                               f"https://127.0.0.1:{ports['kube-controller-manager']}")
            scheduler = self._launch(state, "kube-scheduler",
                                     [str(binaries["kube-scheduler"]),
                                      f"--kubeconfig={kubeconfigs / 'scheduler.kubeconfig'}",
                                      "--bind-address=127.0.0.1", f"--secure-port={ports['kube-scheduler']}",
                                      "--leader-elect=false"],
                                     f"https://127.0.0.1:{ports['kube-scheduler']}")
            state.nodes = [gpu_nodes.node_name(i) for i in range(self.node_count)]
            for name in state.nodes:
                response = api.post("/api/v1/nodes", json=gpu_nodes.node_manifest(name, self.gpu_shape))
                if response.status_code not in (201, 409):
                    raise DevClusterError(f"creating node {name} failed: {response.status_code} {response.text}")
            kwok_home = self.state_dir / "kwok-home"
            kwok_home.mkdir(exist_ok=True)
            pod_cidr = gpu_nodes.free_pod_cidr(gpu_nodes.pod_cidrs_in_use())
            kwok = self._launch(state, "kwok",
                                gpu_nodes.kwok_argv(binaries["kwok"], self.kubeconfig, stage_dir, pod_cidr),
                                f"{len(state.nodes)} nodes, pods {pod_cidr}",
                                env={**os.environ, "HOME": str(kwok_home)})

            for record in (kcm, scheduler):
                url = f"{record.address}/healthz"
                self._await(record, functools.partial(_answers, url, verify=False, body="ok"), deadline,
                            f"{record.name} /healthz")
            self._await(kwok, lambda: _nodes_ready(api, state.nodes), deadline,
                        f"{len(state.nodes)} nodes Ready without taints")
            self._await(kcm, lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200,
                        deadline, "ServiceAccount default/default")
            if self.leader_worker_sets:
                self._start_leader_worker_sets(state, api, binaries["lws-controller"], pki, deadline)
        for record, url in monitors:
            self._await(record, functools.partial(_answers, url), deadline, url)
        if self.monitoring:
            runner = self._launch(state, "pod-runner", [sys.executable, "-m", "specdeploy.devcluster.podrunner",
                                                        f"--state-dir={self.state_dir}", f"--engine={self.engine}"],
                                  "watching engine pods")
            self._await(runner, lambda: simregistry.load(self.simulator_registry).synced, deadline,
                        "pod runner watching pods")

    def _start_leader_worker_sets(self, state: ClusterState, api: httpx2.Client, binary: Path, pki: certs.Pki,
                                  deadline: float) -> None:
        """The LeaderWorkerSet CRD, its controller on loopback and its webhooks; ready once a server-side dry run
        of a LeaderWorkerSet passes them (devcluster/leaderworkersets.py says why so)."""
        files = lws.LwsFiles.from_module()
        created = api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=lws.crd_manifest(files))
        if created.status_code not in (201, 409):
            raise DevClusterError(f"creating the LeaderWorkerSet CRD failed: {created.status_code} {created.text}")
        wait_for(lambda: _established(api, lws.CRD_NAME), max(deadline - time.monotonic(), 1.0),
                 f"CRD {lws.CRD_NAME} Established", interval=0.1)
        directory = self.state_dir / "lws"
        cert_dir = directory / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pki.webhook_cert, cert_dir / "tls.crt")
        shutil.copyfile(pki.webhook_key, cert_dir / "tls.key")
        webhook_port, health_port = processes.free_ports(2)
        config = lws.write_config(directory / "config.yaml", webhook_port, health_port, cert_dir)
        webhook_url = f"https://127.0.0.1:{webhook_port}"
        kubeconfig = self.state_dir / "kubeconfigs" / "lws-controller.kubeconfig"
        controller = self._launch(state, "lws-controller", lws.controller_argv(binary, config, kubeconfig),
                                  webhook_url)
        self._await(controller, functools.partial(_answers, f"http://127.0.0.1:{health_port}/readyz"), deadline,
                    "lws-controller /readyz")
        for configuration in lws.webhook_configurations(files, webhook_url, pki.ca_cert.read_bytes()):
            kind = "mutating" if configuration["kind"].startswith("Mutating") else "validating"
            response = api.post(f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations",
                                json=configuration)
            if response.status_code not in (201, 409):
                raise DevClusterError(f"creating the LeaderWorkerSet webhooks failed: {response.status_code} "
                                      f"{response.text}")
        probe = lws.probe_manifest("default")
        self._await(controller, lambda: api.post("/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/"
                                                 "leaderworkersets", params={"dryRun": "All"},
                                                 json=probe).status_code == 201,
                    deadline, "a LeaderWorkerSet through its webhooks (server-side dry run)")

    def _start_monitoring(self, state: ClusterState, prometheus_port: int,
                          alertmanager_port: int) -> list[tuple[ComponentRecord, str]]:
        for binary in (monitoring.PROMETHEUS, monitoring.ALERTMANAGER):
            if not binary.exists():
                raise DevClusterError(f"{binary} is missing; install it with `bash scripts/system-deps.sh` "
                                      "(Debian packages prometheus and prometheus-alertmanager)")
        paths = self.monitoring_paths
        monitoring.write_configs(paths, prometheus_port, alertmanager_port, self.scrape_interval)
        state.prometheus_url = f"http://127.0.0.1:{prometheus_port}"
        state.alertmanager_url = f"http://127.0.0.1:{alertmanager_port}"
        am = self._launch(state, "alertmanager", monitoring.alertmanager_argv(paths, alertmanager_port),
                          state.alertmanager_url)
        prom = self._launch(state, "prometheus", monitoring.prometheus_argv(paths, prometheus_port),
                            state.prometheus_url)
        return [(prom, f"{state.prometheus_url}/-/ready"), (am, f"{state.alertmanager_url}/-/ready")]

    def _etcd_argv(self, etcd: Path, client_url: str, peer_port: int) -> list[str]:
        peer = f"http://127.0.0.1:{peer_port}"
        return [
            str(etcd), "--name=dev", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=dev={peer}", "--unsafe-no-fsync", "--log-level=warn",
        ]

    def _apiserver_argv(self, apiserver: Path, etcd_url: str, port: int, pki: certs.Pki) -> list[str]:
        return [
            str(apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.state_dir / 'pki'}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--api-audiences={SA_ISSUER}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            *(audit.apiserver_flags(self._audit_policy(), self.audit_log) if self.audit_enabled else []),
        ]

    @property
    def audit_log(self) -> Path:
        """The apiserver's audit log of the writes the operator makes (devcluster/audit.py), JSON lines."""
        return self.logs_dir / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.state_dir / "audit-policy.yaml"
        path.write_text(audit.POLICY)
        return path

    def _kcm_argv(self, kcm: Path, kubeconfig: Path, port: int, pki: certs.Pki) -> list[str]:
        return [
            str(kcm),
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.state_dir / 'kcm-certs'}",
            "--leader-elect=false",
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--cluster-name=specdeploy-dev",
        ]


def _admin_client(kubeconfig: Path) -> httpx2.Client:
    """The HTTP client lightkube builds for `kubeconfig`'s current context (server, CA, client certificate),
    10 s timeouts."""
    config = KubeConfig.from_file(kubeconfig).get()
    assert config is not None   # get() raises without a current context
    return client_adapter.Client(config, client_adapter.ConnectionParams())


def _answers(url: str, verify: bool = True, body: str | None = None) -> bool:
    """GET `url` answers 200 (and, with `body`, exactly that text)."""
    response = httpx.get(url, verify=verify, timeout=2)
    return response.status_code == 200 and (body is None or response.text.strip() == body)


def _established(api: httpx2.Client, crd: str) -> bool:
    response = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
    conditions = (response.json().get("status") or {}).get("conditions") or [] if response.status_code == 200 else []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _nodes_ready(api: httpx2.Client, names: list[str]) -> bool:
    """Every named node has Ready=True and no node.kubernetes.io/* taint (so pods can schedule now)."""
    items = {n["metadata"]["name"]: n for n in api.get("/api/v1/nodes").json().get("items", [])}
    for name in names:
        node = items.get(name)
        if node is None:
            return False
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        taints = node.get("spec", {}).get("taints") or []
        if conditions.get("Ready") != "True" or any(t["key"].startswith("node.kubernetes.io/") for t in taints):
            return False
    return True
