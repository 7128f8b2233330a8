"""judgment/prometheus against prepared Prometheus HTTP API answers (httpx.MockTransport): a vector, an empty
result, NaN, errors by status code, timeouts, malformed bodies; and query_all's grouping per SD and variant."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from specdeploy.api.spec import EngineKind
from specdeploy.clients.prometheus import (
    PrometheusBadQuery,
    PrometheusBadResponse,
    PrometheusClient,
    PrometheusError,
    PrometheusRefused,
    PrometheusUnavailable,
    Sample,
    query_all,
)
from specdeploy.judgment.queries import queries_for
from specdeploy.judgment.samples import (
    PositionCounts,
    QueryErrorKind,
    QueryGroup,
    SeriesKey,
    Signal,
    SignalValues,
)

BASE = "http://prometheus.test:9090"
TOKEN = "Bearer s3cr3t-token"
Handler = Callable[[httpx.Request], httpx.Response]


def vector(*series: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": m, "value": [1767225600.0, v]} for m, v in series]}}


def matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": m, "values": [[t, v] for t, v in points]}
                                                     for m, points in series]}}


def sd(namespace: str, name: str, variant: str, **more: str) -> dict[str, str]:
    return {"namespace": namespace, "specdeploy_io_name": name, "specdeploy_io_variant": variant, **more}


def query_once(handler: Handler, promql: str = "up", **client: Any) -> list[Sample]:
    async def go() -> list[Sample]:
        async with PrometheusClient(BASE, transport=httpx.MockTransport(handler), **client) as prometheus:
            return await prometheus.query(promql)
    return asyncio.run(go())


def answer(status: int, body: Any = None, text: str | None = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)
    return handler


def raising(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc
    return handler


# -- query ----------------------------------------------------------------------------------------

def test_a_vector() -> None:
    samples = query_once(answer(200, vector((sd("prod", "llama", "speculative"), "0.71"),
                                            (sd("prod", "llama", "control"), "0"))))
    assert samples == [Sample(sd("prod", "llama", "speculative"), 0.71), Sample(sd("prod", "llama", "control"), 0.0)]


def test_an_empty_result() -> None:
    assert query_once(answer(200, vector())) == []


T = 1767225300.0


def test_a_matrix_becomes_points_in_time_order_with_the_last_as_the_value() -> None:
    """A subquery (`…[330s:30s]`) sent as an instant query answers a range vector."""
    samples = query_once(answer(200, matrix(
        (sd("prod", "llama", "speculative"), [(T, "10"), (T + 30, "12.5"), (T + 60, "NaN")]),
        (sd("prod", "llama", "control"), [(T, "4")]),
    )))
    [spec, control] = samples
    assert spec.labels == sd("prod", "llama", "speculative")
    assert spec.points[:2] == ((T, 10.0), (T + 30, 12.5))
    assert spec.points[2][0] == T + 60 and math.isnan(spec.points[2][1]) and math.isnan(spec.value)
    assert control == Sample(sd("prod", "llama", "control"), 4.0, ((T, 4.0),))
    assert query_once(answer(200, matrix())) == []


def test_a_vector_has_no_points() -> None:
    [sample] = query_once(answer(200, vector((sd("prod", "llama", "speculative"), "0.5"))))
    assert sample.points == ()


@pytest.mark.parametrize("item", [
    {"metric": {}},                                   # no values
    {"values": [[T, "1"]]},                           # no metric
    {"metric": {}, "values": []},
    {"metric": {}, "values": "1,2"},
    {"metric": [], "values": [[T, "1"]]},
    {"metric": {}, "values": [[T, 1.0]]},             # a number, not its text
    {"metric": {}, "values": [[T, "many"]]},
    {"metric": {}, "values": [[T]]},
    {"metric": {}, "values": [[T, "1", "2"]]},
    {"metric": {}, "values": [["soon", "1"]]},
    {"metric": {}, "value": [T, "1"]},                # a vector's element in a matrix
])
def test_a_malformed_matrix_is_a_bad_response_naming_the_element_not_repeating_it(item: Any) -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": [item]}}
    with pytest.raises(PrometheusBadResponse, match=r'expected \{metric: \{…\}, values: \[\[time, "number"\]') as caught:
        query_once(answer(200, body))
    assert str(caught.value).endswith("series 0 is not")


def test_a_matrix_whose_result_is_not_a_list_is_a_bad_response() -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": {"metric": {}, "values": [[T, "1"]]}}}
    with pytest.raises(PrometheusBadResponse, match="expected an instant or range vector .* resultType 'matrix'"):
        query_once(answer(200, body))


@pytest.mark.parametrize(("text", "check"), [
    ("NaN", math.isnan), ("+Inf", lambda v: v == math.inf), ("-Inf", lambda v: v == -math.inf),
])
def test_nan_and_inf_are_kept(text: str, check: Callable[[float], bool]) -> None:
    [sample] = query_once(answer(200, vector((sd("prod", "llama", "speculative"), text))))
    assert check(sample.value)


def test_the_request_is_a_form_post_with_a_timeout_and_the_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=vector())

    async def go() -> None:
        async with PrometheusClient(BASE + "/prom/", headers={"Authorization": TOKEN},
                                    transport=httpx.MockTransport(handler), timeout=2.5) as prometheus:
            await prometheus.query("sum(up)", at=1767225600.5)
    asyncio.run(go())
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", BASE + "/prom/api/v1/query")
    assert request.headers["authorization"] == TOKEN
    assert parse_qs(request.content.decode()) == {"query": ["sum(up)"], "timeout": ["2500ms"],
                                                  "time": ["1767225600.500"]}


@pytest.mark.parametrize(("handler", "error", "text"), [
    (answer(500, text="internal error"), PrometheusUnavailable, "HTTP 500"),
    (answer(503, {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}),
     PrometheusUnavailable, "HTTP 503, errorType timeout"),
    (answer(429, text="too many requests"), PrometheusUnavailable, "HTTP 429"),
    (answer(400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected \"}\""}),
     PrometheusBadQuery, r"rejected the query \(HTTP 400, errorType bad_data\)$"),
    (answer(422, {"status": "error", "errorType": "execution", "error": "vector cannot contain metrics with the "
                                                                      "same labelset"}),
     PrometheusBadQuery, "HTTP 422, errorType execution"),
    (answer(401, text="Unauthorized"), PrometheusRefused, "headersSecretRef"),
    (answer(404, text="404 page not found"), PrometheusRefused, r"spec.analysis.prometheus.url"),
    (answer(200, text="<html>login</html>"), PrometheusBadResponse, "expected JSON"),
    (answer(200, {"status": "error", "errorType": "internal", "error": "boom"}), PrometheusBadResponse,
     "expected status 'success' from http://prometheus.test:9090, errorType internal$"),
    (answer(200, {"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}),
     PrometheusBadResponse, "resultType 'scalar'"),
    (answer(200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}),
     PrometheusBadResponse, "value: .* series 0 is not"),
    (answer(200, {"status": "success", "data": {"resultType": "vector",
                                                "result": [{"metric": {}, "value": [1, "many"]}]}}),
     PrometheusBadResponse, "series 0 is not"),
    (raising(httpx.ConnectError("[Errno 111] Connection refused")), PrometheusUnavailable, "ConnectError"),
    (raising(httpx.ReadTimeout("timed out")), PrometheusUnavailable, r"did not answer within 10s \(gave up after"),
    (raising(httpx.ConnectTimeout("timed out")), PrometheusUnavailable, "did not answer within 10s"),
])
def test_errors_are_translated(handler: Handler, error: type[PrometheusError], text: str) -> None:
    with pytest.raises(error, match=text) as caught:
        query_once(handler, headers={"Authorization": TOKEN})
    assert TOKEN not in str(caught.value)


def test_a_silent_prometheus_times_out() -> None:
    """A real timeout: a loopback server accepts the connection and never answers."""
    async def go() -> None:
        stop = asyncio.Event()
        handlers: list[asyncio.Task[None]] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            await reader.read(65536)
            await stop.wait()
            writer.close()
            await writer.wait_closed()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with PrometheusClient(f"http://127.0.0.1:{port}", timeout=0.2) as prometheus:
                await prometheus.query("up")
        finally:
            stop.set()
            server.close()
            await server.wait_closed()
            await asyncio.gather(*handlers, return_exceptions=True)

    with pytest.raises(PrometheusUnavailable, match="did not answer within 0.2s"):
        asyncio.run(asyncio.wait_for(go(), timeout=3))


def test_headers_never_show_in_repr() -> None:
    client = PrometheusClient(BASE, headers={"Authorization": TOKEN})
    assert TOKEN not in repr(client)
    asyncio.run(client.aclose())


# -- query_all ------------------------------------------------------------------------------------

def prepared(answers: dict[Signal, Handler], engine: EngineKind = EngineKind.VLLM, window: float = 300.0,
             seen: list[dict[str, list[str]]] | None = None) -> Handler:
    """A Prometheus that answers each signal's query (recognised by its exact text) with a prepared handler."""
    by_text = {q.promql: answers.get(q.signal, answer(200, vector())) for q in queries_for(engine, window)}

    def handler(request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        if seen is not None:
            seen.append(form)
        return by_text[form["query"][0]](request)
    return handler


def run_all(handler: Handler, groups: list[QueryGroup], at: float | None = 1767225600.0) -> Any:
    async def go() -> Any:
        async with PrometheusClient(BASE, transport=httpx.MockTransport(handler)) as prometheus:
            return await query_all(prometheus, groups, at=at)
    return asyncio.run(go())


def test_query_all_groups_values_by_sd_and_variant() -> None:
    spec, control, other = sd("prod", "llama", "speculative"), sd("prod", "llama", "control"), sd("dev", "q", "speculative")
    seen: list[dict[str, list[str]]] = []
    handler = prepared({
        Signal.ACCEPTANCE_RATE: answer(200, vector((spec, "0.71"), (other, "NaN"))),
        Signal.REQUESTS: answer(200, vector((spec, "1234"), (control, "410"), (other, "0"))),
        Signal.P99_INTER_TOKEN_LATENCY: answer(200, vector((spec, "0.031"), (control, "0.030"))),
        Signal.RUNNING: answer(200, vector(({"namespace": "prod"}, "3"))),    # no SD labels: ignored
        Signal.INTER_TOKEN_LATENCY_SUM_SERIES: answer(200, matrix((spec, [(T, "1.5"), (T + 30, "2.0")]),
                                                                  (control, [(T, "0.7")]))),
        Signal.INTER_TOKEN_LATENCY_COUNT_SERIES: answer(200, matrix((spec, [(T, "100"), (T + 30, "130")]))),
    }, seen=seen)
    samples = run_all(handler, [QueryGroup(EngineKind.VLLM, 300.0)] * 3)
    # duplicates asked once; vLLM answers every signal but TensorRT-LLM's drafts per position (window, latest slice)
    assert samples.query_count == len(Signal) - 2 == len(seen)
    assert {form["time"][0] for form in seen} == {"1767225600.000"}       # one instant for the cycle
    [group] = samples.groups.values()
    assert group.errors == {}
    assert group.values[SeriesKey("prod", "llama", "speculative")] == SignalValues(
        acceptance_rate=0.71, requests=1234.0, p99_inter_token_latency_seconds=0.031,
        series={Signal.INTER_TOKEN_LATENCY_SUM_SERIES: ((T, 0.0), (T + 30, 0.5)),
                Signal.INTER_TOKEN_LATENCY_COUNT_SERIES: ((T, 0.0), (T + 30, 30.0))})
    assert group.values[SeriesKey("prod", "llama", "control")] == SignalValues(
        requests=410.0, p99_inter_token_latency_seconds=0.030,
        series={Signal.INTER_TOKEN_LATENCY_SUM_SERIES: ((T, 0.0),)})
    assert math.isnan(group.values[SeriesKey("dev", "q", "speculative")].acceptance_rate or 0.0)

    sample = samples.for_deployment("prod", "llama", EngineKind.VLLM, 300.0)
    assert sample.speculative.acceptance_rate == 0.71
    assert sample.control.requests == 410.0
    assert sample.requests_per_second == pytest.approx(1234 / 300)
    assert sample.speculative.points(Signal.INTER_TOKEN_LATENCY_COUNT_SERIES) == ((T, 0.0), (T + 30, 30.0))
    assert sample.control.points(Signal.INTER_TOKEN_LATENCY_COUNT_SERIES) == ()
    assert sample.speculative.mean_inter_token_latency_seconds is None, "a series is no value"
    missing = samples.for_deployment("prod", "absent", EngineKind.VLLM, 300.0)
    assert missing.speculative == SignalValues() and missing.errors == {}


def test_query_all_reads_the_counts_per_draft_position_from_the_position_label() -> None:
    spec, control = sd("prod", "llama", "speculative"), sd("prod", "llama", "control")
    vllm = prepared({
        Signal.DRAFTS: answer(200, vector((spec, "1000"))),
        Signal.ACCEPTED_PER_POSITION: answer(200, vector(
            ({**spec, "position": "0"}, "700"), ({**spec, "position": "2"}, "300"), ({**spec, "position": "1"}, "480"),
            ({**spec, "position": "x"}, "1"), (spec, "5"))),                 # no position: ignored
    })
    sample = run_all(vllm, [QueryGroup(EngineKind.VLLM, 300.0)]).for_deployment("prod", "llama", EngineKind.VLLM, 300.0)
    assert sample.speculative.drafts == 1000.0
    assert sample.position_counts == PositionCounts(1000.0, (700.0, 480.0, 300.0))
    assert sample.position_counts.rates == pytest.approx((0.7, 0.48, 0.3))
    assert sample.control.position_counts is None

    trtllm = prepared({
        Signal.ACCEPTED_PER_POSITION: answer(200, vector(({**spec, "token_position": "0"}, "60"),
                                                         ({**control, "token_position": "0"}, "7"))),
        Signal.DRAFTED_PER_POSITION: answer(200, vector(({**spec, "token_position": "0"}, "100"),
                                                        ({**spec, "token_position": "1"}, "40"))),
    }, engine=EngineKind.TRTLLM)
    sample = run_all(trtllm, [QueryGroup(EngineKind.TRTLLM, 300.0)]).for_deployment(
        "prod", "llama", EngineKind.TRTLLM, 300.0)
    assert sample.position_counts == PositionCounts(100.0, (60.0, 0.0), (100.0, 40.0))
    assert sample.position_counts.rates == pytest.approx((0.6, 0.0))


def test_query_all_records_errors_per_signal_and_keeps_the_rest() -> None:
    spec = sd("prod", "llama", "speculative")
    handler = prepared({
        Signal.REQUESTS: answer(200, vector((spec, "100"))),
        Signal.P99_INTER_TOKEN_LATENCY: answer(422, {"status": "error", "errorType": "execution", "error": "nope"}),
        Signal.P99_E2E_LATENCY: raising(httpx.ConnectError("refused")),
        Signal.E2E_LATENCY_SUM_SERIES: answer(200, {"status": "success", "data": {
            "resultType": "matrix", "result": [{"metric": sd("prod", "llama", "speculative"), "values": []}]}}),
    })
    samples = run_all(handler, [QueryGroup(EngineKind.VLLM, 300.0)])
    sample = samples.for_deployment("prod", "llama", EngineKind.VLLM, 300.0)
    assert sample.speculative.requests == 100.0
    assert {s: e.kind for s, e in sample.errors.items()} == {
        Signal.P99_INTER_TOKEN_LATENCY: QueryErrorKind.BAD_QUERY,
        Signal.P99_E2E_LATENCY: QueryErrorKind.UNAVAILABLE,
        Signal.E2E_LATENCY_SUM_SERIES: QueryErrorKind.BAD_RESPONSE,
    }
    assert sample.speculative.points(Signal.E2E_LATENCY_SUM_SERIES) == ()
    assert "(HTTP 422, errorType execution)" in sample.errors[Signal.P99_INTER_TOKEN_LATENCY].message
    assert "nope" not in sample.errors[Signal.P99_INTER_TOKEN_LATENCY].message


def test_query_all_when_prometheus_is_down_reports_every_signal() -> None:
    samples = run_all(raising(httpx.ConnectError("refused")),
                      [QueryGroup(EngineKind.VLLM, 300.0), QueryGroup(EngineKind.SGLANG, 60.0)])
    assert samples.query_count == len(queries_for(EngineKind.VLLM, 300.0)) + len(queries_for(EngineKind.SGLANG, 60.0))
    for group, answers in samples.groups.items():
        assert set(answers.errors) == {q.signal for q in queries_for(group.engine, group.window_seconds)}
        assert answers.values == {}


def test_query_all_sends_the_queries_concurrently() -> None:
    """Every query is in flight before any is answered: a cycle costs one round trip, not eight."""
    in_flight = 0
    most = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return httpx.Response(200, json=vector())

    async def go() -> None:
        async with PrometheusClient(BASE, transport=httpx.MockTransport(handler)) as prometheus:
            await query_all(prometheus, [QueryGroup(EngineKind.VLLM, 300.0), QueryGroup(EngineKind.TRTLLM, 300.0)])
    asyncio.run(go())
    assert most == len(queries_for(EngineKind.VLLM, 300.0)) + len(queries_for(EngineKind.TRTLLM, 300.0))


def test_vector_payload_shape_matches_the_documented_envelope() -> None:
    body = vector((sd("a", "b", "speculative"), "1"))
    assert json.loads(json.dumps(body))["data"]["result"][0]["value"][1] == "1"


# -- isolation: a body never repeated, a deadline for all of a query, a cap on its answer, a share of the cycle --

BODY = "internal-endpoint-secret-text"


@pytest.mark.parametrize("handler", [
    answer(500, text=BODY), answer(404, text=BODY), answer(401, {"status": "error", "errorType": BODY, "error": BODY}),
    answer(400, {"status": "error", "errorType": "bad_data", "error": BODY}), answer(200, text=f"<html>{BODY}</html>"),
    answer(200, {"status": BODY}), answer(200, {"status": "success", "data": {"resultType": BODY, "result": []}}),
    answer(200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, BODY]}]}}),
])
def test_a_failed_answer_s_body_is_never_repeated(handler: Handler) -> None:
    """Whoever writes spec.analysis.prometheus.url must not read an endpoint through the SD's status."""
    with pytest.raises(PrometheusError) as caught:
        query_once(handler)
    assert BODY not in str(caught.value)


