"""The engine core: a queue, continuous batching, chunked prefill, speculative steps, on any clock.

    engine = Engine(served, seed=7)
    engine.add(SimRequest("r1", arrival=0.0, prompt_tokens=200, output_tokens=128), now=0.0)
    step = engine.plan_step(now=0.0)          # what runs next and how long it takes (model seconds)
    engine.complete_step(step, now=step.seconds)

The core never reads a clock: a driver calls `plan_step(now)`, lets `step.seconds` pass (virtually in
sim/virtual.py, asyncio.sleep in sim/server.py) and calls `complete_step(step, now)`. Scheduling follows
vLLM V1: running sequences first (each decoding one takes 1 + k tokens of the step's budget, a
prefilling one the next chunk of its prompt), then waiting requests in arrival order while there are
sequence slots, KV cache and token budget. When the KV cache runs out the newest running request is
preempted and recomputed later, as vLLM does. How many tokens a step verifies and drafts is the engine's
k schedule's (sim/schedule.py): k itself, or what vLLM's and TensorRT-LLM's tables by batch size or SGLang's
adaptive tiers give.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from specdeploy_engine.sim.engines import SIMULATED_ENGINES
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import ServedModel, StepShape, alpha_at
from specdeploy_engine.sim.schedule import draft_schedule

BLOCK_TOKENS = 16   # KV cache page size (vLLM's default block_size)


class Observer(Protocol):
    """What the core reports; sim/metrics.py turns it into each engine's Prometheus metrics."""

    def on_first_token(self, request: SimRequest, now: float) -> None: ...
    def on_tokens(self, request: SimRequest, count: int, interval: float, now: float) -> None: ...
    def on_drafts(self, drafted: int, accepted: int, k: int) -> None: ...
    def on_finished(self, request: SimRequest, now: float) -> None: ...
    def on_step(self, engine: Engine, step: Step, now: float) -> None: ...
    def on_preempted(self, request: SimRequest) -> None: ...


@dataclass
class RequestSpecDecodeStats:
    """One request's own speculation: how many verify steps accepted j drafted tokens (histogram[j], j = 0
    … k), the tokens drafted, and with `detailed` the accepted/drafted count of each step in order. What
    vLLM's scheduler accumulates per request under --per-request-spec-decode-metrics (RequestSpecDecodeMetrics
    in vllm/v1/metrics/stats.py); sim/openai_api.py writes it as the response's metrics.speculative_decoding.
    The counts are those reported to the observer (the Prometheus spec_decode counters), step by step."""

    num_spec_tokens: int
    detailed: bool = False
    histogram: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.num_spec_tokens + 1)

    def observe(self, drafted: int, accepted: int) -> None:
        self.histogram[accepted] += 1
        self.num_draft_tokens += drafted
        if self.detailed:
            self.per_step_accepted.append(accepted)
            self.per_step_drafted.append(drafted)

    @property
    def num_spec_steps(self) -> int:
        return sum(self.histogram)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(j * count for j, count in enumerate(self.histogram))


