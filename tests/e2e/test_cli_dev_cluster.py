"""The CLI with kubectl's habits on the dev cluster: `specdeploy get NAME -n NS -w` in a terminal redraws through a
rollback, `specdeploy retry` brings speculation back, and `specdeploy probe NAME -n NS` reaches the engine through
the apiserver's pod proxy with no port-forward."""

from __future__ import annotations

import ipaddress
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_resources import SCENARIO_NAME, serve_scenario

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json, wait_for_object

pytestmark = pytest.mark.e2e

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


class Terminal:
    """A command in a pseudo-terminal 200 columns wide (so it draws as on a person's screen); what it has
    drawn so far, without the escape sequences, grows in a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._pid, self._fd = pty.fork()
        if self._pid == 0:   # the child: the command, or an exit that never runs pytest's code twice
            try:
                # A person's shell starts a command with Ctrl-C at its default; a test run started in the background
                # by a non-interactive shell (as CI may be) ignores SIGINT, and an ignored signal survives exec.
                for sig in (signal.SIGINT, signal.SIGQUIT):
                    signal.signal(sig, signal.SIG_DFL)
                os.execve(argv[0], argv, {**env, "COLUMNS": "200", "LINES": "200", "TERM": "xterm"})
            finally:
                os._exit(127)
        self._raw = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self._raw += chunk

    @property
    def text(self) -> str:
        with self._lock:
            return ANSI.sub("", self._raw.decode(errors="replace"))

    def wait_for(self, words: str, timeout: float, after: int = 0) -> int:
        """Where `words` appear after position `after` of `text`, once they do."""
        return wait_for(lambda: (self.text.find(words, after) + 1) or None, timeout, f"{words!r} on the terminal") - 1

    def interrupt(self) -> int:
        """Ctrl-C, as a person ends a watch; its exit status."""
        os.kill(self._pid, signal.SIGINT)

        def ended() -> tuple[int] | None:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
            return (os.waitstatus_to_exitcode(status),) if pid else None

        [code] = wait_for(ended, 30, "the watch to end")
        os.close(self._fd)
        return code


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "specdeploy.cli", *args]


def _env(cluster: DevCluster) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HF_HUB_OFFLINE": "1"}


def _speculation(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return dict(get_json(cluster, "sd", SCENARIO_NAME, namespace=namespace).get("status", {}).get("speculation") or {})


def test_get_watch_redraws_through_a_rollback_and_retry_brings_speculation_back(
        dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]) -> None:
    analysing_operator()
    serving = serve_scenario(dev_cluster, namespace)
    traffic = Traffic(dev_cluster, serving, qps=4, duration=240).start()
    watch = Terminal(_cli("get", SCENARIO_NAME, "-n", namespace, "-w"), _env(dev_cluster))
    try:
        healthy = watch.wait_for("verdict Healthy", 120)
        assert "speculation on (decided)" in watch.text
        # The pods' rows redraw on their own 5 s tick: each variant's ready pod once it is drawn so.
        wait_for(lambda: re.search(r"speculative\s+\S+\s+Running\s+yes\s+\d+\s+4\s", watch.text), 30,
                 "the speculative pod drawn ready at k 4 (ngram, from its argv)")
        wait_for(lambda: re.search(r"control\s+\S+\s+Running\s+yes\s+\d+\s+off\s", watch.text), 30,
                 "the control pod drawn ready without speculation")
        early = subprocess.run(_cli("retry", SCENARIO_NAME, "-n", namespace), env=_env(dev_cluster),
                               capture_output=True, text=True, timeout=60)
        assert early.returncode == 1 and "nothing to retry" in early.stderr   # and no annotation written
        assert "specdeploy.io/retry-speculation" not in (
            get_json(dev_cluster, "sd", SCENARIO_NAME, namespace=namespace)["metadata"].get("annotations") or {})
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})   # below the SD's floor 0.5
        wait_for_object(dev_cluster, ["sd", SCENARIO_NAME], lambda o: bool(
            (o.get("status", {}).get("speculation") or {}).get("lastRollback")), 90, "the rollback",
            namespace=namespace)
        rolled = watch.wait_for("last rollback", 30, after=healthy)
        watch.wait_for("speculation off (decided)", 30, after=healthy)
        # Acceptance below minAcceptanceRate fails the sample; at k 4 and acceptance 0.3 the per-token comparison may
        # fail the same sample first, and either reason is the rollback's.
        assert re.search(r"Failing (AcceptanceBelowMinimum|InterTokenLatencyRegressed|SlowerBelowAcceptanceFloor)",
                         watch.text[healthy:]), watch.text[healthy:][-3000:]
        watch.wait_for("SpeculationRolledBack", 30, after=rolled)   # the Event (posted after the status write)
        wait_for(lambda: re.search(r"speculative\s+\S+\s+Running\s+yes\s+\d+\s+off\s", watch.text[rolled:]), 60,
                 "a speculative pod drawn running without speculation")

        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.8})
        retry = subprocess.run(_cli("retry", SCENARIO_NAME, "-n", namespace), env=_env(dev_cluster),
                               capture_output=True, text=True, timeout=60)
        assert retry.returncode == 0, retry.stderr
        annotations = get_json(dev_cluster, "sd", SCENARIO_NAME, namespace=namespace)["metadata"]["annotations"]
        assert annotations["specdeploy.io/retry-speculation"] in retry.stdout
        wait_for(lambda: _speculation(dev_cluster, namespace).get("decided") is True, 60, "speculation back")
        watch.wait_for("speculation on (decided)", 30, after=rolled)
    finally:
        traffic.stop()
        assert watch.interrupt() == 0


SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: chat}
spec:
  replicas: 1
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: eagle3, draft: {name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}, numSpeculativeTokens: 3}
  serving: {port: PORT}
"""
ARGV = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama", "--speculative-config",
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}',
        "--per-request-spec-decode-metrics", "summary"]
