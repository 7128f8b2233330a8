"""`specdeploy demo`: the whole loop on this machine, and a rollback you can watch.

A real control plane with fake GPU nodes, the Helm chart, the operator (acting as the chart's
ServiceAccount, not admin), engine pods brought alive as simulators and scraped by a real Prometheus,
traffic, an acceptance collapse, the rollback, its Event and the Alertmanager alert; then a load ramp on a second
SD whose batch-size schedule the operator derived (`schedule: {mode: Auto}`): the engine stops drafting at the
peak and drafts again after it, with no restart and no rollback.
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
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.dashboard import dashboard_queries, panels_without_data
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json
from specdeploy.judgment.evidence import parse_rfc3339
from specdeploy.planning.plan import make_plan
from specdeploy.report import schedule_table

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "specdeploy"
RELEASE, OPERATOR_NAMESPACE, NAMESPACE, NAME = "specdeploy", "specdeploy-system", "demo", "llama-8b-eagle3"
SD = f"{NAMESPACE}/{NAME}"
COLLAPSED_ACCEPTANCE = 0.02
DASHBOARD_NOT_IN_DEMO = {"Last probe: acceptance by workload and temperature", "annotation Would roll back (observe)"}
"""The dashboard's panels that stay empty in the demo: no probe runs, and the judgment acts."""
K = 3

# The demo's SD: short windows so a rollback takes a minute rather than an hour; k = 3, the EAGLE-3 head's usual
# setting. At k = 3 the collapse costs ~15–20% per token on the simulator's hardware profile (measured +17%; it was
# ~10% on the planner's roofline, when a fresh-clone CI measured 0.91×, interval 0.90–0.92): above the 1.10 limit, so
# the ratio check usually rolls it back; where the interval sits on the limit the acceptance, surely below its
# floor, makes the measured loss a failure (SlowerBelowAcceptanceFloor, docs/analysis.md "Slower and explained").
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
    numSpeculativeTokens: {K}
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

# The load ramp's SD: Llama-3.3-70B on 4 H100s with an 8B draft on TensorRT-LLM, k per batch size derived by
# the operator (Auto): k 2 to 49 running sequences, k 1 to 192, none from 193, rendered as TensorRT-LLM's
# draft_len_schedule. TensorRT-LLM skips the drafter past the schedule's largest key, so its k = 0 costs nothing
# (vLLM's still runs the drafter, 20–31% in vllm#49986: a vLLM pod held at k 0 is the rollback's, not a demo of
# the schedule). The simulators' acceptance is the prior's (0.48 at k 2), so calibration keeps the table. The
# analysis is shortened (interval 5 s, window 30 s) so a phase takes a minute; its checks and failureLimit are
# the defaults. tests/e2e/test_schedule_dev_cluster.py runs the same SD through the same loads.
RAMP_NAME = "llama-70b-auto"
RAMP_SD = f"{NAMESPACE}/{RAMP_NAME}"
RAMP_WINDOW_SECONDS = 30
RAMP_RESOURCE = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {RAMP_NAME}, namespace: {NAMESPACE}}}
spec:
  replicas: 1
  engine:
    kind: trtllm
    env: [{{name: SPECDEPLOY_SIM_KNOBS, value: '{{"acceptance": 0.48}}'}}]
  model: {{name: meta-llama/Llama-3.3-70B-Instruct}}
  speculation:
    method: draft_model
    draft: {{name: meta-llama/Llama-3.1-8B-Instruct}}
    numSpeculativeTokens: 3
    schedule: {{mode: Auto}}
  resources: {{gpu: {{product: H100-80GB, count: 4}}, tensorParallelSize: 4}}
  serving: {{maxModelLen: 4096, maxNumSeqs: 300}}
  analysis:
    interval: 5s
    window: {RAMP_WINDOW_SECONDS}s
    minRequests: 10
    baseline: {{mode: Control, controlReplicas: 1}}
