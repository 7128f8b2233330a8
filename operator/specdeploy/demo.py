"""`specdeploy demo`: the whole loop on this machine, and a rollback you can watch.

A real control plane with fake GPU nodes, the Helm chart, the operator (acting as the chart's
ServiceAccount, not admin), engine pods brought alive as simulators and scraped by a real Prometheus,
traffic, an acceptance collapse, the rollback, its Event and the Alertmanager alert; then a load ramp on a second
SD with an Auto batch-size schedule: the engine stops drafting at high load and drafts again at low load, with no
restart and no rollback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json
from specdeploy.planning.plan import make_plan

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "specdeploy"
RELEASE, OPERATOR_NAMESPACE, NAMESPACE, NAME = "specdeploy", "specdeploy-system", "demo", "llama-8b-eagle3"
SD = f"{NAMESPACE}/{NAME}"
COLLAPSED_ACCEPTANCE = 0.02

# The demo's SD: short windows so a rollback takes a minute rather than an hour.
RESOURCE = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {NAME}, namespace: {NAMESPACE}}}
spec:
  replicas: 2
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation:
    method: eagle3
    draft: {{name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}}
    numSpeculativeTokens: 3
  serving: {{maxModelLen: 8192, maxNumSeqs: 32}}
  analysis:
    interval: 3s
    window: 20s
    minRequests: 10
    failureLimit: 2
    baseline: {{mode: Control, controlReplicas: 1}}
    # The default checks: per-token latency 1.10×, end-to-end 1.20×, TTFT 1.50× the control's, judged on the
    # means with a 95% interval; minAcceptanceRate unset, so the floor is the cost model's break-even.
"""

# The load ramp's SD: Llama-3.1-70B on 4 H100s with an 8B draft, k by batch size derived by the operator (Auto).
# Its table stops drafting from 288 running sequences (a k = 0 range needs a compute-bound target: no smaller
# pair in the catalog has one below that), so maxNumSeqs 320 gives the peak a k = 0 range to reach. The
# simulators run 10× slower than real time (SPECDEPLOY_SIM_OPTIONS), so 320 sequences per pod take ~20 requests/s
# per pod on this machine, not 200. At k = 0 vLLM still runs the drafter (vllm#49548, 20–31% in vllm#49986; the
# simulator charges 25%): the checks allow that (1.5×) so the peak is the schedule's to absorb, not a rollback.
# The k = 0 pod also serves fewer requests/s than the control, so it ends a peak behind it: the samples whose
# window spans the end of the peak compare its last peak steps with a control already idle and can fail.
# failureLimit 6 is more than one window's samples (15 s / 3 s), so such a transition alone never rolls back.
RAMP_NAME = "llama-70b-auto"
RAMP_SD = f"{NAMESPACE}/{RAMP_NAME}"
RAMP_RESOURCE = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {RAMP_NAME}, namespace: {NAMESPACE}}}
spec:
  replicas: 1
  engine:
    env: [{{name: SPECDEPLOY_SIM_OPTIONS, value: "--time-scale 10"}}]
  model: {{name: meta-llama/Llama-3.1-70B-Instruct}}
  speculation:
    method: draft_model
    draft: {{name: meta-llama/Llama-3.1-8B-Instruct}}
    numSpeculativeTokens: 3
    schedule: {{mode: Auto}}
  resources: {{gpu: {{product: H100-80GB, count: 4}}, tensorParallelSize: 4}}
  serving: {{maxModelLen: 2048, maxNumSeqs: 320}}
  analysis:
    interval: 3s
    window: 15s
    minRequests: 10
    failureLimit: 6
    baseline: {{mode: Control, controlReplicas: 1}}
    checks: {{maxP99InterTokenLatencyRatio: 1.5, maxP99E2ELatencyRatio: 1.5, maxP99TimeToFirstTokenRatio: 2.0}}
