"""The operator against real vLLM: a dev cluster whose pod runner runs vLLM's CPU build for vLLM engine pods.

A dev cluster comes up with `engine="vllm"` (`dev-cluster up --monitoring --engine vllm`); an operator process
runs against it; a draft_model SD (k=3, Control baseline) is applied with kubectl. Its pods run real `vllm
serve` with the stand-in target and draft (devcluster.standins: the draft agrees with the target on every word
of the predictable half). Traffic of predictable prompts then has to show up as the pod's real
`vllm:spec_decode_*` series in Prometheus under the SD's labels, and as a measured acceptance rate in
`kubectl get sd`. An EAGLE-3 SD (its head mapped to the stand-in EAGLE-3 head) keeps speculating under
predictable prompts and rolls back on acceptance when the traffic moves to prompts its head does not predict;
an argument vLLM refuses shows in the SD's status in vLLM's words.

It needs vLLM's CPU build in its cached environment (~6 GiB; `make real-vllm` installs it) and several minutes
of two cores (two real vLLM servers start), so it runs only with SPECDEPLOY_REAL_VLLM=1, which `make test` (CI)
sets. Start time, wall time and CPU per request are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdeploy.devcluster import DevCluster, processes, wait_for
from specdeploy.devcluster.simadmin import endpoints
from specdeploy.devcluster.standins import PREDICTABLE, UNPREDICTABLE, half_words
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json, wait_established

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("SPECDEPLOY_REAL_VLLM") != "1",
                       reason="real vLLM (CPU build, minutes to start): set SPECDEPLOY_REAL_VLLM=1"),
]

REPO = Path(__file__).resolve().parents[2]
NAME = "standin"
DRAFT_MODEL = "{method: draft_model, draft: {name: meta-llama/Llama-3.2-1B-Instruct}, numSpeculativeTokens: 3}"


def _manifest(name: str, speculation: str, analysis: str, engine: str = "{}") -> str:
    """An SD of the stand-in target (Llama-3.1-8B's name: the pod runner maps it to the local stand-in)."""
    return f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation: {speculation}
  serving: {{maxModelLen: 2048, maxNumSeqs: 4}}
  engine: {engine}
  analysis: {analysis}
"""


#: Loose latency limits: on two shared CPU cores the draft costs more than it saves, and this test is about
#: acceptance being measured, not about a speedup.
SD = _manifest(NAME, DRAFT_MODEL, "{interval: 3s, window: 30s, minRequests: 2, "
               "baseline: {mode: Control, controlReplicas: 1}, checks: {minAcceptanceRate: 0.5, "
               "maxP99InterTokenLatencyRatio: 1000, maxP99E2ELatencyRatio: 1000, maxP99TimeToFirstTokenRatio: 1000}}")
START_TIMEOUT = 900.0        # two real vLLM servers starting on two cores, one after the other at worst
MEASURE_TIMEOUT = 240.0


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def vllm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A dev cluster (one GPU node, monitoring) whose vLLM engine pods run real vLLM; down afterwards, logs kept."""
    cluster = DevCluster(tmp_path_factory.mktemp("vllm-cluster"), nodes=1, monitoring=True, engine="vllm",
                         progress=_say)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(keep_logs=True)


@pytest.fixture
def vllm_namespace(vllm_cluster: DevCluster) -> Iterator[str]:
    """A namespace with its default ServiceAccount and the CRD installed; deleted afterwards."""
    name = f"real-vllm-{uuid.uuid4().hex[:6]}"   # one per test: a deleted namespace takes a while to go
    vllm_cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    wait_established(vllm_cluster, "speculativedeployments.specdeploy.io")
    vllm_cluster.kubectl("create", "namespace", name)
    wait_for(lambda: vllm_cluster.kubectl("get", "serviceaccount", "default", "-n", name,
                                          check=False).returncode == 0, timeout=30, what=f"ServiceAccount {name}")
    yield name
    vllm_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def analysing_operator(vllm_cluster: DevCluster, vllm_namespace: str, tmp_path: Path) -> Iterator[Path]:
    """`specdeploy run` for the namespace, sampling the cluster's Prometheus every second; its log's path."""
    log = tmp_path / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(vllm_cluster.kubeconfig), "SPECDEPLOY_NAMESPACES": vllm_namespace,
           "SPECDEPLOY_LEASE_NAMESPACE": vllm_namespace, "HF_HUB_OFFLINE": "1"}
    pid = processes.start(
        "operator",
        [sys.executable, "-m", "specdeploy.cli", "run", "--namespace", vllm_namespace, "--lease-namespace",
         vllm_namespace, "--resync-seconds", "3", "--liveness", "", "--log-format", "plain", "--metrics-port", "0",
         "--prometheus-url", vllm_cluster.prometheus_url, "--alertmanager-url", vllm_cluster.alertmanager_url,
         "--analysis-tick-seconds", "1"],
        log, env=env)
    try:
        yield log
    finally:
        processes.stop(pid, grace=20.0)