"""
RAMP_LOW_QPS = 2.0       # requests/s over both pods: a handful of running sequences per pod, k 2
RAMP_PEAK_QPS = 34.0     # added to the low load: more than two pods answer at 300 sequences, so both stay full
RAMP_FASTER = 1.2        # a low-load phase ends on a sample whose speedup interval lies above this (the model: 1.42×)
RAMP_FULL = 270          # "at the peak": this many running sequences or more on each pod (0.9 × maxNumSeqs)


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
        # Scraped as the chart's ServiceMonitor has it scraped: the dashboard's panels read the operator's series.
        self.scraped_from = time.time()
        self.cluster.add_scrape_target("specdeploy-operator", f"127.0.0.1:{metrics_port}")
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
        self.step(f"kubectl apply: {SD} — Llama-3.1-8B with its EAGLE-3 head drafting k = {K}, 2 speculative pods + "
                  "1 control")
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
        self.dashboard()

    def dashboard(self) -> None:
        """The chart's Grafana dashboard for this SD, asked of the demo's Prometheus as Grafana would ask it."""
        self.step("The chart's Grafana dashboard for this SD, its queries asked of this Prometheus (docs/alerts.md)")
        queries = {panel: exprs for panel, exprs in dashboard_queries(NAMESPACE, NAME).items()
                   if panel not in DASHBOARD_NOT_IN_DEMO}
        wait_for(lambda: not panels_without_data(self.cluster.prometheus_url, queries, self.scraped_from), 30,
                 "data in every dashboard panel", describe=lambda: str(
                     panels_without_data(self.cluster.prometheus_url, queries, self.scraped_from)))
        self.console.print(f"dashboard: every panel has data ({len(queries)}: {', '.join(queries)}); the probe's "
                           "table and the Observe annotation stay empty here (no probe runs, the judgment acts)",
                           highlight=False, soft_wrap=True)

    # --- the load ramp: k by batch size, inside the engine ------------------------------------------------

    def ramp_sd(self) -> dict[str, Any]:
        return get_json(self.cluster, "sd", RAMP_NAME, namespace=NAMESPACE)

    def ramp_pods(self) -> dict[str, int]:
        """The ramp SD's pods: name -> restarts of their containers."""
        listing = get_json(self.cluster, "pods", "-l", f"specdeploy.io/name={RAMP_NAME}", namespace=NAMESPACE)
        return {pod["metadata"]["name"]: sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])
                for pod in listing["items"] if not pod["metadata"].get("deletionTimestamp")}

    def engine_info(self, variant: str) -> dict[str, Any]:
        """The ramp SD's pod of `variant`, as its simulator reports it: the running batch and the k in use."""
        [url] = endpoints(self.cluster, RAMP_SD, variant)
        return dict(httpx.get(f"{url}/admin/info", timeout=5).json())

    def apply_ramp(self) -> tuple[dict[str, int], int]:
        """Apply the ramp SD; its pods (name -> restarts) and the largest batch at which its schedule drafts."""
        self.step(f"kubectl apply: {RAMP_SD} — Llama-3.3-70B + an 8B draft on 4 H100s, TensorRT-LLM, "
                  "spec.speculation.schedule {mode: Auto}: 1 speculative pod + 1 control")
        self.kubectl("apply", "-f", "-", input=RAMP_RESOURCE)
        wait_for(lambda: _condition(self.ramp_sd(), "Ready") == "True", 120, "the ramp SD to be Ready")
        wait_for(lambda: endpoints(self.cluster, RAMP_SD, "speculative") and endpoints(self.cluster, RAMP_SD, "control"),
                 60, "the ramp SD's simulators")
        plan = make_plan(SpeculativeDeploymentSpec.model_validate(self.ramp_sd()["spec"]))
        assert plan.schedule is not None
        self.console.print("The schedule the operator derived, as `specdeploy plan` prints it:", highlight=False)
        self.console.print(schedule_table(plan))
        config = get_json(self.cluster, "configmap", f"{RAMP_NAME}-engine", namespace=NAMESPACE)["data"]
        rendered = next(line.strip() for line in config["speculative.trtllm.yaml"].splitlines()
                        if "draft_len_schedule" in line)
        self.console.print(f"rendered into the speculative pod's TensorRT-LLM config: {rendered} (past its largest "
                           "key the engine drafts nothing)", highlight=False)
        self.show("get", "sd", RAMP_NAME, "-n", NAMESPACE)
        pods = self.ramp_pods()
        self.console.print(f"pods: {', '.join(pods)}", highlight=False)
        return pods, max(r.max_batch for r in plan.schedule.ranges if r.k > 0)

    def ramp_watch(self, label: str, until: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], bool],
                   seconds: float, pods: dict[str, int]) -> None:
        """A line every 2 s — the speculative engine's batch and k in use, the control's batch, the SD's status —
        until `until(sd, speculative info, control info)`; fails at once on a rollback, a restart or a new pod."""
        self.console.print("  ".join(f"{h:>12}" for h in ("time", "load", "spec batch", "k in use", "ctl batch",
                                                          "speculating", "speedup", "verdict", "reason")), highlight=False,
                           soft_wrap=True)
        started = time.monotonic()
        while True:
            obj, spec, control = self.ramp_sd(), self.engine_info("speculative"), self.engine_info("control")
            status = obj.get("status", {})
            analysis = status.get("analysis") or {}
            row = [f"{time.monotonic() - started:5.0f}s", label, str(spec["running"]), str(spec["kInUse"]),
                   str(control["running"]), str((status.get("speculation") or {}).get("active")),
                   _speedup(analysis.get("speedup")), str(analysis.get("verdict")), analysis.get("verdictReason") or "-"]
            self.console.print("  ".join(f"{cell:>12}" for cell in row), highlight=False, soft_wrap=True)
            if (status.get("speculation") or {}).get("lastRollback"):
                raise RuntimeError(f"the ramp SD rolled back: {status['speculation']['lastRollback']}")
            if (now := self.ramp_pods()) != pods:
                raise RuntimeError(f"the ramp SD's pods changed: {pods} -> {now}")
            if until(obj, spec, control):
                return
            if time.monotonic() - started > seconds:
                raise TimeoutError(f"waited {seconds:.0f} s for {label}; status.analysis: {json.dumps(analysis)}")
            time.sleep(2)

    def ramp_checkpoint(self, what: str, pods: dict[str, int]) -> None:
        """After a phase: the `kubectl get sd` line, the pods and their restarts, the rollbacks."""
        self.show("get", "sd", RAMP_NAME, "-n", NAMESPACE)
        now = self.ramp_pods()
        speculation = self.ramp_sd()["status"].get("speculation") or {}
        self.console.print(f"after {what}: {'the same pods' if now.keys() == pods.keys() else 'OTHER PODS'}, restarts "
                           f"{sum(now.values())}, rollbacks {speculation.get('rollbacks', 0)}", highlight=False)

    def fit_hardware(self, seconds: float = 240) -> None:
        """Low load until the operator has fitted the GPUs from the control pods (docs/analysis.md, "The GPUs the
        SD really got"): status says what the fitted model would change; the pods keep the prior's table."""
        self.step("The operator measures its GPUs: the control pods' per-token latency at their batch against the "
                  "prior cost model, until the fit is better than the prior")

        def fitted() -> dict[str, Any] | None:
            fit = (self.ramp_sd().get("status", {}).get("analysis") or {}).get("hardwareFit") or {}
            return fit if fit.get("appliedFactor") is not None else None

        fit = wait_for(fitted, seconds, "the hardware fit in status.analysis.hardwareFit", interval=2.0)
        self.console.print(fit["message"], highlight=False, soft_wrap=True)

    def load_ramp(self) -> None:
        pods, drafting_to = self.apply_ramp()
        low = _ramp_traffic(self.cluster, RAMP_LOW_QPS)
        peak: Traffic | None = None
        try:
            self.fit_hardware()
            self.step(f"Low load, {RAMP_LOW_QPS:g} requests/s: a few sequences per pod, the engine drafts k = 2 and "
                      "the speculative pod is faster than the control")
            since = time.time()
            self.ramp_watch("low", lambda o, s, c: s["kInUse"] > 0 and _faster(o, since, RAMP_FASTER), 150, pods)
            self.ramp_checkpoint("low load", pods)
            self.step(f"Peak, +{RAMP_PEAK_QPS:g} requests/s: both pods fill to maxNumSeqs 300, past the schedule's "
                      f"last drafting range (to {drafting_to}) — the engine stops drafting by itself, with no restart")
            peak = _ramp_traffic(self.cluster, RAMP_PEAK_QPS)
            full_since: list[float] = []

            def at_peak(obj: dict[str, Any], spec: dict[str, Any], control: dict[str, Any]) -> bool:
                if spec["running"] < RAMP_FULL or control["running"] < RAMP_FULL or spec["kInUse"] != 0:
                    full_since.clear()
                    return False
                full_since[:] = full_since or [time.time()]
                return _sampled_after(obj, full_since[0] + RAMP_WINDOW_SECONDS)

            self.ramp_watch("peak", at_peak, 180, pods)
            self.ramp_checkpoint("the peak", pods)
            self.step(f"Back to {RAMP_LOW_QPS:g} requests/s (the peak's clients leave): the batch falls into the "
                      "k = 2 range and the engine drafts again")
            peak.stop()
            since = time.time()
            self.ramp_watch("low again", lambda o, s, c: s["kInUse"] > 0 and _faster(
                o, since + RAMP_WINDOW_SECONDS, RAMP_FASTER), 180, pods)
            self.ramp_checkpoint("the ramp", pods)
            self.console.print("No restart and no rollback: the schedule switched drafting off and on inside the "
                               "engine, and the analysis judged the same pods throughout.", highlight=False)
        finally:
            low.stop()
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


