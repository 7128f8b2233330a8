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
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from specdeploy.devcluster import DevCluster, wait_for


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A running dev cluster (4 GPU nodes, Prometheus, Alertmanager), shared by the session."""
    reuse = os.environ.get("SPECDEPLOY_E2E_CLUSTER_DIR")
    state_dir = Path(reuse) if reuse else tmp_path_factory.mktemp("dev-cluster")
    cluster = DevCluster(state_dir, nodes=4, monitoring=True, progress=_progress)
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
