"""The Prometheus HTTP API client of the analysis loop: async (httpx), with timeouts, errors made ours.

    async with PrometheusClient("http://prometheus.monitoring:9090", headers=secret_headers) as client:
        samples = await query_all(client, {QueryGroup(EngineKind.VLLM, 300.0)})

At the edge: it asks and parses, and decides nothing. Every failure becomes one of these, so a verdict
can say why it is Inconclusive (the tree mirrors samples.QueryErrorKind):

    PrometheusError
    ├── PrometheusUnavailable   connection refused or reset, timeout, HTTP 5xx or 429: try next cycle
    ├── PrometheusRefused       HTTP 401, 403, 404 or another 4xx: the URL or the headers are wrong
    ├── PrometheusBadQuery      HTTP 400 or 422: Prometheus rejected the PromQL
    ├── PrometheusNotAllowed    not sent: the URL is outside the operator's allow-list (clients/endpoints.py)
    └── PrometheusBadResponse   not the JSON envelope the API documents, or not an instant or range vector

Status codes and the envelope `{status, data: {resultType, result}, errorType, error}` are those of the
Prometheus HTTP API (prometheus.io/docs/prometheus/latest/querying/api: 400 for bad parameters, 422 for
an expression that cannot be executed, 503 for a query that timed out or was aborted). NaN and ±Inf
values are kept as the floats they are; the verdict handles them, and query_all leaves the instants where a slice
series has one out of that SD's slices. A failed answer's body is never repeated in an error (only the status
code and Prometheus' own error type): the operator must not read endpoints for whoever writes the URL. Each
query has a deadline for all of it, the answer a cap on its size, and query_all a share of the cycle for all of
one Prometheus' queries. Header values (tokens from
`spec.analysis.prometheus.headersSecretRef`) are never logged nor shown in repr or error messages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import httpx

from specdeploy.judgment.assembly import Answer, Sample, assemble, series_key
from specdeploy.judgment.queries import Query, queries_for, series_pods_query
from specdeploy.judgment.samples import QueryError, QueryErrorKind, QueryGroup, Samples

log = logging.getLogger(__name__)

QUERY_PATH = "/api/v1/query"
MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The most of one answer read before giving up on it. The largest answer the analysis asks for is a slice series
(CUMULATIVE_SERIES: SLICES + 1 points per pod) for every SD of an engine and window: about 500 bytes a pod, so
16 MiB is some 30,000 pods in one answer (an estimate from the answer's shape). Past it the body is not read
further: a URL that streams without end costs the operator this much memory, not all of it."""
KNOWN_ERROR_TYPES = frozenset({"bad_data", "timeout", "canceled", "execution", "internal", "unavailable",
                               "not_found", "not_acceptable"})
"""The `errorType` values of the Prometheus HTTP API (prometheus.io/docs/prometheus/latest/querying/api, "Format
overview"). Only these are repeated in a message: the rest of a failed answer's body never is (see `_vector`)."""


class PrometheusError(Exception):
    """A query got no usable answer; `kind` says which branch of the tree above."""

    kind: QueryErrorKind = QueryErrorKind.BAD_RESPONSE


class PrometheusUnavailable(PrometheusError):
    kind = QueryErrorKind.UNAVAILABLE


class PrometheusRefused(PrometheusError):
    kind = QueryErrorKind.REFUSED


class PrometheusBadQuery(PrometheusError):
    kind = QueryErrorKind.BAD_QUERY


class PrometheusBadResponse(PrometheusError):
    kind = QueryErrorKind.BAD_RESPONSE


class PrometheusNotAllowed(PrometheusError):
    kind = QueryErrorKind.NOT_ALLOWED


