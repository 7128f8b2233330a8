"""The analysis loop's pure decisions: which SDs are due for a sample, from the objects as the watch delivered them."""

from __future__ import annotations

import ast
import asyncio
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from lightkube import ALL_NS

from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.controller import analysis_loop, logs
from specdeploy.controller.analysis_loop import Source, _validated_due, due
from specdeploy.controller.logs import WATCH_HANDLERS, QuietWatchHandlers
from specdeploy.controller.metrics import OperatorMetrics
from specdeploy.controller.watched import SD, Watched
from specdeploy.judgment.samples import DeploymentSample, QueryErrorKind

NOW = datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC).timestamp()
PROMETHEUS = "http://prometheus.monitoring:9090"


def _listed(interval: str, last_sample_at: str | None) -> dict[str, object]:
    """An SD as the apiserver lists it: the CRD's defaults filled in, status as the operator wrote it."""
    status = {"analysis": {"lastSampleAt": last_sample_at}} if last_sample_at else {}
    return {"spec": {"analysis": {"interval": interval}}, "status": status}


def test_an_sd_is_due_once_its_interval_has_passed_or_when_never_sampled() -> None:
    assert due(_listed("30s", None), NOW)
    assert due({"spec": {}}, NOW)                                        # no status at all yet
    assert due(_listed("30s", "2026-11-29T12:00:00Z"), NOW)             # 30 s ago
    assert not due(_listed("1m", "2026-11-29T12:00:00Z"), NOW)
    assert due(_listed("3s", "2026-11-29T12:00:27Z"), NOW)              # half a second of slack for the tick
    assert not due(_listed("3s", "2026-11-29T12:00:28Z"), NOW)


# A status as the operator wrote it before the per-token comparison: P99s in seconds, a Previous baseline
# without the load it was taken at nor any means.
BEFORE_THE_COMPARISON = {
    "analysis": {
        "lastSampleAt": "2026-11-29T11:59:00Z", "acceptanceRate": 0.71, "p99InterTokenLatencySeconds": 0.031,
        "baselineP99InterTokenLatencySeconds": 0.029, "verdict": "Healthy", "consecutiveFailures": 0,
        "previousBaseline": {"takenAt": "2026-11-29T09:00:00Z", "requestsPerSecond": 3.0,
                             "p99InterTokenLatencySeconds": 0.025},
    },
}


def test_an_sd_with_a_status_from_before_the_comparison_is_due_and_still_validates() -> None:
    """After an upgrade the loop must go on sampling such SDs: the removed fields are ignored, not refused."""
    body = {
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": "llama", "namespace": "prod"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "speculation": {"method": "ngram"},
                 "analysis": {"interval": "30s", "baseline": {"mode": "Previous", "controlReplicas": 0}}},
        "status": BEFORE_THE_COMPARISON,
    }
    assert due(body, NOW)
    resource = SpeculativeDeployment.model_validate(body)
    assert resource.status is not None and resource.status.analysis is not None
    analysis = resource.status.analysis
    assert (analysis.acceptance_rate, analysis.verdict, analysis.speedup) == (0.71, "Healthy", None)
    assert "p99InterTokenLatencySeconds" not in resource.status.to_wire()["analysis"]
    snapshot = analysis.previous_baseline
    assert snapshot is not None and snapshot.p99_inter_token_latency_seconds == 0.025
    assert snapshot.running_per_pod is None and snapshot.inter_token_latency is None
    assert not due({**body, "status": {"analysis": {"lastSampleAt": "2026-11-29T12:00:20Z"}}}, NOW)


def _sd(namespace: str, name: str, last_sample_at: str | None = None) -> dict[str, object]:
    status = {"analysis": {"lastSampleAt": last_sample_at}} if last_sample_at else {}
    return {"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "speculation": {"method": "ngram"},
                     "analysis": {"interval": "30s"}}, "status": status}


def test_the_loop_reads_the_sds_as_the_watch_last_delivered_them() -> None:
    """No list per tick: the watch's latest body of each SD says whether it is due; a deleted SD is gone."""
    known = Watched()
    known.seen(SD, _sd("prod", "a"))
    known.seen(SD, _sd("prod", "b", "2026-11-29T12:00:20Z"))              # sampled 10 s ago
    known.seen(SD, _sd("dev", "c"))
    assert [r.metadata.name for r in _validated_due(known, ["prod"], NOW, PROMETHEUS)] == ["a"]
    known.seen(SD, _sd("prod", "a", "2026-11-29T12:00:25Z"))              # its status write, seen by the watch
    known.seen(SD, _sd("prod", "b", "2026-11-29T11:59:50Z"))
    assert [r.metadata.name for r in _validated_due(known, ["prod"], NOW, PROMETHEUS)] == ["b"]
    known.gone(SD, "prod", "b")
    assert _validated_due(known, ["prod"], NOW, PROMETHEUS) == []
    # A sample's status held unwritten (only its time changed) says when it was sampled, not the object.
    a = _sd("prod", "a", "2026-11-29T11:59:50Z") | {"metadata": {"name": "a", "namespace": "prod", "resourceVersion": "7"}}
    known.seen(SD, a)
    assert [r.metadata.name for r in _validated_due(known, ["prod"], NOW, PROMETHEUS)] == ["a"]
    known.hold("prod", "a", "7", {"analysis": {"lastSampleAt": "2026-11-29T12:00:25Z"}})
    assert _validated_due(known, ["prod"], NOW, PROMETHEUS) == []
    assert sorted(r.metadata.name for r in _validated_due(known, [ALL_NS], NOW, PROMETHEUS)) == ["c"]


