"""Credentials end to end: a Prometheus and an Alertmanager that demand basic auth (the real servers, with
`--web.config.file`), an SD whose `headersSecretRef`s name Secrets holding the Authorization headers, a
rollback — and the passwords found nowhere: not in the operator's log, Events, status, the SD or its
children. Also: the applied engine Deployments keep their locked-down security contexts."""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import json
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_resources import SCENARIO_NAME, SCENARIO_SD

from specdeploy.devcluster import DevCluster, monitoring, wait_for
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = SCENARIO_NAME
USER = "specdeploy"


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash (cost 4, the least Go's bcrypt takes) from the system's libcrypt (libxcrypt), which
    Prometheus' and Alertmanager's `basic_auth_users` want; no Python bcrypt package needed."""
    library = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    library.crypt_gensalt.restype = library.crypt.restype = ctypes.c_char_p
    library.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    library.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    entropy = os.urandom(16)
    salt = library.crypt_gensalt(b"$2b$", 4, entropy, len(entropy))
    hashed = library.crypt(password.encode(), salt)
    assert hashed and hashed.startswith(b"$2b$04$"), "libcrypt cannot make bcrypt hashes"
    return str(hashed.decode())


@dataclass
class AuthMonitoring:
    """The authenticated pair: their URLs and the password each accepts for USER."""

    prometheus_url: str
    alertmanager_url: str
    prometheus_password: str
    alertmanager_password: str

    def alerts(self, namespace: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.alertmanager_url}/api/v2/alerts", params={"filter": f'namespace="{namespace}"'},
                             auth=(USER, self.alertmanager_password), timeout=10)
        response.raise_for_status()
        return [a for a in response.json() if a["labels"].get("alertname") == "SpeculationRolledBack"]


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def auth_monitoring(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthMonitoring]:
    """A second Prometheus (scraping the dev cluster's simulator targets) and Alertmanager on loopback,
    each demanding basic auth with its own distinctive password."""
    directory = tmp_path_factory.mktemp("auth-monitoring")
    prometheus_password = f"prom-{secrets.token_hex(8)}"
    alertmanager_password = f"am-{secrets.token_hex(8)}"
    prometheus_port, alertmanager_port = free_port(), free_port()
    for server, password in (("prometheus", prometheus_password), ("alertmanager", alertmanager_password)):
        (directory / f"{server}-web.yml").write_text(yaml.safe_dump({"basic_auth_users": {USER: bcrypt_hash(password)}}))
    (directory / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s", "scrape_timeout": "2s"},
        "scrape_configs": [{"job_name": "dev-cluster", "file_sd_configs": [
            {"files": [str(dev_cluster.monitoring_paths.targets / "*.json")], "refresh_interval": "1s"}]}],
    }))
    (directory / "alertmanager.yml").write_text(yaml.safe_dump(monitoring.alertmanager_config()))
    servers = [
        _start([str(monitoring.PROMETHEUS), f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
                f"--web.config.file={directory / 'prometheus-web.yml'}"], directory / "prometheus.log"),
        _start([str(monitoring.ALERTMANAGER), f"--config.file={directory / 'alertmanager.yml'}",
                f"--storage.path={directory / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{alertmanager_port}", "--cluster.listen-address=",
                f"--web.config.file={directory / 'alertmanager-web.yml'}"], directory / "alertmanager.log"),
    ]
    pair = AuthMonitoring(f"http://127.0.0.1:{prometheus_port}", f"http://127.0.0.1:{alertmanager_port}",
                          prometheus_password, alertmanager_password)
    try:
        for url, password in ((pair.prometheus_url, prometheus_password), (pair.alertmanager_url, alertmanager_password)):
            wait_for(lambda u=url, p=password: _ready(u, p), 60, f"{url} ready")
        yield pair
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)


def _ready(url: str, password: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", auth=(USER, password), timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _authorization(password: str) -> str:
    return "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()


def _forms(password: str) -> list[str]:
    """Every form a leak could take: the password, the header value, and the base64 a Secret stores."""
    header = _authorization(password)
    return [password, header.split()[1], base64.b64encode(header.encode()).decode(),
            base64.b64encode(password.encode()).decode()]


def _secret(cluster: DevCluster, namespace: str, name: str, authorization: str, labelled: bool = True) -> None:
    cluster.kubectl("create", "secret", "generic", name, "-n", namespace, f"--from-literal=Authorization={authorization}")
    if labelled:   # the operator sends only Secrets labelled for it
        cluster.kubectl("label", "secret", name, "-n", namespace, "specdeploy.io/headers=true")


def _scenario(prometheus_url: str, prometheus_secret: str, alertmanager_url: str, alertmanager_secret: str) -> str:
    sd = yaml.safe_load(SCENARIO_SD)
    sd["spec"]["analysis"]["prometheus"] = {"url": prometheus_url, "headersSecretRef": prometheus_secret}
    sd["spec"]["alerting"] = {"alertmanagerUrl": alertmanager_url, "headersSecretRef": alertmanager_secret}
    return yaml.safe_dump(sd)


def _analysis(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("analysis") or {})


def _rolled_back(obj: dict[str, Any]) -> bool:
    speculation = obj.get("status", {}).get("speculation") or {}
    return speculation.get("active") is False and bool(speculation.get("lastRollback"))


def _everything_readable(cluster: DevCluster, namespace: str, operator_log: str) -> dict[str, str]:
    """What a person with read access (and the operator's log) would see, by where it is."""
    def listing(*kinds: str) -> str:
        return json.dumps(get_json(cluster, ",".join(kinds), namespace=namespace))

    return {
        "operator log": operator_log,
        "events": listing("events"),
        "the SD": listing("sd"),
        "children": listing("deployments", "replicasets", "pods", "configmaps", "services"),
    }


def _assert_no_leak(places: dict[str, str], *passwords: str) -> None:
    for place, text in places.items():
        for password in passwords:
            for form in _forms(password):
                assert form not in text, f"a form of a password ({form[:4]}…) is in {place}"


def _assert_locked_down(cluster: DevCluster, namespace: str) -> None:
    """The apiserver kept what the operator applied: the engine pods' security contexts."""
    for deployment in get_json(cluster, "deployments", "-l", f"specdeploy.io/name={NAME}", namespace=namespace)["items"]:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        [container] = pod["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}
        assert all("valueFrom" not in variable for variable in container["env"]) and "envFrom" not in container


@pytest.mark.parametrize("source", ["sd-secrets", "operator-directories"])
def test_credentials_reach_prometheus_and_alertmanager_and_nowhere_else(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any], auth_monitoring: AuthMonitoring,
    source: str, tmp_path: Path
) -> None:
    """Either each SD names labelled Secrets and URLs, or the SD names nothing and the operator's own URLs
    get the headers of directories (the chart mounts Secrets there)."""
    monitoring_pair = auth_monitoring
    for url in (monitoring_pair.prometheus_url, monitoring_pair.alertmanager_url):
        assert httpx.get(f"{url}/-/ready", timeout=5).status_code == 401     # they do demand credentials
    if source == "sd-secrets":
        _secret(dev_cluster, namespace, "prometheus-auth", _authorization(monitoring_pair.prometheus_password))
        _secret(dev_cluster, namespace, "alertmanager-auth", _authorization(monitoring_pair.alertmanager_password))
        operator = operator_processes("operator", "--analysis-tick-seconds", "1")
        manifest = _scenario(monitoring_pair.prometheus_url, "prometheus-auth", monitoring_pair.alertmanager_url,
                             "alertmanager-auth")
    else:
        directories = []
        for which, password in (("prometheus", monitoring_pair.prometheus_password),
                                ("alertmanager", monitoring_pair.alertmanager_password)):
            directory = tmp_path / f"{which}-headers"
            directory.mkdir()
            (directory / "Authorization").write_text(_authorization(password) + "\n")
            directories += [f"--{which}-headers-dir", str(directory)]
        operator = operator_processes("operator", "--analysis-tick-seconds", "1", "--prometheus-url",
                                      monitoring_pair.prometheus_url, "--alertmanager-url",
                                      monitoring_pair.alertmanager_url, *directories)
        manifest = SCENARIO_SD
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    serving = f"{namespace}/{NAME}"
    wait_for(lambda: endpoints(dev_cluster, serving, "speculative") and endpoints(dev_cluster, serving, "control"),
             90, "both variants' simulators")
    assert all(result.ok for result in sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.8}))
    traffic = Traffic(dev_cluster, serving, qps=4, duration=240).start()
    try:
        # Healthy needs numbers, so the operator's queries passed the authenticated Prometheus.
        wait_for_object(dev_cluster, ["sd", NAME], lambda o: _analysis(o).get("verdict") == "Healthy", 120,
                        "a healthy sample from the authenticated Prometheus", namespace=namespace)
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})
        wait_for_object(dev_cluster, ["sd", NAME], _rolled_back, 120, "the rollback", namespace=namespace)
    finally:
        traffic.stop()
    alerts = wait_for(lambda: monitoring_pair.alerts(namespace), 60, "the alert in the authenticated Alertmanager")
    assert alerts[0]["labels"]["name"] == NAME and alerts[0]["labels"]["reason"] == "AcceptanceBelowMinimum"
    wait_for_object(dev_cluster, ["sd", NAME],
                    lambda o: (o["status"]["speculation"]["lastRollback"] or {}).get("notified") is True, 30,
                    "the rollback marked as notified", namespace=namespace)
    _assert_no_leak(_everything_readable(dev_cluster, namespace, operator.output()),
                    monitoring_pair.prometheus_password, monitoring_pair.alertmanager_password)
    _assert_locked_down(dev_cluster, namespace)


