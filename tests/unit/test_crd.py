"""The CRD is generated from the models: committed copy, structure and rules."""

from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.crd import crd, crd_yaml
from specdeploy.api.resource import InvalidResource, parse_resource

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "specdeploy.io_speculativedeployments.yaml"


def test_committed_crd_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == crd_yaml(), "run `specdeploy crd > crds/specdeploy.io_speculativedeployments.yaml`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found += _walk(value, f"{path}.{key}")
        if "items" in node:
            found += _walk(node["items"], f"{path}[]")
        if "additionalProperties" in node:
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


def _root() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural() -> None:
    for path, node in _walk(_root()):
        assert "$ref" not in node, path
        # a typed map (its values' schema), never beside properties and never a bare true/false
        assert isinstance(node.get("additionalProperties", {}), dict), path
        assert not ("additionalProperties" in node and "properties" in node), path
        assert "title" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            continue
        assert "type" in node, f"{path} has no type"
        assert "anyOf" not in node, path
        assert node.get("default", 0) is not None, path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), path


def test_names_columns_and_subresource() -> None:
    version = crd()["spec"]["versions"][0]
    assert crd()["spec"]["names"]["shortNames"] == ["sd"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Ready", "Method", "Speculating", "Acceptance", "Speedup", "TPOT", "Fits", "Age"]
    by_name = {column["name"]: column for column in version["additionalPrinterColumns"]}
    assert by_name["Speedup"]["jsonPath"] == ".status.analysis.speedup.value"
    assert (by_name["TPOT"]["jsonPath"], by_name["TPOT"]["type"]) == (".status.analysis.perTokenLatency", "string")
    assert by_name["TPOT"]["priority"] == 1, "the text column only in `kubectl get -o wide`"
    assert all("priority" not in column for name, column in by_name.items() if name != "TPOT")


def test_every_printer_column_reads_a_field_of_its_type() -> None:
    """A jsonPath that names no field prints an empty column forever; kubectl does not complain."""
    types = {"string": "string", "number": "number", "boolean": "boolean", "integer": "integer", "date": "string"}
    for column in crd()["spec"]["versions"][0]["additionalPrinterColumns"]:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            continue
        node = _root()
        for part in column["jsonPath"].removeprefix(".").split("."):
            assert part in node.get("properties", {}), (column["name"], part)
            node = node["properties"][part]
        assert node["type"] == types[column["type"]], column["name"]


def test_the_status_keeps_no_p99_inter_token_latency_in_seconds() -> None:
    """A P99 below vLLM's first bucket (10 ms) is a bound, not a number: status shows it as text."""
    analysis = _root()["properties"]["status"]["properties"]["analysis"]["properties"]
    assert "p99InterTokenLatencySeconds" not in analysis
    assert "baselineP99InterTokenLatencySeconds" not in analysis
    assert analysis["p99InterTokenLatency"]["type"] == "string"
    assert set(analysis["speedup"]["required"]) == {"value", "low", "high", "baseline", "requests",
                                                    "baselineRequests"}


def test_min_acceptance_rate_has_no_default_so_unset_means_auto() -> None:
    checks = _root()["properties"]["spec"]["properties"]["analysis"]["properties"]["checks"]["properties"]
    node = checks["minAcceptanceRate"]
    assert "default" not in node and (node["minimum"], node["maximum"]) == (0, 1)
    assert parse_resource(_document()).spec.analysis.checks.min_acceptance_rate is None
    fixed = parse_resource(_document(analysis={"checks": {"minAcceptanceRate": 0.4}}))
    assert fixed.spec.analysis.checks.min_acceptance_rate == 0.4


def test_conditions_are_a_map_list_keyed_by_type() -> None:
    conditions = _root()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_every_cel_message_names_a_field() -> None:
    rules = [rule for _, node in _walk(_root()) for rule in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 10
    for rule in rules:
        assert "`" in rule["message"] or rule["message"].startswith("must be"), rule


def _document(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "ngram"},
    }
    spec.update(spec_overrides)
    return {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
            "metadata": {"name": "x"}, "spec": spec}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"speculation": {"method": "eagle3"}}, "`spec.speculation.draft` is required"),
        ({"speculation": {"method": "mtp", "draft": {"name": "d"}}}, "`spec.speculation.draft` must not be set"),
        ({"speculation": {"method": "dflash"}}, "`spec.speculation.draft` is required"),
        ({"speculation": {"method": "ngram_gpu", "draft": {"name": "d"}}}, "`spec.speculation.draft` must not be set"),
        ({"engine": {"kind": "sglang"}, "speculation": {"method": "ngram_gpu"}},
         "`spec.speculation.method` suffix or ngram_gpu is supported by vllm only"),
        ({"engine": {"kind": "trtllm"}, "speculation": {"method": "dspark", "draft": {"name": "d"}}},
         "dflash and dspark are not supported by trtllm"),
        ({"speculation": {"method": "ngram", "numSpeculativeTokens": 17}}, "numSpeculativeTokens` must be at least 1"),
        ({"resources": {"gpuMemoryUtilization": 0}}, "gpuMemoryUtilization` must be greater than 0"),
        ({"resources": {"tensorParallelSize": 2, "gpu": {"count": 1}}}, "tensorParallelSize` must not be greater"),
        ({"replicas": 1, "analysis": {"baseline": {"mode": "Control", "controlReplicas": 2}}},
         "`spec.replicas` must be at least"),
        ({"engine": {"kind": "sglang"}, "serving": {"kvCacheMemoryGiB": 10}}, "kvCacheMemoryGiB` is a vLLM setting"),
        ({"serving": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}}, "maxNumBatchedTokens` must be at least"),
        ({"analysis": {"interval": "1m", "window": "30s"}}, "window` must not be shorter"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Table"}}}, "`spec.speculation.schedule.table` is required"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Auto", "table": [
            {"minBatch": 1, "maxBatch": 8, "k": 2}]}}}, "`spec.speculation.schedule.table` must not be set unless"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Table", "table": [
            {"minBatch": 2, "maxBatch": 8, "k": 2}]}}}, "must list its ranges in ascending order without gaps"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Table", "table": [
            {"minBatch": 1, "maxBatch": 8, "k": 2}, {"minBatch": 5, "maxBatch": 64, "k": 1}]}}},
         "must list its ranges in ascending order without gaps"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Table", "table": [
            {"minBatch": 9, "maxBatch": 64, "k": 1}, {"minBatch": 1, "maxBatch": 8, "k": 2}]}}},
         "must list its ranges in ascending order without gaps"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Table", "table": [
            {"minBatch": 8, "maxBatch": 1, "k": 2}]}}}, "minBatch` must not be greater than its `maxBatch"),
        ({"speculation": {"method": "ngram", "schedule": {"mode": "Table", "table": [
            {"minBatch": 1, "maxBatch": 8, "k": 0}]}}}, "must draft in at least one range"),
        ({"speculation": {"method": "ngram", "numSpeculativeTokens": 3, "schedule": {"mode": "Table", "table": [
            {"minBatch": 1, "maxBatch": 8, "k": 4}]}}}, "table\\[\\].k` must not be greater than"),
    ],
)
def test_python_validation_gives_the_cel_message(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidResource, match=message.replace("`", ".")):
        parse_resource(_document(**overrides))


