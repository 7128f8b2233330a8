"""The chart's PrometheusRule and Grafana dashboard: what they read, and each alert as promtool evaluates it.

The alerts and the dashboard read what the operator exports about its own judgment and the per-token histograms
the judgment compares — never an engine's per-step inter-token latency (docs/alerts.md). promtool (Debian package
prometheus, installed by `make system-deps`) evaluates every alert firing and not firing; a machine without it
fails here with that instruction rather than skip the chart's alerts. The dashboard's queries against a real
Prometheus under traffic: tests/e2e/test_rollback_scenarios.py.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import _kinds, _one, _render

from specdeploy.api.spec import EngineKind
from specdeploy.controller.metrics import OperatorMetrics
from specdeploy.engines import metric_names

ALERTS = ["SpeculationRolledBack", "SpeculationWouldRollBack", "SpeculationFailing", "AcceptanceBelowFloor",
          "SpeculationInconclusive", "OperatorDown"]
DESCRIBE = "kubectl describe sd -n prod llama"


@functools.cache
def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: `make system-deps` installs it (Debian package prometheus); the "
                    "chart's alerts are evaluated with it, not skipped")
    return found


def _rule_groups(*sets: str) -> list[dict[str, Any]]:
    return list(_one(_render("prometheusRule.enabled=true", *sets), "PrometheusRule")["spec"]["groups"])


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _rule_groups() for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    config_map = _one(_render(), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    return dict(json.loads(config_map["data"]["specdeploy.json"]))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation of the chart's dashboard, with Grafana's variables."""
    dashboard = _dashboard()
    return ([(p["title"], t["expr"]) for p in _panels(dashboard) for t in p["targets"]]
            + [(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"]])


def concrete(expr: str, namespace: str = ".*", name: str = ".*", rate_interval: str = "5m") -> str:
    """A dashboard query as Grafana sends it, its variables filled in."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$namespace", namespace)
            .replace("$sd", name))


def test_prometheus_rule_has_its_alerts_and_the_stack_label() -> None:
    rule = _one(_render("prometheusRule.enabled=true"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]] == ALERTS
    relabelled = _one(_render("prometheusRule.enabled=true", "prometheusRule.labels.release=prom"), "PrometheusRule")
    assert relabelled["metadata"]["labels"]["release"] == "prom"
    assert _kinds(_render(), "PrometheusRule") == []


# --- what they read ------------------------------------------------------------------------------------

def _per_step_histograms() -> set[str]:
    """Each engine's inter-token latency histogram where it is observed per engine step (vLLM's): it rises with
    speculation while tokens get faster. SGLang's divides each interval by the tokens emitted: it is the
    per-token histogram the judgment compares (engines/sglang.py), and may be read."""
    return {names.inter_token_latency for names in map(metric_names, EngineKind)
            if names.inter_token_latency != names.time_per_output_token}


def test_no_alert_reads_an_engine_metric_or_inter_token_latency() -> None:
    """The alerts read only the operator's own series (its judgment) and the operator's scrape."""
    operator = set(re.findall(r"^# TYPE (\S+)", OperatorMetrics().render(), re.MULTILINE))
    exposed = {f"{name}{suffix}" for name in operator for suffix in ("", "_total")}
    for rule in _rules():
        assert "inter_token_latency" not in rule["expr"], rule["alert"]
        named = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*(?=\{|\[| offset|\))", rule["expr"]))
        metrics = {n for n in named if n.startswith(("specdeploy_", "vllm:", "sglang:", "trtllm_", "up"))}
        assert metrics <= exposed | {"up"}, (rule["alert"], metrics - exposed)


def test_the_dashboard_reads_no_per_step_inter_token_latency() -> None:
    exprs = [expr for _, expr in dashboard_queries()]
    for histogram in _per_step_histograms() | {"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"}:
        assert not [e for e in exprs if histogram in e], histogram
    per_token = {metric_names(kind).time_per_output_token for kind in EngineKind}
    assert not [e for e in exprs if "histogram_quantile" in e and any(name in e for name in per_token)]   # only means


def test_the_per_token_panel_reads_what_the_judgment_compares() -> None:
    """Mean per-token latency by variant from _sum/_count of each engine's time_per_output_token histogram."""
    [panel] = [p for p in _panels(_dashboard()) if p["title"] == "Mean per-token latency by variant"]
    [target] = panel["targets"]
    judged = {metric_names(kind).time_per_output_token for kind in EngineKind}
    for suffix in ("_sum", "_count"):
        [names] = re.findall(rf'__name__=~"([^"]*{suffix})"', target["expr"])
        assert set(names.split("|")) == {f"{name}{suffix}" for name in judged}
    assert "specdeploy_io_variant" in target["expr"] and "{{specdeploy_io_variant}}" in target["legendFormat"]


def test_dashboard_has_the_judgment_panels_and_rollbacks_as_annotations() -> None:
    dashboard = _dashboard()
    by_title = {p["title"]: p for p in _panels(dashboard)}
    wanted = {"Verdict": "specdeploy_verdict", "Speedup with its 95% interval": "specdeploy_speedup",
              "Acceptance against the operator's floor": "specdeploy_acceptance_floor",
              "Mean per-token latency by variant": "_sum", "k in use against the running batch": "specdeploy_k_in_use",
              "Rollbacks": "specdeploy_rollbacks_total"}
    for title, metric in wanted.items():
        assert any(metric in t["expr"] for t in by_title[title]["targets"]), title
    assert {re.findall(r'bound="(\w+)"', t["expr"])[0] for t in by_title["Speedup with its 95% interval"]["targets"]
            } == {"estimate", "low", "high"}
    assert any("specdeploy_running_batch" in t["expr"] for t in by_title["k in use against the running batch"]["targets"])
    annotations = {a["name"]: a["expr"] for a in dashboard["annotations"]["list"]}
    assert "specdeploy_rollbacks_total" in annotations["Rollbacks"]
    assert "specdeploy_would_rollbacks_total" in annotations["Would roll back (observe)"]
    assert _kinds(_render("dashboard.enabled=false"), "ConfigMap") == []


def test_dashboard_names_only_metrics_that_exist() -> None:
    engine = {name for kind in EngineKind for name in vars(metric_names(kind)).values()
              if isinstance(name, str) and re.match(r"^(vllm:|sglang:|trtllm_)", name)}
    operator = set(re.findall(r"^# TYPE (\S+)", OperatorMetrics().render(), re.MULTILINE))

    def base(series: str) -> str:
        """A histogram's `_bucket`, `_sum` and `_count` series are named by the histogram in the engines' tables."""
        trimmed = re.sub(r"_(bucket|sum|count)$", "", series)
        return trimmed if trimmed in engine else series

    named = {base(n) for _, expr in dashboard_queries()
             for n in re.findall(r"\b(?:vllm:|sglang:|trtllm_|specdeploy_)[a-zA-Z0-9_:]+", expr)
             if not n.startswith("specdeploy_io_")}   # the pod labels, not metrics
    assert named
    assert named - engine - operator == set()


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = [{"record": f"specdeploy:dashboard_query_{i}", "expr": concrete(expr)}
             for i, (_, expr) in enumerate(dashboard_queries())]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([_promtool(), "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- every alert, firing and not, as promtool evaluates it ---------------------------------------------

def _series(metric: str, values: str, **labels: str) -> dict[str, str]:
    text = ", ".join(f'{k}="{v}"' for k, v in {**labels, "job": "sd-specdeploy-metrics", "instance": "i"}.items())
    return {"series": f"{metric}{{{text}}}", "values": values}


def _verdict(name: str, verdict: str, reason: str, observe: str, values: str) -> dict[str, str]:
    return _series("specdeploy_verdict", values, namespace="prod", name=name, verdict=verdict, reason=reason,
                   observe=observe)


ROLLED_BACK = {
    "summary": "Speculation rolled back for prod/llama (AcceptanceBelowMinimum)",
    "description": "The operator took speculative decoding away from SpeculativeDeployment prod/llama "
                   "(AcceptanceBelowMinimum); the pods now run the target alone. The numbers that decided it are in "
                   "status.speculation.lastRollback and the SpeculationRolledBack Event (kubectl describe sd -n prod "
                   "llama). Fix the cause (the draft, k, or the workload), then re-enable with `specdeploy retry llama "
                   "-n prod` or a spec change."}
WOULD_ROLL_BACK = {
    "summary": "Speculation of prod/llama would have been rolled back (InterTokenLatencyRegressed); nothing was",
    "description": "The judgment decided a rollback of SpeculativeDeployment prod/llama (InterTokenLatencyRegressed) "
                   "but may not act: spec.analysis.mode is Observe, or the specdeploy.io/paused annotation is set. "
                   "status.analysis.message says what it would have done (kubectl describe sd -n prod llama). If you "
                   "agree, set spec.analysis.mode: Act (or `specdeploy resume`) and it rolls back at the next failing "
                   "sample."}
FAILING = {
    "summary": "Speculation of prod/llama has been Failing for 10m",
    "description": "Every analysis sample of SpeculativeDeployment prod/llama for 10m judged speculation Failing, and "
                   "it still runs. With observe=\"true\" the judgment may not act (Observe mode or paused): decide "
                   "whether to let it (spec.analysis.mode: Act, `specdeploy resume`). Otherwise the failures are not "
                   "consecutive enough for spec.analysis.failureLimit, or the rollback is not getting through: read "
                   "status.analysis.message and the operator's log (kubectl describe sd -n prod llama)."}
BELOW_FLOOR = {
    "summary": "Draft acceptance of prod/llama is 8%, below the operator's floor",
    "description": "The share of drafted tokens the target accepts has stayed below the acceptance floor the operator "
                   "holds SpeculativeDeployment prod/llama to (specdeploy_acceptance_floor: minAcceptanceRate, or the "
                   "cost model's break-even under Auto) for 15m: below it the drafts cost more than they save. The "
                   "workload may have changed, or the draft does not match the target: run `specdeploy probe llama -n "
                   "prod` to see acceptance by workload and temperature, and lower k or change the draft (kubectl "
                   "describe sd -n prod llama)."}
INCONCLUSIVE = {
    "summary": "The operator has not been able to judge prod/llama for 30m",
    "description": "Every analysis sample of SpeculativeDeployment prod/llama for 30m was Inconclusive: speculation "
                   "runs unjudged and would not be rolled back if it hurt. status.analysis.verdictReason says why "
                   "(kubectl describe sd -n prod llama): NoData or Prometheus* — the engine pods are not scraped or "
                   "Prometheus is unreachable; TooFewRequests — too little traffic for spec.analysis.window; "
                   "NotEnoughEvidence — the latency interval is too wide to decide (a longer window)."}
OPERATOR_DOWN = {
    "summary": "The specdeploy operator is down",
    "description": "Prometheus has not scraped the operator (job sd-specdeploy-metrics) for 5m: nothing reconciles "
                   "SpeculativeDeployments or rolls speculation back. Look at its pods: kubectl get pods -n "
                   "specdeploy-system -l app.kubernetes.io/name=specdeploy, and their logs."}


def _fires(at: str, alert: str, *expected: tuple[dict[str, str], dict[str, str]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations} for labels, annotations in expected]}


def _llama(severity: str, **labels: str) -> dict[str, str]:
    return {"severity": severity, "namespace": "prod", "name": "llama", **labels}


PROMTOOL_TESTS: list[dict[str, Any]] = [
    # A first rollback: the counter appears at 1, increase() alone would never see it; a second one 30 m on.
    {"interval": "1m",
     "input_series": [_series("specdeploy_rollbacks_total", "_x5 1x30 2x30", namespace="prod", name="llama",
                              reason="AcceptanceBelowMinimum")],
     "alert_rule_test": [
         _fires("4m", "SpeculationRolledBack"),
         *(_fires(at, "SpeculationRolledBack", (_llama("warning", reason="AcceptanceBelowMinimum", observe="false"),
                                                ROLLED_BACK)) for at in ("6m", "40m")),
         _fires("30m", "SpeculationRolledBack")]},
    # Observe: the judgment would have rolled back; the alert says so with observe="true".
    {"interval": "1m",
     "input_series": [_series("specdeploy_would_rollbacks_total", "_x5 1 2 3 4x30", namespace="prod", name="llama",
                              reason="InterTokenLatencyRegressed")],
     "alert_rule_test": [
         _fires("4m", "SpeculationWouldRollBack"),
         _fires("8m", "SpeculationWouldRollBack", (_llama("info", reason="InterTokenLatencyRegressed", observe="true"),
                                                   WOULD_ROLL_BACK)),
         _fires("30m", "SpeculationWouldRollBack")]},
    # Failing for 10 minutes while speculation runs (under Observe: nothing acts), its reason changing on the way;
    # qwen fails as long but was rolled back; mistral turns Healthy after 8 minutes of failing.
    {"interval": "1m",
     "input_series": [
         _verdict("llama", "Failing", "InterTokenLatencyRegressed", "true", "1x5 stale"),
         _verdict("llama", "Failing", "SlowerBelowAcceptanceFloor", "true", "_x6 1x30"),
         _series("specdeploy_speculation_active", "1x40", namespace="prod", name="llama"),
         _verdict("qwen", "Failing", "AcceptanceBelowMinimum", "false", "1x40"),
         _series("specdeploy_speculation_active", "1x2 0x40", namespace="prod", name="qwen"),
         _verdict("mistral", "Failing", "AcceptanceBelowMinimum", "false", "1x8 stale"),
         _verdict("mistral", "Healthy", "", "false", "_x9 1x30"),
         _series("specdeploy_speculation_active", "1x40", namespace="prod", name="mistral")],
     "alert_rule_test": [
         _fires("9m", "SpeculationFailing"),
         _fires("12m", "SpeculationFailing", (_llama("warning", observe="true"), FAILING))]},
    # The case: acceptance 0.3 against the EAGLE-3 SD's floor 0.11 is healthy (a fixed 0.5 paged on it);
    # below the floor for 15 minutes fires, with the verdict's observe label; mistral's is as low, rolled back.
    {"interval": "1m",
     "input_series": [
         _series("specdeploy_acceptance_rate", "0.3x10 0.08x30", namespace="prod", name="llama"),
         _series("specdeploy_acceptance_floor", "0.11x40", namespace="prod", name="llama"),
         _verdict("llama", "Healthy", "", "false", "1x10 stale"),
         _verdict("llama", "Failing", "AcceptanceBelowMinimum", "false", "_x11 1x30"),
         _series("specdeploy_speculation_active", "1x40", namespace="prod", name="llama"),
         _series("specdeploy_acceptance_rate", "0.3x40", namespace="prod", name="qwen"),
         _series("specdeploy_acceptance_floor", "0.11x40", namespace="prod", name="qwen"),
         _verdict("qwen", "Healthy", "", "false", "1x40"),
         _series("specdeploy_speculation_active", "1x40", namespace="prod", name="qwen"),
         _series("specdeploy_acceptance_rate", "0.02x40", namespace="prod", name="mistral"),
         _series("specdeploy_acceptance_floor", "0.11x40", namespace="prod", name="mistral"),
         _verdict("mistral", "Failing", "AcceptanceBelowMinimum", "false", "1x40"),
         _series("specdeploy_speculation_active", "1x3 0x40", namespace="prod", name="mistral")],
     "alert_rule_test": [
         _fires("20m", "AcceptanceBelowFloor"),
         _fires("27m", "AcceptanceBelowFloor", (_llama("warning", observe="false"), BELOW_FLOOR))]},
    # Unjudged for 30 minutes while speculating fires; qwen is as long Inconclusive but rolled back (nothing to
    # judge), mistral judges Healthy in between.
    {"interval": "1m",
     "input_series": [
         _verdict("llama", "Inconclusive", "TooFewRequests", "false", "1x10 stale"),
         _verdict("llama", "Inconclusive", "NotEnoughEvidence", "false", "_x11 1x30"),
         _series("specdeploy_speculation_active", "1x40", namespace="prod", name="llama"),
         _verdict("qwen", "Inconclusive", "NotDrafting", "false", "1x40"),
         _series("specdeploy_speculation_active", "0x40", namespace="prod", name="qwen"),
         _verdict("mistral", "Inconclusive", "NoData", "false", "1x20 stale"),
         _verdict("mistral", "Healthy", "", "false", "_x21 1x2 stale"),
         _verdict("mistral", "Inconclusive", "NoData", "false", "_x24 1x20"),
         _series("specdeploy_speculation_active", "1x40", namespace="prod", name="mistral")],
     "alert_rule_test": [
         _fires("25m", "SpeculationInconclusive"),
         _fires("32m", "SpeculationInconclusive", (_llama("warning", observe="false"), INCONCLUSIVE))]},
    {"interval": "1m",
     "input_series": [{"series": 'up{job="sd-specdeploy-metrics", namespace="specdeploy-system", instance="10.0.0.1:8081"}',
                       "values": "1x10 0x20"}],
     "alert_rule_test": [
         _fires("10m", "OperatorDown"),
         _fires("20m", "OperatorDown", ({"severity": "critical", "job": "sd-specdeploy-metrics"}, OPERATOR_DOWN))]},
    # No scrape job at all: absent() fires too.
    {"interval": "1m", "input_series": [],
     "alert_rule_test": [_fires("6m", "OperatorDown",
                                ({"severity": "critical", "job": "sd-specdeploy-metrics"}, OPERATOR_DOWN))]},
]


def test_every_alert_is_tested_firing_and_not() -> None:
    tested: dict[str, set[bool]] = {}
    for case in PROMTOOL_TESTS:
        for check in case["alert_rule_test"]:
            tested.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    assert tested == {alert: {True, False} for alert in ALERTS}


def test_alerts_fire_as_promtool_evaluates_them(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": _rule_groups()}))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": PROMTOOL_TESTS}, width=1000))
    checked = subprocess.run([_promtool(), "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([_promtool(), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_removed_alerts_values_are_accepted_and_ignored() -> None:
    """A release upgraded with the old AcceptanceLow / SpeculativeP99Regression settings still upgrades (the schema
    accepts the keys) and gets only the judgment's alerts; NOTES.txt says they are ignored."""
    sets = ("prometheusRule.acceptanceLow.threshold=0.5", "prometheusRule.speculativeP99Regression.ratio=1.2")
    alerts = [rule["alert"] for group in _rule_groups(*sets) for rule in group["rules"]]
    assert alerts == ALERTS
    notes = Path(__file__).parents[2] / "charts/specdeploy/templates/NOTES.txt"
    assert "prometheusRule.acceptanceLow" in notes.read_text()