def _promql(cluster: DevCluster, query: str) -> list[dict[str, object]]:
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": query}, timeout=10)
    response.raise_for_status()
    result: list[dict[str, object]] = response.json()["data"]["result"]
    return result


def _engine_cpu_seconds(cluster: DevCluster, sd: str) -> float:
    """CPU seconds (user + system) of every process of the SD's engine pods (vLLM's server and engine core)."""
    namespace, name = sd.split("/")
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for sim in cluster.simulators(namespace=namespace, sd=name):
        for pid in processes.group_members(sim.pid) if sim.pid else ():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def _what_ran(cluster: DevCluster, namespace: str, name: str, operator_log: Path, traffic: Traffic,
              selector: str) -> str:
    """What a timed-out wait saw: the engines, where the traffic went and how it fared, what Prometheus holds of
    the speculative pod, the SD's status and the operator's last words (a failure on a slower machine says why)."""
    engines = [f"{sim.url} {sim.variant} {sim.state}" for sim in cluster.simulators(namespace=namespace, sd=name)]
    sent: dict[str, list[str]] = {}
    for record in traffic.records:
        sent.setdefault(record.target, []).append(
            "ok" if record.error is None else str(record.error)[:80])
    fared = {target: f"{outcomes.count('ok')} ok of {len(outcomes)}" for target, outcomes in sent.items()}
    series = [(s["metric"].get("__name__"), s["value"][1]) for s in _promql(  # type: ignore[index, attr-defined]
        cluster, f'{{__name__=~"vllm:spec_decode.*_total|up",{selector}}}')]
    status = json.dumps(_status(cluster, namespace, name).get("speculation"))
    log = operator_log.read_text(errors="replace").splitlines()[-25:] if operator_log.exists() else []
    return "\n".join([f"engines: {engines}", f"requests per target: {fared}", f"series: {series}",
                       f"status.speculation: {status}", "operator log:", *log])