"""
RAMP_LOW_QPS = 4.0       # requests/s over both pods: ~20 running sequences per pod, k 2
RAMP_PEAK_QPS = 40.0     # added to the low load: every pod at maxNumSeqs 320, k 0 on the speculative one


@dataclass
class Demo:
    console: Console
    cluster: DevCluster
    qps: float = 6.0

    def step(self, text: str) -> None:
        self.console.print(f"\n[bold cyan]==>[/] [bold]{text}[/]")

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, **kwargs)

    def show(self, *args: str) -> None:
        self.console.print(f"[dim]$ kubectl {' '.join(args)}[/]")
        self.console.print(self.kubectl(*args).stdout.rstrip(), highlight=False)

    def sd(self) -> dict[str, Any]:
        return get_json(self.cluster, "sd", NAME, namespace=NAMESPACE)

    def install_chart(self) -> None:
        self.step(f"helm install {RELEASE} charts/specdeploy (CRD, RBAC, ServiceAccount, operator Deployment)")
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        command = [str(self.cluster.helm_path), "upgrade", "--install", RELEASE, str(CHART), "--namespace",
                   OPERATOR_NAMESPACE, "--create-namespace", "--set", f"prometheusUrl={self.cluster.prometheus_url}",
                   "--set", f"alertmanagerUrl={self.cluster.alertmanager_url}"]
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"helm install failed:\n{result.stderr}")
        self.console.print(result.stdout.split("NOTES:")[0].rstrip(), highlight=False)

    def start_operator(self, log: Path) -> subprocess.Popen[bytes]:
        self.step("Starting the operator as the chart's ServiceAccount (no admin rights), on this machine")
        self.console.print("[dim](engine pods are simulated here, so the operator runs as a local process "
                           "with the chart's RBAC; in a real cluster the chart's Deployment runs it)[/]")
        kubeconfig = self.cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, RELEASE)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            metrics_port = probe.getsockname()[1]
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        # The demo's models are in the built-in catalog and the dev cluster reaches no Hub: stay offline
        # unless the user says otherwise (HF_HUB_OFFLINE=0 with a reachable Hub pins their commits).
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        command = [sys.executable, "-m", "specdeploy.cli", "run", "--lease-namespace", OPERATOR_NAMESPACE,
                   "--prometheus-url", self.cluster.prometheus_url, "--alertmanager-url",
                   self.cluster.alertmanager_url, "--analysis-tick-seconds", "1", "--metrics-port",
                   str(metrics_port), "--liveness", "", "--log-format", "plain"]
        with log.open("ab") as output:
            process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        wait_for(lambda: "acquired lease" in log.read_text(errors="replace"), 60, "the operator to start",
                 describe=lambda: log.read_text(errors="replace")[-3000:])
        self.console.print(f"operator pid {process.pid}, log {log}")
        return process

    def apply(self) -> None:
        self.step(f"kubectl apply: {SD} — Llama-3.1-8B with its EAGLE-3 head, 2 speculative pods + 1 control")
        self.kubectl("create", "namespace", NAMESPACE, check=False)
        self.kubectl("apply", "-f", "-", input=RESOURCE)
        wait_for(lambda: _condition(self.sd(), "Ready") == "True", 120, "the SD to be Ready")
        wait_for(lambda: len(endpoints(self.cluster, SD, "speculative")) == 2 and endpoints(self.cluster, SD, "control"),
                 60, "the engine simulators")
        self.show("get", "sd", "-n", NAMESPACE)
        self.show("get", "pods", "-n", NAMESPACE, "-L", "specdeploy.io/variant")

    def watch(self, until: Callable[[dict[str, Any]], bool], seconds: float, what: str) -> dict[str, Any]:
        """Print a status line every 2 s until `until(sd)` holds."""
        table = Table("time", "phase", "speculating", "acceptance", "TPOT spec", "TPOT control", "speedup",
                      "verdict", box=None, header_style="bold")
        self.console.print(table)
        started = time.monotonic()
        while True:
            obj = self.sd()
            status = obj.get("status", {})
            analysis = status.get("analysis") or {}
            row = [f"{time.monotonic() - started:5.0f}s", str(status.get("phase")),
                   str((status.get("speculation") or {}).get("active")), _number(analysis.get("acceptanceRate")),
                   _ms(analysis.get("meanInterTokenLatencySeconds")),
                   _ms(analysis.get("baselineMeanInterTokenLatencySeconds")), _speedup(analysis.get("speedup")),
                   str(analysis.get("verdict"))]
            self.console.print("  ".join(f"{cell:>12}" for cell in row), highlight=False)
            if until(obj):
                return obj
            if time.monotonic() - started > seconds:
                raise TimeoutError(f"waited {seconds:.0f} s for {what}")
            time.sleep(2)

    def rollback_story(self, obj: dict[str, Any]) -> None:
        record = obj["status"]["speculation"]["lastRollback"]
        self.step(f"Rolled back: {record['reason']}")
        self.console.print(f"evidence: {record['evidence']}", highlight=False)
        self.show("get", "sd", "-n", NAMESPACE)
        self.console.print("[dim]$ kubectl get events -n demo --field-selector reason=SpeculationRolledBack[/]")
        wait_for(lambda: "SpeculationRolledBack" in self.kubectl(
            "get", "events", "-n", NAMESPACE, "--field-selector", "reason=SpeculationRolledBack").stdout, 30,
            "the Event")
        self.show("get", "events", "-n", NAMESPACE, "--field-selector", "reason=SpeculationRolledBack")
        alerts = wait_for(lambda: _alerts(self.cluster.alertmanager_url), 30, "the alert")
        self.step("Alertmanager has the alert")
        for alert in alerts:
            self.console.print(json.dumps({"labels": alert["labels"], "annotations": alert["annotations"]},
                                          indent=1), highlight=False)
        wait_for(lambda: "--speculative-config" not in " ".join(_args(self.cluster)), 60, "the rollout")
        self.step("The engine Deployment now runs the same target without speculation")
        self.console.print(" ".join(_args(self.cluster)), highlight=False)
        rollbacks = [line for line in httpx.get(self.metrics_url).text.splitlines()
                     if line.startswith("specdeploy_rollbacks_total{")]
        self.console.print("operator metric: " + "; ".join(rollbacks), highlight=False)
        self.console.print("Git still holds the spec as written: the rollback lives in status "
                           f"(metadata.generation is {obj['metadata']['generation']}).")

    # --- the load ramp: k by batch size, inside the engine --------------------------------------------------

    def ramp_sd(self) -> dict[str, Any]:
        return get_json(self.cluster, "sd", RAMP_NAME, namespace=NAMESPACE)

    def ramp_pods(self) -> dict[str, int]:
        """The ramp SD's pods: name -> restarts of its engine container."""
        listing = get_json(self.cluster, "pods", "-l", f"specdeploy.io/name={RAMP_NAME}", namespace=NAMESPACE)
        return {pod["metadata"]["name"]: sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])
                for pod in listing["items"] if not pod["metadata"].get("deletionTimestamp")}

    def engine_info(self, variant: str) -> dict[str, Any]:
        """GET /admin/info of the ramp SD's one pod of `variant`: the running batch and the k in use."""
        return dict(httpx.get(f"{endpoints(self.cluster, RAMP_SD, variant)[0]}/admin/info", timeout=5).json())

    def apply_ramp(self) -> dict[str, int]:
        self.step(f"kubectl apply: {RAMP_SD} — Llama-3.1-70B + an 8B draft on 4 H100s, "
                  "spec.speculation.schedule {mode: Auto}: 1 speculative pod + 1 control")
        self.kubectl("apply", "-f", "-", input=RAMP_RESOURCE)
        wait_for(lambda: _condition(self.ramp_sd(), "Ready") == "True", 120, "the ramp SD to be Ready")
        wait_for(lambda: endpoints(self.cluster, RAMP_SD, "speculative") and endpoints(self.cluster, RAMP_SD, "control"),
                 60, "the ramp SD's simulators")
        spec = SpeculativeDeploymentSpec.model_validate(self.ramp_sd()["spec"])
        schedule = make_plan(spec).schedule
        assert schedule is not None
        self.console.print("The schedule the operator derived (`specdeploy plan` prints the same; speedup against "
                           "no speculation, predicted):", highlight=False)
        for r in schedule.ranges:
            self.console.print(f"  batch {r.min_batch:>3}–{r.max_batch:<3}  k {r.k}  "
                               f"{r.speedup_at_min_batch:.2f}× → {r.speedup_at_max_batch:.2f}×", highlight=False)
        config = next(a for a in _args(self.cluster, RAMP_NAME) if a.startswith("{"))
        self.console.print(f"rendered into the engine's --speculative-config: {config}", highlight=False)
        self.show("get", "sd", RAMP_NAME, "-n", NAMESPACE)
        pods = self.ramp_pods()
        self.console.print(f"pods: {', '.join(f'{name} (restarts {n})' for name, n in pods.items())}", highlight=False)
        return pods

    def ramp_watch(self, label: str, until: Callable[[dict[str, Any], dict[str, Any]], bool], seconds: float,
                   pods: dict[str, int]) -> None:
        """A line every 2 s: the speculative engine's batch and k, the control's batch, and the SD's status, until
        `until(sd, speculative engine info)`; fails at once on a rollback, a restart or a new pod."""
        self.console.print("  ".join(f"{h:>12}" for h in ("time", "load", "spec batch", "k in use", "ctl batch",
                                                          "speculating", "speedup", "verdict")), highlight=False)
        started = time.monotonic()
        while True:
            obj, info, control = self.ramp_sd(), self.engine_info("speculative"), self.engine_info("control")
            status = obj.get("status", {})
            analysis = status.get("analysis") or {}
            speedup = analysis.get("speedup")
            row = [f"{time.monotonic() - started:5.0f}s", label, str(info["running"]), str(info["kInUse"]),
                   str(control["running"]), str((status.get("speculation") or {}).get("active")),
                   "-" if not speedup else f"{speedup['value']:.2f}×", str(analysis.get("verdict"))]
            self.console.print("  ".join(f"{cell:>12}" for cell in row), highlight=False)
            if (status.get("speculation") or {}).get("lastRollback"):
                raise RuntimeError(f"the ramp SD rolled back: {status['speculation']['lastRollback']}")
            if (now := self.ramp_pods()) != pods:
                raise RuntimeError(f"the ramp SD's pods changed: {pods} -> {now}")
            if until(obj, info):
                return
            if time.monotonic() - started > seconds:
                raise TimeoutError(f"waited {seconds:.0f} s for {label}; status.analysis: {json.dumps(analysis)}")
            time.sleep(2)

    def ramp_checkpoint(self, what: str, pods: dict[str, int]) -> None:
        """After a phase: the `kubectl get sd` line, the pods and their restarts, and no rollback."""
        self.show("get", "sd", RAMP_NAME, "-n", NAMESPACE)
        now = self.ramp_pods()
        speculation = self.ramp_sd()["status"].get("speculation") or {}
        self.console.print(f"{what}: pods {', '.join(f'{name} (restarts {n})' for name, n in now.items())}"
                           f"{' — the same pods, no restart' if now == pods else ' — CHANGED'}; "
                           f"rollbacks {speculation.get('rollbacks', 0)}, lastRollback "
                           f"{speculation.get('lastRollback')}", highlight=False)

    def load_ramp(self) -> None:
        pods = self.apply_ramp()
        traffic = _ramp_traffic(self.cluster, RAMP_LOW_QPS)
        peak: Traffic | None = None
        try:
            self.step(f"Low load: {RAMP_LOW_QPS:g} requests/s (~20 running sequences per pod): the engine drafts "
                      "k = 2, the speculative pod is faster than the control")
            phase = time.monotonic()
            window = 15.0
            self.ramp_watch("low", lambda o, i: i["kInUse"] > 0 and _sampled_after(o, phase + window)
                            and _speedup_value(o) > 1.15, 120, pods)
            self.ramp_checkpoint("low load", pods)
            self.step(f"Peak: +{RAMP_PEAK_QPS:g} requests/s: every pod at maxNumSeqs 320, in the schedule's k = 0 "
                      "range from 288 — the engine stops drafting by itself, with no restart")
            peak = _ramp_traffic(self.cluster, RAMP_PEAK_QPS)
            phase = time.monotonic()
            self.ramp_watch("peak", lambda o, i: i["kInUse"] == 0 and i["running"] >= 288
                            and _sampled_after(o, phase + window) and 0 < _speedup_value(o) < 0.9, 150, pods)
            self.ramp_checkpoint("peak", pods)
            self.step(f"Back to {RAMP_LOW_QPS:g} requests/s (the peak's clients leave, their unanswered requests "
                      "cancelled): the batch falls and the engine drafts again. The samples whose 15 s window spans the "
                      "peak's end may fail (the k = 0 pod ends the peak behind the control); failureLimit 6 outlasts them")
            peak.stop()
            phase = time.monotonic()
            self.ramp_watch("low again", lambda o, i: i["kInUse"] > 0 and i["running"] < 79
                            and _sampled_after(o, phase + window) and _speedup_value(o) > 1.15, 150, pods)
            self.ramp_checkpoint("low load again", pods)
            self.console.print("No restart and no rollback: the schedule switched drafting off and on inside the "
                               "engine; the analysis judged the same pods throughout.", highlight=False)
        finally:
            traffic.stop()
            if peak is not None:
                peak.stop()


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.2f} ms"


