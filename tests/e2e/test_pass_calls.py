"""What one pass asks the apiserver, counted by a client that records each call (the real apiserver
answers them): a new SD's first pass reads no child and waits for one round of applies; a pass that finds
everything as it left it writes nothing. The world is let settle between the two (the Deployment rolled out,
its pod Ready): a pass that finds a pod newly Ready rightly writes status and a transition's Event."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from specdeploy.clients import kube
from specdeploy.controller.reconciler import Reconciler, Trigger
from specdeploy.controller.watched import SD
from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import wait_for_object

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


class CountingClient:
    """lightkube's AsyncClient, each call recorded as (method, kind) before it goes to the apiserver."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.client, method)

        def recorded(resource: Any, *args: Any, **kwargs: Any) -> Any:
            kind = resource._api_info.resource.kind if isinstance(resource, type) else resource.kind
            self.calls.append((method, kind))
            return call(resource, *args, **kwargs)

        return recorded


def _sd(namespace: str) -> dict[str, Any]:
    document = yaml.safe_load((REPO / "examples" / "llama-8b-ngram.yaml").read_text())
    document["metadata"] = {"name": "counted", "namespace": namespace}
    document["spec"]["replicas"] = 1
    document["spec"]["analysis"] = {"baseline": {"mode": "None"}}
    return dict(document)


def _wait_rolled_out(dev_cluster: DevCluster, namespace: str) -> None:
    """Until every Deployment of the namespace has rolled out its generation and its pods are available."""
    def rolled_out(listing: dict[str, Any]) -> bool:
        return bool(listing["items"]) and all(
            d.get("status", {}).get("observedGeneration") == d["metadata"]["generation"]
            and d.get("status", {}).get("updatedReplicas") == d["spec"]["replicas"]
            and d.get("status", {}).get("availableReplicas") == d["spec"]["replicas"] for d in listing["items"])

    wait_for_object(dev_cluster, ["deployments"], rolled_out, 120, "the SD's Deployment rolled out", namespace=namespace)


def test_a_new_sds_first_pass_reads_no_child_and_a_second_pass_writes_nothing(
        dev_cluster: DevCluster, crds: None, namespace: str) -> None:
    dev_cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(_sd(namespace)))

    async def passes() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        client = CountingClient(AsyncClient(KubeConfig.from_file(dev_cluster.kubeconfig),
                                            field_manager=kube.FIELD_MANAGER))
        reconciler = Reconciler(cast(AsyncClient, client))
        try:
            body = await kube.get_resource(client.client, namespace, "counted")
            assert body is not None and not body.get("status")
            reconciler.watched.seen(SD, body)   # as kopf's create handler records it
            await reconciler.reconcile(namespace, "counted", Trigger.SPEC)
            first, client.calls = client.calls, []
            await asyncio.to_thread(_wait_rolled_out, dev_cluster, namespace)
            # This resync finds the pod Ready (its status says so); the next one finds the world as it left it.
            await reconciler.reconcile(namespace, "counted", Trigger.RESYNC)
            client.calls = []
            await reconciler.reconcile(namespace, "counted", Trigger.RESYNC)
            return first, client.calls
        finally:
            await client.client.close()

    first, second = asyncio.run(passes())
    assert sorted(first) == sorted([
        ("apply", "ConfigMap"), ("apply", "Deployment"), ("apply", "Service"),
        ("patch", "SpeculativeDeployment"), ("create", "Event"),
    ]), first
    assert not [call for call in second if call[0] in ("apply", "delete", "create")], second
    assert ("get", "Deployment") in second and ("get", "ConfigMap") in second, second
    status = yaml.safe_load(dev_cluster.kubectl("get", "sd", "counted", "-n", namespace, "-o", "yaml").stdout)["status"]
    assert status["observedGeneration"] == 1
