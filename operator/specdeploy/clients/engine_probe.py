"""Send a probe's requests to one engine and read each answer's speculative counts (judgment/probe.py).

    async with httpx.AsyncClient() as http:
        outcomes = await send_probe(http, "http://10.0.0.7:8000", "llama", requests, budget, deadline_seconds=120)

One request at a time, no faster than the budget's rate, and never past the deadline: a probe takes at most
`budget.requests_per_second` of the pod's capacity and stops by itself. An engine error, a timeout or an
answer without counts is an outcome with its reason, never an exception: the caller reports it.

Counts come from each answer's `metrics.speculative_decoding` (vLLM with `--per-request-spec-decode-metrics`).
Given the engine's counter names, an engine without it is measured by the difference of its spec-decode
counters on /metrics around each request instead — exact only while nothing else is served by that pod
(one request at a time keeps the probe's own requests apart). The first answer decides which.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.engines.base import MetricNames
from specdeploy.judgment.probe import (
    ProbeBudget,
    ProbeOutcome,
    ProbeRequest,
    SpecDecodeCounts,
    probe_requests,
)

REQUEST_TIMEOUT_SECONDS = 60.0


class EngineUnreachable(Exception):
    """The URL answers no OpenAI `/v1/models`: nothing was sent."""


async def served_model(http: httpx.AsyncClient, base_url: str) -> str:
    """The model the engine serves, from `/v1/models` (the name probe requests must send)."""
    try:
        response = await http.get(f"{base_url.rstrip('/')}/v1/models", timeout=30)
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
        raise EngineUnreachable(f"{base_url} does not answer /v1/models as an OpenAI server does: "
                                f"{type(error).__name__}: {error}") from error


async def run_probe(http: httpx.AsyncClient, base_url: str, workloads: dict[str, list[str]],
                    temperatures: Sequence[float], budget: ProbeBudget, deadline_seconds: float,
                    counters: MetricNames | None = None,
                    on_outcome: Callable[[ProbeOutcome], None] | None = None) -> tuple[str, list[ProbeOutcome]]:
    """The served model and the outcome of every request of the probe (`specdeploy probe` and the operator's);
    `on_outcome` sees each as it comes (the CLI's progress)."""
    model = await served_model(http, base_url)
    requests = probe_requests(workloads, temperatures, budget)
    return model, await send_probe(http, base_url, model, requests, budget, deadline_seconds, counters=counters,
                                   on_outcome=on_outcome)


async def send_probe(http: httpx.AsyncClient, base_url: str, model: str, requests: Sequence[ProbeRequest],
                     budget: ProbeBudget, deadline_seconds: float,
                     counters: MetricNames | None = None,
                     on_outcome: Callable[[ProbeOutcome], None] | None = None) -> list[ProbeOutcome]:
    """The outcome of each request sent, in order; requests left when the deadline comes are not sent.
    `counters`: the engine's metric names, to fall back on counter deltas (see the module docstring)."""
    outcomes: list[ProbeOutcome] = []
    started = time.monotonic()
    gap = 1.0 / budget.requests_per_second
    per_answer: bool | None = None if counters is not None else True
    for index, request in enumerate(requests):
        due = started + index * gap
        if due >= started + deadline_seconds:
            break
        await asyncio.sleep(max(0.0, due - time.monotonic()))   # the rate limit, not a wait for a condition
        left = started + deadline_seconds - time.monotonic()
        if left <= 0:
            break
        timeout = min(left, REQUEST_TIMEOUT_SECONDS)
        before = await _counter_totals(http, base_url, counters, timeout) if not per_answer and counters else None
        outcome = await _one(http, base_url, model, request, budget, timeout)
        if outcome.counts is not None:
            per_answer = True
        elif before is not None and outcome.error == NO_COUNTS:
            after = await _counter_totals(http, base_url, counters, timeout)
            delta = after - before if after is not None else None
            if delta is not None and min(delta.steps, delta.drafted, delta.accepted) >= 0:
                per_answer = False
                outcome = ProbeOutcome(request, delta, from_counters=True)
            elif delta is not None:
                outcome = ProbeOutcome(request, error="the engine's spec-decode counters went back (did it restart?)")
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


NO_COUNTS = "the answer has no metrics.speculative_decoding (is --per-request-spec-decode-metrics set?)"


async def _one(http: httpx.AsyncClient, base_url: str, model: str, request: ProbeRequest, budget: ProbeBudget,
               timeout: float) -> ProbeOutcome:
    body = {"model": model, "prompt": request.prompt, "max_tokens": budget.max_tokens,
            "temperature": request.temperature, "n": 1, "stream": False}
    try:
        response = await http.post(f"{base_url.rstrip('/')}/v1/completions", json=body, timeout=timeout)
    except httpx.HTTPError as error:
        return ProbeOutcome(request, error=f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
    if response.status_code != 200:
        return ProbeOutcome(request, error=f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        answer = response.json()
    except ValueError:
        return ProbeOutcome(request, error="the answer is not JSON")
    counts = SpecDecodeCounts.from_response(answer) if isinstance(answer, dict) else None
    if counts is None:
        return ProbeOutcome(request, error=NO_COUNTS)
    return ProbeOutcome(request, counts)


async def _counter_totals(http: httpx.AsyncClient, base_url: str, names: MetricNames | None,
                          timeout: float) -> SpecDecodeCounts | None:
    """The engine's drafts, drafted tokens and accepted tokens so far (summed over its label sets), from
    its /metrics; None when it cannot be read or lacks one of them."""
    if names is None or not (names.drafts_total and names.draft_tokens_total and names.accepted_tokens_total):
        return None
    try:
        response = await http.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    wanted = (names.drafts_total, names.draft_tokens_total, names.accepted_tokens_total)
    totals = dict.fromkeys(wanted, 0.0)
    seen: set[str] = set()
    try:
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
                    seen.add(sample.name)
    except ValueError:
        return None
    if seen != set(wanted):
        return None
    return SpecDecodeCounts(*(int(totals[name]) for name in wanted))
