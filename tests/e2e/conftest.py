"""e2e fixtures: one real dev cluster per test session, a fresh namespace per test.

The session cluster lives in its own temporary state directory (never a user's or the demo's
cluster), is built if the binaries are missing, and is torn down at the end of the session, also
after failures and interrupts. Set SPECDEPLOY_E2E_CLUSTER_DIR to reuse a cluster already running
there (it is then left running) for a fast edit-test loop.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.waiters import wait_established


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A running dev cluster (4 GPU nodes, Prometheus, Alertmanager, the LeaderWorkerSet controller), shared by the
    session."""
    reuse = os.environ.get("SPECDEPLOY_E2E_CLUSTER_DIR")
    state_dir = Path(reuse) if reuse else tmp_path_factory.mktemp("dev-cluster")
    cluster = DevCluster(state_dir, nodes=4, monitoring=True, progress=_progress, audit=True, leader_worker_sets=True)
    owned = not cluster.running()
    # SIGTERM (CI stopping the run, `timeout`) would skip finalizers; as SystemExit they run.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        cluster.up()
        yield cluster
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut `down` short
        try:
            if owned:
                cluster.down(keep_logs=True)  # logs stay in pytest's tmp dir for a post-mortem
        finally:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@pytest.fixture
def namespace(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, with its default ServiceAccount; deleted afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    dev_cluster.kubectl("create", "namespace", name)
    wait_for(lambda: dev_cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             timeout=30, what=f"ServiceAccount {name}/default")
    yield name
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


# --- the operator -------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crds(dev_cluster: DevCluster) -> None:
    """The SpeculativeDeployment CRD, applied as committed."""
    dev_cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))

    wait_established(dev_cluster, "speculativedeployments.specdeploy.io")


def operator_env(dev_cluster: DevCluster, namespace: str) -> dict[str, str]:
    """What an operator scoped to `namespace` needs: credentials, scope, its Lease, a short resync."""
    return {
        "KUBECONFIG": str(dev_cluster.kubeconfig),
        "SPECDEPLOY_NAMESPACES": namespace,
        "SPECDEPLOY_LEASE_NAMESPACE": namespace,
        "SPECDEPLOY_RESYNC_SECONDS": "3",
        "SPECDEPLOY_METRICS_PORT": "0",
    }


@pytest.fixture
def operator(dev_cluster: DevCluster, crds: None, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The operator (kopf, in this process) watching only the test's namespace."""
    from kopf.testing import KopfRunner

    for key, value in operator_env(dev_cluster, namespace).items():
        monkeypatch.setenv(key, value)
    args = ["run", "--standalone", "--namespace", namespace, "-m", "specdeploy.controller.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield
    assert runner.exception is None, runner.output[-4000:]


class OperatorProcess:
    """`specdeploy run` as a separate process, for tests that kill it or start a second one."""

    metrics_url = ""   # set by `analysing_operator(metrics=True)`

    def __init__(self, dev_cluster: DevCluster, namespace: str, log: Path, extra_args: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None) -> None:
        self.log = log
        env = {**os.environ, **operator_env(dev_cluster, namespace), **(extra_env or {})}
        self._file = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specdeploy.cli", "run", "--namespace", namespace, "--lease-namespace", namespace,
             "--resync-seconds", "3", "--liveness", "", "--log-format", "plain", "--metrics-port", "0",
             *extra_args],
            env=env, stdout=self._file, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers, no lease release."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._file.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._file.close()


@pytest.fixture
def operator_processes(dev_cluster: DevCluster, crds: None, namespace: str,
                       tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    """A factory of operator processes for the test's namespace; all are stopped afterwards."""
    started: list[OperatorProcess] = []

    def start(label: str, *extra_args: str, env: dict[str, str] | None = None) -> OperatorProcess:
        process = OperatorProcess(dev_cluster, namespace, tmp_path / f"operator-{label}.log", extra_args, env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def analysing_operator(dev_cluster: DevCluster, namespace: str,
                       operator_processes: Callable[..., OperatorProcess]) -> Iterator[Callable[..., OperatorProcess]]:
    """Start an operator that samples the dev Prometheus every second and alerts the dev Alertmanager.
    `metrics=True` serves its /metrics at `process.metrics_url` — only for tests that read it: a port
    probed free here can be taken before the operator binds it, and the operator then stops. `scraped=True`
    also has the dev Prometheus scrape it, as the chart's ServiceMonitor has it scraped (until the test ends)."""
    targets: list[str] = []

    def start(label: str = "operator", env: dict[str, str] | None = None, metrics: bool = False,
              scraped: bool = False) -> OperatorProcess:
        port = free_port() if metrics or scraped else 0
        process = operator_processes(
            label, "--prometheus-url", dev_cluster.prometheus_url, "--alertmanager-url",
            dev_cluster.alertmanager_url, "--analysis-tick-seconds", "1", "--metrics-port", str(port), env=env)
        process.metrics_url = f"http://127.0.0.1:{port}/metrics"
        if scraped:
            targets.append(f"operator-{namespace}-{label}")
            dev_cluster.add_scrape_target(targets[-1], f"127.0.0.1:{port}")
        return process

    yield start
    for target in targets:
        dev_cluster.remove_scrape_target(target)


# --- the operator as the Helm chart's ServiceAccount ---------------------------------------------------

@pytest.fixture
def chart_identity(dev_cluster: DevCluster, crds: None, namespace: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Install charts/specdeploy into the test's namespace, watching it, and return the environment that
    makes an operator act as the chart's ServiceAccount instead of admin (KUBECONFIG with a token of it):
    `operator_processes(label, ..., env=chart_identity)`. The release is uninstalled afterwards."""
    import yaml

    release = f"sd-{uuid.uuid4().hex[:6]}"
    helm = [str(dev_cluster.helm_path), f"--kubeconfig={dev_cluster.kubeconfig}"]
    subprocess.run([*helm, "install", release, str(REPO / "charts" / "specdeploy"), "-n", namespace,
                    "--set", f"watchNamespaces={{{namespace}}}"], check=True, capture_output=True, timeout=120)
    try:
        manifest = subprocess.run([*helm, "get", "manifest", release, "-n", namespace], check=True,
                                  capture_output=True, text=True, timeout=60).stdout
        [account] = [d["metadata"]["name"] for d in yaml.safe_load_all(manifest) if d and d["kind"] == "ServiceAccount"]
        kubeconfig = dev_cluster.service_account_kubeconfig(namespace, account, tmp_path / "chart-identity.kubeconfig")
        yield {"KUBECONFIG": str(kubeconfig)}
    finally:
        subprocess.run([*helm, "uninstall", release, "-n", namespace], capture_output=True, timeout=120)