def test_real_vllm_pods_report_their_acceptance_to_the_operator(vllm_cluster: DevCluster, vllm_namespace: str,
                                                                analysing_operator: Path) -> None:
    began = time.monotonic()
    sd = f"{vllm_namespace}/{NAME}"
    vllm_cluster.kubectl("apply", "-n", vllm_namespace, "-f", "-", input=SD)
    wait_for(lambda: endpoints(vllm_cluster, sd, "speculative") and endpoints(vllm_cluster, sd, "control"),
             START_TIMEOUT, "both variants' real vLLM answering /health")
    started = time.monotonic() - began
    _say(f"measured: SD applied -> both real vLLM pods answering /health: {started:.0f}s")

    cpu_before = _engine_cpu_seconds(vllm_cluster, sd)
    traffic = Traffic(vllm_cluster, sd, qps=0.5, duration=MEASURE_TIMEOUT, output_tokens="16", prompt_tokens="8",
                      temperature="0", prompt_words=half_words(PREDICTABLE)).start()
    selector = f'namespace="{vllm_namespace}",specdeploy_io_name="{NAME}",specdeploy_io_variant="speculative"'
    def what_ran() -> str:
        return _what_ran(vllm_cluster, vllm_namespace, NAME, analysing_operator, traffic, selector)

    try:
        wait_for(lambda: any(float(s["value"][1]) > 0 for s in _promql(  # type: ignore[index]
            vllm_cluster, f"vllm:spec_decode_num_accepted_tokens_total{{{selector}}}")),
            MEASURE_TIMEOUT, "the pod's real vllm:spec_decode_num_accepted_tokens_total in Prometheus",
            describe=what_ran)

        def acceptance() -> str:
            return vllm_cluster.kubectl("get", "sd", NAME, "-n", vllm_namespace, "-o",
                                        "jsonpath={.status.analysis.acceptanceRate}").stdout.strip()

        wait_for(acceptance, MEASURE_TIMEOUT, "a measured acceptance rate in the SD's status", describe=what_ran)
    finally:
        traffic.stop()
    cpu_used = _engine_cpu_seconds(vllm_cluster, sd) - cpu_before
    sent = [r for r in traffic.records if r.error is None]
    _say(f"measured: {len(sent)} requests of 8 words -> 16 tokens, engine CPU {cpu_used:.1f}s "
         f"({cpu_used / max(len(sent), 1):.2f} s/request over both pods)")
    _say(vllm_cluster.kubectl("get", "sd", "-n", vllm_namespace).stdout)

    # Real series, under the SD's labels: drafts per position as vLLM exposes them (position 0..k-1).
    positions = {s["metric"]["position"] for s in _promql(  # type: ignore[index]
        vllm_cluster, f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{selector}}}")}
    assert positions == {"0", "1", "2"}
    assert float(acceptance()) >= 0.9, "every word of the predictable half is one the stand-in draft gets right"
    _say(f"measured: test wall time {time.monotonic() - began:.0f}s (after the cluster was up)")


# -- the traffic moves away from what the draft predicts: it keeps speculating, then rolls back --------------

SHIFT_NAME = "shift"
#: An EAGLE-3 head (the pod runner maps it to the stand-in head, which drafts what the stand-in draft drafts).
#: No baseline: acceptance decides (against minAcceptanceRate), and one real vLLM pod is all the cores allow.
EAGLE3 = "{method: eagle3, draft: {name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}, numSpeculativeTokens: 3}"
SHIFT_SD = _manifest(SHIFT_NAME, EAGLE3, "{interval: 3s, window: 20s, minRequests: 2, failureLimit: 2, "
                     "baseline: {mode: None}, checks: {minAcceptanceRate: 0.5}}")


def _status(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "sd", name, namespace=namespace).get("status") or {})


def _engine_argv(cluster: DevCluster, namespace: str, name: str) -> list[str]:
    """The command line of the real vLLM process serving the SD's speculative pod now."""
    [sim] = cluster.simulators(namespace=namespace, sd=name, variant="speculative")
    return Path(f"/proc/{sim.pid}/cmdline").read_bytes().decode().split("\0")