WORKLOADS = "code: ['[code] def parse(text):']\nsupport: ['[support] Where is my refund?']\n"


def _host_address() -> str | None:
    """An IPv4 address of this machine that the apiserver's pod proxy accepts (global unicast in Go's sense)."""
    words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    for word in words:
        address = ipaddress.ip_address(word)
        if address.version == 4 and not (address.is_loopback or address.is_link_local or address.is_multicast):
            return word
    return None


@pytest.fixture
def pod_at_host_address(dev_cluster: DevCluster, crds: None, namespace: str) -> Iterator[tuple[str, str, int]]:
    """A speculative engine pod of SD `chat` whose pod IP is this machine's own address: the dev cluster's kwok pods
    have loopback IPs, which the apiserver never proxies to ("address not allowed"). The pod is bound to a Node no
    kwok manages and its status is written here, as a kubelet would; the pod runner starts its simulator at
    that IP, as for any Running engine pod. Yields (address, pod name, port)."""
    address = _host_address()
    if address is None:
        pytest.skip("this machine has no global unicast IPv4 address for the apiserver's pod proxy to reach")
    node, pod, port = f"probe-node-{uuid.uuid4().hex[:6]}", "chat-speculative-proxied", free_port()
    dev_cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                                "metadata": {"name": node}}))
    try:
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD.replace("PORT", str(port)))
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "labels": {"specdeploy.io/name": "chat", "specdeploy.io/variant": "speculative"}},
            # it tolerates every taint: the Node, with no kubelet behind it, turns NotReady (NoExecute) within a minute
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "engine", "image": "vllm/vllm-openai", "args": ARGV,
                                     "ports": [{"containerPort": port}]}]}}))
        dev_cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p",
                            json.dumps({"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}],
                                                   "conditions": [{"type": "Ready", "status": "True"}]}}))
        wait_for(lambda: endpoints(dev_cluster, f"{namespace}/chat", "speculative"), 60, "the pod's simulator")
        yield address, pod, port
    finally:
        dev_cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false", "--ignore-not-found", check=False)
        dev_cluster.kubectl("delete", "node", node, "--wait=false", "--ignore-not-found", check=False)


def test_probe_by_name_goes_through_the_apiservers_pod_proxy(
        dev_cluster: DevCluster, namespace: str, pod_at_host_address: tuple[str, str, int], tmp_path: Path) -> None:
    _, pod, port = pod_at_host_address
    knobs = {"workloadAcceptance": {"[code]": 0.85, "[support]": 0.03}}
    assert all(result.ok for result in sim_admin(dev_cluster, f"{namespace}/chat", "speculative", knobs))
    (tmp_path / "workloads.yaml").write_text(WORKLOADS)
    probe = subprocess.run(
        _cli("probe", "chat", "-n", namespace, "--workloads", str(tmp_path / "workloads.yaml"), "--temperatures", "0,1",
             "--requests-per-cell", "3", "--rate", "20", "-o", "json", "--plot", str(tmp_path / "probe.svg")),
        env=_env(dev_cluster), capture_output=True, text=True, timeout=180)
    assert probe.returncode == 0, probe.stderr
    printed = json.loads(probe.stdout)
    assert printed["url"].endswith(f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy")
    cells = {(c["workload"], c["temperature"]): c for c in printed["cells"]}
    assert set(cells) == {(w, t) for w in ("code", "support") for t in (0.0, 1.0)}
    assert all(c["requests"] == 3 for c in cells.values())
    assert cells[("code", 0.0)]["pays"] and not cells[("support", 0.0)]["pays"]
    assert "probe round 3/3: code@0 " in probe.stderr   # the progress, per round of requests
    assert (tmp_path / "probe.svg").read_text().count("<svg") == 1
    status = get_json(dev_cluster, "sd", "chat", namespace=namespace)["status"]
    assert status["probe"]["cells"] == printed["cells"]
