"""`spec.speculation.extraConfig` against the real apiserver and the operator: a key the operator renders is
refused at `kubectl apply` (the CRD's CEL rule, as committed in crds/), free-form JSON is stored as written,
an accepted SD's Deployment carries the merged --speculative-config and its simulator pods start with it, and
a key vLLM has not got is refused by the plan."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from specdeploy.api.resource import InvalidResource, parse_resource
from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e

SCHEDULE = [[1, 8, 4], [9, 256, 2]]


def _manifest(name: str, extra: dict[str, Any], engine: str = "vllm") -> str:
    return yaml.safe_dump({
        "apiVersion": "specdeploy.io/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "engine": {"kind": engine},
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "ngram", "numSpeculativeTokens": 4, "extraConfig": extra},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            "analysis": {"baseline": {"mode": "None"}},
        },
    })


def _apply(cluster: DevCluster, namespace: str, manifest: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=manifest, check=False)


def _python_error(manifest: str) -> str:
    try:
        parse_resource(yaml.safe_load(manifest))
    except InvalidResource as error:
        return str(error)
    return ""


def _observed(kind: str, status: str) -> Callable[[dict[str, Any]], bool]:
    def check(obj: dict[str, Any]) -> bool:
        found = condition(obj, kind)
        observed = obj.get("status", {}).get("observedGeneration")
        return found is not None and found["status"] == status and observed == obj["metadata"]["generation"]
    return check


def _deployments(cluster: DevCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    listing = get_json(cluster, "deployments", "-l", f"specdeploy.io/name={name}", namespace=namespace)
    return list(listing["items"])


def test_a_managed_key_is_refused_at_apply_with_the_field_to_set(
    dev_cluster: DevCluster, crds: None, namespace: str
) -> None:
    for name, extra, engine, owner in [
        ("managed-vllm", {"num_speculative_tokens": 7, "disable_padded_drafter_batch": True}, "vllm",
         "`spec.speculation.numSpeculativeTokens`"),
        ("managed-trtllm", {"max_draft_len": 2}, "trtllm", "`spec.speculation.numSpeculativeTokens`"),
    ]:
        manifest = _manifest(name, extra, engine)
        result = _apply(dev_cluster, namespace, manifest)
        assert result.returncode != 0, result.stdout
        assert "`spec.speculation.extraConfig` must not set a key that the operator renders" in result.stderr
        assert owner in result.stderr
        assert "`spec.speculation.extraConfig` must not set a key that the operator renders" in _python_error(manifest)
    too_many = _manifest("too-many-keys", {f"key_{i}": i for i in range(65)})
    result = _apply(dev_cluster, namespace, too_many)
    assert result.returncode != 0 and "must have at most 64 items" in result.stderr, result.stderr
    assert _python_error(too_many)
    # Another engine's managed key is no business of the CRD for vllm: the plan judges it.
    other = _manifest("trtllm-key-on-vllm", {"max_draft_len": 2})
    assert _apply(dev_cluster, namespace, other).returncode == 0
    assert get_json(dev_cluster, "sd", "trtllm-key-on-vllm", namespace=namespace)["spec"]["speculation"][
        "extraConfig"] == {"max_draft_len": 2}


def test_extra_config_is_merged_into_the_running_speculative_config(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    extra = {"disable_padded_drafter_batch": True, "num_speculative_tokens_per_batch_size": SCHEDULE,
             "suffix_decoding_max_spec_factor": 1.5}
    assert _apply(dev_cluster, namespace, _manifest("merged", extra)).returncode == 0
    stored = get_json(dev_cluster, "sd", "merged", namespace=namespace)
    assert stored["spec"]["speculation"]["extraConfig"] == extra   # kept as written: nothing pruned
    obj = wait_for_object(dev_cluster, ["sd", "merged"], _observed("Ready", "True"), 120, "merged: Ready",
                          namespace=namespace)
    compatible = condition(obj, "Compatible")
    assert compatible is not None and compatible["status"] == "True"
    [deployment] = _deployments(dev_cluster, namespace, "merged")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args.count("--speculative-config") == 1
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                      "prompt_lookup_max": 5, **extra}


def test_keys_the_engine_has_not_got_are_refused_by_the_plan(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    assert _apply(dev_cluster, namespace, _manifest("unknown-key", {"disable_padded_drafter": True})).returncode == 0
    assert _apply(dev_cluster, namespace, _manifest("on-sglang", {"x": 1}, engine="sglang")).returncode == 0
    unknown = wait_for_object(dev_cluster, ["sd", "unknown-key"], _observed("Compatible", "False"), 60,
                              "unknown-key: Compatible False", namespace=namespace)
    found = condition(unknown, "Compatible")
    assert found is not None and found["reason"] == "ExtraConfigKeyUnknown"
    assert "disable_padded_drafter:" in found["message"]
    assert "did you mean disable_padded_drafter_batch?" in found["message"]
    sglang = wait_for_object(dev_cluster, ["sd", "on-sglang"], _observed("Compatible", "False"), 60,
                             "on-sglang: Compatible False", namespace=namespace)
    refused = condition(sglang, "Compatible")
    assert refused is not None and refused["reason"] == "ExtraConfigNotSupported"
    assert "SGLang has no speculative config" in refused["message"]
    assert _deployments(dev_cluster, namespace, "unknown-key") == []
    assert _deployments(dev_cluster, namespace, "on-sglang") == []
