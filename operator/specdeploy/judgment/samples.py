"""What one analysis cycle measured: the signals per (namespace, SD, variant) and the queries that failed.

    samples = await query_all(client, [QueryGroup(EngineKind.VLLM, 300.0)])
    sample = samples.for_deployment("prod", "llama", EngineKind.VLLM, 300.0)
    sample.speculative.acceptance_rate      # 0.71, NaN, or None when Prometheus had no series

Pure data: the Prometheus client fills it, the verdict reads it. A value is None when Prometheus returned
no series for it and NaN (or ±Inf) when it returned one without a usable number (0/0 rates, quantiles of
empty histograms); the verdict treats both as "nothing known", never as a failure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, TypeVar

from specdeploy.api.spec import EngineKind


class Signal(StrEnum):
    """One measured quantity; the value is the SignalValues field that holds it."""

    ACCEPTANCE_RATE = "acceptance_rate"
    MEAN_ACCEPTANCE_LENGTH = "mean_acceptance_length"
    P99_INTER_TOKEN_LATENCY = "p99_inter_token_latency_seconds"
    P99_E2E_LATENCY = "p99_e2e_latency_seconds"
    P99_TIME_TO_FIRST_TOKEN = "p99_time_to_first_token_seconds"
    MEAN_INTER_TOKEN_LATENCY = "mean_inter_token_latency_seconds"
    MEAN_E2E_LATENCY = "mean_e2e_latency_seconds"
    MEAN_TIME_TO_FIRST_TOKEN = "mean_time_to_first_token_seconds"
    MEAN_QUEUE_TIME = "mean_queue_time_seconds"
    REQUESTS = "requests"
    OUTPUT_TOKENS_PER_SECOND = "output_tokens_per_second"
    RUNNING = "running"
    WAITING = "waiting"
    PODS = "pods"
    # Cumulative series over the window at evenly spaced instants (a subquery): the slices of the paired test.
    INTER_TOKEN_LATENCY_SUM_SERIES = "inter_token_latency_sum"
    INTER_TOKEN_LATENCY_COUNT_SERIES = "inter_token_latency_count"
    E2E_LATENCY_SUM_SERIES = "e2e_latency_sum"
    E2E_LATENCY_COUNT_SERIES = "e2e_latency_count"
    TIME_TO_FIRST_TOKEN_SUM_SERIES = "time_to_first_token_sum"
    TIME_TO_FIRST_TOKEN_COUNT_SERIES = "time_to_first_token_count"
    # Time in the engine without the queue (vLLM's prefill and inference histograms): the Latency objective's
    # TTFT and end-to-end sources; engines without them are judged on TTFT (E2E) − queue time, slice by slice.
    PREFILL_TIME_SUM_SERIES = "prefill_time_sum"
    PREFILL_TIME_COUNT_SERIES = "prefill_time_count"
    INFERENCE_TIME_SUM_SERIES = "inference_time_sum"
    INFERENCE_TIME_COUNT_SERIES = "inference_time_count"
    QUEUE_TIME_SUM_SERIES = "queue_time_sum"
    QUEUE_TIME_COUNT_SERIES = "queue_time_count"
    OUTPUT_TOKENS_SERIES = "output_tokens_count"      # the generation-tokens counter: a count of tokens
    # Speculation per draft position over the window, the evidence of the schedule's calibration
    # (judgment/calibration.py): drafts (vLLM's drafts counter), and per position the drafts whose positions up
    # to it were all accepted and (TensorRT-LLM) the drafts that proposed it.
    DRAFTS = "drafts"
    ACCEPTED_PER_POSITION = "accepted_per_position"
    DRAFTED_PER_POSITION = "drafted_per_position"
    # The same over the window's latest slice (judgment/queries.py latest_seconds): where acceptance stands now,
    # against which the rest of the window tells whether it moved (judgment/calibration.py acceptance_now).
    LATEST_DRAFTS = "latest_drafts"
    LATEST_ACCEPTED_PER_POSITION = "latest_accepted_per_position"
    LATEST_DRAFTED_PER_POSITION = "latest_drafted_per_position"

    @property
    def is_series(self) -> bool:
        """Answered by a range (points over the window), not one number."""
        return self.value.endswith(("_sum", "_count"))

    @property
    def is_per_position(self) -> bool:
        """Answered by one number per draft position (a series per value of the engine's position label)."""
        return self.value.endswith("_per_position")


Points = tuple[tuple[float, float], ...]
"""(Unix time, value) pairs in time order."""

_K = TypeVar("_K")

PerPosition = Mapping[int, float]
"""A count per draft position, the first drafted token being position 1."""


@dataclass(frozen=True)
class PositionCounts:
    """Speculation of one variant per draft position over the window, summed over its pods.

    drafts: drafts that proposed at least one token (vLLM counts no draft at k = 0).
    accepted: accepted[i] is the number of drafts whose positions 1..i+1 were all accepted (vLLM
        spec_decode_num_accepted_tokens_per_pos_total{position=i}; TensorRT-LLM
        spec_decode_accepted_tokens_total{token_position=i}): a token after the first rejection is never accepted.
    drafted: drafted[i] is the number of drafts that proposed position i+1 (TensorRT-LLM); None where the engine
        counts drafts only as a whole (vLLM), whose rate at a position a draft did not reach is then too low.
    """

    drafts: float
    accepted: tuple[float, ...]
    drafted: tuple[float, ...] | None = None

    def drafted_at(self, position: int) -> float:
        """The drafts counted for `position` (from 1): the denominator of its acceptance."""
        if self.drafted is None:
            return self.drafts
        return self.drafted[position - 1] if position <= len(self.drafted) else 0.0

    @property
    def rates(self) -> tuple[float, ...]:
        """accepted ÷ drafted per position, as measured (NaN where nothing was drafted)."""
        return tuple(a / n if (n := self.drafted_at(i)) > 0 else math.nan
                     for i, a in enumerate(self.accepted, start=1))


class Variant(StrEnum):
    """The `specdeploy.io/variant` pod label, as `specdeploy_io_variant` on the engines' series."""

    SPECULATIVE = "speculative"
    CONTROL = "control"


class SeriesKey(NamedTuple):
    """The labels every analysis query groups by."""

    namespace: str
    name: str
    variant: str


class QueryGroup(NamedTuple):
    """SDs that share one set of queries: the same engine (metric names) and the same window; `selector`: the
    series they read ("": every SD's, judgment/queries.py SELECTOR; else one SD's own pods, `pinned_selector`)."""

    engine: EngineKind
    window_seconds: float
    selector: str = ""


@dataclass(frozen=True)
class SignalValues:
    """The signals of one variant of one SD over the window (None: no series)."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    p99_inter_token_latency_seconds: float | None = None
    p99_e2e_latency_seconds: float | None = None
    p99_time_to_first_token_seconds: float | None = None
    mean_inter_token_latency_seconds: float | None = None
    mean_e2e_latency_seconds: float | None = None
    mean_time_to_first_token_seconds: float | None = None
    mean_queue_time_seconds: float | None = None
    requests: float | None = None
    output_tokens_per_second: float | None = None
    running: float | None = None
    waiting: float | None = None
    pods: float | None = None
    drafts: float | None = None
    latest_drafts: float | None = None
    series: Mapping[Signal, Points] = field(default_factory=dict)
    positions: Mapping[Signal, PerPosition] = field(default_factory=dict)

    def get(self, signal: Signal) -> float | None:
        value: float | None = getattr(self, signal.value)
        return value

    def points(self, signal: Signal) -> Points:
        return self.series.get(signal, ())

    def with_value(self, signal: Signal, value: float) -> SignalValues:
        return dataclasses.replace(self, **{signal.value: value})  # type: ignore[arg-type]

    def with_points(self, signal: Signal, points: Points) -> SignalValues:
        return dataclasses.replace(self, series={**self.series, signal: points})

    def with_position(self, signal: Signal, position: int, value: float) -> SignalValues:
        counts = {**self.positions.get(signal, {}), position: value}
        return dataclasses.replace(self, positions={**self.positions, signal: counts})

    @property
    def position_counts(self) -> PositionCounts | None:
        """Drafts and accepted tokens per position over the window; None without them (SGLang exports none, a variant
        that does not speculate has none, and a window without drafts counts nothing).

        Positions run from 1 to the highest one reported; a position missing below it counted nothing. TensorRT-LLM
        has no drafts counter: its drafts are those that proposed position 1.
        """
        return self._counts(Signal.ACCEPTED_PER_POSITION, Signal.DRAFTED_PER_POSITION, self.drafts)

    @property
    def latest_position_counts(self) -> PositionCounts | None:
        """The same over the window's latest slice."""
        return self._counts(Signal.LATEST_ACCEPTED_PER_POSITION, Signal.LATEST_DRAFTED_PER_POSITION,
                            self.latest_drafts)

    def _counts(self, accepted_signal: Signal, drafted_signal: Signal, drafts_total: float | None
                ) -> PositionCounts | None:
        accepted = self.positions.get(accepted_signal, {})
        drafted = self.positions.get(drafted_signal)
        top = max((*accepted, *(drafted or {})), default=0)
        if top == 0:
            return None
        if drafted is not None:
            drafted_at = tuple(_count(drafted.get(position)) for position in range(1, top + 1))
            drafts = drafted_at[0]
        else:
            drafted_at, drafts = None, _count(drafts_total)
        if drafts <= 0:
            return None
        return PositionCounts(drafts, tuple(_count(accepted.get(position)) for position in range(1, top + 1)),
                              drafted_at)

    @property
    def running_per_pod(self) -> float | None:
        """Requests in the batch of one pod, averaged over the window: the load a step time depends on."""
        running, pods = self.running, self.pods
        if running is None or pods is None or not math.isfinite(running) or not pods or not math.isfinite(pods):
            return None
        return running / pods

    def per_pod(self, value: float | None) -> float | None:
        """`value` (a variant's total: waiting requests, tokens per second) divided by its pods."""
        pods = self.pods
        if value is None or pods is None or not math.isfinite(value) or not pods or not math.isfinite(pods):
            return None
        return value / pods


def _count(value: float | None) -> float:
    """A counter's increase as a count: no series, NaN or a negative extrapolation count nothing."""
    return value if value is not None and math.isfinite(value) and value > 0 else 0.0


class QueryErrorKind(StrEnum):
    """Why a query gave no answer (the PrometheusError subclass, without importing the client)."""

    UNAVAILABLE = "Unavailable"      # connection refused, timeout, HTTP 5xx or 429
    REFUSED = "Refused"              # HTTP 401/403/404 and other 4xx: wrong URL or credentials
    BAD_QUERY = "BadQuery"           # HTTP 400/422: Prometheus rejected the PromQL
    BAD_RESPONSE = "BadResponse"     # an answer that is not the JSON the API documents
    NOT_ALLOWED = "NotAllowed"       # not sent: the URL is outside the operator's allow-list (clients/endpoints.py)


@dataclass(frozen=True)
class QueryError:
    """One failed query: which signal, what kind of failure, and Prometheus' own words."""

    signal: Signal
    kind: QueryErrorKind
    message: str


@dataclass(frozen=True)
class GroupSamples:
    """The answers to one QueryGroup's queries; `dropped`: per (namespace, SD), the instants of its slice series
    left out because a scrape read NaN or ±Inf there (`finite_instants`)."""

    values: Mapping[SeriesKey, SignalValues] = field(default_factory=dict)
    errors: Mapping[Signal, QueryError] = field(default_factory=dict)
    dropped: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class DeploymentSample:
    """Everything the verdict needs about one SD in one cycle."""

    window_seconds: float
    speculative: SignalValues = field(default_factory=SignalValues)
    control: SignalValues = field(default_factory=SignalValues)
    errors: Mapping[Signal, QueryError] = field(default_factory=dict)
    dropped_instants: int = 0

    @property
    def dropped_note(self) -> str:
        """"; 1 instant of the window left out of its slices: a scrape read NaN or ±Inf" when any was: the
        evidence counts what it did not use."""
        if not self.dropped_instants:
            return ""
        many = "s" if self.dropped_instants > 1 else ""
        return (f"; {self.dropped_instants} instant{many} of the window left out of its slices: a scrape read NaN or "
                "±Inf")

    @property
    def requests_per_second(self) -> float | None:
        """The speculative pods' load: finished requests per second over the window."""
        requests = self.speculative.requests
        if requests is None or not math.isfinite(requests) or self.window_seconds <= 0:
            return None
        return requests / self.window_seconds

    @property
    def position_counts(self) -> PositionCounts | None:
        """The speculative pods' drafts and accepted tokens per draft position (SignalValues.position_counts)."""
        return self.speculative.position_counts

    @property
    def latest_position_counts(self) -> PositionCounts | None:
        """The same over the window's latest slice."""
        return self.speculative.latest_position_counts


@dataclass(frozen=True)
class Samples:
    """One cycle's measurements for every SD the operator watches, and what the cycle cost."""

    groups: Mapping[QueryGroup, GroupSamples] = field(default_factory=dict)
    query_seconds: tuple[float, ...] = ()

    @property
    def query_count(self) -> int:
        return len(self.query_seconds)

    def for_deployment(self, namespace: str, name: str, engine: EngineKind, window_seconds: float,
                       selector: str = "") -> DeploymentSample:
        """The sample of SD `namespace/name`; empty values (and no errors) when its group was not queried."""
        group = self.groups.get(QueryGroup(engine, window_seconds, selector), GroupSamples())
        speculative = group.values.get(SeriesKey(namespace, name, Variant.SPECULATIVE.value), SignalValues())
        control = group.values.get(SeriesKey(namespace, name, Variant.CONTROL.value), SignalValues())
        return DeploymentSample(window_seconds, speculative, control, group.errors,
                                group.dropped.get((namespace, name), 0))


def finite_instants(per_pod: Mapping[_K, Sequence[Points]]) -> tuple[dict[_K, list[Points]], int]:
    """One SD's per-pod cumulative series (both variants, every slice signal) without the instants at which any
    of them is NaN or ±Inf, and how many instants that left out; keyed as the caller likes (variant, signal).

    One such point (a scrape that exported NaN) otherwise made every later total of the merged series NaN
    (judgment/comparison.py merge_counters accumulates growth), so the window had no slice after it. Leaving the
    instant out of every series of the SD alike, the slice ending there joins the next one in both variants: the
    paired slices still cover the same time, and a counter's growth across the instant is kept (the next point is
    cumulative). A bad last instant only drops the last slice.
    """
    bad = {at for pods in per_pod.values() for points in pods for at, value in points if not math.isfinite(value)}
    if not bad:
        return {key: list(pods) for key, pods in per_pod.items()}, 0
    kept = {key: [tuple((at, value) for at, value in points if at not in bad) for points in pods]
            for key, pods in per_pod.items()}
    return kept, len(bad)


def chain_acceptance(sample: DeploymentSample, k: int) -> DeploymentSample:
    """`sample` with the acceptance rate as accepted ÷ proposed chain positions, (L − 1) ÷ k, from the mean
    acceptance length L. SGLang's sglang:spec_accept_rate is (accept_tokens − forward_ct) ÷ (forward_ct ×
    (num_draft_tokens − 1)) (its scheduler metrics): with eagleTopk > 1 the denominator is the draft tree, so the
    same floor would read lower on trees; the accept length counts the same on every shape."""
    if k <= 0:
        return sample

    def chain(values: SignalValues) -> SignalValues:
        length = values.mean_acceptance_length
        if length is None:
            return values
        rate = (length - 1.0) / k if math.isfinite(length) else length
        return dataclasses.replace(values, acceptance_rate=rate)

    return dataclasses.replace(sample, speculative=chain(sample.speculative), control=chain(sample.control))