@dataclass(eq=False)
class SimRequest:
    """One generation request and its progress."""

    id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int                         # tokens to generate before finishing
    temperature: float = 0.0
    finish_reason: str = "length"              # what it finishes with: length (max_tokens) or stop
    on_output: Callable[[SimRequest, int, bool], None] | None = None   # (request, new tokens, finished)
    text: str = ""                             # the prompt's text, which the workloadAcceptance knob reads
    # progress (the core's)
    prefilled: int = 0
    prefill_target: int = 0                   # prompt (plus generated tokens after a preemption)
    generated: int = 0
    acceptance_offset: float = 0.0             # this request's draw of the noise knob
    alpha_for_rate: float = -1.0               # the acceptance rate log_alpha was computed for
    log_alpha: float = 0.0
    workload_table: dict[str, float] | None = None   # the workloadAcceptance mapping workload_rate is from
    workload_rate: float | None = None         # its rate for this prompt; None: no marker matched
    spec_stats: RequestSpecDecodeStats | None = None   # with --per-request-spec-decode-metrics (vLLM)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    rng: random.Random = field(default_factory=random.Random, repr=False)

    @property
    def context(self) -> int:
        """Tokens in the KV cache once computed: prompt plus generated."""
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def kv_blocks(self) -> int:
        """KV pages held: the whole prompt is reserved at admission (no thrashing on partial prefills),
        then one more token than the context."""
        return -(-(max(self.prefill_target, self.context) + 1) // BLOCK_TOKENS)


@dataclass
class Step:
    """What one engine step runs and how long it takes."""

    decode: list[SimRequest]
    prefill: list[tuple[SimRequest, int]]       # (request, prompt tokens computed this step)
    shape: StepShape
    seconds: float
    started_at: float
    verify_k: int = 0           # drafts each decoding sequence verifies in this step
    draft_k: int = 0            # drafts proposed per sequence in this step (k schedules move it)


class Engine:
    """Continuous batching over a ServedModel. Deterministic for a seed and a request sequence: each
    request draws its acceptance from its own random stream, seeded by the engine seed and its order."""

    def __init__(self, served: ServedModel, *, seed: int = 0, knobs: Knobs | None = None,
                 observer: Observer | None = None) -> None:
        self.served = served
        self.config = served.config
        self.knobs = knobs if knobs is not None else Knobs()
        self.observer = observer
        self.seed = seed
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.kv_capacity_blocks = (served.kv_cache_tokens // BLOCK_TOKENS) if served.kv_cache_tokens else None
        self.num_preemptions = 0
        self._admitted = 0
        self._window = served.timing.target.window if served.timing.target.window_kv_bytes_per_token else 0
        self.schedule = draft_schedule(served.config)

    # --- requests ---------------------------------------------------------------------------------------

    def add(self, request: SimRequest, now: float) -> None:
        """Queue a request (its arrival time is `request.arrival`)."""
        request.rng = random.Random(f"{self.seed}:{self._admitted}")
        self._admitted += 1
        noise = self.knobs.noise
        request.acceptance_offset = request.rng.gauss(0.0, noise) if noise > 0 else 0.0
        request.prefill_target = request.prompt_tokens
        level = self.config.per_request_spec_decode_metrics
        if level != "none" and self.served.k:
            request.spec_stats = RequestSpecDecodeStats(self.served.k, detailed=level == "detailed")
        self.waiting.append(request)

    def abort(self, request: SimRequest, now: float) -> None:
        """The client went away: drop the request wherever it is."""
        if request.finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.aborted = True
        request.finish_reason = "abort"
        request.finished_at = now
        if self.observer is not None:
            self.observer.on_finished(request, now)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def kv_used_blocks(self) -> int:
        return sum(request.kv_blocks for request in self.running)

    def kv_usage(self) -> float:
        """Share of the KV cache in use, as vllm:kv_cache_usage_perc reports it (0 to 1)."""
        if not self.kv_capacity_blocks:
            return 0.0
        return min(1.0, self.kv_used_blocks() / self.kv_capacity_blocks)

    # --- acceptance -------------------------------------------------------------------------------------

    def acceptance_rate(self) -> float | None:
        """The greedy acceptance rate now in force: the knob's, else the model's default."""
        if self.served.k == 0:
            return None
        knob = self.knobs.acceptance
        return knob if knob is not None else self.served.default_acceptance_rate

    def request_rate(self, request: SimRequest, rate: float) -> float:
        """The greedy acceptance rate of one request: its workload's (the workloadAcceptance knob's rate for
        the first marker its prompt contains), else `rate`. The lookup is redone only when the knob changes."""
        table = self.knobs.workload_acceptance
        if not table or not request.text:
            return rate
        if request.workload_table is not table:
            request.workload_table = table
            request.workload_rate = self.knobs.workload_rate(request.text)
        return rate if request.workload_rate is None else request.workload_rate

    def _accepted(self, request: SimRequest, rate: float, k: int) -> int:
        """Drafted tokens accepted this step: a run of successes with probability α, cut at the k drafted
        (drawn by inverting the geometric distribution: one random number per step). α is that of the rate
        at the engine's k (its largest), so a schedule that drafts fewer tokens keeps each position's odds."""
        if request.alpha_for_rate != rate:      # the knob moved, or the request's first draft
            alpha = alpha_at(rate + request.acceptance_offset, self.served.k, request.temperature)
            request.alpha_for_rate = rate
            request.log_alpha = math.log(alpha) if 0.0 < alpha < 1.0 else (0.0 if alpha >= 1.0 else -math.inf)
        log_alpha = request.log_alpha
        if log_alpha == 0.0:
            return k
        if log_alpha == -math.inf:
            return 0
        return min(k, int(math.log(1.0 - request.rng.random()) / log_alpha))

    # --- stepping ---------------------------------------------------------------------------------------

    def plan_step(self, now: float) -> Step | None:
        """Choose what the next step computes (admitting waiting requests) and time it; None when idle."""
        budget = self.config.max_num_batched_tokens
        decode: list[SimRequest] = []
        prefill: list[tuple[SimRequest, int]] = []
        used = self._make_room()
        verify_k = self.schedule.verify_k(self.running)
        verify = self._verify_tokens(verify_k)
        for request in self.running:
            if request.prefilled < request.prefill_target:
                chunk = min(request.prefill_target - request.prefilled, budget)
                if chunk > 0:
                    prefill.append((request, chunk))
                    budget -= chunk
            elif budget >= verify:
                decode.append(request)
                budget -= verify
        self._admit(now, budget, prefill, used)
        if not decode and not prefill:
            return None
        draft_k = self.schedule.draft_k(len(decode) + len(prefill), verify_k)
        window = self._window
        shape = StepShape(
            decode_seqs=len(decode),
            verify_tokens=verify,
            decode_kv_tokens=sum(request.context for request in decode),
            decode_window_kv_tokens=sum(min(window, request.context) for request in decode) if window else 0,
            prefill_tokens=sum(chunk for _, chunk in prefill),
            prefill_kv_tokens=sum(request.prefilled for request, _ in prefill),
            prefill_attention_pairs=sum(chunk * request.prefilled + chunk * chunk // 2 for request, chunk in prefill),
            drafting_seqs=len(decode) + sum(
                1 for request, chunk in prefill if request.prefilled + chunk >= request.prefill_target),
            draft_passes=draft_k,
        )
        seconds = self.served.timing.step_seconds(shape) * self.knobs.hardware_slowdown
        if draft_k == 0 and self.served.k and SIMULATED_ENGINES[self.config.kind].drafter_runs_at_zero_k:
            # vLLM's k = 0 still runs the drafter's forward (vllm#49548) and costs 20-31% over no speculation
            # (vllm#49986): the zeroDraftOverhead knob.
            seconds *= 1.0 + self.knobs.zero_draft_overhead
        seconds += max(0.0, self.knobs.extra_latency_seconds)
        return Step(decode, prefill, shape, seconds, now, verify_k, draft_k)

    def _verify_tokens(self, verify_k: int) -> int:
        """Tokens a decoding sequence feeds the target: the engine's own count at its k (a tree verifies
        more than k + 1), else k + 1 (schedules run chains)."""
        return self.served.verify_tokens if verify_k == self.served.k else verify_k + 1

    def _admit(self, now: float, budget: int, prefill: list[tuple[SimRequest, int]], used: int) -> None:
        capacity = self.kv_capacity_blocks
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            need = -(-(request.prefill_target + 1) // BLOCK_TOKENS)
            if capacity is not None and self.running and used + need + self._headroom() > capacity:
                break
            self.waiting.popleft()
            used += need
            if request.scheduled_at is None:
                request.scheduled_at = now
            self.running.append(request)
            chunk = min(request.prefill_target - request.prefilled, budget)
            prefill.append((request, chunk))
            budget -= chunk

    def _headroom(self) -> int:
        """KV pages kept free at admission: vLLM V0's 1% watermark (BlockSpaceManager watermark=0.01),
        and at least one step's growth of every running sequence, so admissions do not force preemptions."""
        assert self.kv_capacity_blocks is not None
        growth = -(-self.served.verify_tokens // BLOCK_TOKENS)
        return max(self.kv_capacity_blocks // 100, growth * (len(self.running) + 1))

    def _make_room(self) -> int:
        """Preempt the newest running requests while the next tokens would overflow the KV cache; returns
        the KV pages then in use (0 when the cache is unbounded)."""
        capacity = self.kv_capacity_blocks
        if capacity is None:
            return 0
        used = self.kv_used_blocks()
        growth = -(-self.served.verify_tokens // BLOCK_TOKENS)
        while len(self.running) > 1 and used + growth * len(self.running) > capacity:
            victim = self.running.pop()
            used -= victim.kv_blocks
            victim.prefilled = 0
            victim.prefill_target = victim.context
            self.waiting.appendleft(victim)
            self.num_preemptions += 1
            if self.observer is not None:
                self.observer.on_preempted(victim)
        return used

    def complete_step(self, step: Step, now: float) -> list[SimRequest]:
        """Apply a step that ended at `now`: prompts advance, tokens are emitted, requests finish."""
        finished: list[SimRequest] = []
        observer = self.observer
        for request, chunk in step.prefill:
            if request.finished:
                continue
            request.prefilled += chunk
            if request.prefilled >= request.prefill_target and request.first_token_at is None:
                request.first_token_at = now
                request.last_token_at = now
                if observer is not None:
                    observer.on_first_token(request, now)
                self._emit(request, 1, now, finished)
        k = step.verify_k
        rate = self.acceptance_rate() if k else None
        accepted_each: list[int] = []
        for request in step.decode:
            if request.finished:
                continue
            count = 1
            if rate is not None:
                accepted = self._accepted(request, self.request_rate(request, rate), k)
                accepted_each.append(accepted)
                count = accepted + 1
                if request.spec_stats is not None:
                    request.spec_stats.observe(k, accepted)
                if observer is not None:
                    observer.on_drafts(k, accepted, k)
            count = min(count, request.output_tokens - request.generated)
            interval = now - (request.last_token_at if request.last_token_at is not None else now)
            request.last_token_at = now
            if observer is not None:
                observer.on_tokens(request, count, interval, now)
            self._emit(request, count, now, finished)
        self.schedule.observe(accepted_each)
        if finished:
            done = set(map(id, finished))
            self.running = [request for request in self.running if id(request) not in done]
        if observer is not None:
            observer.on_step(self, step, now)
        return finished

    def _emit(self, request: SimRequest, count: int, now: float, finished: list[SimRequest]) -> None:
        request.generated += count
        done = request.generated >= request.output_tokens
        if done:
            request.finished_at = now
            finished.append(request)
            if self.observer is not None:
                self.observer.on_finished(request, now)
        if request.on_output is not None:
            request.on_output(request, count, done)