def _sampled_after(obj: dict[str, Any], moment: float) -> bool:
    """The SD's last sample was taken after `moment` (epoch seconds)."""
    taken = (obj.get("status", {}).get("analysis") or {}).get("lastSampleAt")
    return taken is not None and parse_rfc3339(taken).timestamp() >= moment


def _faster(obj: dict[str, Any], moment: float, by: float) -> bool:
    """A sample taken after `moment` whose per-token speedup interval lies above `by`."""
    speedup = (obj.get("status", {}).get("analysis") or {}).get("speedup") or {}
    return _sampled_after(obj, moment) and speedup.get("low", 0) > by


def _ramp_traffic(cluster: DevCluster, qps: float) -> Traffic:
    """Whole answers (a peak stays cheap for this machine's client) at temperature 0, so the acceptance knob is
    the measured rate; short prompts, ~600 tokens out, so the peak holds the pods full. stop() cancels the
    answers still under way at once: the peak ends on both pods together."""
    return Traffic(cluster, RAMP_SD, qps, duration=900, chunk_seconds=600,
                   prompt_tokens="50-150", output_tokens="500-700", temperature="0", stream=False,
                   drain_seconds=0.0).start()


def _alerts(url: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v2/alerts", params={"filter": f'namespace="{NAMESPACE}"'}, timeout=5)
    return [a for a in answer.json() if a["labels"].get("alertname") == "SpeculationRolledBack"]


def _args(cluster: DevCluster) -> list[str]:
    deployment = get_json(cluster, "deployment", NAME, namespace=NAMESPACE)
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _next_steps(cluster: DevCluster, operator: subprocess.Popen[bytes], log: Path) -> str:
    env = " ".join(f"{k}={v}" for k, v in cluster.env().items())
    return f"""
The cluster is still up. Try:
  export {env}
  kubectl describe sd {NAME} -n {NAMESPACE}                     # conditions and Events
  kubectl describe sd {RAMP_NAME} -n {NAMESPACE}                # the Auto schedule's SD after the ramp
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