def _trickling_server(go: Callable[[int], Any]) -> Any:
    """Run `go(port)` against a loopback server that sends an answer's headers and then a byte every 50 ms:
    no single read waits long, the answer never ends."""
    async def main() -> Any:
        handlers: list[asyncio.Task[Any]] = []

        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            await reader.read(65536)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
            try:
                while True:
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(0.05)
            finally:
                writer.close()

        server = await asyncio.start_server(trickle, "127.0.0.1", 0)
        try:
            return await go(server.sockets[0].getsockname()[1])
        finally:
            for task in handlers:
                task.cancel()
            server.close()
            await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()
    return asyncio.run(asyncio.wait_for(main(), timeout=5))


def test_a_query_has_one_deadline_for_all_of_it_not_per_read() -> None:
    async def go(port: int) -> None:
        async with PrometheusClient(f"http://127.0.0.1:{port}", timeout=0.5) as prometheus:
            await prometheus.query("up")

    started = time.monotonic()
    with pytest.raises(PrometheusUnavailable, match=r"did not answer within 0.5s \(gave up after 0.5 s\)"):
        _trickling_server(go)
    assert time.monotonic() - started < 2


def test_an_answer_past_the_cap_is_not_read_further() -> None:
    read: list[int] = []

    async def go(port: int) -> None:
        async with PrometheusClient(f"http://127.0.0.1:{port}", timeout=3, max_answer_bytes=5) as prometheus:
            try:
                await prometheus.query("up")
            finally:
                read.append(prometheus.answer_bytes)

    with pytest.raises(PrometheusBadResponse, match=r"larger than 5 bytes \(HTTP 200\); stopped reading it"):
        _trickling_server(go)
    assert read == [6]


