"""The load generator: workload descriptions, Poisson arrivals, the report, and a run against simulators
on loopback."""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import threading

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from test_sim_server import free_port, start_process, wait_healthy

from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.loadgen import (
    Lengths,
    LoadReport,
    QpsSchedule,
    RequestRecord,
    TargetUnreachable,
    TemperatureMix,
    Workload,
    WorkloadError,
    main,
    parse_duration,
    run_load,
    run_load_async,
)
from specdeploy_engine.loadgen.report import percentile
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import served_model
from specdeploy_engine.sim.server import SimServer


def test_qps_schedules() -> None:
    assert QpsSchedule.parse("4").qps_at(1000.0) == 4.0
    ladder = QpsSchedule.parse("0-60s:2, 60-120s:8")
    assert [ladder.qps_at(t) for t in (0, 59.9, 60, 119, 120)] == [2, 2, 8, 8, 0]
    assert ladder.end == 120
    for bad in ("fast", "0-60:2,30-90:4", "60-0:2", "-1"):
        with pytest.raises(WorkloadError):
            QpsSchedule.parse(bad)


def test_poisson_arrivals_follow_each_segment_rate() -> None:
    arrivals = list(QpsSchedule.parse("0-300:2,300-600:8").arrivals(random.Random(1), 600))
    first = sum(1 for t in arrivals if t < 300)
    second = len(arrivals) - first
    assert first == pytest.approx(600, abs=3 * math.sqrt(600))
    assert second == pytest.approx(2400, abs=3 * math.sqrt(2400))
    gaps = [b - a for a, b in zip(arrivals[first:], arrivals[first + 1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 8, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(1 / 8, rel=0.15)      # exponential: stdev = mean
    assert arrivals == sorted(arrivals) and all(0 <= t < 600 for t in arrivals)


@given(st.integers(1, 5000), st.integers(0, 3000))
def test_fixed_and_uniform_lengths_stay_in_range(low: int, width: int) -> None:
    rng = random.Random(low)
    assert Lengths.parse(str(low)).sample(rng) == low
    uniform = Lengths.parse(f"{low}-{low + width}")
    assert all(low <= uniform.sample(rng) <= low + width for _ in range(20))


def test_normal_and_lognormal_lengths() -> None:
    rng = random.Random(2)
    normal = Lengths.parse("normal:2048,1024,10,4096")
    values = [normal.sample(rng) for _ in range(4000)]
    assert min(values) >= 10 and max(values) <= 4096
    assert statistics.mean(values) == pytest.approx(2048, rel=0.03)
    lognormal = Lengths.parse("lognormal:220,0.8")
    assert statistics.mean(lognormal.sample(rng) for _ in range(20000)) == pytest.approx(220, rel=0.05)
    for bad in ("many", "normal:0,1", "300-100", "lognormal:10,1,50,20"):
        with pytest.raises(WorkloadError):
            Lengths.parse(bad)


def test_temperature_mixes() -> None:
    rng = random.Random(3)
    assert TemperatureMix.parse("0.7").sample(rng) == 0.7
    mix = TemperatureMix.parse("0:0.75,1.0:0.25")
    draws = [mix.sample(rng) for _ in range(4000)]
    assert draws.count(1.0) / len(draws) == pytest.approx(0.25, abs=0.03)
    for bad in ("hot", "3.0", "0:0,1:0"):
        with pytest.raises(WorkloadError):
            TemperatureMix.parse(bad)


def test_a_plan_is_seeded_and_bounded() -> None:
    workload = Workload(QpsSchedule.constant(10), Lengths.parse("100-200"), Lengths.parse("50"),
                        TemperatureMix.parse("0:1,1:1"))
    assert workload.plan(60, seed=1) == workload.plan(60, seed=1)
    assert workload.plan(60, seed=1) != workload.plan(60, seed=2)
    assert len(workload.plan(60, max_requests=25, seed=1)) == 25
    assert all(item.at < 60 for item in workload.plan(60, seed=1))


def test_parse_duration() -> None:
    assert [parse_duration(text) for text in ("90", "90s", "2m", "1h")] == [90, 90, 120, 3600]


def record(target: str, ttft: float, e2e: float, tokens: int, status: int = 200) -> RequestRecord:
    return RequestRecord(target=target, sent_at=0.0, prompt_tokens=10, max_tokens=tokens, temperature=0.0,
                         status=status, ttft=ttft, e2e=e2e, output_tokens=tokens, chunk_gaps=[0.01] * (tokens - 1))


def test_report_percentiles_and_text() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    records = [record("a", 0.1 * i, 1.0 + i, 11) for i in range(1, 11)] + [record("b", 0.0, 0.0, 1, status=500)]
    records[-1].e2e = None
    report = LoadReport.from_records(records, duration=10.0)
    assert (report.sent, report.ok, report.failed) == (11, 10, 1)
    assert report.ttft.p50 == pytest.approx(0.5) and report.ttft.p99 == pytest.approx(1.0)
    assert report.tpot.mean == pytest.approx(statistics.mean((1 + 0.9 * i) / 10 for i in range(1, 11)))
    assert report.output_tokens == 110 and report.output_tokens_per_second == 11.0
    assert report.errors == {"HTTP 500": 1}
    text = report.to_text()
    assert "11 sent, 10 ok, 1 failed" in text and "TTFT ms" in text and "error (1x): HTTP 500" in text
    assert json.loads(json.dumps(report.to_dict()))["ttftSeconds"]["p99"] == pytest.approx(1.0)


@pytest.mark.parametrize("stream", [True, False])
def test_a_run_against_two_simulators_spreads_the_load_and_measures_it(stream: bool) -> None:
    gpu = find_gpu("H100-80GB")
    assert gpu is not None
    argv = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"]

    async def scenario() -> LoadReport:
        servers, runners, bases = [], [], []
        for seed in (1, 2):
            server = SimServer(served_model(parse_engine_argv(argv, gpu=gpu), gpu), knobs=Knobs(), seed=seed,
                               time_scale=0.2)
            runner = await server.start("127.0.0.1", 0)
            servers.append(server)
            runners.append(runner)
            host, port = runner.addresses[0][:2]
            bases.append(f"http://{host}:{port}")
        try:
            return await run_load_async(bases, 20, 2.0, prompt_tokens="50-100", output_tokens=24,
                                        temperature="0:1,1:1", drain_seconds=10, stream=stream)
        finally:
            for server, runner in zip(servers, runners, strict=True):
                await server.stop(runner)

    report = asyncio.run(scenario())
    assert report.failed == 0 and report.unfinished == 0 and report.ok == report.sent > 15
    assert sorted(report.by_target.values()) in ([report.sent // 2, report.sent - report.sent // 2],)
    assert report.output_tokens == 24 * report.ok
    if stream:
        assert 0 < report.ttft.p50 < report.e2e.p50 < 10.0    # answered, not hung: within the drain
        assert report.tpot.p50 > 0 and report.itl.count > 0
    else:  # whole answers: no first token nor chunk gaps to time, only end to end
        assert 0 < report.e2e.p50 < 10.0 and report.e2e.count == report.ok
        assert report.ttft.count == report.tpot.count == report.itl.count == 0
    assert report.duration < 2.0 + 10


def test_the_command_line_prints_a_report_and_fails_on_errors(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    process = start_process(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], port)
    try:
        wait_healthy(process, port)
        target = f"http://127.0.0.1:{port}"
        assert main(["--target", target, "--qps", "10", "--duration", "1s", "--output-tokens", "8",
                     "--prompt-tokens", "16", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["ok"] == printed["sent"] > 0 and printed["failed"] == 0
        assert main(["--target", target, "--qps", "5", "--duration", "1s", "--model", "not-served"]) == 1
        assert "error" in capsys.readouterr().out
        assert main(["--target", target, "--qps", "fast"]) == 2
    finally:
        process.terminate()
        process.communicate(timeout=20)


def test_an_unreachable_target_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", f"http://127.0.0.1:{free_port()}", "--qps", "1", "--duration", "1s"]) == 2
    assert "cannot ask the targets for their model" in capsys.readouterr().err


def test_a_stop_event_ends_a_run_early_from_another_thread() -> None:
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    try:   # nothing listens there: each request fails at once, and without the stop the run would take 60 s
        report = run_load([f"http://127.0.0.1:{free_port()}"], 20, 60.0, model="m", drain_seconds=60.0, stop=stop)
    finally:
        timer.cancel()
    assert 0 < report.sent < 60 and report.duration < 10


# --- many requests under way at once ------------------------------------------------------------------------

async def _slow_server(hold_seconds: float) -> tuple[web.AppRunner, str, dict[str, int]]:
    """A server that answers every completion after `hold_seconds`, counting the requests it holds at once."""
    counts = {"now": 0, "peak": 0}

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        counts["now"] += 1
        counts["peak"] = max(counts["peak"], counts["now"])
        try:
            await asyncio.sleep(hold_seconds)
        finally:
            counts["now"] -= 1
        return web.json_response({"usage": {"completion_tokens": 4}})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}", counts


def test_hundreds_of_slow_answers_under_way_do_not_hold_up_sending() -> None:
    """An open loop against slow answers holds one connection per request under way. The client used to be
    httpx, whose pool (httpcore 1.0) walks all its connections for each one whenever a request is added or
    ends: at ~1000 connections it fell 36 s behind its plan and sent nothing for up to 7 s at a time (50
    requests/s against two simulated 70B pods). Here ~300 requests are under way while others start and end;
    the httpx client fell 5.1 s behind in this scenario (26 s of CPU), aiohttp's 0.05 s (1.2 s of CPU)."""
    rate, duration, hold = 150.0, 6.0, 2.0

    async def scenario() -> tuple[LoadReport, dict[str, int]]:
        runner, base, counts = await _slow_server(hold)
        try:
            return await run_load_async([base], rate, duration, model="m", prompt_tokens=4, output_tokens=4,
                                        stream=False, drain_seconds=30), counts
        finally:
            await runner.cleanup()

    report, counts = asyncio.run(scenario())
    planned = Workload(QpsSchedule.constant(rate), Lengths.parse("4"), Lengths.parse("4")).plan(duration)
    assert report.ok == report.sent == len(planned) > 800, report.to_text()
    lag = max(record.sent_at - item.at for record, item in zip(report.records, planned, strict=True))
    assert lag < 1.0, f"sending fell {lag:.1f} s behind its plan"
    assert counts["peak"] > 250        # under way together, not one after another
    assert report.e2e.p50 < hold + 1.0


def test_max_connections_bounds_the_requests_under_way() -> None:
    async def scenario() -> tuple[LoadReport, dict[str, int]]:
        runner, base, counts = await _slow_server(0.3)
        try:
            return await run_load_async([base], 100, 1.0, model="m", prompt_tokens=4, output_tokens=4,
                                        stream=False, drain_seconds=30, max_connections=5), counts
        finally:
            await runner.cleanup()

    report, counts = asyncio.run(scenario())
    assert report.ok == report.sent > 50 and counts["peak"] == 5


def test_a_target_that_names_no_model_raises_target_unreachable() -> None:
    with pytest.raises(TargetUnreachable, match="/v1/models"):
        run_load([f"http://127.0.0.1:{free_port()}"], 1, 1.0)
