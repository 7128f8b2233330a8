"""The engine's Prometheus metrics in its real names, types, labels and buckets, fed by the engine core.

    metrics = engine_metrics(served)          # VllmMetrics, SglangMetrics or TrtllmMetrics
    engine = Engine(served, observer=metrics)
    text = metrics.render()

Names come from specdeploy.engines.metric_names (one table per engine, shared with the analysis
queries); the few the table does not carry are named here with their source. What each engine counts
differs, and the difference matters to whoever reads the numbers:

- vLLM V1 observes vllm:inter_token_latency_seconds once per engine step per request: the time since the
  request's previous tokens (vllm/v1/metrics/stats.py, IterationStats.update_from_output). A speculative
  step emits several tokens at once, so the "ITL" of a speculating vLLM is the interval between token
  batches, not the time per token. vllm:request_time_per_output_token_seconds is the per-token figure.
- SGLang divides a step's interval by the tokens it emitted and counts each token
  (sglang/srt/observability/metrics_collector.py, observe_inter_token_latency).
- TensorRT-LLM reports time per output token per finished request (trtllm_time_per_output_token_seconds).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from specdeploy.api.spec import EngineKind
from specdeploy.engines import metric_names
from specdeploy_engine.sim.exposition import Labels, Registry

if TYPE_CHECKING:
    from specdeploy_engine.sim.engine import Engine, SimRequest, Step
    from specdeploy_engine.sim.model import ServedModel

# vllm/v1/metrics/loggers.py (PrometheusStatLogger): bucket boundaries of the timing histograms.
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                     10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)
VLLM_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vllm/v1/engine/__init__.py FinishReason: every value is pre-registered with the request_success counter.
VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

# sglang/srt/observability/metrics_collector.py defaults.
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
                      0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
                      1800, 2400)
SGLANG_QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200,
                        300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)
# SGLang logs (and sets its spec gauges) once per decode_log_interval batches (default 40).
SGLANG_DECODE_LOG_INTERVAL = 40

# tensorrt_llm/metrics/collector.py defaults (the same boundaries as vLLM's).
TRTLLM_REQUEST_LATENCY_BUCKETS = VLLM_REQUEST_LATENCY_BUCKETS
TRTLLM_TTFT_BUCKETS = VLLM_TTFT_BUCKETS
TRTLLM_TPOT_BUCKETS = VLLM_ITL_BUCKETS


class EngineMetrics:
    """Observer base: gauges and request counts common to all engines; subclasses register families."""

    def __init__(self, served: ServedModel) -> None:
        self.served = served
        self.registry = Registry()
        self.k = served.k

    def render(self) -> str:
        return self.registry.render()

    # Observer protocol (sim/engine.py); engines override what they record.
    def on_first_token(self, request: SimRequest, now: float) -> None: ...
    def on_tokens(self, request: SimRequest, count: int, interval: float, now: float) -> None: ...
    def on_drafts(self, drafted: int, accepted: int, k: int) -> None: ...
    def on_finished(self, request: SimRequest, now: float) -> None: ...
    def on_step(self, engine: Engine, step: Step, now: float) -> None: ...
    def on_preempted(self, request: SimRequest) -> None: ...

    def on_idle(self, engine: Engine) -> None:
        """Refresh the gauges when nothing runs (a request arrived or left between steps)."""


def _tpot(request: SimRequest) -> float | None:
    if request.generated < 2 or request.first_token_at is None or request.finished_at is None:
        return None
    return (request.finished_at - request.first_token_at) / (request.generated - 1)


class VllmMetrics(EngineMetrics):
    """vLLM V1: vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py. Labels model_name, engine."""

    def __init__(self, served: ServedModel) -> None:
        super().__init__(served)
        names = metric_names(EngineKind.VLLM)
        labels = ("model_name", "engine")
        self.labels: Labels = (served.config.served_model_name, "0")
        r = self.registry
        self.running = r.gauge(names.requests_running, "Number of requests in model execution batches.", labels)
        self.waiting = r.gauge(names.requests_waiting, "Number of requests waiting to be processed.", labels)
        self.kv_usage = r.gauge(names.kv_cache_usage, "KV-cache usage. 1 means 100 percent usage.", labels)
        self.preemptions = r.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
                                     labels)
        self.prompt_tokens = r.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", labels)
        self.generation_tokens = r.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
                                           labels)
        self.success = r.counter(names.request_success_total, "Count of successfully processed requests.",
                                 (*labels, "finished_reason"))
        self.ttft = r.histogram(names.time_to_first_token, "Histogram of time to first token in seconds.", labels,
                                VLLM_TTFT_BUCKETS)
        self.itl = r.histogram(names.inter_token_latency, "Histogram of inter-token latency in seconds.", labels,
                               VLLM_ITL_BUCKETS)
        self.tpot = r.histogram("vllm:request_time_per_output_token_seconds",
                                "Histogram of time_per_output_token_seconds per request.", labels, VLLM_ITL_BUCKETS)
        self.e2e = r.histogram(names.e2e_request_latency, "Histogram of e2e request latency in seconds.", labels,
                               VLLM_REQUEST_LATENCY_BUCKETS)
        assert names.request_queue_time is not None
        self.queue = r.histogram(names.request_queue_time, "Histogram of time spent in WAITING phase for request.",
                                 labels, VLLM_REQUEST_LATENCY_BUCKETS)
        # The phases after the queue (vllm/v1/metrics/stats.py FinishedRequestStats, observed at finish):
        # prefill = first token − scheduled, decode = last token − first token, inference = last token − scheduled.
        assert names.request_prefill_time and names.request_inference_time
        self.prefill = r.histogram(names.request_prefill_time, "Histogram of time spent in PREFILL phase for request.",
                                   labels, VLLM_REQUEST_LATENCY_BUCKETS)
        self.decode = r.histogram("vllm:request_decode_time_seconds",
                                  "Histogram of time spent in DECODE phase for request.", labels,
                                  VLLM_REQUEST_LATENCY_BUCKETS)
        self.inference = r.histogram(names.request_inference_time,
                                     "Histogram of time spent in RUNNING phase for request.", labels,
                                     VLLM_REQUEST_LATENCY_BUCKETS)
        for family in (self.running, self.waiting, self.kv_usage, self.preemptions, self.prompt_tokens,
                       self.generation_tokens):
            family.touch(self.labels)
        for reason in VLLM_FINISH_REASONS:
            self.success.touch((*self.labels, reason))
        for histogram in (self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.prefill, self.decode,
                          self.inference):
            histogram.touch(self.labels)
        self.speculating = served.k > 0
        if self.speculating:
            # Only a speculating engine registers these (SpecDecodingProm does nothing without a config).
            assert names.drafts_total and names.draft_tokens_total and names.accepted_tokens_total
            assert names.accepted_tokens_per_pos_total and names.position_label
            self.drafts = r.counter(names.drafts_total, "Number of spec decoding drafts.", labels)
            self.draft_tokens = r.counter(names.draft_tokens_total, "Number of draft tokens.", labels)
            self.accepted = r.counter(names.accepted_tokens_total, "Number of accepted tokens.", labels)
            self.per_position = r.counter(names.accepted_tokens_per_pos_total,
                                          "Accepted tokens per draft position.", (*labels, names.position_label))
            for family in (self.drafts, self.draft_tokens, self.accepted):
                family.touch(self.labels)
            for position in range(served.k):
                self.per_position.touch((*self.labels, str(position)))

    def on_first_token(self, request: SimRequest, now: float) -> None:
        self.ttft.observe(self.labels, now - request.arrival)
        self.prompt_tokens.inc(self.labels, request.prompt_tokens)
        self.generation_tokens.inc(self.labels, 1)

    def on_tokens(self, request: SimRequest, count: int, interval: float, now: float) -> None:
        self.itl.observe(self.labels, interval)
        self.generation_tokens.inc(self.labels, count)

    def on_drafts(self, drafted: int, accepted: int, k: int) -> None:
        self.drafts.inc(self.labels)
        self.draft_tokens.inc(self.labels, drafted)
        self.accepted.inc(self.labels, accepted)
        for position in range(accepted):
            self.per_position.inc((*self.labels, str(position)))

    def on_finished(self, request: SimRequest, now: float) -> None:
        self.success.inc((*self.labels, request.finish_reason))
        if request.aborted:
            return
        self.e2e.observe(self.labels, now - request.arrival)
        scheduled = request.scheduled_at if request.scheduled_at is not None else now
        first = request.first_token_at if request.first_token_at is not None else now
        self.queue.observe(self.labels, scheduled - request.arrival)
        self.prefill.observe(self.labels, first - scheduled)
        self.decode.observe(self.labels, now - first)
        self.inference.observe(self.labels, now - scheduled)
        tpot = _tpot(request)
        if tpot is not None:
            self.tpot.observe(self.labels, tpot)

    def on_preempted(self, request: SimRequest) -> None:
        self.preemptions.inc(self.labels)

    def on_step(self, engine: Engine, step: Step, now: float) -> None:
        self.on_idle(engine)

    def on_idle(self, engine: Engine) -> None:
        self.running.set(self.labels, len(engine.running))
        self.waiting.set(self.labels, len(engine.waiting))
        self.kv_usage.set(self.labels, engine.kv_usage())


class SglangMetrics(EngineMetrics):
    """SGLang with --enable-metrics: sglang/srt/observability/metrics_collector.py. Scheduler metrics carry
    model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; tokenizer metrics model_name and engine_type."""

    def __init__(self, served: ServedModel) -> None:
        super().__init__(served)
        names = metric_names(EngineKind.SGLANG)
        name = served.config.served_model_name
        scheduler = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
        tokenizer = ("model_name", "engine_type")
        self.scheduler_labels: Labels = (name, "unified", "0", "0", "0")
        self.labels: Labels = (name, "unified")
        r = self.registry
        self.running = r.gauge(names.requests_running, "The number of running requests.", scheduler)
        self.queued = r.gauge(names.requests_waiting, "The number of requests in the waiting queue.", scheduler)
        self.token_usage = r.gauge(names.kv_cache_usage, "The token usage.", scheduler)
        assert names.acceptance_length_gauge and names.acceptance_rate_gauge and names.request_queue_time
        self.accept_length = r.gauge(names.acceptance_length_gauge,
                                     "The average acceptance length of speculative decoding.", scheduler)
        self.accept_rate = r.gauge(names.acceptance_rate_gauge,
                                   "The average acceptance rate of speculative decoding "
                                   "(`accepted tokens / total draft tokens` in batch).", scheduler)
        self.queue = r.histogram(names.request_queue_time, "Histogram of queueing time in seconds.", scheduler,
                                 SGLANG_QUEUE_BUCKETS)
        self.prompt_tokens = r.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", tokenizer)
        self.generation_tokens = r.counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                           tokenizer)
        self.requests = r.counter(names.request_success_total, "Number of requests processed.", tokenizer)
        self.aborted = r.counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tokenizer)
        self.ttft = r.histogram(names.time_to_first_token, "Histogram of time to first token in seconds.", tokenizer,
                                SGLANG_TTFT_BUCKETS)
        self.itl = r.histogram(names.inter_token_latency, "Histogram of inter-token latency in seconds.", tokenizer,
                               SGLANG_ITL_BUCKETS)
        self.e2e = r.histogram(names.e2e_request_latency, "Histogram of End-to-end request latency in seconds",
                               tokenizer, SGLANG_E2E_BUCKETS)
        for family in (self.running, self.queued, self.token_usage, self.accept_length, self.accept_rate):
            family.touch(self.scheduler_labels)
        for counter in (self.prompt_tokens, self.generation_tokens, self.requests, self.aborted):
            counter.touch(self.labels)
        self.queue.touch(self.scheduler_labels)
        for histogram in (self.ttft, self.itl, self.e2e):
            histogram.touch(self.labels)
        self._window: deque[tuple[int, int, int]] = deque(maxlen=SGLANG_DECODE_LOG_INTERVAL)
        self._verifies = self._accepted = self._drafted = 0

    def on_first_token(self, request: SimRequest, now: float) -> None:
        self.ttft.observe(self.labels, now - request.arrival)
        self.queue.observe(self.scheduler_labels, (request.scheduled_at or now) - request.arrival)

    def on_tokens(self, request: SimRequest, count: int, interval: float, now: float) -> None:
        if count > 0:
            self.itl.observe(self.labels, interval / count, weight=count, total=interval)

    def on_drafts(self, drafted: int, accepted: int, k: int) -> None:
        self._verifies += 1
        self._drafted += drafted
        self._accepted += accepted

    def recent_accept_length(self) -> float | None:
        """The accept length over the last decode batches (what sglang:spec_accept_length shows), for
        /server_info's avg_spec_accept_length; None before any verify."""
        verifies = sum(item[0] for item in self._window)
        return 1.0 + sum(item[1] for item in self._window) / verifies if verifies else None

    def on_finished(self, request: SimRequest, now: float) -> None:
        if request.aborted:
            self.aborted.inc(self.labels)
            return
        self.prompt_tokens.inc(self.labels, request.prompt_tokens)
        self.generation_tokens.inc(self.labels, request.generated)
        self.requests.inc(self.labels)
        self.e2e.observe(self.labels, now - request.arrival)

    def on_step(self, engine: Engine, step: Step, now: float) -> None:
        if self._verifies:
            self._window.append((self._verifies, self._accepted, self._drafted))
            self._verifies = self._accepted = self._drafted = 0
            verifies = sum(item[0] for item in self._window)
            accepted = sum(item[1] for item in self._window)
            drafted = sum(item[2] for item in self._window)
            self.accept_length.set(self.scheduler_labels, 1.0 + accepted / verifies)
            self.accept_rate.set(self.scheduler_labels, accepted / drafted if drafted else 0.0)
        self.on_idle(engine)

    def on_idle(self, engine: Engine) -> None:
        self.running.set(self.scheduler_labels, len(engine.running))
        self.queued.set(self.scheduler_labels, len(engine.waiting))
        self.token_usage.set(self.scheduler_labels, engine.kv_usage())