def test_defaults_fill_a_minimal_resource() -> None:
    resource = parse_resource(_document())
    assert resource.spec.resources.gpu_memory_utilization == 0.9
    assert resource.spec.analysis.interval == 30.0
    assert resource.spec.resources.gpu_count == 1


def test_committed_configuration_reference_is_current() -> None:
    from specdeploy.api.reference import reference_markdown

    committed = ROOT / "docs" / "configuration.md"
    assert committed.read_text() == reference_markdown(), "run `specdeploy reference > docs/configuration.md`"


def test_schedule_rules_are_in_the_crd() -> None:
    speculation = _root()["properties"]["spec"]["properties"]["speculation"]
    schedule = speculation["properties"]["schedule"]
    assert schedule["properties"]["table"]["maxItems"] == 64
    assert schedule["properties"]["mode"]["enum"] == ["Fixed", "Auto", "Table"]
    assert len(schedule["x-kubernetes-validations"]) == 4
    assert any("self.schedule.table.all" in rule["rule"] for rule in speculation["x-kubernetes-validations"])


def test_a_valid_table_parses() -> None:
    table = [{"minBatch": 1, "maxBatch": 8, "k": 3}, {"minBatch": 9, "maxBatch": 64, "k": 1},
             {"minBatch": 65, "maxBatch": 256, "k": 0}]
    resource = parse_resource(_document(speculation={"method": "ngram", "schedule": {"mode": "Table", "table": table}}))
    schedule = resource.spec.speculation.schedule
    assert schedule is not None and [r.k for r in schedule.table or []] == [3, 1, 0]


