"""Engine pods and the chart's operator pod meet the Kubernetes "restricted" Pod Security Standard, run
with a read-only root filesystem whose writable places are emptyDirs, and never carry the Prometheus or
Alertmanager credentials."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.spec import EnvVar
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import desired_children
from specdeploy.reconcile.podsecurity import WRITABLE_ENV

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENGINE_EXAMPLES = ["llama-70b-fp8-tp2.yaml", "sglang-llama-8b-eagle3.yaml", "trtllm-llama-8b-eagle3.yaml"]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in `pod` (a PodSpec) breaks the restricted Pod Security Standard, or needs a writable root."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"pod {key}")
    problems += [f"volume {v['name']} is a hostPath" for v in pod.get("volumes") or [] if "hostPath" in v]
    if (pod_context.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append("pod seccompProfile is not RuntimeDefault")
    for container in pod["containers"] + pod.get("initContainers", []):
        context = {**pod_context, **(container.get("securityContext") or {})}
        name = container["name"]
        if context.get("runAsNonRoot") is not True or context.get("runAsUser", 1) == 0:
            problems.append(f"{name} may run as root")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name} may escalate privileges")
        if context.get("privileged"):
            problems.append(f"{name} is privileged")
        capabilities = context.get("capabilities") or {}
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            problems.append(f"{name} keeps capabilities: {capabilities}")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name} has a writable root filesystem")
    return problems


def _writable_mounts(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    return [m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty_dirs and not m.get("readOnly")]


def _on_a_writable_mount(path: str, mounts: list[str]) -> bool:
    return any(posixpath.commonpath([path, mount]) == mount for mount in mounts)


def _pods(resource: SpeculativeDeployment) -> list[dict[str, Any]]:
    children = desired_children(resource, make_plan(resource.spec))
    return [deployment["spec"]["template"]["spec"] for deployment in children.deployments.values()]


@pytest.mark.parametrize("example", ENGINE_EXAMPLES)
def test_engine_pods_are_restricted_with_a_read_only_root(example: str) -> None:
    resource = load_resource((EXAMPLES / example).read_text())
    pods = _pods(resource)
    assert len(pods) == 2    # speculative and control
    for pod in pods:
        assert restricted_violations(pod) == []
        assert pod["securityContext"]["runAsUser"] > 0 and pod["securityContext"]["runAsGroup"] > 0
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False


@pytest.mark.parametrize("example", ENGINE_EXAMPLES)
def test_every_directory_an_engine_writes_is_a_writable_empty_dir(example: str) -> None:
    resource = load_resource((EXAMPLES / example).read_text())
    for pod in _pods(resource):
        [container] = pod["containers"]
        mounts = _writable_mounts(pod, container)
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        for variable in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME"):
            assert _on_a_writable_mount(env[variable], mounts), (variable, env[variable], mounts)
        assert env["USER"]                               # TorchInductor's getpass.getuser() without a passwd entry
        assert {"/tmp", "/dev/shm"} <= set(mounts)
        config = next(m for m in container["volumeMounts"] if m["name"] == "engine-config")
        assert config["readOnly"] is True


def test_the_users_engine_env_wins_and_each_name_appears_once() -> None:
    resource = load_resource((EXAMPLES / "llama-8b-ngram.yaml").read_text())
    resource.spec.engine.env = [EnvVar(name="HF_HOME", value="/models/hf"), EnvVar(name="A", value="1")]
    for pod in _pods(resource):
        env = [(e["name"], e.get("value")) for e in pod["containers"][0]["env"]]
        names = [name for name, _ in env]
        assert len(names) == len(set(names))
        assert ("HF_HOME", "/models/hf") in env and ("A", "1") in env
        assert {name for name, _ in WRITABLE_ENV} <= set(names)


def test_engine_pods_never_carry_the_monitoring_credentials() -> None:
    text = (EXAMPLES / "llama-8b-ngram.yaml").read_text()
    resource = load_resource(text)
    resource.spec.analysis.prometheus.headers_secret_ref = "prometheus-auth-7f3a"
    resource.spec.alerting.headers_secret_ref = "alertmanager-auth-9c1e"
    children = desired_children(resource, make_plan(resource.spec))
    rendered = json.dumps(children.all())
    assert "prometheus-auth-7f3a" not in rendered and "alertmanager-auth-9c1e" not in rendered
    for deployment in children.deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        assert not any("secret" in volume for volume in pod["volumes"])
        for container in pod["containers"]:
            assert "envFrom" not in container
            assert all("valueFrom" not in variable for variable in container["env"])


def test_the_hub_token_reaches_every_engine_pod_by_reference_only() -> None:
    resource = load_resource((EXAMPLES / "llama-8b-ngram.yaml").read_text())
    resource.spec.model.token_secret_ref = "hf-token-5d2b"
    children = desired_children(resource, make_plan(resource.spec))
    assert len(children.deployments) == 2
    for deployment in children.deployments.values():
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        [token] = [v for v in container["env"] if v["name"] == "HF_TOKEN"]
        assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token-5d2b", "key": "token"}}}
    assert "hf-token-5d2b" not in json.dumps(children.config_map)


def test_the_charts_operator_pod_is_restricted_with_a_read_only_root() -> None:
    from test_chart import _one, _render

    pod = _one(_render(), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    [container] = pod["containers"]
    assert "/tmp" in _writable_mounts(pod, container)


# --- RBAC: exactly the calls the code makes ----------------------------------------------------------

#: Calls kopf makes for the handlers (controller/handlers.py's @kopf.on.* watch these, and LeaderWorkerSets where
#: the operator runs them: `watch_leader_worker_sets`) and CRD discovery.
KOPF_CALLS = {("specdeploy.io", "speculativedeployments", v) for v in ("list", "watch", "patch")} | {
    ("apps", "deployments", "list"), ("apps", "deployments", "watch"), ("", "pods", "list"), ("", "pods", "watch"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "list"), ("leaderworkerset.x-k8s.io", "leaderworkersets", "watch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
#: Clients only the CLI uses, with the user's own credentials (kubectl's), never the operator's ServiceAccount.
CLI_ONLY_CLIENTS = {"cluster_access"}
#: Server-side apply is a create when the object is missing and a patch otherwise; replace is an update.
_VERBS = {"get": ("get",), "list": ("list",), "watch": ("watch",), "create": ("create",), "patch": ("patch",),
          "delete": ("delete",), "replace": ("update",), "apply": ("create", "patch")}


def _lightkube_calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every `client.<verb>(Resource, …)` in the packages that talk to the apiserver
    (clients/, controller/); applied manifests count by the kinds desired_children renders."""
    import ast
    import importlib

    from lightkube.resources.coordination_v1 import Lease
    from lightkube.resources.core_v1 import ConfigMap, Service

    from specdeploy.clients import kube

    calls = set()
    root = Path(kube.__file__).parents[1]
    for path in sorted([*(root / "clients").glob("*.py"), *(root / "controller").glob("*.py")]):
        if path.stem in CLI_ONLY_CLIENTS:
            continue
        module = importlib.import_module(f"specdeploy.{path.parent.name}.{path.stem}")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _VERBS and ast.unparse(node.func.value).endswith("client") and node.args):
                continue
            if node.func.attr == "apply":
                kinds = [kube.Deployment, kube.LeaderWorkerSet, ConfigMap, Service, kube.PodMonitor]
            elif isinstance(node.args[0], ast.Subscript):   # one of a mapping's resources: ENGINE_KINDS[kind]
                kinds = list(eval(ast.unparse(node.args[0].value), vars(module)).values())
            else:
                target = node.args[0]   # a resource class, an object built in place, or the Lease leader.py got
                name = ast.unparse(target.func if isinstance(target, ast.Call) else target)
                kinds = [{**vars(module), "lease": Lease}[name] if "." not in name else eval(name, vars(module))]
            for kind in kinds:
                info = kind._api_info
                resource = info.plural + (f"/{info.action}" if info.action else "")   # e.g. .Status
                calls |= {(info.resource.group, resource, verb) for verb in _VERBS[node.func.attr]}
    return calls


def test_the_charts_rbac_is_exactly_the_calls_the_code_makes() -> None:
    from test_chart import CLUSTER_READS, LEADER_WORKER_SET_CALLS, LEASE_CALLS, OPERATOR_CALLS

    admission = {("specdeploy.io", "speculativedeployments/finalizers", "update")}  # OwnerReferencesPermissionEnforcement
    # Granted to every authenticated identity by Kubernetes' default ClusterRole system:basic-user, not the chart:
    # the operator asks whether it may write PodMonitors.
    everyone = {("authorization.k8s.io", "selfsubjectaccessreviews", "create")}
    used = (_lightkube_calls() | KOPF_CALLS) - everyone
    granted = OPERATOR_CALLS | CLUSTER_READS | LEASE_CALLS | LEADER_WORKER_SET_CALLS   # the last: rbac.leaderWorkerSets
    assert used | admission == granted | admission, (
        f"granted, unused: {sorted(granted - used)}; used, not granted: {sorted(used - granted)}")