def test_query_all_gives_up_at_the_end_of_its_share_of_the_cycle() -> None:
    async def silent(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200, json=vector())

    async def go() -> Any:
        async with PrometheusClient(BASE, transport=httpx.MockTransport(silent)) as prometheus:
            return await query_all(prometheus, [QueryGroup(EngineKind.VLLM, 300.0)], share=0.2)

    started = time.monotonic()
    samples = asyncio.run(go())
    assert time.monotonic() - started < 2
    [group] = samples.groups.values()
    assert {e.kind for e in group.errors.values()} == {QueryErrorKind.UNAVAILABLE}
    assert len(group.errors) == len(queries_for(EngineKind.VLLM, 300.0))
    assert all("did not answer within its share of the analysis cycle (gave up after 0.2 s)" in e.message
               for e in group.errors.values())


def test_query_all_leaves_a_nan_instant_out_of_the_sd_s_slices_and_counts_it() -> None:
    spec, control = sd("prod", "llama", "speculative", pod="a"), sd("prod", "llama", "control", pod="b")
    handler = prepared({
        Signal.INTER_TOKEN_LATENCY_SUM_SERIES: answer(200, matrix(
            (spec, [(T, "1"), (T + 30, "NaN"), (T + 60, "3")]), (control, [(T, "1"), (T + 30, "2"), (T + 60, "3")]))),
        Signal.INTER_TOKEN_LATENCY_COUNT_SERIES: answer(200, matrix(
            (spec, [(T, "10"), (T + 30, "20"), (T + 60, "30")]), (control, [(T, "10"), (T + 30, "20"), (T + 60, "30")]))),
    })
    sample = run_all(handler, [QueryGroup(EngineKind.VLLM, 300.0)]).for_deployment("prod", "llama", EngineKind.VLLM, 300.0)
    for values in (sample.speculative, sample.control):    # the instant left out of both variants alike
        assert values.points(Signal.INTER_TOKEN_LATENCY_SUM_SERIES) == ((T, 0.0), (T + 60, 2.0))
        assert values.points(Signal.INTER_TOKEN_LATENCY_COUNT_SERIES) == ((T, 0.0), (T + 60, 20.0))
    assert sample.dropped_instants == 1