class TrtllmMetrics(EngineMetrics):
    """TensorRT-LLM with return_perf_metrics: tensorrt_llm/metrics/collector.py. Labels model_name,
    engine_type; per-position speculative counters add token_position."""

    def __init__(self, served: ServedModel) -> None:
        super().__init__(served)
        names = metric_names(EngineKind.TRTLLM)
        labels = ("model_name", "engine_type")
        self.labels: Labels = (served.config.served_model_name, "trtllm")
        r = self.registry
        self.success = r.counter(names.request_success_total, "Count of successfully processed requests.",
                                 (*labels, "finished_reason"))
        self.e2e = r.histogram(names.e2e_request_latency, "Histogram of end to end request latency in seconds.",
                               labels, TRTLLM_REQUEST_LATENCY_BUCKETS)
        self.ttft = r.histogram(names.time_to_first_token, "Histogram of time to first token in seconds.", labels,
                                TRTLLM_TTFT_BUCKETS)
        self.tpot = r.histogram(names.inter_token_latency, "Histogram of time per output token in seconds.", labels,
                                TRTLLM_TPOT_BUCKETS)
        assert names.request_queue_time is not None
        self.queue = r.histogram(names.request_queue_time, "Histogram of time spent in WAITING phase for request.",
                                 labels, TRTLLM_REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = r.counter("trtllm_prompt_tokens_total",
                                       "Cumulative number of prompt (input) tokens processed.", labels)
        self.generation_tokens = r.counter("trtllm_generation_tokens_total",
                                           "Cumulative number of generation (output) tokens produced.", labels)
        self.kv_usage = r.gauge(names.kv_cache_usage, "KV cache utilization", labels)
        self.running = r.gauge(names.requests_running, "Number of active requests", labels)
        self.waiting = r.gauge(names.requests_waiting, "Number of queued requests", labels)
        for family in (self.prompt_tokens, self.generation_tokens, self.kv_usage, self.running, self.waiting):
            family.touch(self.labels)
        self.speculating = served.k > 0
        if self.speculating:
            assert names.draft_tokens_total and names.accepted_tokens_total and names.acceptance_length_gauge
            assert names.accepted_tokens_per_pos_total and names.position_label
            self.draft_tokens = r.counter(names.draft_tokens_total,
                                          "Total number of draft tokens in speculative decoding", labels)
            self.accepted = r.counter(names.accepted_tokens_total,
                                      "Total number of accepted tokens in speculative decoding", labels)
            self.accept_length = r.gauge(names.acceptance_length_gauge, "Acceptance length in speculative decoding",
                                         labels)
            self.drafted_per_position = r.counter("trtllm_spec_decode_drafted_tokens_total",
                                                  "Total drafted tokens per speculative decoding position.",
                                                  (*labels, names.position_label))
            self.accepted_per_position = r.counter(names.accepted_tokens_per_pos_total,
                                                   "Total accepted tokens per speculative decoding position.",
                                                   (*labels, names.position_label))
            for family in (self.draft_tokens, self.accepted, self.accept_length):
                family.touch(self.labels)
            for position in range(served.k):
                self.drafted_per_position.touch((*self.labels, str(position)))
                self.accepted_per_position.touch((*self.labels, str(position)))
        self._step_verifies = self._step_accepted = 0

    def on_drafts(self, drafted: int, accepted: int, k: int) -> None:
        self.draft_tokens.inc(self.labels, drafted)
        self.accepted.inc(self.labels, accepted)
        for position in range(k):
            self.drafted_per_position.inc((*self.labels, str(position)))
        for position in range(accepted):
            self.accepted_per_position.inc((*self.labels, str(position)))
        self._step_verifies += 1
        self._step_accepted += accepted

    def on_finished(self, request: SimRequest, now: float) -> None:
        self.success.inc((*self.labels, request.finish_reason))
        if request.aborted:
            return
        self.e2e.observe(self.labels, now - request.arrival)
        self.ttft.observe(self.labels, (request.first_token_at or now) - request.arrival)
        self.queue.observe(self.labels, (request.scheduled_at or now) - request.arrival)
        tpot = _tpot(request)
        if tpot is not None:
            self.tpot.observe(self.labels, tpot)
        self.prompt_tokens.inc(self.labels, request.prompt_tokens)
        self.generation_tokens.inc(self.labels, request.generated)

    def on_step(self, engine: Engine, step: Step, now: float) -> None:
        if self.speculating and self._step_verifies:
            self.accept_length.set(self.labels, 1.0 + self._step_accepted / self._step_verifies)
            self._step_verifies = self._step_accepted = 0
        self.on_idle(engine)

    def on_idle(self, engine: Engine) -> None:
        self.running.set(self.labels, len(engine.running))
        self.waiting.set(self.labels, len(engine.waiting))
        self.kv_usage.set(self.labels, engine.kv_usage())


def engine_metrics(served: ServedModel) -> EngineMetrics:
    """The metrics of the engine `served` runs as."""
    kinds: dict[EngineKind, type[EngineMetrics]] = {
        EngineKind.VLLM: VllmMetrics, EngineKind.SGLANG: SglangMetrics, EngineKind.TRTLLM: TrtllmMetrics,
    }
    return kinds[served.config.kind](served)
