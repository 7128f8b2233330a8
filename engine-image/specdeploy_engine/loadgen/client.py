"""Send a planned workload to OpenAI-compatible servers, open loop, and time every streamed answer.

    report = await send_workload(["http://127.0.0.1:8000"], workload.plan(60, seed=1), duration=60)

Open loop: each request leaves at its planned time whether or not earlier ones have answered (a closed
loop would slow down with the server and hide its queueing). Targets are chosen round-robin or at random,
as a Kubernetes Service spreads connections. Requests stream (`stream: true` with usage), so the client
sees the first token and every chunk; with `stream=False` each answer comes whole, so only the end-to-end
latency is measured, and a high request rate costs the client one response per request instead of one
event per token.

The HTTP client is aiohttp: an open loop holds one connection per request under way (hundreds at a high
rate against slow answers), and aiohttp's connector hands them out in constant time. httpx's pool
(httpcore 1.0) walks its connections for each of its connections whenever a request is added or ends. At 50
requests/s for 60 s against two simulated 70B pods (~1000 connections) the httpx client spent 87 s of CPU in
130 s (cProfile: 121 of 142 s in httpcore's `_assign_requests_to_connections`), fell 36 s behind its plan,
sent nothing for up to 7 s at a time while the pods drained, and 132 requests failed on ConnectTimeout; the
aiohttp client spent 4 s of CPU, was at most 0.16 s behind, and none failed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from specdeploy_engine.loadgen.report import LoadReport, RequestRecord
from specdeploy_engine.loadgen.workload import PlannedRequest

PROMPT_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett")
#: Connections open at once, at most; a request beyond them waits for one in the client (no longer open loop).
MAX_CONNECTIONS = 1000
CONNECT_SECONDS = 10.0
STOP_POLL_SECONDS = 0.25
#: What a request can fail with, as recorded (never raised).
REQUEST_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


class TargetUnreachable(RuntimeError):
    """A target did not name its model at /v1/models: refused, timed out, answered an error or listed none."""


def prompt_text(tokens: int, rng: random.Random, words: Sequence[str] = PROMPT_WORDS) -> str:
    """A prompt of `tokens` words drawn from `words`: the simulator counts one token per word, real engines a
    little more. `words` from a real model's vocabulary make prompts it continues as a test needs (the dev
    cluster's stand-in models: standins.half_words)."""
    return " ".join(rng.choice(words) for _ in range(max(1, tokens)))


async def discover_model(session: aiohttp.ClientSession, target: str) -> str:
    """The first model id a server lists at /v1/models; TargetUnreachable when it lists none or cannot be asked."""
    try:
        async with session.get(f"{target}/v1/models", timeout=aiohttp.ClientTimeout(total=10.0)) as response:
            body = await response.read()
            if response.status != 200:
                raise TargetUnreachable(f"{target}/v1/models answered HTTP {response.status}")
            data = json.loads(body).get("data") or []
    except REQUEST_ERRORS as error:     # JSONDecodeError is a ValueError
        raise TargetUnreachable(f"{target}/v1/models: {type(error).__name__}: {error}") from error
    if not data:
        raise TargetUnreachable(f"{target}/v1/models lists no model")
    return str(data[0]["id"])


