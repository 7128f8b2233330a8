"""The probe end to end on loopback: its requests sent to the simulator (vLLM's per-request speculative metrics
on, two workloads with their own acceptance), the answers read, and the cells they make."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
from simulated import simulator_on_loopback

from specdeploy.api.spec import EngineKind
from specdeploy.clients.engine_probe import send_probe
from specdeploy.engines import metric_names
from specdeploy.judgment.probe import (
    DEFAULT_TEMPERATURES,
    ProbeBudget,
    ProbeOutcome,
    not_paying,
    probe_cells,
    probe_requests,
)
from specdeploy_engine.sim.knobs import Knobs

EAGLE3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'
ARGV = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama",
        "--speculative-config", EAGLE3]
WORKLOADS = {"code": ["[code] def fibonacci(n):", "[code] class LinkedList:"],
             "support": ["[support] My parcel has not arrived.", "[support] I want a refund."]}
BREAK_EVEN = 0.4


def simulator(argv: list[str]) -> contextlib.AbstractAsyncContextManager[str]:
    knobs = Knobs()
    knobs.update({"workloadAcceptance": {"[code]": 0.9, "[support]": 0.2}})
    return simulator_on_loopback(argv, knobs, seed=3, time_scale=0.05)


def test_the_probe_measures_each_cell_and_names_the_workload_below_break_even() -> None:
    budget = ProbeBudget(requests_per_cell=6, max_tokens=64, requests_per_second=200.0)
    requests = probe_requests(WORKLOADS, DEFAULT_TEMPERATURES, budget)

    async def main() -> list[ProbeOutcome]:
        async with simulator([*ARGV, "--per-request-spec-decode-metrics", "summary"]) as base, \
                httpx.AsyncClient() as client:
            return await send_probe(client, base, "llama", requests, budget, deadline_seconds=60)

    outcomes = asyncio.run(main())
    assert len(outcomes) == len(requests) and all(o.error is None for o in outcomes)
    cells = {(c.workload, c.temperature): c for c in probe_cells(outcomes, k=3, break_even=BREAK_EVEN)}
    assert all(c.requests == 6 for c in cells.values())
    code = [cells[("code", t)].acceptance_rate for t in DEFAULT_TEMPERATURES]
    assert code[0] is not None and code[2] is not None and code[0] > code[2]       # falls as temperature rises
    assert all(cells[("code", t)].pays for t in DEFAULT_TEMPERATURES)
    assert not any(cells[("support", t)].pays for t in DEFAULT_TEMPERATURES)
    named = not_paying(cells.values(), BREAK_EVEN)
    assert len(named) == 3 and all(sentence.startswith("support at temperature") for sentence in named)


def test_an_engine_without_per_request_metrics_gives_reasons_not_numbers() -> None:
    budget = ProbeBudget(requests_per_cell=1, max_tokens=8, requests_per_second=200.0)
    requests = probe_requests({"neutral": ["Hello"]}, (0.0,), budget)

    async def main() -> list[ProbeOutcome]:
        async with simulator(ARGV) as base, httpx.AsyncClient() as client:
            return await send_probe(client, base, "llama", requests, budget, deadline_seconds=30)

    [outcome] = asyncio.run(main())
    assert "--per-request-spec-decode-metrics" in (outcome.error or "")


def test_an_engine_without_per_request_metrics_is_measured_by_its_counters_around_each_request() -> None:
    budget = ProbeBudget(requests_per_cell=4, max_tokens=64, requests_per_second=200.0)
    requests = probe_requests(WORKLOADS, (0.0,), budget)

    async def main() -> list[ProbeOutcome]:
        async with simulator(ARGV) as base, httpx.AsyncClient() as client:
            return await send_probe(client, base, "llama", requests, budget, deadline_seconds=60,
                                    counters=metric_names(EngineKind.VLLM))

    outcomes = asyncio.run(main())
    assert all(o.from_counters and o.counts is not None and o.counts.drafted > 0 for o in outcomes)
    cells = {c.workload: c for c in probe_cells(outcomes, k=3, break_even=BREAK_EVEN)}
    assert cells["code"].pays and not cells["support"].pays


def test_the_deadline_stops_the_probe_before_its_requests_run_out() -> None:
    budget = ProbeBudget(requests_per_cell=50, max_tokens=8, requests_per_second=10.0)   # 5 s at the rate
    requests = probe_requests({"neutral": ["Hello"]}, (0.0,), budget)

    async def main() -> list[ProbeOutcome]:
        async with simulator([*ARGV, "--per-request-spec-decode-metrics", "summary"]) as base, \
                httpx.AsyncClient() as client:
            return await send_probe(client, base, "llama", requests, budget, deadline_seconds=0.5)

    outcomes = asyncio.run(main())
    assert 1 <= len(outcomes) <= 6