def test_traffic_the_draft_stops_predicting_rolls_back_real_vllm(vllm_cluster: DevCluster, vllm_namespace: str,
                                                                  analysing_operator: Path) -> None:
    sd = f"{vllm_namespace}/{SHIFT_NAME}"
    vllm_cluster.kubectl("apply", "-n", vllm_namespace, "-f", "-", input=SHIFT_SD)
    wait_for(lambda: endpoints(vllm_cluster, sd, "speculative"), START_TIMEOUT, "real vLLM answering /health")
    argv = _engine_argv(vllm_cluster, vllm_namespace, SHIFT_NAME)
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config["method"] == "eagle3" and Path(config["model"]).name == "eagle3", config   # the stand-in head

    def send(half: str) -> Traffic:
        return Traffic(vllm_cluster, sd, qps=0.5, duration=MEASURE_TIMEOUT, output_tokens="16", prompt_tokens="8",
                       temperature="0", prompt_words=half_words(half)).start()

    def analysis() -> dict[str, Any]:
        return dict(_status(vllm_cluster, vllm_namespace, SHIFT_NAME).get("analysis") or {})

    # (c) Predictable prompts: five healthy samples in a row, speculation kept.
    traffic = send(PREDICTABLE)
    try:
        healthy: set[str] = set()

        def five_healthy() -> bool:
            now = analysis()
            if now.get("verdict") == "Healthy":
                healthy.add(str(now.get("lastSampleAt")))
            return len(healthy) >= 5

        wait_for(five_healthy, MEASURE_TIMEOUT, "five healthy samples of real vLLM under predictable traffic")
    finally:
        traffic.stop()
    status = _status(vllm_cluster, vllm_namespace, SHIFT_NAME)
    assert status["speculation"]["decided"] is True and "lastRollback" not in status["speculation"]
    assert float(status["analysis"]["acceptanceRate"]) >= 0.9

    # (b) Unpredictable prompts: acceptance collapses and the SD rolls back, with its Event and alert.
    traffic = send(UNPREDICTABLE)
    try:
        wait_for(lambda: (_status(vllm_cluster, vllm_namespace, SHIFT_NAME).get("speculation") or {}).get(
            "lastRollback"), MEASURE_TIMEOUT, "the rollback on acceptance")
    finally:
        traffic.stop()
    record = _status(vllm_cluster, vllm_namespace, SHIFT_NAME)["speculation"]["lastRollback"]
    assert record["reason"] == "AcceptanceBelowMinimum", record
    _say(f"measured: rolled back on real vLLM: {record['evidence']}")
    events = get_json(vllm_cluster, "events", "--field-selector", f"involvedObject.name={SHIFT_NAME}",
                      namespace=vllm_namespace)["items"]
    assert [e["reason"] for e in events if e["reason"] == "SpeculationRolledBack"] == ["SpeculationRolledBack"]
    alerts = wait_for(lambda: [a for a in httpx.get(f"{vllm_cluster.alertmanager_url}/api/v2/alerts",
                                                     params={"filter": f'namespace="{vllm_namespace}"'}).json()
                               if a["labels"].get("name") == SHIFT_NAME], 30, "the rollback alert")
    assert alerts[0]["labels"]["reason"] == "AcceptanceBelowMinimum"
    # The rolled pod runs real vLLM without a speculative config, and status says so once it does. The old
    # pod's vLLM may still be shutting down when status turns (a terminating pod takes no traffic): wait for
    # the variant to be one process, the new one, answering.
    def rolled_pod_alone_serving() -> bool:
        sims = vllm_cluster.simulators(namespace=vllm_namespace, sd=SHIFT_NAME, variant="speculative")
        return (_status(vllm_cluster, vllm_namespace, SHIFT_NAME).get("speculation") or {}).get(
            "active") is False and len(sims) == 1 and sims[0].ready

    wait_for(rolled_pod_alone_serving, START_TIMEOUT, "the rolled pod's real vLLM answering alone, nothing speculating")
    assert "--speculative-config" not in _engine_argv(vllm_cluster, vllm_namespace, SHIFT_NAME)
    assert _status(vllm_cluster, vllm_namespace, SHIFT_NAME)["phase"] == "RolledBack"


# -- an engine argument vLLM refuses: in vLLM's own words, in the SD's status ----------------------------------

REFUSED_NAME = "refused"
REFUSED_SD = _manifest(REFUSED_NAME, "{method: ngram, numSpeculativeTokens: 3}", "{baseline: {mode: None}}",
                       engine='{extraArgs: ["--tokenizer-mode", "banana"]}')


def test_an_argument_real_vllm_refuses_is_in_the_sd_status_in_vllms_words(
        vllm_cluster: DevCluster, vllm_namespace: str, analysing_operator: Path) -> None:
    vllm_cluster.kubectl("apply", "-n", vllm_namespace, "-f", "-", input=REFUSED_SD)

    def stuck() -> str | None:
        ready = next((c for c in _status(vllm_cluster, vllm_namespace, REFUSED_NAME).get("conditions") or []
                      if c["type"] == "Ready"), None)
        return ready["message"] if ready and ready["reason"] == "RolloutStuck" else None

    message = wait_for(stuck, START_TIMEOUT, "Ready=False RolloutStuck with vLLM's refusal")
    _say(f"measured: Ready says: {message}")
    # vLLM 0.32's words: "ValueError: No tokenizer registered for tokenizer_mode='banana'."
    assert "CrashLoopBackOff" in message and "tokenizer_mode='banana'" in message, message