def _body(planned: PlannedRequest, model: str, chat: bool, stream: bool, rng: random.Random,
          prompt_words: Sequence[str]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "max_tokens": planned.output_tokens, "temperature": planned.temperature,
        "stream": stream, "ignore_eos": True,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    text = prompt_text(planned.prompt_tokens, rng, prompt_words)
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


async def send_one(session: aiohttp.ClientSession, target: str, model: str, planned: PlannedRequest, *,
                   chat: bool, start: float, rng: random.Random, stream: bool = True,
                   prompt_words: Sequence[str] = PROMPT_WORDS) -> RequestRecord:
    """One request, streamed or not; never raises (failures are recorded)."""
    record = RequestRecord(target=target, sent_at=time.monotonic() - start, prompt_tokens=planned.prompt_tokens,
                           max_tokens=planned.output_tokens, temperature=planned.temperature)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    sent = time.monotonic()
    last: float | None = None
    words = 0
    body = _body(planned, model, chat, stream, rng, prompt_words)
    try:
        async with session.post(target + path, json=body) as response:
            record.status = response.status
            if response.status != 200:
                detail = (await response.read()).decode(errors="replace")[:200]
                record.error = f"HTTP {response.status}: {detail}"
                return record
            if not stream:
                answer = json.loads(await response.read())
                record.output_tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
                record.e2e = time.monotonic() - sent
                return record
            async for raw in response.content:          # one server-sent-event line at a time
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                now = time.monotonic()
                usage = chunk.get("usage")
                if usage:
                    record.output_tokens = int(usage.get("completion_tokens") or 0)
                text = _chunk_text(chunk)
                if not text:
                    continue
                words += len(text.split())
                if last is None:
                    record.ttft = now - sent
                else:
                    record.chunk_gaps.append(now - last)
                last = now
        record.e2e = time.monotonic() - sent
        record.output_tokens = record.output_tokens or words
    except REQUEST_ERRORS as error:
        record.error = f"{type(error).__name__}: {error}"
    return record


async def send_workload(
    targets: Sequence[str],
    planned: Sequence[PlannedRequest],
    *,
    duration: float,
    model: str | None = None,
    chat: bool = False,
    balance: str = "round-robin",
    seed: int = 0,
    drain_seconds: float = 60.0,
    max_connections: int = MAX_CONNECTIONS,
    stream: bool = True,
    stop: threading.Event | None = None,
    stop_drain_seconds: float | None = None,
    prompt_words: Sequence[str] = PROMPT_WORDS,
) -> LoadReport:
    """Send `planned` (offsets in seconds) to `targets` and wait at most `drain_seconds` after `duration`
    for the answers still coming; those still under way then are cancelled and counted unfinished. Setting
    `stop` (from any thread) ends sending at the next request, and cuts the wait for answers to
    `stop_drain_seconds` (default `drain_seconds`) from then. Prompts are words drawn from `prompt_words`.
    At most `max_connections` requests are under way at once (over all targets); more wait for one.
    Raises TargetUnreachable when `model` is None and a target does not name its model."""
    if not targets:
        raise ValueError("at least one target URL is needed")
    if balance not in ("round-robin", "random"):
        raise ValueError(f"balance must be round-robin or random, got {balance!r}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
    after_stop = drain_seconds if stop_drain_seconds is None else stop_drain_seconds
    bases = [target.rstrip("/") for target in targets]
    rng = random.Random(f"client:{seed}")
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    # No total or read limit: an answer takes as long as the server's queue makes it (the drain bounds the run).
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=CONNECT_SECONDS, sock_read=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        models = {base: model or await discover_model(session, base) for base in bases}
        cycle = itertools.cycle(bases)
        start = time.monotonic()
        tasks: list[asyncio.Task[RequestRecord]] = []
        for item in planned:
            if item.at >= duration or (stop is not None and stop.is_set()):
                break
            delay = item.at - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            base = next(cycle) if balance == "round-robin" else rng.choice(bases)
            tasks.append(asyncio.create_task(send_one(
                session, base, models[base], item, chat=chat, start=start, rng=random.Random(rng.random()),
                stream=stream, prompt_words=prompt_words)))
        deadline = start + max(duration, time.monotonic() - start) + drain_seconds
        pending: set[asyncio.Task[RequestRecord]] = set(tasks)
        while pending:
            now = time.monotonic()
            if stop is not None and stop.is_set():
                deadline = min(deadline, now + after_stop)
                stop = None                 # seen: the deadline is set from the moment it was
            if now >= deadline:
                break
            # Woken every 0.25 s to see a stop set meanwhile.
            wait = deadline - now if stop is None else min(deadline - now, STOP_POLL_SECONDS)
            _, pending = await asyncio.wait(pending, timeout=wait)
        for task in pending:    # cancelled, not left running: each would hold its socket open
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        records = sorted((task.result() for task in tasks if task not in pending), key=lambda record: record.sent_at)
        elapsed = time.monotonic() - start
    return LoadReport.from_records(records, duration=elapsed, unfinished=len(pending))
