"""devcluster.traffic.Traffic against local servers standing in for an SD's pods (the cluster's pod list is
patched): chunks overlap, so answers slower than a chunk do not pause the sending; stop() drains and ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from specdeploy.devcluster import traffic as traffic_module
from specdeploy.devcluster import wait_for
from specdeploy.devcluster.traffic import Traffic


@pytest.fixture
def slow_pods(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Two servers that answer each completion after 2 s, listed as the SD's pods; counts what they hold."""
    counts = {"now": 0, "peak": 0, "answered": 0}
    ready = threading.Event()
    urls: list[str] = []
    loop = asyncio.new_event_loop()

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        counts["now"] += 1
        counts["peak"] = max(counts["peak"], counts["now"])
        try:
            await asyncio.sleep(2.0)
        finally:
            counts["now"] -= 1
        counts["answered"] += 1
        return web.json_response({"usage": {"completion_tokens": 4}})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def serve() -> list[web.AppRunner]:
        runners = []
        for _ in range(2):
            app = web.Application()
            app.router.add_post("/v1/completions", completions)
            app.router.add_get("/v1/models", models)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            urls.append(f"http://{host}:{port}")
            runners.append(runner)
        return runners

    def run() -> None:
        asyncio.set_event_loop(loop)
        runners = loop.run_until_complete(serve())
        ready.set()
        loop.run_forever()
        for runner in runners:
            loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    monkeypatch.setattr(traffic_module, "endpoints", lambda cluster, sd: list(urls))
    yield counts
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_answers_slower_than_a_chunk_do_not_pause_the_sending(slow_pods: dict[str, int]) -> None:
    """Chunks of 0.5 s, answers of 2 s: each chunk used to wait for its answers before the next was sent, so
    the pods saw a burst every ~2.5 s and little in between (two simulated 70B pods at 36 requests/s never
    passed 100 running requests each; with overlapping chunks both held 300, their maximum, for 63 s)."""
    rate, duration = 40.0, 4.0
    report = Traffic(None, "ns/sd", qps=rate, duration=duration, chunk_seconds=0.5,
                     output_tokens="4", prompt_tokens="4", stream=False).run()
    assert report.failed == 0 and report.unfinished == 0
    assert report.ok > 0.7 * rate * duration, report.to_text()      # ~160 sent; waiting for each chunk's answers, 36
    assert slow_pods["peak"] > 0.7 * rate * 2.0                     # ~80 under way at once: 2 s of sending
    assert sorted(report.by_target.values())[0] > 0.4 * report.ok    # spread over both pods


def test_stop_ends_the_sending_and_gives_answers_under_way_the_drain(slow_pods: dict[str, int]) -> None:
    traffic = Traffic(None, "ns/sd", qps=40, duration=60, chunk_seconds=0.5,
                      output_tokens="4", prompt_tokens="4", stream=False, drain_seconds=5.0).start()
    wait_for(lambda: slow_pods["now"] > 0, 10, "requests under way at the pods")
    stopped = time.monotonic()
    traffic.stop()
    assert time.monotonic() - stopped < 5.0     # the 2-s answers came; nothing waited for the 60 s
    assert traffic._thread is not None and not traffic._thread.is_alive()
    assert traffic.records and all(record.ok for record in traffic.records)
    assert slow_pods["now"] == 0


def test_answers_still_under_way_when_the_drain_ends_are_unfinished(slow_pods: dict[str, int]) -> None:
    report = Traffic(None, "ns/sd", qps=40, duration=1.0, chunk_seconds=0.5,
                     output_tokens="4", prompt_tokens="4", stream=False, drain_seconds=0.5).run()
    assert report.unfinished > 0 and report.ok == 0
