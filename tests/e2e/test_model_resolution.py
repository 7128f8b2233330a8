"""A model outside the built-in catalog, planned by the operator from its config.json on a Hub (the real
huggingface_hub client against a fake Hub on loopback): pinned to the commit it resolved to, held there
while its branch moves, rolled to a new revision when the spec asks for one, and left serving — with a
condition that says why it cannot re-plan — while the Hub is down."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.fakehub import FakeHub
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hub"
HERMES = "NousResearch/Hermes-3-Llama-3.1-8B"     # a Llama-3.1-8B fine-tune the catalog does not have
NAME = "hermes"
SD = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {NAME}}}
spec:
  replicas: 1
  model: {{name: {HERMES}}}
  speculation: {{method: ngram, numSpeculativeTokens: 4}}
  serving: {{maxModelLen: 8192, maxNumSeqs: 32}}
  analysis: {{baseline: {{mode: None}}}}
"""


def _args(cluster: DevCluster, namespace: str) -> list[str]:
    deployment = get_json(cluster, "deployment", NAME, namespace=namespace)
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _observed(generation: int, memory: str = "True") -> Callable[[dict[str, Any]], bool]:
    def check(obj: dict[str, Any]) -> bool:
        fits = condition(obj, "MemoryFits") or {}
        return obj.get("status", {}).get("observedGeneration") == generation and fits.get("status") == memory
    return check


def _patch(cluster: DevCluster, namespace: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "sd", NAME, "-n", namespace, "--type", "merge", "-p", json.dumps({"spec": spec}))


def test_a_model_outside_the_catalog_is_planned_from_the_hub_pinned_and_survives_a_hub_outage(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any], tmp_path: Path
) -> None:
    with FakeHub.from_fixtures(FIXTURES) as hub:
        operator_processes("hub", env={"HF_HUB_OFFLINE": "", "HF_ENDPOINT": hub.url,
                                       "SPECDEPLOY_CACHE_DIR": str(tmp_path / "cache")})
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD)
        first = hub.sha(HERMES)
        obj = wait_for_object(dev_cluster, ["sd", NAME], _observed(1), 90, "planned from the Hub", namespace=namespace)
        record = obj["status"]["deployRecord"]
        assert record["target"]["source"] == "Hub" and record["target"]["commit"] == first
        assert record["engine"]["kind"] == "vllm" and record["engine"]["image"]
        args = _args(dev_cluster, namespace)
        assert args[args.index("--revision") + 1] == first

        # The branch moves on the Hub; a re-plan (here: a replicas change) keeps the pods at the planned commit.
        config = json.loads((FIXTURES / HERMES / "config.json").read_text())
        hub.commit(HERMES, {"config.json": json.dumps({**config, "transformers_version": "9.9.9"}).encode()})
        assert hub.sha(HERMES) != first
        _patch(dev_cluster, namespace, {"replicas": 2})
        obj = wait_for_object(dev_cluster, ["sd", NAME], _observed(2), 60, "re-planned", namespace=namespace)
        assert obj["status"]["deployRecord"]["target"]["commit"] == first and first in _args(dev_cluster, namespace)

        # A new revision in the spec resolves again, and the pods roll to it.
        v2 = hub.commit(HERMES, {"config.json": json.dumps({**config, "transformers_version": "2.0.0"}).encode()},
                        branch="v2")
        v3 = hub.commit(HERMES, {"config.json": json.dumps({**config, "transformers_version": "3.0.0"}).encode()},
                        branch="v3")
        _patch(dev_cluster, namespace, {"model": {"revision": "v2"}})
        obj = wait_for_object(dev_cluster, ["sd", NAME], _observed(3), 60, "planned at v2", namespace=namespace)
        assert obj["status"]["deployRecord"]["target"] == {**obj["status"]["deployRecord"]["target"],
                                                           "revision": "v2", "commit": v2}
        assert v2 in _args(dev_cluster, namespace)

        # The Hub goes down and the spec asks for v3: nothing that runs changes, and status says why.
        hub.stop()
        _patch(dev_cluster, namespace, {"model": {"revision": "v3"}})
        obj = wait_for_object(dev_cluster, ["sd", NAME], _observed(4, memory="Unknown"), 60,
                              "MemoryFits Unknown while the Hub is down", namespace=namespace)
        fits = condition(obj, "MemoryFits")
        assert fits is not None and fits["reason"] == "HubUnreachable" and "retries with backoff" in fits["message"]
        assert obj["status"]["phase"] != "Rejected"
        assert "keep serving" in condition(obj, "Ready")["message"]  # type: ignore[index]
        assert obj["status"]["deployRecord"]["target"]["commit"] == v2 and v2 in _args(dev_cluster, namespace)

        # Back: once the Hub is no longer taken for down (30 s after it failed), the resync (3 s here) plans v3.
        hub.start()
        obj = wait_for_object(dev_cluster, ["sd", NAME], _observed(4), 90, "planned at v3 once the Hub is back",
                              namespace=namespace)
        assert obj["status"]["deployRecord"]["target"]["commit"] == v3 and v3 in _args(dev_cluster, namespace)