def _timeout_param(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PrometheusClient:
    """Instant queries against one Prometheus (or anything that speaks its HTTP API: Thanos, Mimir …).

    base_url: e.g. http://prometheus.monitoring:9090 (a path prefix such as …/prometheus is kept).
    headers: sent with every request (e.g. Authorization); never logged.
    headers_from: where the headers came from (e.g. "Secret team-a/prometheus-auth"), named when
        Prometheus refuses them.
    unusable_headers: why the headers meant for this Prometheus could not be had; every query then fails
        with PrometheusRefused saying so instead of going out without them (without a tenant header, a
        Mimir or Thanos could answer with another tenant's series).
    not_allowed: why the URL is outside the operator's allow-list (AllowedEndpoints.refusal); every query then
        fails with PrometheusNotAllowed saying so, and nothing is sent.
    timeout: seconds one query may take in all — connecting, sending, Prometheus' own evaluation (`timeout=`) and
        reading the whole answer — not httpx's per-read timeout, which a server that trickles bytes never trips.
    max_answer_bytes: the most of one answer read (MAX_ANSWER_BYTES).
    transport: for tests (httpx.MockTransport).

    `answer_bytes` counts the bytes read so far, for the operator's per-source metric.
    """

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None, headers_from: str | None = None,
                 unusable_headers: str | None = None, max_answer_bytes: int = MAX_ANSWER_BYTES,
                 not_allowed: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.not_allowed = not_allowed
        self.headers_from = headers_from
        self.unusable_headers = unusable_headers
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self.answer_bytes = 0
        self._client = httpx.AsyncClient(headers=dict(headers or {}), timeout=httpx.Timeout(timeout),
                                         transport=transport)

    def __repr__(self) -> str:
        return f"PrometheusClient({self.base_url!r}, timeout={self.timeout})"

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """The vector `promql` evaluates to, now or at Unix time `at` (a range vector for a subquery: each Sample
        then has its points); raises PrometheusError."""
        if self.not_allowed is not None:
            raise PrometheusNotAllowed(self.not_allowed)
        if self.unusable_headers is not None:
            raise PrometheusRefused(f"no query sent to Prometheus at {self.base_url}: {self.unusable_headers}")
        form = {"query": promql, "timeout": _timeout_param(self.timeout)}
        if at is not None:
            form["time"] = f"{at:.3f}"
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client.stream("POST", self.base_url + QUERY_PATH, data=form) as response:
                    body = await self._read(response)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {self.base_url} did not answer within {self.timeout:g}s "
                f"(gave up after {time.monotonic() - started:.1f} s)"
            ) from exc
        except httpx.HTTPError as exc:   # its message is httpx's or the socket's, never the server's
            raise PrometheusUnavailable(
                f"cannot reach Prometheus at {self.base_url}: {type(exc).__name__} "
                f"(after {time.monotonic() - started:.1f} s)"
            ) from exc
        return _vector(self.base_url, response.status_code, body, self.headers_from)

    async def _read(self, response: httpx.Response) -> bytes:
        """The answer's body, read as it streams in and abandoned past `max_answer_bytes`."""
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            self.answer_bytes += len(chunk)
            if size > self.max_answer_bytes:
                raise PrometheusBadResponse(
                    f"the answer of Prometheus at {self.base_url} is larger than {self.max_answer_bytes:,} bytes "
                    f"(HTTP {response.status_code}); stopped reading it")
            chunks.append(chunk)
        return b"".join(chunks)


def _error_type(body: Any) -> str:
    """", errorType bad_data" when the body is Prometheus' error envelope with one of its own error types."""
    kind = body.get("errorType") if isinstance(body, dict) else None
    return f", errorType {kind}" if kind in KNOWN_ERROR_TYPES else ""


def _vector(base_url: str, code: int, raw: bytes, headers_from: str | None = None) -> list[Sample]:
    """The samples of an answer, or the PrometheusError it is. No message repeats the body: whoever can write
    `spec.analysis.prometheus.url` could otherwise read any endpoint the operator reaches through its status
    (docs/security.md); the status code, Prometheus' own error type and a fixed sentence say what went wrong."""
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = None
    if code >= 400:
        detail = f"HTTP {code}{_error_type(body)}"
        if code in (400, 422):
            raise PrometheusBadQuery(f"Prometheus at {base_url} rejected the query ({detail})")
        if code >= 500 or code == 429:
            raise PrometheusUnavailable(f"Prometheus at {base_url} failed ({detail})")
        hint = "check `spec.analysis.prometheus.url`" if code == 404 else \
            f"check the headers in {headers_from or '`spec.analysis.prometheus.headersSecretRef`'}"
        raise PrometheusRefused(f"Prometheus at {base_url} refused the query ({detail}); {hint}")
    if body is None:
        raise PrometheusBadResponse(
            f"expected JSON from {base_url}{QUERY_PATH}, got {len(raw):,} bytes of something else (HTTP {code}); "
            "is `spec.analysis.prometheus.url` a Prometheus?")
    if not isinstance(body, dict) or body.get("status") != "success":
        raise PrometheusBadResponse(f"expected status 'success' from {base_url}{_error_type(body)}")
    data = body.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    if not isinstance(data, dict) or kind not in ("vector", "matrix") or not isinstance(data.get("result"), list):
        shown = f"resultType {kind!r}" if kind in ("scalar", "string", "vector", "matrix") else "something else"
        raise PrometheusBadResponse(f"expected an instant or range vector from {base_url}, got {shown}")
    if kind == "matrix":
        return [_range_sample(base_url, index, item) for index, item in enumerate(data["result"])]
    return [_sample(base_url, index, item) for index, item in enumerate(data["result"])]


