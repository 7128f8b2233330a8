"""Send a probe's requests to one engine and read each answer's speculative counts (judgment/probe.py).

    async with httpx.AsyncClient() as client:
        outcomes = await send_probe(client, "http://10.0.0.7:8000", "llama", requests, budget, deadline_seconds=120)

One request at a time, no faster than the budget's rate, and never past the deadline: a probe takes at most
`budget.requests_per_second` of the pod's capacity and stops by itself. An engine error, a timeout or an
answer without counts is an outcome with its reason, never an exception: the caller reports it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from specdeploy.judgment.probe import ProbeBudget, ProbeOutcome, ProbeRequest, SpecDecodeCounts

REQUEST_TIMEOUT_SECONDS = 60.0


async def send_probe(client: httpx.AsyncClient, base_url: str, model: str, requests: Sequence[ProbeRequest],
                     budget: ProbeBudget, deadline_seconds: float) -> list[ProbeOutcome]:
    """The outcome of each request sent, in order; requests left when the deadline comes are not sent."""
    outcomes: list[ProbeOutcome] = []
    started = time.monotonic()
    gap = 1.0 / budget.requests_per_second
    for index, request in enumerate(requests):
        due = started + index * gap
        if due >= started + deadline_seconds:
            break
        await asyncio.sleep(max(0.0, due - time.monotonic()))   # the rate limit, not a wait for a condition
        left = started + deadline_seconds - time.monotonic()
        if left <= 0:
            break
        outcomes.append(await _one(client, base_url, model, request, budget, min(left, REQUEST_TIMEOUT_SECONDS)))
    return outcomes


async def _one(client: httpx.AsyncClient, base_url: str, model: str, request: ProbeRequest, budget: ProbeBudget,
               timeout: float) -> ProbeOutcome:
    body = {"model": model, "prompt": request.prompt, "max_tokens": budget.max_tokens,
            "temperature": request.temperature, "n": 1, "stream": False}
    try:
        response = await client.post(f"{base_url.rstrip('/')}/v1/completions", json=body, timeout=timeout)
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
        return ProbeOutcome(request, error="the answer has no metrics.speculative_decoding "
                                           "(is --per-request-spec-decode-metrics set?)")
    return ProbeOutcome(request, counts)
