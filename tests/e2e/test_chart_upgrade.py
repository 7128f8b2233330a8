"""A chart upgrade from an earlier commit, as docs/helm.md says to do it: the SDs, their Deployments and their
speculation are kept (each engine Deployment rolls once, for what this version's pods add), and the new CRD is
served.

The earlier commit's chart, CRD and operator code come from this clone's history (`git archive`): CI runs on a
full clone, and a clone without that commit fails here, saying so. The CRD as the earlier chart left it is put
in place with `kubectl replace` (the session's cluster has the CRD already, and SDs of other tests may use it;
deleting it would delete them), under the field manager `helm`, which is whom `helm install` leaves owning it.
Both operators run locally as the chart's ServiceAccount, as in test_chart_install.py; the earlier one imports
the earlier commit's code.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart_install import ChartOperator

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.waiters import condition, get_json
from specdeploy.reconcile.children import ANNOTATION_REPLICAS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "specdeploy"
CRD = "speculativedeployments.specdeploy.io"
EARLIER = "87a745c"
"""The last commit before the CRD gained tokenSecretRef and the scale subresource (2026-12-05)."""
SDS = {"llama-8b-ngram": "llama-8b-ngram.yaml", "qwen3-4b": "qwen3-4b-draft.yaml"}


def _earlier_tree(destination: Path) -> Path:
    """The chart, CRD and operator code of `EARLIER`, extracted under `destination`."""
    git = shutil.which("git")
    assert git, "this test needs git on PATH: it takes the earlier chart from the repository's history"
    found = subprocess.run([git, "-C", str(REPO), "cat-file", "-e", f"{EARLIER}^{{commit}}"], capture_output=True,
                           text=True)
    assert found.returncode == 0, (
        f"commit {EARLIER} is not in this clone's history ({REPO}): the upgrade test installs the chart as it was "
        f"there. Clone with full history (or `git fetch --unshallow`). git said: {found.stderr.strip()}")
    archive = subprocess.run([git, "-C", str(REPO), "archive", "--format=tar", EARLIER, "charts/specdeploy",
                              "operator", "engine-image"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(destination, filter="data")
    return destination


def _helm(cluster: DevCluster, *args: str) -> str:
    argv = [str(cluster.helm_path), f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _chart_operator(cluster: DevCluster, release: str, namespace: str, log: Path,
                    python_path: str | None = None) -> ChartOperator:
    """The operator with the arguments the installed release rendered, as its ServiceAccount."""
    manifest = [d for d in yaml.safe_load_all(_helm(cluster, "get", "manifest", release, "-n", namespace)) if d]
    [account] = [d["metadata"]["name"] for d in manifest if d["kind"] == "ServiceAccount"]
    [deployment] = [d for d in manifest if d["kind"] == "Deployment"]
    args = list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    kubeconfig = cluster.service_account_kubeconfig(namespace, account, log.with_suffix(".kubeconfig"))
    return ChartOperator(args, kubeconfig, namespace, log, python_path=python_path)


@pytest.fixture
def earlier_crd(dev_cluster: DevCluster, crds: None, tmp_path: Path) -> Iterator[Path]:
    """The earlier commit's tree, its CRD in the cluster; this commit's CRD again afterwards, whatever happened."""
    earlier = _earlier_tree(tmp_path / "earlier")
    dev_cluster.kubectl("replace", "--field-manager=helm", "-f", str(earlier / "charts/specdeploy/crds"))
    try:
        yield earlier
    finally:
        dev_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))


@pytest.fixture
def watched(dev_cluster: DevCluster, namespace: str) -> Iterator[str]:
    """The SDs' namespace; the release namespace holds only the operator's Lease."""
    name = f"{namespace[:50]}-sds"
    dev_cluster.kubectl("create", "namespace", name)
    yield name
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def release(dev_cluster: DevCluster, namespace: str) -> Iterator[str]:
    """A release name; uninstalled afterwards (its ClusterRoles outlive the namespace)."""
    name = f"sd-{uuid.uuid4().hex[:6]}"
    yield name
    subprocess.run([str(dev_cluster.helm_path), f"--kubeconfig={dev_cluster.kubeconfig}", "uninstall", name, "-n",
                    namespace, "--ignore-not-found"], capture_output=True, timeout=120)


def _ready(obj: dict[str, Any]) -> bool:
    return ((condition(obj, "Ready") or {}).get("status") == "True"
            and obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"])


def _running(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    """What an upgrade must leave alone: each engine Deployment's uid and spec, the ReplicaSets (a new one is a
    rollout), and each engine pod's uid, simulator process and restarts (the pod runner runs one per pod)."""
    deployments = get_json(cluster, "deployments", namespace=namespace)["items"]
    replicasets = get_json(cluster, "replicasets", namespace=namespace)["items"]
    return {
        "deployments": {d["metadata"]["name"]: (d["metadata"]["uid"], d["spec"]) for d in deployments},
        "replicasets": sorted((r["metadata"]["name"], r["metadata"]["uid"]) for r in replicasets),
        "pods": sorted((s.pod, s.uid, s.pid, s.restarts) for s in cluster.simulators(namespace=namespace)),
    }


def _deployment_metadata(cluster: DevCluster, namespace: str) -> dict[str, tuple[int, dict[str, str]]]:
    """Each Deployment's generation and annotations."""
    return {d["metadata"]["name"]: (d["metadata"]["generation"], d["metadata"].get("annotations") or {})
            for d in get_json(cluster, "deployments", namespace=namespace)["items"]}