def _range_sample(base_url: str, index: int, item: Any) -> Sample:
    try:
        labels, values = item["metric"], item["values"]
        if not isinstance(labels, dict) or not isinstance(values, list) or not values:
            raise TypeError("metric must be an object and values a non-empty list")
        points = tuple((float(at), float(text)) for at, text in values if isinstance(text, str))
        if len(points) != len(values):
            raise TypeError("every value must be [time, \"number\"]")
        return Sample({str(k): str(v) for k, v in labels.items()}, points[-1][1], points)
    except (KeyError, TypeError, ValueError) as exc:
        raise PrometheusBadResponse(
            f"expected {{metric: {{…}}, values: [[time, \"number\"], …]}} from {base_url}; series {index} is not"
        ) from exc


def _sample(base_url: str, index: int, item: Any) -> Sample:
    try:
        labels = item["metric"]
        _, text = item["value"]
        if not isinstance(labels, dict) or not isinstance(text, str):
            raise TypeError("metric must be an object and value a string")
        return Sample({str(k): str(v) for k, v in labels.items()}, float(text))
    except (KeyError, TypeError, ValueError) as exc:
        raise PrometheusBadResponse(
            f"expected {{metric: {{…}}, value: [time, \"number\"]}} from {base_url}; series {index} is not"
        ) from exc


async def _ask(client: PrometheusClient, query: Query, at: float | None, until: float | None) -> Answer:
    """One query's answer or error; `until`: the loop time by which the source's share of the cycle ends."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout_at(until):
            samples = await client.query(query.promql, at)
    except TimeoutError as exc:
        error: PrometheusError = PrometheusUnavailable(
            f"Prometheus at {client.base_url} did not answer within its share of the analysis cycle "
            f"(gave up after {time.perf_counter() - started:.1f} s)")
        error.__cause__ = exc
    except PrometheusError as exc:
        error = exc
    else:
        return Answer(query, samples, None, time.perf_counter() - started)
    if not isinstance(error, PrometheusNotAllowed):   # nothing was sent; the analysis loop says it once
        log.warning("analysis query %s for %s failed: %s", query.signal.value, query.engine.value, error)
    return Answer(query, None, QueryError(query.signal, error.kind, str(error)), time.perf_counter() - started)


async def query_all(client: PrometheusClient, groups: Iterable[QueryGroup], at: float | None = None,
                    share: float | None = None) -> Samples:
    """Every signal for every SD in `groups`, the queries sent concurrently, evaluated at one instant.

    `at` defaults to now (one timestamp for all queries, so the signals of a cycle describe the same
    window). `share`: seconds all of them may take together (this Prometheus' share of the cycle); a query
    unanswered by then is PrometheusUnavailable. The answers become Samples in judgment/assembly.py (a failed query
    recorded per signal, never raised).
    """
    instant = time.time() if at is None else at
    until = None if share is None else asyncio.get_running_loop().time() + share
    queries = [q for group in dict.fromkeys(groups)
               for q in queries_for(group.engine, group.window_seconds, group.selector)]
    answers = await asyncio.gather(*(_ask(client, q, instant, until) for q in queries))
    return assemble(answers)


SeriesPods = dict[tuple[str, str], dict[str, set[tuple[str, str]]]]
"""Per (namespace, SD): per variant, the (pod, job) label pairs of the series labelled as that SD's."""


async def series_pods(client: PrometheusClient, groups: Iterable[QueryGroup], at: float | None = None,
                      share: float | None = None) -> tuple[SeriesPods, PrometheusError | None, tuple[float, ...]]:
    """The pods (and scrape jobs) whose series the analysis queries of `groups` read over each window
    (queries.SERIES_PODS), the first error when a query failed (its SDs are then not checked this cycle), and each
    query's seconds."""
    instant = time.time() if at is None else at
    until = None if share is None else asyncio.get_running_loop().time() + share
    found: SeriesPods = {}
    first_error = None
    seconds = []
    for group in dict.fromkeys(QueryGroup(g.engine, g.window_seconds) for g in groups):
        started = time.perf_counter()
        try:
            async with asyncio.timeout_at(until):
                answer = await client.query(series_pods_query(group.engine, group.window_seconds), instant)
        except (TimeoutError, PrometheusError) as error:
            first_error = first_error or (error if isinstance(error, PrometheusError) else PrometheusUnavailable(
                f"Prometheus at {client.base_url} did not answer which pods wrote the series within its share of "
                f"the analysis cycle (gave up after {time.perf_counter() - started:.1f} s)"))
            continue
        finally:
            seconds.append(time.perf_counter() - started)
        for sample in answer:
            key = series_key(sample.labels)
            if key is not None:
                pods = found.setdefault((key.namespace, key.name), {}).setdefault(key.variant, set())
                pods.add((sample.labels.get("pod", ""), sample.labels.get("job", "")))
    return found, first_error, tuple(seconds)
