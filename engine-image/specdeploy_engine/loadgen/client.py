"""Send a planned workload to OpenAI-compatible servers, open loop, and time every streamed answer.

    report = await send_workload(["http://127.0.0.1:8000"], workload.plan(60, seed=1), duration=60)

Open loop: each request leaves at its planned time whether or not earlier ones have answered (a closed
loop would slow down with the server and hide its queueing). Targets are chosen round-robin or at random,
as a Kubernetes Service spreads connections. Requests stream (`stream: true` with usage), so the client
sees the first token and every chunk; with `stream=False` each answer comes whole, so only the end-to-end
latency is measured, and a high request rate costs the client one response per request instead of one
event per token.
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

import httpx

from specdeploy_engine.loadgen.report import LoadReport, RequestRecord
from specdeploy_engine.loadgen.workload import PlannedRequest

PROMPT_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett")


def prompt_text(tokens: int, rng: random.Random, words: Sequence[str] = PROMPT_WORDS) -> str:
    """A prompt of `tokens` words drawn from `words`: the simulator counts one token per word, real engines a
    little more. `words` from a real model's vocabulary make prompts it continues as a test needs (the dev
    cluster's stand-in models: standins.half_words)."""
    return " ".join(rng.choice(words) for _ in range(max(1, tokens)))


async def discover_model(client: httpx.AsyncClient, target: str) -> str:
    """The first model id a server lists at /v1/models."""
    response = await client.get(f"{target}/v1/models", timeout=10.0)
    response.raise_for_status()
    data = response.json().get("data") or []
    if not data:
        raise RuntimeError(f"{target}/v1/models lists no model")
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


async def send_one(client: httpx.AsyncClient, target: str, model: str, planned: PlannedRequest, *, chat: bool,
                   start: float, rng: random.Random, stream: bool = True,
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
        if not stream:
            response = await client.post(target + path, json=body)
            record.status = response.status_code
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return record
            record.output_tokens = int((response.json().get("usage") or {}).get("completion_tokens") or 0)
            record.e2e = time.monotonic() - sent
            return record
        async with client.stream("POST", target + path, json=body) as response:
            record.status = response.status_code
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:200]
                record.error = f"HTTP {response.status_code}: {detail}"
                return record
            async for line in response.aiter_lines():
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
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as error:
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
    max_connections: int = 1000,
    stream: bool = True,
    stop: threading.Event | None = None,
    prompt_words: Sequence[str] = PROMPT_WORDS,
) -> LoadReport:
    """Send `planned` (offsets in seconds) to `targets` and wait at most `drain_seconds` after `duration`
    for the answers still coming. Setting `stop` (from any thread) ends sending at the next request; the
    answers under way get `drain_seconds` as after `duration`. Prompts are words drawn from `prompt_words`."""
    if not targets:
        raise ValueError("at least one target URL is needed")
    if balance not in ("round-robin", "random"):
        raise ValueError(f"balance must be round-robin or random, got {balance!r}")
    bases = [target.rstrip("/") for target in targets]
    rng = random.Random(f"client:{seed}")
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        models = {base: model or await discover_model(client, base) for base in bases}
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
                client, base, models[base], item, chat=chat, start=start, rng=random.Random(rng.random()),
                stream=stream, prompt_words=prompt_words)))
        remaining = max(0.0, duration - (time.monotonic() - start)) + drain_seconds
        if stop is not None and stop.is_set():
            remaining = drain_seconds   # the answers under way may still come; cancelling them leaks sockets
        done, pending = await asyncio.wait(tasks, timeout=remaining) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        records = sorted((task.result() for task in done), key=lambda record: record.sent_at)
        elapsed = time.monotonic() - start
    return LoadReport.from_records(records, duration=elapsed, unfinished=len(pending))
