"""The GPU preflight by default: an init container with the engine's image runs the one-file preflight from the
SD's ConfigMap; its refusal reaches the SD's status in its own words."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile import children
from specdeploy.reconcile.children import Variant, desired_children
from specdeploy.reconcile.observed import stuck_pods

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-8b-ngram.yaml"
STANDIN = Path(__file__).resolve().parents[2] / "operator" / "specdeploy" / "devcluster" / "gpu_standin"


def _resource(**engine: Any) -> SpeculativeDeployment:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["engine"] = engine
    return load_resource(yaml.safe_dump(document))


def _pod(resource: SpeculativeDeployment) -> dict[str, Any]:
    return dict(desired_children(resource, make_plan(resource.spec)).deployments[Variant.SPECULATIVE]["spec"][
        "template"])


def test_the_upstream_image_gets_the_preflight_as_an_init_container_on_the_same_gpus() -> None:
    resource = _resource()
    rendered = desired_children(resource, make_plan(resource.spec))
    for deployment in rendered.deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        [init], [engine] = pod["initContainers"], pod["containers"]
        assert init["image"] == engine["image"] == "vllm/vllm-openai:v0.33.0"
        assert init["command"] == ["python3", "/etc/specdeploy/preflight.py", "--check", "/etc/specdeploy/plan.json"]
        assert init["resources"] == {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
        assert init["securityContext"] == engine["securityContext"]
        [config] = [v for v in pod["volumes"] if v["name"] == "engine-config"]
        assert {"key": "preflight.py", "path": "preflight.py"} in config["configMap"]["items"]
    script = rendered.config_map["data"]["preflight.py"]
    assert script == (Path(__file__).resolve().parents[2] / "engine-image" / "specdeploy_engine" / "preflight.py"
                      ).read_text()


def test_the_script_is_not_in_the_config_hash_so_an_operator_upgrade_restarts_no_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _pod(_resource())["metadata"]
    monkeypatch.setattr(children, "preflight_script", lambda: "# another version\n")
    assert _pod(_resource())["metadata"] == before


@pytest.mark.parametrize(("env", "expected"), [([], None), ([{"name": "SPECDEPLOY_PREFLIGHT", "value": "warn"}], "warn")])
def test_warn_reaches_the_init_container(env: list[dict[str, str]], expected: str | None) -> None:
    [init] = _pod(_resource(env=env))["spec"]["initContainers"]
    assert {e["name"]: e["value"] for e in init["env"]}.get("SPECDEPLOY_PREFLIGHT") == expected


@pytest.mark.parametrize("engine", [{"env": [{"name": "SPECDEPLOY_PREFLIGHT", "value": "off"}]},
                                    {"image": "ghcr.io/example/specdeploy-engine-vllm:0.1"}],
                         ids=["off", "launcher image"])
def test_no_init_container_when_off_or_when_the_images_launcher_checks(engine: dict[str, Any]) -> None:
    resource = _resource(**engine)
    rendered = desired_children(resource, make_plan(resource.spec))
    assert "initContainers" not in rendered.deployments[Variant.SPECULATIVE]["spec"]["template"]["spec"]
    assert "preflight.py" not in rendered.config_map["data"]


def _run_script(tmp_path: Path, held_mib: int) -> subprocess.CompletedProcess[str]:
    data = desired_children(_resource(), make_plan(_resource().spec)).config_map["data"]
    (tmp_path / "preflight.py").write_text(data["preflight.py"])
    (tmp_path / "plan.json").write_text(data["speculative.plan.json"])
    env = {"PYTHONPATH": str(STANDIN), "SPECDEPLOY_DEV_GPUS": "1", "SPECDEPLOY_DEV_GPU_TOTAL_MIB": "81559",
           "SPECDEPLOY_DEV_GPU_HELD_MIB": str(held_mib)}
    return subprocess.run([sys.executable, str(tmp_path / "preflight.py"), "--check", str(tmp_path / "plan.json")],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_script_runs_alone_passes_an_empty_gpu_and_refuses_a_held_one(tmp_path: Path) -> None:
    passed = _run_script(tmp_path, 0)
    assert passed.returncode == 0, passed.stderr
    assert "the GPU memory holds the plan" in passed.stderr
    refused = _run_script(tmp_path, 30 * 1024)
    assert refused.returncode == 3
    assert "30.00 GiB of it is held by another process" in refused.stderr


def test_a_refused_preflight_is_a_stuck_pod_with_its_verdict_and_fix() -> None:
    report = ("specdeploy preflight refused to start vllm: GPU 0 cannot hold the memory plan.\n"
              "GPU 0 (H100): the plan needs 71.27 GiB …: does not fit.\n  The plan needs 21.62 GiB more than is free.\n"
              "  Fix: free the GPU: 30.00 GiB of it is held by another process.\n"
              "SPECDEPLOY_PREFLIGHT=warn starts the engine anyway; =off skips this check.\n")
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Pending", "initContainerStatuses": [{
        "name": "preflight", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
        "lastState": {"terminated": {"exitCode": 3, "message": report}}}],
        "containerStatuses": [{"name": "engine", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    [stuck] = stuck_pods([pod])
    assert stuck.reason == "CrashLoopBackOff"
    assert stuck.message == ("back-off 10s; it exited with code 3: specdeploy preflight refused to start vllm: GPU 0 "
                             "cannot hold the memory plan. Fix: free the GPU: 30.00 GiB of it is held by another "
                             "process.")