def test_without_a_prometheus_url_only_an_sd_naming_its_own_is_due() -> None:
    known = Watched()
    known.seen(SD, _sd("prod", "a"))
    own = _sd("prod", "b")
    own["spec"]["analysis"]["prometheus"] = {"url": PROMETHEUS}   # type: ignore[index]
    known.seen(SD, own)
    assert [r.metadata.name for r in _validated_due(known, ["prod"], NOW, None)] == ["b"]


def test_an_sd_that_does_not_validate_is_skipped_and_the_others_are_sampled(caplog: pytest.LogCaptureFixture) -> None:
    broken = _sd("prod", "broken")
    broken["spec"] = {"speculation": {"method": "ngram"}}                # no model
    known = Watched()
    known.seen(SD, broken)
    known.seen(SD, _sd("prod", "fine"))
    with caplog.at_level(logging.WARNING):
        due_now = _validated_due(known, ["prod"], NOW, PROMETHEUS)
    assert [r.metadata.name for r in due_now] == ["fine"]
    assert "skipping broken in analysis" in caplog.text


def test_kopfs_success_line_for_a_watch_handler_is_dropped_and_failures_are_kept() -> None:
    quiet = QuietWatchHandlers()

    def record(level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)

    assert not quiet.filter(record(logging.INFO, "Handler 'sd_seen' succeeded."))
    assert not quiet.filter(record(logging.INFO, "Handler 'child_changed' succeeded."))
    assert quiet.filter(record(logging.INFO, "Handler 'reconcile' succeeded."))
    assert quiet.filter(record(logging.ERROR, "Handler 'sd_seen' failed with an exception. Will retry."))


def test_the_quiet_handlers_are_exactly_the_watch_event_handlers() -> None:
    """WATCH_HANDLERS names handlers.py's `@kopf.on.event` functions, read from its source (importing it
    would register the handlers with kopf in this test session)."""
    tree = ast.parse((Path(logs.__file__).with_name("handlers.py")).read_text())
    event_handlers = {
        node.name for node in ast.walk(tree) if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
        and any(isinstance(d, ast.Call) and ast.unparse(d.func) == "kopf.on.event" for d in node.decorator_list)
    }
    assert event_handlers == set(WATCH_HANDLERS)


class _Recording:
    """A Reconciler as the analysis loop uses it: the watched SDs, metrics, and reconcile() recording each sample."""

    def __init__(self, watched: Watched) -> None:
        self.watched, self.client, self.metrics = watched, None, OperatorMetrics()
        self.samples: dict[str, tuple[float, DeploymentSample]] = {}
        self.started = time.monotonic()

    async def reconcile(self, namespace: str, name: str, trigger: object, sample: DeploymentSample) -> None:
        self.samples[name] = (time.monotonic() - self.started, sample)


EMPTY = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'


def test_a_silent_prometheus_makes_only_its_own_sds_inconclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two namespaces, two Prometheus URLs; one accepts and never answers. The other's SD has its sample at once,
    the silent one's SD gets PrometheusUnavailable (with the time) at the end of its share of the cycle."""
    monkeypatch.setattr(analysis_loop, "SOURCE_SHARE_SECONDS", 3.0)   # room for the answering source on a busy CPU
    urls: dict[str, str] = {}

    async def go() -> _Recording:
        stop = asyncio.Event()
        handlers: list[asyncio.Task[None]] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bool) -> None:
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            try:
                while not stop.is_set():
                    await reader.readuntil(b"\r\n\r\n")
                    if not answer:
                        await stop.wait()
                        break
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(EMPTY), EMPTY))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        servers = {namespace: await asyncio.start_server(
            lambda r, w, answer=answer: serve(r, w, answer), "127.0.0.1", 0)  # type: ignore[misc]
            for namespace, answer in (("team-a", False), ("team-b", True))}
        known = Watched()
        for namespace, server in servers.items():
            urls[namespace] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            body = _sd(namespace, namespace)
            body["spec"]["analysis"]["prometheus"] = {"url": urls[namespace]}  # type: ignore[index]
            known.seen(SD, body)
        reconciler = _Recording(known)
        try:
            sampled = await asyncio.wait_for(analysis_loop.analyse_once(reconciler, [ALL_NS], None), 10)  # type: ignore[arg-type]
            assert sampled == 2
        finally:
            stop.set()
            for server in servers.values():
                server.close()
            await asyncio.gather(*handlers, return_exceptions=True)
        return reconciler

    reconciler = asyncio.run(go())
    answered_at, answered = reconciler.samples["team-b"]
    silent_at, silent = reconciler.samples["team-a"]
    assert answered.errors == {} and answered_at < silent_at, "not held up by the silent source"
    assert silent_at >= 3.0
    assert {error.kind for error in silent.errors.values()} == {QueryErrorKind.UNAVAILABLE}
    messages = [error.message for error in silent.errors.values()]
    assert all("did not answer within its share of the analysis cycle (gave up after " in message
               for message in messages), messages
    metric = reconciler.metrics.value
    assert metric("specdeploy_prometheus_source_failures_total", source=urls["team-a"], kind="Unavailable") \
        == len(silent.errors)
    assert metric("specdeploy_prometheus_source_failures_total", source=urls["team-b"], kind="Unavailable") is None
    assert (metric("specdeploy_prometheus_source_bytes_total", source=urls["team-b"]) or 0) >= len(EMPTY)
    assert metric("specdeploy_prometheus_source_seconds_count", source=urls["team-a"]) == 1


def test_a_source_is_named_without_the_credentials_its_url_may_carry() -> None:
    assert Source("https://user:pa55@prom.example:9090/p?token=t#x", "", None).label == "https://prom.example:9090/p"
    assert Source("http://p:9090", "team-a", "auth").label == "http://p:9090 (Secret team-a/auth)"
    assert Source("http://p:9090", "", None, Path("/h")).label == "http://p:9090 (operator's headers)"
