"""docs/operator.md "Production checklist", run as written: every console line and YAML block of that section, in
order, in the test's namespace, then what each step promises is checked on the objects it made. The dev cluster
has no storage provisioner, so a PersistentVolume for the claim is made first (the checklist says to bind one)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import get_json

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
BLOCK = re.compile(r"```(console|yaml)\n(.*?)```", re.DOTALL)


def checklist_steps() -> list[tuple[str, str]]:
    """The section's blocks in order: ("console", one `$ …` command) or ("yaml", a manifest)."""
    text = DOC.read_text()
    section = text[text.index("## Production checklist"):]
    section = section[:section.index("\n## ", 1)]
    steps: list[tuple[str, str]] = []
    for kind, body in BLOCK.findall(section):
        if kind == "yaml":
            steps.append((kind, body))
        else:
            steps += [(kind, line[2:]) for line in body.splitlines() if line.startswith("$ ")]
    return steps


@pytest.fixture
def volume(dev_cluster: DevCluster, namespace: str, tmp_path: Path) -> Iterator[None]:
    """A ReadWriteMany PersistentVolume for the checklist's claim, removed afterwards."""
    dev_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": namespace},
        "spec": {"capacity": {"storage": "300Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": str(tmp_path)}, "claimRef": {"namespace": namespace, "name": "llama-weights"}},
    }))
    try:
        yield
    finally:
        dev_cluster.kubectl("delete", "pv", namespace, "--wait=false", "--ignore-not-found", check=False)


def test_every_step_of_the_production_checklist_runs_as_written(
    dev_cluster: DevCluster, operator: None, namespace: str, volume: None
) -> None:
    steps = checklist_steps()
    assert [kind for kind, _ in steps] == ["console", "yaml", "yaml", "console", "console", "console", "console"]
    printed: list[str] = []
    for kind, step in steps:
        if kind == "yaml":
            dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=step)
            continue
        command = shlex.split(step)
        assert command[0] == "kubectl", step
        printed.append(dev_cluster.kubectl(*command[1:], "-n", namespace, timeout=240).stdout)

    # Step 4 printed READY for 2 + 1 pods; step 5's wait passed at 3 + 1.
    assert re.search(r"\s3/3\s", printed[2]), printed[2]
    deployments = {d["metadata"]["name"]: d for d in get_json(dev_cluster, "deployments", namespace=namespace)["items"]}
    assert (deployments["llama-70b"]["spec"]["replicas"], deployments["llama-70b-control"]["spec"]["replicas"]) == (3, 1)
    for deployment in deployments.values():
        pod: dict[str, Any] = deployment["spec"]["template"]
        [engine] = pod["spec"]["containers"]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in engine["env"]
        [cache] = [v for v in pod["spec"]["volumes"] if v["name"] == "model-cache"]
        assert cache["persistentVolumeClaim"] == {"claimName": "llama-weights"}
        assert pod["metadata"]["labels"]["team"] == "inference"
        assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in pod["spec"][
            "tolerations"]
        assert engine["resources"]["requests"] == {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": "2"}
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["preflight"]
    claim = get_json(dev_cluster, "pvc", "llama-weights", namespace=namespace)
    assert claim["status"]["phase"] == "Bound"
    assert "hf_replace_me" not in dev_cluster.kubectl("get", "sd,deployments,configmaps", "-n", namespace,
                                                       "-o", "yaml").stdout