def _speedup(value: Any) -> str:
    return "-" if not value else f"{value['value']:.2f}× ({value['low']:.2f}–{value['high']:.2f})"


def _speedup_value(obj: dict[str, Any]) -> float:
    speedup = (obj.get("status", {}).get("analysis") or {}).get("speedup")
    return float(speedup["value"]) if speedup else 0.0


def _sampled_after(obj: dict[str, Any], moment: float) -> bool:
    """The SD's last sample was taken after `moment` (time.monotonic())."""
    text = (obj.get("status", {}).get("analysis") or {}).get("lastSampleAt")
    if not text:
        return False
    taken = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return taken >= time.time() - (time.monotonic() - moment)


def _ramp_traffic(cluster: DevCluster, qps: float) -> Traffic:
    """Whole answers (no streaming: the peak stays cheap for this machine) at temperature 0, short prompts, one
    long chunk (a chunk waits for its answers before the next starts, which would pause the load). stop() cancels
    the answers still under way at once: a speculative pod at k = 0 serves fewer requests/s than the control, so
    after a peak it has the longer queue, and draining it while the control idles would read as a regression."""
    return Traffic(cluster, RAMP_SD, qps, duration=600, chunk_seconds=600, prompt_tokens="32-64",
                   output_tokens="16-48", temperature="0", stream=False, drain_seconds=0.0).start()


