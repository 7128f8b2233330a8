"""The Argo CD health check (charts/specdeploy/argocd/health.lua), run by a real Lua 5.1 interpreter.

Argo CD runs health scripts in gopher-lua, a Lua 5.1 VM, with the live object as the global `obj`; the
script returns a table {status, message}. Here lupa's Lua 5.1 runs it in an environment holding only
`obj` and the standard functions it may use, so a script reaching for anything else fails.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

from specdeploy.api.status import Phase

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "charts" / "specdeploy" / "argocd" / "health.lua").read_text()
ARGOCD_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

_RUNNER = """
local script, obj = ...
local chunk = assert(loadstring(script, "health.lua"))
setfenv(chunk, {obj = obj, ipairs = ipairs, pairs = pairs, tostring = tostring, type = type,
                string = string, table = table, math = math})
local hs = chunk()
return hs.status, hs.message
"""


def _lua_value(runtime: Any, value: Any) -> Any:
    """JSON as Argo CD hands it to Lua: objects and arrays become tables, null becomes absent."""
    if isinstance(value, dict):
        return runtime.table_from({k: _lua_value(runtime, v) for k, v in value.items() if v is not None})
    if isinstance(value, list):
        return runtime.table_from([_lua_value(runtime, v) for v in value])
    return value


def health(sd: dict[str, Any]) -> tuple[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    status, message = runtime.execute(_RUNNER, SCRIPT, _lua_value(runtime, sd))
    return str(status), str(message)


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 4}


READY = condition("Ready", "True", "Available", "every wanted Deployment is available")
NOT_READY = condition("Ready", "False", "Progressing", "llama: 1 of 2 replicas available")


def sd(phase: str | None, *conditions: dict[str, Any], generation: int = 4, observed: int | None = 4) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": observed, "phase": phase, "conditions": list(conditions)}
    return {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
            "metadata": {"name": "llama", "namespace": "prod", "generation": generation}, "status": status}


def test_speculating_is_healthy() -> None:
    text = ("acceptance rate 0.72 (floor 0.11); per-token latency −40% (95% interval −41%…−39%) vs the control "
            "over 5m (1,234 requests; control 617)")
    healthy = condition("SpeculationHealthy", "True", "Healthy", text)
    assert health(sd("Speculating", READY, healthy)) == ("Healthy", "Healthy: " + text)


def test_rolled_back_is_degraded_with_the_evidence() -> None:
    rolled = condition("RolledBack", "True", "AcceptanceBelowMinimum",
                       "3 consecutive failing samples (failureLimit 3); the last: acceptance rate 0.31 < "
                       "minAcceptanceRate 0.50 (Fixed: minAcceptanceRate 0.50)")
    status, message = health(sd("RolledBack", READY, rolled))
    assert status == "Degraded"
    assert message == ("Speculation rolled back: AcceptanceBelowMinimum: 3 consecutive failing samples (failureLimit 3); "
                       "the last: acceptance rate 0.31 < minAcceptanceRate 0.50 (Fixed: minAcceptanceRate 0.50)")


# The evidence of a latency rollback as judgment/verdict.py writes it: "…", "−", "≈" are not ASCII.
LATENCY_EVIDENCE = ("3 consecutive failing samples (failureLimit 3); the last: per-token latency +18% (95% interval "
                    "+9%…+27%) vs the control, above maxPerTokenLatencyRatio 1.10; mean 5.9 ms vs 5 ms, "
                    "P99 < 10 ms vs < 10 ms; 412 vs 198 requests in 10 slices over 5m (412 requests; control 198)")


def test_a_latency_rollback_keeps_its_evidence_byte_for_byte() -> None:
    rolled = condition("RolledBack", "True", "InterTokenLatencyRegressed", LATENCY_EVIDENCE)
    assert health(sd("RolledBack", READY, rolled)) == (
        "Degraded", "Speculation rolled back: InterTokenLatencyRegressed: " + LATENCY_EVIDENCE)


@pytest.mark.parametrize(("reason", "message"), [
    ("NotEnoughEvidence", "per-token latency +9.5% (95% interval +8%…+11%) vs the control: the interval holds "
                          "maxPerTokenLatencyRatio 1.10; about 4,321 requests per variant would tell"),
    ("NotDrafting", "not drafting now: the draft counters did not move in the window (the engine drafts nothing "
                    "at this batch size); per-token latency −0.5% (95% interval −1%…+1%) vs the control"),
])
def test_an_undecided_sample_is_measuring_and_healthy_with_why(reason: str, message: str) -> None:
    """Too little evidence and an engine that drafts nothing are no failure: the pods serve, Argo CD stays green."""
    waiting = condition("SpeculationHealthy", "Unknown", reason, message)
    assert health(sd("Measuring", READY, waiting)) == ("Healthy", f"Measuring: {reason}: {message}")


def test_rejected_is_degraded_with_the_first_failing_condition() -> None:
    fits = condition("MemoryFits", "False", "WeightsDoNotFit", "weights need 70.6 GiB per GPU, the budget is 72.0 GiB")
    compatible = condition("Compatible", "True", "Compatible")
    rejected = condition("Ready", "False", "Rejected", "nothing runs")
    assert health(sd("Rejected", fits, compatible, rejected)) == (
        "Degraded", "Rejected: WeightsDoNotFit: weights need 70.6 GiB per GPU, the budget is 72.0 GiB")
    incompatible = condition("Compatible", "False", "DraftVocabularyMismatch", "the draft's vocabulary differs")
    assert health(sd("Rejected", condition("MemoryFits", "True", "Fits"), incompatible, rejected)) == (
        "Degraded", "Rejected: DraftVocabularyMismatch: the draft's vocabulary differs")


def test_deploying_is_progressing_with_the_rollout() -> None:
    assert health(sd("Deploying", NOT_READY)) == ("Progressing", "Progressing: llama: 1 of 2 replicas available")


@pytest.mark.parametrize(("phase", "conditions", "expected"), [
    ("Serving", [READY], "Healthy"),
    ("Measuring", [READY], "Healthy"),
    ("Measuring", [NOT_READY], "Progressing"),
    ("Measuring", [], "Progressing"),
    ("Pending", [], "Progressing"),
    (None, [], "Progressing"),
    ("Degraded", [condition("Ready", "False", "Unavailable", "0 of 2 replicas available")], "Degraded"),
    ("SomethingNew", [READY], "Unknown"),
])
def test_every_phase(phase: str | None, conditions: list[dict[str, Any]], expected: str) -> None:
    assert health(sd(phase, *conditions))[0] == expected


def test_measuring_says_what_it_waits_for() -> None:
    waiting = condition("SpeculationHealthy", "Unknown", "NotMeasured", "no sample yet")
    assert health(sd("Measuring", READY, waiting)) == ("Healthy", "Measuring: NotMeasured: no sample yet")


@pytest.mark.parametrize("phase", ["Speculating", "RolledBack", "Rejected", "Degraded"])
def test_a_status_behind_the_spec_is_progressing_whatever_its_phase(phase: str) -> None:
    status, message = health(sd(phase, READY, generation=5, observed=4))
    assert (status, message) == ("Progressing", "Waiting for the operator to observe generation 5 (status describes 4)")
    assert health(sd(phase, READY, generation=5, observed=None)) == (
        "Progressing", "Waiting for the operator to observe generation 5 (status describes none)")


def test_an_sd_without_status_waits_for_the_operator() -> None:
    resource = sd("Speculating")
    del resource["status"]
    assert health(resource) == ("Progressing", "Waiting for the specdeploy operator to reconcile this SpeculativeDeployment")


def test_every_phase_the_operator_writes_maps_to_an_argocd_status_other_than_unknown() -> None:
    for phase in Phase:
        status, message = health(sd(phase.value, READY))
        assert status in ARGOCD_STATUSES - {"Unknown"}, phase
        assert message, phase


def test_docs_embed_the_script_as_it_is() -> None:
    text = (REPO / "docs" / "gitops.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    configs = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "ConfigMap"
               and b["metadata"]["name"] == "argocd-cm"]
    assert configs, "docs/gitops.md has no argocd-cm ConfigMap"
    embedded = configs[0]["data"]["resource.customizations.health.specdeploy.io_SpeculativeDeployment"]
    assert embedded == SCRIPT, "copy charts/specdeploy/argocd/health.lua into docs/gitops.md"