# Every value an operator has written to these status fields (their writers' git history: judgment/, reconcile/status.py,
# modelsource/): they became enums, and status stored by an older operator must stay valid after an upgrade.
STORED_STATUS_VALUES = {
    "speculation.lastRollback.reason": {
        "AcceptanceBelowMinimum", "InterTokenLatencyRegressed", "E2ELatencyRegressed", "TimeToFirstTokenRegressed",
        "E2ELatencyAboveSLO", "QueueTimeRegressed", "OutputThroughputRegressed", "NoSchedulePays",
        "SlowerBelowAcceptanceFloor", "SpeculativePodOutOfMemory", "InconclusiveTooLong"},
    "speculation.calibration.lastDecision.kind": {"Changed", "Kept"},
    "speculation.calibration.lastDecision.reason": {
        "ScheduleRecalibrated", "NotAuto", "NoPositionCounts", "TooFewDrafts", "SameSchedule", "NeverPays",
        "LosesAtLoad", "GainBelowMinimum", "WithinMinimumPeriod", "NotExpressible"},
    "speculation.calibration.positions[].source": {"Measured", "Extrapolated"},
    "analysis.speedup.baseline": {"control", "Previous"},
    "analysis.diagnosis.speculative": {"Queue-bound", "Prefill-bound", "Decode-bound"},
    "analysis.diagnosis.control": {"Queue-bound", "Prefill-bound", "Decode-bound"},
    "analysis.objective": {"Latency", "Throughput", "Both"},
    "analysis.verdictReason": {
        "AcceptanceBelowMinimum", "InterTokenLatencyRegressed", "E2ELatencyRegressed", "TimeToFirstTokenRegressed",
        "E2ELatencyAboveSLO", "QueueTimeRegressed", "OutputThroughputRegressed", "NoSchedulePays",
        "SlowerBelowAcceptanceFloor", "NoData", "NotANumber", "TooFewRequests", "ControlTooFewRequests",
        "NoControlData", "NoPreviousBaseline", "LoadDiffersFromPrevious", "NotEnoughEvidence", "NotDrafting",
        "PrometheusUnavailable", "PrometheusRefused", "PrometheusBadQuery", "PrometheusBadResponse",
        "PrometheusUrlNotAllowed"},
    "deployRecord.target.source": {"Spec", "ConfigMap", "Path", "Hub", "Catalog"},
    "deployRecord.draft.source": {"Spec", "ConfigMap", "Path", "Hub", "Catalog"},
    "deployRecord.engine.kind": {"vllm", "sglang", "trtllm"},
    "probe.trigger": {"Manual", "NewGeneration", "Interval"},
    "probe.countsFrom": {"answers", "counters"},
}


def test_status_enums_admit_every_value_written_before() -> None:
    nodes = dict(_walk(_root()["properties"]["status"]))
    for path, written in STORED_STATUS_VALUES.items():
        node = nodes[f".{path}"]
        assert written <= set(node["enum"]), (path, written - set(node["enum"]))


def test_a_status_an_older_operator_wrote_still_parses() -> None:
    from specdeploy.api.status import SpeculativeDeploymentStatus

    stored = SpeculativeDeploymentStatus.model_validate({
        "speculation": {"decided": False, "lastRollback": {"at": "2026-12-04T10:00:00Z", "reason": "NoSchedulePays",
                                                           "evidence": "…"},
                        "calibration": {"lastDecision": {"kind": "Kept", "reason": "NotExpressible"}}},
        "analysis": {"speedup": {"value": 1.2, "low": 1.1, "high": 1.3, "baseline": "control", "requests": 400,
                                 "baselineRequests": 200},
                     "diagnosis": {"speculative": "Queue-bound"}, "objective": "Latency",
                     "verdictReason": "NotEnoughEvidence"},
        "deployRecord": {"target": {"source": "Hub", "name": "m"}, "engine": {"kind": "vllm", "image": "i"}},
    })
    assert stored.speculation is not None and stored.speculation.last_rollback is not None
    assert stored.speculation.last_rollback.reason == "NoSchedulePays"
