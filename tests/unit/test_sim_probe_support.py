"""What an acceptance probe needs from the simulator: vLLM's per-request speculative metrics in the answer
(--per-request-spec-decode-metrics, metrics.speculative_decoding) and the workloadAcceptance knob that gives
prompts of one workload (a marker in their text) their own acceptance rate."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from simulated import run_to_end, simulator_on_loopback

from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.sim.argv import EngineArgvError, parse_engine_argv
from specdeploy_engine.sim.engine import Engine, SimRequest
from specdeploy_engine.sim.exposition import parse
from specdeploy_engine.sim.knobs import MAX_WORKLOADS, KnobError, Knobs
from specdeploy_engine.sim.metrics import engine_metrics
from specdeploy_engine.sim.model import ServedModel, served_model

H100 = find_gpu("H100-80GB")
assert H100 is not None
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'
VLLM_EAGLE3 = ["vllm", "serve", LLAMA_8B, "--served-model-name", "llama", "--speculative-config", EAGLE3]
SUMMARY = [*VLLM_EAGLE3, "--per-request-spec-decode-metrics", "summary"]
DETAILED = [*VLLM_EAGLE3, "--per-request-spec-decode-metrics", "detailed"]
SPEC_KEYS = {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
             "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens"}
TIMING_KEYS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}


def served(argv: list[str]) -> ServedModel:
    assert H100 is not None
    return served_model(parse_engine_argv(argv, gpu=H100), H100)


# --- the command line -------------------------------------------------------------------------------------

def test_the_flag_is_read_and_refused_without_speculation_as_vllm_refuses_it() -> None:
    assert H100 is not None
    assert parse_engine_argv(SUMMARY, gpu=H100).per_request_spec_decode_metrics == "summary"
    assert parse_engine_argv(VLLM_EAGLE3, gpu=H100).per_request_spec_decode_metrics == "none"
    with pytest.raises(EngineArgvError) as refused:
        parse_engine_argv(["vllm", "serve", LLAMA_8B, "--per-request-spec-decode-metrics", "detailed"], gpu=H100)
    assert refused.value.exit_code == 1
    assert "--per-request-spec-decode-metrics requires speculative decoding to be enabled" in refused.value.stderr
    # `none` without speculation is fine, and a value outside the choices is argparse's error
    parse_engine_argv(["vllm", "serve", LLAMA_8B, "--per-request-spec-decode-metrics", "none"], gpu=H100)
    with pytest.raises(EngineArgvError) as wrong:
        parse_engine_argv([*VLLM_EAGLE3, "--per-request-spec-decode-metrics", "full"], gpu=H100)
    assert wrong.value.exit_code == 2 and "invalid choice: 'full'" in wrong.value.stderr


# --- the engine core ----------------------------------------------------------------------------------------

def test_per_request_stats_add_up_to_the_prometheus_counters_and_the_tokens() -> None:
    model = served(DETAILED)
    metrics = engine_metrics(model)
    engine = Engine(model, seed=3, observer=metrics)
    requests = [SimRequest(f"r{index}", 0.0, 50 + index, 40 + 7 * index, temperature=0.5 * (index % 3))
                for index in range(12)]
    for request in requests:
        engine.add(request, 0.0)
    run_to_end(engine)
    k = model.k
    total_accepted = total_drafted = total_steps = 0
    for request in requests:
        stats = request.spec_stats
        assert stats is not None and stats.num_spec_tokens == k and len(stats.histogram) == k + 1
        assert len(stats.per_step_accepted) == len(stats.per_step_drafted) == stats.num_spec_steps
        assert Counter(stats.per_step_accepted) == Counter(
            {j: count for j, count in enumerate(stats.histogram) if count})
        assert sum(stats.per_step_accepted) == stats.num_accepted_tokens
        assert stats.per_step_drafted == [k] * stats.num_spec_steps and stats.num_draft_tokens == k * stats.num_spec_steps
        # the first token comes from the prefill; each verify step emits accepted + 1, the last one cut
        emitted = stats.num_spec_steps + stats.num_accepted_tokens
        assert emitted - k <= request.generated - 1 <= emitted
        total_accepted += stats.num_accepted_tokens
        total_drafted += stats.num_draft_tokens
        total_steps += stats.num_spec_steps
    families = parse(metrics.render())
    assert families["vllm:spec_decode_num_accepted_tokens_total"].value() == total_accepted
    assert families["vllm:spec_decode_num_draft_tokens_total"].value() == total_drafted
    assert families["vllm:spec_decode_num_drafts_total"].value() == total_steps
    assert 0 < total_accepted < total_drafted


def test_summary_keeps_no_per_step_arrays_and_no_flag_keeps_no_stats() -> None:
    made = {}
    for name, argv in (("summary", SUMMARY), ("plain", VLLM_EAGLE3), ("sglang", [
            "python3", "-m", "sglang.launch_server", "--model-path", LLAMA_8B, "--speculative-algorithm", "NGRAM"])):
        engine = Engine(served(argv))
        made[name] = SimRequest(name, 0.0, 20, 30)
        engine.add(made[name], 0.0)
        run_to_end(engine)
    summary = made["summary"].spec_stats
    assert summary is not None and summary.num_spec_steps > 0
    assert summary.per_step_accepted == [] and summary.per_step_drafted == []
    assert made["plain"].spec_stats is None and made["sglang"].spec_stats is None


def workload_engine(knobs: Knobs) -> tuple[Engine, dict[str, list[SimRequest]]]:
    engine = Engine(served(SUMMARY), seed=11, knobs=knobs)
    prompts = {"code": "def f(x): [code] return x", "support": "my order is late [support] help",
               "other": "tell me a story", "code-hot": "def g(y): [code] return y"}
    made: dict[str, list[SimRequest]] = {name: [] for name in prompts}
    for index in range(40):
        for name, text in prompts.items():
            request = SimRequest(f"{name}-{index}", 0.0, len(text.split()), 120, text=text,
                                 temperature=1.0 if name == "code-hot" else 0.0)
            made[name].append(request)
            engine.add(request, 0.0)
    return engine, made


def measured_rate(requests: list[SimRequest]) -> float:
    accepted = sum(request.spec_stats.num_accepted_tokens for request in requests if request.spec_stats)
    drafted = sum(request.spec_stats.num_draft_tokens for request in requests if request.spec_stats)
    return accepted / drafted


def test_the_workload_knob_gives_each_marked_prompt_its_own_acceptance_and_temperature_still_lowers_it() -> None:
    engine, made = workload_engine(Knobs(acceptance=0.55, workload_acceptance={"[code]": 0.9, "[support]": 0.25}))
    run_to_end(engine)
    rates = {name: measured_rate(requests) for name, requests in made.items()}
    assert rates["code"] == pytest.approx(0.9, abs=0.03)
    assert rates["support"] == pytest.approx(0.25, abs=0.03)
    assert rates["other"] == pytest.approx(0.55, abs=0.03)        # no marker: the acceptance knob
    assert rates["code-hot"] < rates["code"] - 0.05                # the same workload at T = 1


def test_without_the_acceptance_knob_an_unmarked_prompt_has_the_methods_default() -> None:
    engine, made = workload_engine(Knobs(workload_acceptance={"[code]": 0.95}))
    run_to_end(engine)
    default = engine.served.default_acceptance_rate
    assert default is not None
    assert measured_rate(made["other"]) == pytest.approx(default, abs=0.03)
    assert measured_rate(made["support"]) == pytest.approx(default, abs=0.03)
    assert measured_rate(made["code"]) == pytest.approx(0.95, abs=0.03)


def test_the_first_marker_in_the_knobs_order_wins_and_a_new_mapping_is_looked_up_again() -> None:
    knobs = Knobs(acceptance=0.5)
    engine = Engine(served(VLLM_EAGLE3), knobs=knobs)
    both = SimRequest("both", 0.0, 6, 10, text="[support] ticket about [code]")
    ids = SimRequest("ids", 0.0, 6, 10)                     # a prompt of token ids has no text
    assert engine.request_rate(both, 0.5) == 0.5
    knobs.update({"workloadAcceptance": {"[code]": 0.9, "[support]": 0.2}})
    assert engine.request_rate(both, 0.5) == 0.9 and engine.request_rate(ids, 0.5) == 0.5
    knobs.update({"workloadAcceptance": {"[support]": 0.2, "[code]": 0.9}})
    assert engine.request_rate(both, 0.5) == 0.2
    knobs.update({"workloadAcceptance": None})
    assert engine.request_rate(both, 0.5) == 0.5
    assert knobs.workload_rate("plain [Code]") is None      # markers match exactly (case included)


# --- the knob's validation ------------------------------------------------------------------------------------

def test_the_workload_knob_is_validated_all_or_nothing() -> None:
    knobs = Knobs()
    knobs.update({"workloadAcceptance": {"[code]": 0.8, "[support]": 0}})
    assert knobs.to_wire()["workloadAcceptance"] == {"[code]": 0.8, "[support]": 0.0}
    assert list(knobs.to_wire()["workloadAcceptance"]) == ["[code]", "[support]"]      # order kept
    knobs.update({"workloadAcceptance": " [code]=0.7 , [chat]=1 ,"})                    # the text form
    assert knobs.workload_acceptance == {"[code]": 0.7, "[chat]": 1.0}
    bad: list[tuple[Any, str]] = [
        ({"[code]": 1.5}, "between 0 and 1"),
        ({"[code]": "high"}, "must be a number"),
        ({"[code]": True}, "must be a number"),
        ({"[code]": math.nan}, "must be a number"),
        ({"": 0.5}, "non-empty string"),
        ({"   ": 0.5}, "non-empty string"),
        ({"x" * 201: 0.5}, "at most 200 characters"),
        ({f"m{index}": 0.5 for index in range(MAX_WORKLOADS + 1)}, f"at most {MAX_WORKLOADS} markers"),
        ([["[code]", 0.5]], "must be an object"),
        (0.5, "must be an object"),
        ("[code]0.5", "MARKER=RATE"),
        ("[code]=x", "must be a number"),
        ("=0.5", "non-empty string"),
        ("[a]=0.1,[a]=0.2", "given twice"),
    ]
    for value, message in bad:
        with pytest.raises(KnobError, match=message):
            knobs.update({"acceptance": 0.2, "workloadAcceptance": value})
        assert knobs.acceptance is None and knobs.workload_acceptance == {"[code]": 0.7, "[chat]": 1.0}
    from_env = Knobs.from_env({"SPECDEPLOY_SIM_KNOBS": '{"workloadAcceptance": {"[code]": 0.9}}'})
    assert from_env.workload_acceptance == {"[code]": 0.9}


# --- the server -----------------------------------------------------------------------------------------------

def serve(argv: list[str], scenario: Callable[[httpx.AsyncClient, str], Awaitable[None]],
          knobs: Knobs | None = None) -> None:
    async def main() -> None:
        async with simulator_on_loopback(argv, knobs) as base, httpx.AsyncClient(timeout=30) as client:
            await scenario(client, base)
    asyncio.run(main())


async def spec_counters(client: httpx.AsyncClient, base: str) -> tuple[float, float, float]:
    families = parse((await client.get(base + "/metrics")).text)
    return (families["vllm:spec_decode_num_accepted_tokens_total"].value(),
            families["vllm:spec_decode_num_draft_tokens_total"].value(),
            families["vllm:spec_decode_num_drafts_total"].value())


async def stream_chunks(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(httpx.Response(200, content=line[6:]).json())
    return chunks


def check_consistent(spec: dict[str, Any], deltas: tuple[float, float, float], completion_tokens: int) -> None:
    accepted, drafted, steps = deltas
    assert set(spec) >= SPEC_KEYS
    assert spec["num_spec_tokens"] == 3 and len(spec["acceptance_histogram"]) == 4
    assert spec["num_accepted_draft_tokens"] == accepted and spec["num_draft_tokens"] == drafted
    assert spec["num_spec_steps"] == steps == sum(spec["acceptance_histogram"])
    assert spec["num_accepted_draft_tokens"] == sum(j * n for j, n in enumerate(spec["acceptance_histogram"]))
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / drafted)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    emitted = steps + accepted
    assert emitted - 3 <= completion_tokens - 1 <= emitted


def test_the_answer_carries_vllms_speculative_metrics_and_they_match_the_counters() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        before = await spec_counters(client, base)
        answer = (await client.post(base + "/v1/completions", json={
            "prompt": "one two three", "max_tokens": 80, "temperature": 0})).json()
        after = await spec_counters(client, base)
        metrics = answer["metrics"]
        # non-streamed answers are vLLM's model_dump(): the timing fields and summary's arrays are null
        assert set(metrics) == TIMING_KEYS | {"speculative_decoding"}
        assert all(metrics[key] is None for key in TIMING_KEYS)
        spec = metrics["speculative_decoding"]
        assert spec["per_step_accepted"] is None and spec["per_step_drafted"] is None
        check_consistent(spec, (after[0] - before[0], after[1] - before[1], after[2] - before[2]),
                         answer["usage"]["completion_tokens"])
        chat = (await client.post(base + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 60, "temperature": 0.7})).json()
        latest = await spec_counters(client, base)
        check_consistent(chat["metrics"]["speculative_decoding"],
                         (latest[0] - after[0], latest[1] - after[1], latest[2] - after[2]),
                         chat["usage"]["completion_tokens"])
        # streamed: on the usage chunk only, without null fields; without include_usage, nowhere
        chunks = await stream_chunks(client, base + "/v1/completions", {
            "prompt": "a b", "max_tokens": 30, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}})
        assert all("metrics" not in chunk for chunk in chunks[:-1])
        streamed = chunks[-1]["metrics"]
        assert set(streamed) == {"speculative_decoding"} and set(streamed["speculative_decoding"]) == SPEC_KEYS
        bare = await stream_chunks(client, base + "/v1/completions", {"prompt": "a b", "max_tokens": 30,
                                                                       "stream": True})
        assert all("metrics" not in chunk for chunk in bare)
        # a batch of two prompts is not one generation stream: vLLM leaves the metrics out
        batch = (await client.post(base + "/v1/completions", json={"prompt": ["a b", "c d"], "max_tokens": 5})).json()
        assert "metrics" not in batch
    serve(SUMMARY, scenario)


def test_every_draft_accepted_gives_exact_numbers_and_detailed_adds_the_steps() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        answer = (await client.post(base + "/v1/completions", json={
            "prompt": "x", "max_tokens": 41, "temperature": 0})).json()
        spec = answer["metrics"]["speculative_decoding"]
        # one token from the prefill, then ten steps of 3 accepted + 1
        assert spec == {"mean_acceptance_length": 4.0, "draft_acceptance_rate": 1.0,
                        "acceptance_histogram": [0, 0, 0, 10], "num_spec_steps": 10,
                        "num_accepted_draft_tokens": 30, "num_draft_tokens": 30, "num_spec_tokens": 3,
                        "per_step_accepted": [3] * 10, "per_step_drafted": [3] * 10}
        one = (await client.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 1})).json()
        assert one["metrics"]["speculative_decoding"]["mean_acceptance_length"] == 1.0     # no verify step
        assert one["metrics"]["speculative_decoding"]["acceptance_histogram"] == [0, 0, 0, 0]
        # detailed with no step recorded: vLLM's to_dict leaves the arrays out, the model dumps them null
        assert one["metrics"]["speculative_decoding"]["per_step_accepted"] is None
    serve(DETAILED, scenario, knobs=Knobs(acceptance=1.0))


def test_without_the_flag_nothing_changes() -> None:
    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        answer = (await client.post(base + "/v1/completions", json={"prompt": "a", "max_tokens": 20})).json()
        assert "metrics" not in answer and set(answer) == {"id", "object", "created", "model", "choices", "usage"}
        chunks = await stream_chunks(client, base + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "a"}], "max_tokens": 20, "stream": True,
            "stream_options": {"include_usage": True}})
        assert all("metrics" not in chunk for chunk in chunks)
    serve(VLLM_EAGLE3, scenario)
    serve([*VLLM_EAGLE3, "--per-request-spec-decode-metrics", "none"], scenario)


def test_the_workload_knob_over_the_admin_endpoint() -> None:
    async def ask(client: httpx.AsyncClient, base: str, content: Any, temperature: float) -> float:
        answer = (await client.post(base + "/v1/chat/completions", json={
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
            "max_tokens": 120, "temperature": temperature})).json()
        return float(answer["metrics"]["speculative_decoding"]["draft_acceptance_rate"])

    async def scenario(client: httpx.AsyncClient, base: str) -> None:
        knobs = await client.post(base + "/admin/knobs", json={"workloadAcceptance": {"[code]": 1.0, "[support]": 0}})
        assert knobs.status_code == 200 and knobs.json()["workloadAcceptance"] == {"[code]": 1.0, "[support]": 0.0}
        assert (await client.get(base + "/admin/knobs")).json()["workloadAcceptance"] == {"[code]": 1.0,
                                                                                          "[support]": 0.0}
        parts = [{"type": "text", "text": "refactor this"}, {"type": "text", "text": "[code] def f(): pass"}]
        assert await ask(client, base, parts, 0.0) == 1.0            # a marker in a content part counts
        assert await ask(client, base, "where is my parcel [support]", 0.0) == 0.0
        assert await ask(client, base, parts, 1.0) < 1.0              # temperature lowers it on top
        completion = (await client.post(base + "/v1/completions", json={
            "prompt": "[support] refund", "max_tokens": 40, "temperature": 0})).json()
        assert completion["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] == 0
        refused = await client.post(base + "/admin/knobs", json={"workloadAcceptance": {"[code]": 2}})
        assert refused.status_code == 400 and "the rate of '[code]'" in refused.json()["error"]
        text = await client.post(base + "/admin/knobs", json={"workloadAcceptance": "[support]=1.0"})
        assert text.json()["workloadAcceptance"] == {"[support]": 1.0}
        assert await ask(client, base, "where is my parcel [support]", 0.0) == 1.0
    serve(SUMMARY, scenario)