@pytest.mark.parametrize("secret", ["wrong-password", "missing", "unlabelled"])
def test_a_refused_secret_is_inconclusive_naming_the_secret_not_its_value(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any], auth_monitoring: AuthMonitoring,
    secret: str
) -> None:
    wrong = f"wrong-{secrets.token_hex(8)}"
    if secret == "wrong-password":
        _secret(dev_cluster, namespace, "prometheus-auth", _authorization(wrong))
    if secret == "unlabelled":   # the right password, in a Secret not labelled for the operator
        _secret(dev_cluster, namespace, "prometheus-auth", _authorization(auth_monitoring.prometheus_password),
                labelled=False)
    operator = operator_processes("operator", "--analysis-tick-seconds", "1")
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_scenario(
        auth_monitoring.prometheus_url, "prometheus-auth", auth_monitoring.alertmanager_url, "alertmanager-auth"))

    def refused(obj: dict[str, Any]) -> dict[str, Any] | None:
        conditions = obj.get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "SpeculationHealthy" and c["reason"] == "PrometheusRefused"),
                    None)

    wait_for_object(dev_cluster, ["sd", NAME], lambda o: refused(o) is not None, 90, "SpeculationHealthy: PrometheusRefused", namespace=namespace)
    obj = get_json(dev_cluster, "sd", NAME, namespace=namespace)
    condition = refused(obj)
    assert condition is not None and condition["status"] == "Unknown"
    assert f"Secret {namespace}/prometheus-auth" in condition["message"]
    assert {"wrong-password": "HTTP 401", "missing": "not found",
            "unlabelled": "is not labelled specdeploy.io/headers=true"}[secret] in condition["message"]
    assert _analysis(obj)["verdict"].startswith("Inconclusive")
    assert obj["status"]["speculation"]["active"] is True
    if secret == "missing":
        wait_for(lambda: f"cannot read Secret {namespace}/prometheus-auth" in operator.output(), 30,
                 "the warning about the missing Secret")
    _assert_no_leak(_everything_readable(dev_cluster, namespace, operator.output()), wrong,
                    auth_monitoring.prometheus_password)
