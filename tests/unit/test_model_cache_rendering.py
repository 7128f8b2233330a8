"""spec.storage.modelCache: the volume every engine pod downloads into, the env that points the engines there,
what the plan says each variant downloads, and how the dev cluster's pod runner reads it back."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, load_resource
from specdeploy.devcluster.enginepod import CacheVolume, engine_pod
from specdeploy.devcluster.podrunner import RunnerPaths
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import PLAN_FILE, Variant, desired_children

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _resource(example: str, cache: dict[str, Any] | None, **spec: Any) -> SpeculativeDeployment:
    document = yaml.safe_load((EXAMPLES / example).read_text())
    document["spec"].update(spec)
    if cache is not None:
        document["spec"]["storage"] = {"modelCache": cache}
    return load_resource(yaml.safe_dump(document))


def _pods(resource: SpeculativeDeployment) -> dict[Variant, dict[str, Any]]:
    children = desired_children(resource, make_plan(resource.spec))
    return {variant: d["spec"]["template"] for variant, d in children.deployments.items()}


def _cache_volume(pod: dict[str, Any]) -> dict[str, Any]:
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "model-cache"]
    return dict(volume)


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(("cache", "volume"), [
    ({"persistentVolumeClaim": {"claimName": "weights"}}, {"persistentVolumeClaim": {"claimName": "weights"}}),
    ({"hostPath": {"path": "/var/lib/models"}}, {"hostPath": {"path": "/var/lib/models", "type": "DirectoryOrCreate"}}),
    ({"emptyDir": {"sizeLimit": "100Gi"}}, {"emptyDir": {"sizeLimit": "100Gi"}}),
])
def test_both_variants_mount_the_one_cache_and_download_into_it(cache: dict[str, Any], volume: dict[str, Any]) -> None:
    pods = _pods(_resource("llama-8b-ngram.yaml", cache))
    assert set(pods) == {Variant.SPECULATIVE, Variant.CONTROL}
    for pod in pods.values():
        assert _cache_volume(pod) == {"name": "model-cache", **volume}
        assert {"name": "model-cache", "mountPath": "/model-cache"} in pod["spec"]["containers"][0]["volumeMounts"]
        env = _env(pod)
        assert env["HF_HOME"] == "/model-cache/huggingface" and "HF_HUB_OFFLINE" not in env
        claimed = "persistentVolumeClaim" in cache
        assert ("fsGroup" in pod["spec"]["securityContext"]) == claimed, "a claim's files made the engine's group"


def test_without_a_cache_an_empty_dir_bounded_by_the_plans_weights() -> None:
    resource = _resource("llama-70b-fp8-tp2.yaml", None)
    plan = make_plan(resource.spec)
    pods = _pods(resource)
    downloads = json.loads(desired_children(resource, plan).config_map["data"][f"speculative.{PLAN_FILE}"])["downloads"]
    assert [d["name"] for d in downloads] == [resource.spec.model.name, resource.spec.speculation.draft.name]  # type: ignore[union-attr]
    gib = sum(d["gib"] for d in downloads)
    assert 74 < gib < 78, "Llama-3.1-70B and an 8B draft, both in FP8: ~76 GiB"
    expected = f"{int(2 * gib) + 1 + 5}Gi"
    for pod in pods.values():
        assert _cache_volume(pod) == {"name": "model-cache", "emptyDir": {"sizeLimit": expected}}


def test_a_control_pod_downloads_no_draft() -> None:
    resource = _resource("llama-70b-fp8-tp2.yaml", None)
    data = desired_children(resource, make_plan(resource.spec)).config_map["data"]
    control = json.loads(data[f"control.{PLAN_FILE}"])["downloads"]
    assert [d["name"] for d in control] == [resource.spec.model.name]


def test_a_read_only_claim_is_mounted_read_only_and_the_engines_stay_offline() -> None:
    pods = _pods(_resource("llama-8b-ngram.yaml", {"persistentVolumeClaim": {"claimName": "w", "readOnly": True}}))
    for pod in pods.values():
        assert _cache_volume(pod)["persistentVolumeClaim"] == {"claimName": "w", "readOnly": True}
        assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in pod["spec"]["containers"][0][
            "volumeMounts"]
        assert _env(pod)["HF_HUB_OFFLINE"] == "1"


def test_a_users_hf_home_wins_over_the_cache() -> None:
    pods = _pods(_resource("llama-8b-ngram.yaml", None, engine={"env": [{"name": "HF_HOME", "value": "/mine"}]}))
    env = [e for e in pods[Variant.SPECULATIVE]["spec"]["containers"][0]["env"] if e["name"] == "HF_HOME"]
    assert env == [{"name": "HF_HOME", "value": "/mine"}]


def test_two_caches_are_refused() -> None:
    with pytest.raises(InvalidResource, match="must set at most one of persistentVolumeClaim, hostPath and emptyDir"):
        _resource("llama-8b-ngram.yaml", {"hostPath": {"path": "/m"}, "emptyDir": {}})


def test_the_pod_runner_keeps_a_claims_cache_per_claim_a_host_paths_per_node_an_empty_dirs_per_pod() -> None:
    resource = _resource("llama-8b-ngram.yaml", {"hostPath": {"path": "/var/lib/models"}})
    template = _pods(resource)[Variant.SPECULATIVE]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": template["metadata"]["labels"]},
           "spec": {**template["spec"], "nodeName": "node-1"}}
    engine = engine_pod(pod)
    assert engine is not None and engine.cache == CacheVolume("hostPath", "/var/lib/models") and engine.node == "node-1"
    paths = RunnerPaths(Path("/state"))
    assert paths.model_cache(engine, engine.cache) == Path("/state/podrunner/caches/nodes/node-1/var/lib/models")
    assert paths.model_cache(engine, CacheVolume("persistentVolumeClaim", "w")) == Path(
        "/state/podrunner/caches/claims/ns/w")
    assert paths.model_cache(engine, CacheVolume("emptyDir")) == Path("/state/podrunner/pods/u1/model-cache")
    assert engine.hub_bandwidth_mibps is None
