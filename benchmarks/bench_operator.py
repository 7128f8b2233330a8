"""The operator as the benchmarks run it: the CRD applied, one namespace, `specdeploy run` watching it.

    with watching_operator(cluster, state_dir, "bench", "--resync-seconds", "300") as (operator, log_path):
        ...   # operator.pid for /proc readings, log_path for what it logged
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.waiters import wait_established

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def watching_operator(cluster: DevCluster, state_dir: Path, namespace: str, *args: str,
                      before: Callable[[], None] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """Yields the operator process (its Lease acquired) and its log file; stops it on the way out. `before`
    runs once the namespace exists and before the operator starts (what its first listing should find)."""
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    wait_established(cluster, "speculativedeployments.specdeploy.io")   # `kubectl wait` fails before a status
    cluster.kubectl("create", "namespace", namespace)
    if before is not None:
        before()
    log_path = state_dir / "operator.log"
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            [sys.executable, "-m", "specdeploy.cli", "run", "--namespace", namespace, "--lease-namespace",
             namespace, "--liveness", "", "--log-format", "plain", *args],
            # Catalog models, no Hub: what is measured is the reconcile and analysis loops, not the Hub client.
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HF_HUB_OFFLINE": "1"},
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: "acquired lease" in log_path.read_text(errors="replace"), 60, "the operator's lease")
            yield operator, log_path
        finally:
            operator.terminate()
            operator.wait(timeout=30)