def _alerts(url: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v2/alerts", params={"filter": f'namespace="{NAMESPACE}"'}, timeout=5)
    return [a for a in answer.json() if a["labels"].get("alertname") == "SpeculationRolledBack"]


def _args(cluster: DevCluster, name: str = NAME) -> list[str]:
    deployment = get_json(cluster, "deployment", name, namespace=NAMESPACE)
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _next_steps(cluster: DevCluster, operator: subprocess.Popen[bytes], log: Path) -> str:
    env = " ".join(f"{k}={v}" for k, v in cluster.env().items())
    return f"""
The cluster is still up. Try:
  export {env}
  kubectl describe sd {NAME} -n {NAMESPACE}                     # conditions and Events
  kubectl annotate sd {NAME} -n {NAMESPACE} specdeploy.io/retry-speculation=1 --overwrite   # speculate again
  specdeploy load --sd {SD} --qps 8 --duration 60s            # more traffic
  specdeploy sim-admin --sd {SD} --variant speculative --set oom=true   # an OOM crash
  curl -s $PROMETHEUS_URL/api/v1/query --data-urlencode 'query=vllm:spec_decode_num_accepted_tokens_total'
The operator runs as pid {operator.pid} (log: {log}); stop everything with:
  kill {operator.pid}; specdeploy dev-cluster down
"""


def run_demo(*, tty: bool, cleanup: bool, state_dir: Path | None) -> int:
    """The demo; 0 when the rollback was seen end to end."""
    console = Console(force_terminal=tty, no_color=not tty, highlight=False, width=None if tty else 120)
    cluster = DevCluster(state_dir, monitoring=True, progress=lambda message: console.print(message))
    demo = Demo(console, cluster)
    demo.step("Bringing up the dev cluster: etcd, kube-apiserver, controller-manager, scheduler, 4 kwok GPU "
              "nodes, Prometheus, Alertmanager, the pod runner (the first run builds the binaries)")
    cluster.up()
    log = cluster.state_dir / "demo-operator.log"
    operator: subprocess.Popen[bytes] | None = None
    traffic: Traffic | None = None
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        demo.install_chart()
        operator = demo.start_operator(log)
        demo.apply()
        sim_admin(cluster, SD, "speculative", {"acceptance": 0.8})
        demo.step(f"Traffic at {demo.qps:g} requests/s through both variants; acceptance 0.8 (healthy)")
        traffic = Traffic(cluster, SD, demo.qps, duration=600).start()
        demo.watch(lambda o: (o["status"].get("analysis") or {}).get("verdict") == "Healthy"
                   and o["status"].get("phase") == "Speculating", 120, "healthy samples")
        demo.step(f"Injecting an acceptance collapse on the speculative pods: 0.8 → {COLLAPSED_ACCEPTANCE} "
                  "(as a new traffic mix or a quantised target would), below the break-even of ~0.09: the drafts "
                  "now cost more than they save")
        sim_admin(cluster, SD, "speculative", {"acceptance": COLLAPSED_ACCEPTANCE})
        rolled = demo.watch(lambda o: (o["status"].get("speculation") or {}).get("active") is False, 150,
                            "the rollback")
        demo.rollback_story(rolled)
        traffic.stop()
        traffic = None
        demo.load_ramp()
    finally:
        if traffic is not None:
            traffic.stop()
        if cleanup:
            if operator is not None:
                operator.terminate()
                operator.wait(timeout=30)
            cluster.down()
    if not cleanup and operator is not None:
        console.print(_next_steps(cluster, operator, log))
    console.print("[bold green]demo finished: speculation was rolled back, with an Event and an alert; and a load "
                  "peak turned drafting off and on inside the engine, with no restart and no rollback[/]")
    return 0