def _differences(before: Any, after: Any, path: str = "") -> list[str]:
    """Every leaf that differs, as `path: before -> after`, for a failure one can read."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [line for key in sorted(before.keys() | after.keys(), key=str)
                for line in _differences(before.get(key), after.get(key), f"{path}.{key}")]
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and len(before) == len(after):
        return [line for i, (b, a) in enumerate(zip(before, after, strict=True))
                for line in _differences(b, a, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def test_upgrade_from_the_earlier_chart_keeps_the_sds_and_their_speculation_and_serves_the_new_crd(
        dev_cluster: DevCluster, namespace: str, watched: str, release: str, earlier_crd: Path,
        tmp_path: Path) -> None:
    earlier = earlier_crd
    versions = get_json(dev_cluster, "crd", CRD)["spec"]["versions"]
    assert "scale" not in versions[0].get("subresources", {}), "the earlier CRD (no scale subresource) is not in place"
    values = ["--set", f"watchNamespaces={{{watched}}}", "--set", "resyncSeconds=3", "--set", "logFormat=plain"]
    _helm(dev_cluster, "install", release, str(earlier / "charts/specdeploy"), "-n", namespace, *values)
    operator = _chart_operator(dev_cluster, release, namespace, tmp_path / "operator-earlier.log",
                               python_path=f"{earlier / 'operator'}:{earlier / 'engine-image'}")
    try:
        for example in SDS.values():
            resource = yaml.safe_load((REPO / "examples" / example).read_text())
            resource["spec"]["replicas"] = 1
            dev_cluster.kubectl("apply", "-n", watched, "-f", "-", input=yaml.safe_dump(resource))
        for name in SDS:
            wait_for(lambda n=name: _ready(get_json(dev_cluster, "sd", n, namespace=watched)), 120,
                     f"{name} Ready under the earlier operator", describe=lambda: operator.output()[-3000:])
        wait_for(lambda: len([s for s in dev_cluster.simulators(namespace=watched) if s.ready]) == 2 * len(SDS),
                 120, "every engine pod's simulator running")
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    before = _running(dev_cluster, watched)
    assert len(before["deployments"]) == 2 * len(SDS)
    metadata_before = _deployment_metadata(dev_cluster, watched)
    # The earlier operator's own Deployments: it did not yet record the replicas it rendered.
    assert not any(ANNOTATION_REPLICAS in annotations for _, annotations in metadata_before.values())

    # docs/helm.md "Upgrades": the CRD first, then the chart (with the values it was installed with).
    dev_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    _helm(dev_cluster, "upgrade", release, str(CHART), "-n", namespace, *values)
    operator = _chart_operator(dev_cluster, release, namespace, tmp_path / "operator-upgraded.log")
    try:
        def converged() -> bool:
            deployments = get_json(dev_cluster, "deployments", namespace=watched)["items"]
            sds = [get_json(dev_cluster, "sd", name, namespace=watched) for name in SDS]
            return (all(ANNOTATION_REPLICAS in (d["metadata"].get("annotations") or {}) for d in deployments)
                    and all(_ready(sd) and sd["status"].get("selector") for sd in sds))

        wait_for(converged, 90, "the upgraded operator's pass over every SD (the replicas it rendered recorded, "
                 "status.selector written)", describe=lambda: operator.output()[-3000:])
        wait_for(lambda: len([s for s in dev_cluster.simulators(namespace=watched) if s.ready]) == 2 * len(SDS),
                 180, "every engine pod's simulator running after the upgrade's one rollout")
        after = _running(dev_cluster, watched)
        # The same Deployments (no delete and create), each changed only by what this version's pods add for a real
        # cluster (issue 29: the weight cache and its HF_HOME, the preflight init container and its ConfigMap item,
        # default CPU and memory requests) and the config hash over them; the speculation args, images and probes
        # are as they were. That change rolls each engine Deployment once (docs/helm.md, "Upgrades and removal").
        assert {name: uid for name, (uid, _) in after["deployments"].items()} == {
            name: uid for name, (uid, _) in before["deployments"].items()}
        allowed = ("template.metadata.annotations.specdeploy.io/config-hash", "template.spec.containers[0].env[",
                   "template.spec.containers[0].resources.requests.", "template.spec.containers[0].volumeMounts",
                   "template.spec.initContainers", "template.spec.volumes")
        changed = [line for line in _differences(before["deployments"], after["deployments"])
                   if not any(f"[1].{prefix}" in line for prefix in allowed)]
        assert changed == [], "\n".join(changed)
        for _, (_, spec) in after["deployments"].items():
            assert [c["name"] for c in spec["template"]["spec"]["initContainers"]] == ["preflight"]
        for name in SDS:
            speculation = get_json(dev_cluster, "sd", name, namespace=watched)["status"]["speculation"]
            assert speculation.get("rollbacks", 0) == 0, speculation      # an upgrade is not a rollback
        # And the upgraded operator records the replicas it rendered on each Deployment.
        metadata_after = _deployment_metadata(dev_cluster, watched)
        assert all(metadata_after[name][1].get(ANNOTATION_REPLICAS) == "1" for name in metadata_before)
        for name in SDS:
            scale = get_json(dev_cluster, "sd", name, "--subresource=scale", namespace=watched)
            assert scale["kind"] == "Scale"
            assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (1, 1)
            assert scale["status"]["selector"] == f"specdeploy.io/name={name},specdeploy.io/variant=speculative"
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    assert "Forbidden" not in operator.output() and "forbidden" not in operator.output()
