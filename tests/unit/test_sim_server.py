"""The simulator on loopback sockets: the OpenAI API streamed and not, metrics scraped and parsed, knobs
that change what the engine does, a CUDA OOM crash, and command lines the engine would refuse."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from simulated import simulator_on_loopback

from specdeploy_engine.sim.exposition import parse

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'
VLLM_EAGLE3 = ["vllm", "serve", LLAMA_8B, "--served-model-name", "llama", "--speculative-config", EAGLE3]


def serve(argv: list[str], scenario: Callable[[httpx.AsyncClient, str], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        async with simulator_on_loopback(argv, **options) as base, httpx.AsyncClient(timeout=30) as client:
            await scenario(client, base)
    asyncio.run(main())


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                chunks.append({"done": True} if payload == "[DONE]" else json.loads(payload))
    return chunks


def test_streamed_and_plain_completions_and_the_models_list() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        assert (await client.get(base + "/health")).status_code == 200
        models = (await client.get(base + "/v1/models")).json()
        assert models["data"][0]["id"] == "llama" and models["data"][0]["max_model_len"] == 131072
        body = {"model": "llama", "prompt": "one two three four", "max_tokens": 40, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        chunks = await stream_completion(client, base + "/v1/completions", body)
        assert chunks[-1] == {"done": True}
        usage = chunks[-2]
        assert usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 40, "total_tokens": 44}
        texts = [chunk["choices"][0]["text"] for chunk in chunks[:-2]]
        assert sum(len(text.split()) for text in texts) == 40
        assert len(texts) < 40                           # speculative steps stream several tokens at once
        assert [chunk["choices"][0]["finish_reason"] for chunk in chunks[:-2]][-1] == "length"
        assert all(chunk["object"] == "text_completion" for chunk in chunks[:-1])
        chat = (await client.post(base + "/v1/chat/completions", json={
            "model": "llama", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7})).json()
        assert chat["object"] == "chat.completion"
        assert len(chat["choices"][0]["message"]["content"].split()) == 7
        assert chat["usage"]["prompt_tokens"] == 2 + 4 and chat["choices"][0]["finish_reason"] == "length"
        streamed_chat = await stream_completion(client, base + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True})
        assert streamed_chat[0]["choices"][0]["delta"]["role"] == "assistant"
        assert streamed_chat[-1] == {"done": True}
        natural = (await client.post(base + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}]})).json()
        assert natural["choices"][0]["finish_reason"] == "stop" and natural["usage"]["completion_tokens"] >= 1
    serve(VLLM_EAGLE3, scenario)


def test_requests_the_engine_refuses() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        wrong = await client.post(base + "/v1/completions", json={"model": "gpt-4", "prompt": "x"})
        assert wrong.status_code == 404 and wrong.json()["error"]["message"] == "The model `gpt-4` does not exist."
        long = await client.post(base + "/v1/completions", json={"prompt": "x " * 8000, "max_tokens": 500})
        assert long.status_code == 400
        assert long.json()["error"]["message"].startswith("This model's maximum context length is 8192 tokens.")
        bad = await client.post(base + "/v1/completions", content=b"{not json")
        assert bad.status_code == 400
    serve(["vllm", "serve", LLAMA_8B, "--max-model-len", "8192"], scenario)


async def vllm_counters(client: httpx.AsyncClient, base: str) -> tuple[float, float]:
    families = parse((await client.get(base + "/metrics")).text)
    return (families["vllm:spec_decode_num_accepted_tokens_total"].value(),
            families["vllm:spec_decode_num_draft_tokens_total"].value())


async def burst(client: httpx.AsyncClient, base: str, count: int, tokens: int = 60) -> list[float]:
    async def one() -> float:
        started = time.monotonic()
        response = await client.post(base + "/v1/completions", json={"prompt": "a b c", "max_tokens": tokens,
                                                                       "temperature": 0})
        assert response.status_code == 200
        return time.monotonic() - started
    return list(await asyncio.gather(*(one() for _ in range(count))))


def test_metrics_scrape_and_knobs_change_the_engine() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        assert (await client.get(base + "/admin/knobs")).json()["acceptance"] is None
        set_low = await client.post(base + "/admin/knobs", json={"acceptance": 0.1})
        assert set_low.status_code == 200 and set_low.json()["acceptance"] == 0.1
        await burst(client, base, 8)
        accepted, drafted = await vllm_counters(client, base)
        assert accepted / drafted == pytest.approx(0.1, abs=0.06)
        await client.post(base + "/admin/knobs", json={"acceptance": 0.9})
        await burst(client, base, 8)
        accepted_2, drafted_2 = await vllm_counters(client, base)
        assert (accepted_2 - accepted) / (drafted_2 - drafted) == pytest.approx(0.9, abs=0.06)
        await client.post(base + "/admin/knobs", json={"acceptance": 0.0})    # one token per step
        quick = max(await burst(client, base, 2, tokens=20))
        await client.post(base + "/admin/knobs", json={"extraLatencySeconds": 0.25})
        slow = min(await burst(client, base, 2, tokens=20))
        # 20 steps of 250 ms more, at time scale 0.2: 1 s; the margin leaves room for a loaded machine
        assert slow > quick + 0.6
        refused = await client.post(base + "/admin/knobs", json={"acceptance": 1.5})
        assert refused.status_code == 400 and "between 0 and 1" in refused.json()["error"]
        unknown = await client.post(base + "/admin/knobs", json={"speed": 2})
        assert unknown.status_code == 400 and "unknown knob 'speed'" in unknown.json()["error"]
        families = parse((await client.get(base + "/metrics")).text)
        assert families["vllm:request_success_total"].value(finished_reason="length") == 20
        assert families["vllm:e2e_request_latency_seconds"].value("vllm:e2e_request_latency_seconds_count") == 20
        assert families["vllm:num_requests_running"].value() == 0
        info = (await client.get(base + "/admin/info")).json()
        assert info["k"] == 3 and info["acceptance"] == 0.0 and info["method"] == "eagle3"
    serve(VLLM_EAGLE3, scenario)


def test_a_client_that_goes_away_aborts_its_request() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        async with client.stream("POST", base + "/v1/completions", json={
                "prompt": "x", "max_tokens": 5000, "stream": True}) as response:
            async for _ in response.aiter_lines():
                break
        for _ in range(100):
            families = parse((await client.get(base + "/metrics")).text)
            if families["vllm:request_success_total"].value(finished_reason="abort") == 1:
                break
            await asyncio.sleep(0.02)
        assert families["vllm:request_success_total"].value(finished_reason="abort") == 1
        assert families["vllm:num_requests_running"].value() == 0
    serve(VLLM_EAGLE3, scenario)


def test_each_engine_serves_metrics_where_it_does(tmp_path: Path) -> None:
    (tmp_path / "trtllm.yaml").write_text("return_perf_metrics: true\n")

    async def trtllm(client: httpx.AsyncClient, base: str) -> None:
        await burst(client, base, 1, tokens=5)
        text = (await client.get(base + "/prometheus/metrics")).text
        assert "trtllm_e2e_request_latency_seconds_count" in text and "trtllm_spec_decode" not in text

    async def sglang_without_metrics(client: httpx.AsyncClient, base: str) -> None:
        assert (await client.get(base + "/metrics")).status_code == 404
        assert (await client.get(base + "/health")).status_code == 200

    serve(["trtllm-serve", LLAMA_8B, "--config", "/etc/specdeploy/trtllm.yaml"], trtllm, config_dir=tmp_path)
    serve(["python3", "-m", "sglang.launch_server", "--model-path", LLAMA_8B], sglang_without_metrics)


# --- the process ------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_process(argv: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "specdeploy_engine.sim", "--host", "127.0.0.1", "--port", str(port), "--", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )


def wait_healthy(process: subprocess.Popen[str], port: int, deadline: float = 20.0) -> None:
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError("the simulator did not become healthy")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_oom_knob_crashes_the_process_with_cudas_message_and_the_exit_code() -> None:
    port = free_port()
    process = start_process(VLLM_EAGLE3, port)
    try:
        wait_healthy(process, port)
        before = cpu_seconds(process.pid)
        time.sleep(1.0)
        assert cpu_seconds(process.pid) - before < 0.05        # idle: no busy loop
        answer = httpx.post(f"http://127.0.0.1:{port}/admin/knobs", json={"oom": True, "exitCode": 3}, timeout=5)
        assert answer.status_code == 200
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
    assert process.returncode == 3
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in stderr
    assert "GPU 0 has a total capacity of 79.19 GiB" in stderr


def test_oom_at_start_from_the_environment() -> None:
    process = start_process(VLLM_EAGLE3, free_port(), env={"SPECDEPLOY_SIM_KNOBS": '{"oom": true}'})
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1 and "CUDA out of memory" in stderr


def test_sigterm_stops_the_process_cleanly() -> None:
    port = free_port()
    process = start_process(["vllm", "serve", LLAMA_8B], port)
    wait_healthy(process, port)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=20)
    assert process.returncode == 0


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["vllm", "serve", LLAMA_8B, "--speculative-model", "x", "--num-speculative-tokens", "3"], 2,
     "vllm serve: error: unrecognized arguments: --speculative-model x --num-speculative-tokens 3"),
    (["vllm", "serve", LLAMA_8B, "--speculative-config", '{"method":"nope","num_speculative_tokens":1}'], 1,
     "validation error for SpeculativeConfig"),
])
def test_a_command_line_the_engine_refuses_exits_as_the_engine_does(argv: list[str], code: int, message: str) -> None:
    process = start_process(argv, free_port())
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == code
    assert message in stderr


def test_a_model_that_does_not_fit_the_named_gpu_does_not_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy_engine.sim", "--gpu", "L4", "--port", str(free_port()), "--",
         "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "CUDA out of memory" in result.stderr


def test_help_and_a_missing_engine_command() -> None:
    from specdeploy_engine.sim.__main__ import main
    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    assert helped.value.code == 0
    with pytest.raises(SystemExit) as refused:
        main(["--port", "8000"])
    assert refused.value.code == 2
