"""The simulator's Prometheus metrics: each engine's real names (from the shared metric tables), types,
labels and buckets, in valid exposition format, counting what the engine counts."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from specdeploy.api.spec import EngineKind
from specdeploy.engines import metric_names
from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.loadgen.workload import Lengths, QpsSchedule, Workload
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.exposition import ExpositionError, Registry, parse
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.metrics import (
    VLLM_ITL_BUCKETS,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_TTFT_BUCKETS,
    EngineMetrics,
    engine_metrics,
)
from specdeploy_engine.sim.model import served_model
from specdeploy_engine.sim.virtual import simulate

H100 = find_gpu("H100-80GB")
assert H100 is not None
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
HEAD = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
COMMANDS = {
    EngineKind.VLLM: ["vllm", "serve", LLAMA_8B, "--served-model-name", "llama", "--speculative-config",
                      f'{{"method":"eagle3","model":"{HEAD}","num_speculative_tokens":3}}'],
    EngineKind.SGLANG: ["python3", "-m", "sglang.launch_server", "--model-path", LLAMA_8B, "--served-model-name",
                        "llama", "--enable-metrics", "--speculative-algorithm", "EAGLE3",
                        "--speculative-draft-model-path", HEAD, "--speculative-num-steps", "3",
                        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
}


def run(argv: list[str], acceptance: float | None = 0.6, qps: float = 4, seconds: float = 30) -> EngineMetrics:
    assert H100 is not None
    served = served_model(parse_engine_argv(argv, gpu=H100), H100)
    metrics = engine_metrics(served)
    plan = Workload(QpsSchedule.constant(qps), Lengths.parse("200"), Lengths.parse("100")).plan(seconds, seed=1)
    simulate(served, plan, observer=metrics, knobs=Knobs(acceptance=acceptance))
    return metrics


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.SGLANG])
def test_every_name_of_the_engine_table_is_exported_with_its_type(kind: EngineKind) -> None:
    families = parse(run(COMMANDS[kind]).render())
    names = metric_names(kind)
    for name in names.names():
        assert name in families, name
    assert families[names.time_to_first_token].kind == "histogram"
    assert families[names.inter_token_latency].kind == "histogram"
    assert families[names.e2e_request_latency].kind == "histogram"
    assert families[names.requests_running].kind == "gauge"
    assert families[names.request_success_total].kind == "counter"
    for family in families.values():
        assert family.samples, family.name
        for (_, labels), _ in family.samples.items():
            assert dict(labels)[names.model_label] == "llama"


def test_vllm_spec_counters_give_the_acceptance_rate_and_length() -> None:
    names = metric_names(EngineKind.VLLM)
    families = parse(run(COMMANDS[EngineKind.VLLM], acceptance=0.6).render())
    assert names.drafts_total and names.draft_tokens_total and names.accepted_tokens_total
    drafts = families[names.drafts_total].value()
    drafted = families[names.draft_tokens_total].value()
    accepted = families[names.accepted_tokens_total].value()
    assert drafted == 3 * drafts
    assert accepted / drafted == pytest.approx(0.6, abs=0.03)            # the analysis' acceptance rate
    assert names.accepted_tokens_per_pos_total and names.position_label
    per_position = [families[names.accepted_tokens_per_pos_total].value(position=str(p)) for p in range(3)]
    assert sum(per_position) == accepted
    assert per_position == sorted(per_position, reverse=True)           # later positions accept less
    for _, labels in families[names.drafts_total].samples:
        assert dict(labels) == {"model_name": "llama", "engine": "0"}


def test_vllm_has_no_spec_counters_without_speculation() -> None:
    families = parse(run(["vllm", "serve", LLAMA_8B], acceptance=None).render())
    assert not [name for name in families if name.startswith("vllm:spec_decode")]
    assert families["vllm:generation_tokens_total"].value() > 0


def test_vllm_histograms_use_vllms_buckets() -> None:
    families = parse(run(COMMANDS[EngineKind.VLLM]).render())

    def bounds(name: str) -> list[float]:
        found = {float(dict(labels)["le"]) for sample, labels in families[name].samples if sample.endswith("_bucket")}
        return sorted(found - {math.inf})

    assert bounds("vllm:time_to_first_token_seconds") == list(VLLM_TTFT_BUCKETS)
    assert bounds("vllm:inter_token_latency_seconds") == list(VLLM_ITL_BUCKETS)
    assert bounds("vllm:e2e_request_latency_seconds") == list(VLLM_REQUEST_LATENCY_BUCKETS)
    assert bounds("vllm:request_queue_time_seconds") == list(VLLM_REQUEST_LATENCY_BUCKETS)
    success = families["vllm:request_success_total"]
    assert success.value(finished_reason="length") == families["vllm:e2e_request_latency_seconds"].value(
        "vllm:e2e_request_latency_seconds_count")
    assert success.value(finished_reason="abort") == 0


def test_vllm_counts_one_itl_per_step_and_sglang_one_per_token() -> None:
    vllm = parse(run(COMMANDS[EngineKind.VLLM], acceptance=0.9).render())
    sglang = parse(run(COMMANDS[EngineKind.SGLANG], acceptance=0.9).render())
    vllm_itl = vllm["vllm:inter_token_latency_seconds"].value("vllm:inter_token_latency_seconds_count")
    vllm_tokens = vllm["vllm:generation_tokens_total"].value()
    requests = vllm["vllm:e2e_request_latency_seconds"].value("vllm:e2e_request_latency_seconds_count")
    # vLLM: one observation per decode step of each request, far fewer than tokens when drafts are accepted.
    assert vllm_itl < 0.5 * (vllm_tokens - requests)
    sglang_itl = sglang["sglang:inter_token_latency_seconds"].value("sglang:inter_token_latency_seconds_count")
    sglang_tokens = sglang["sglang:generation_tokens_total"].value()
    sglang_requests = sglang["sglang:num_requests_total"].value()
    assert sglang_itl == sglang_tokens - sglang_requests                  # every token after the first
    rate = sglang["sglang:spec_accept_rate"].value()
    length = sglang["sglang:spec_accept_length"].value()
    assert rate == pytest.approx(0.9, abs=0.1) and length == pytest.approx(1 + 3 * rate, rel=1e-9)


def test_trtllm_metrics(tmp_path: Path) -> None:
    folder = tmp_path
    (folder / "trtllm.yaml").write_text(
        "return_perf_metrics: true\nspeculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n"
        f"  speculative_model: {HEAD}\n")
    assert H100 is not None
    served = served_model(parse_engine_argv(["trtllm-serve", LLAMA_8B, "--config", "/etc/specdeploy/trtllm.yaml"],
                                            config_dir=folder, gpu=H100), H100)
    metrics = engine_metrics(served)
    simulate(served, Workload(QpsSchedule.constant(2), Lengths.parse("100"), Lengths.parse("50")).plan(20, seed=2),
             observer=metrics, knobs=Knobs(acceptance=0.5))
    families = parse(metrics.render())
    names = metric_names(EngineKind.TRTLLM)
    for name in names.names():
        assert name in families, name
    assert names.accepted_tokens_total and names.draft_tokens_total
    rate = families[names.accepted_tokens_total].value() / families[names.draft_tokens_total].value()
    assert rate == pytest.approx(0.5, abs=0.05)
    assert families[names.inter_token_latency].value(names.inter_token_latency + "_count") == \
        families[names.e2e_request_latency].value(names.e2e_request_latency + "_count")   # one TPOT per request


def test_exposition_text_is_prometheus_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: 1_750_000_000.0)    # when each series is created
    registry = Registry()
    counter = registry.counter("demo:requests_total", "Requests.", ("model_name",))
    counter.inc(("a",), 2)
    histogram = registry.histogram("demo:latency_seconds", "Latency.", ("model_name",), (0.1, 1.0))
    histogram.observe(("a",), 0.05)
    histogram.observe(("a",), 0.5)
    histogram.observe(("a",), 5.0)
    text = registry.render()
    assert text == (          # as prometheus_client writes it: labels sorted, _created as gauges after each family
        "# HELP demo:requests_total Requests.\n# TYPE demo:requests_total counter\n"
        'demo:requests_total{model_name="a"} 2.0\n'
        "# HELP demo:requests_created Requests.\n# TYPE demo:requests_created gauge\n"
        'demo:requests_created{model_name="a"} 1.75e+09\n'
        "# HELP demo:latency_seconds Latency.\n# TYPE demo:latency_seconds histogram\n"
        'demo:latency_seconds_bucket{le="0.1",model_name="a"} 1.0\n'
        'demo:latency_seconds_bucket{le="1.0",model_name="a"} 2.0\n'
        'demo:latency_seconds_bucket{le="+Inf",model_name="a"} 3.0\n'
        'demo:latency_seconds_count{model_name="a"} 3.0\n'
        'demo:latency_seconds_sum{model_name="a"} 5.55\n'
        "# HELP demo:latency_seconds_created Latency.\n# TYPE demo:latency_seconds_created gauge\n"
        'demo:latency_seconds_created{model_name="a"} 1.75e+09\n'
    )
    families = parse(text)
    assert families["demo:latency_seconds"].value("demo:latency_seconds_sum") == pytest.approx(5.55)
    assert families["demo:requests_created"].value(model_name="a") == 1_750_000_000.0
    with pytest.raises(ValueError):
        counter.inc(("a",), -1)
    with pytest.raises(ValueError):
        registry.gauge("demo:requests_total", "again", ())
    with pytest.raises(ValueError):
        registry.counter("demo:requests", "without _total", ())


def test_counters_and_histograms_carry_when_each_series_was_created() -> None:
    before = time.time()
    families = parse(run(COMMANDS[EngineKind.VLLM], seconds=5).render())
    after = time.time()
    assert {family.kind for family in families.values()} == {"counter", "gauge", "histogram"}
    for name, family in list(families.items()):
        if family.kind == "gauge":
            continue
        created = families.pop(name.removesuffix("_total") + "_created")
        assert created.kind == "gauge"
        series = {pairs for sample, pairs in family.samples if not sample.endswith("_bucket")}
        assert {pairs for _, pairs in created.samples} == series, name
        assert all(before <= value <= after for value in created.samples.values()), name
    assert not [name for name in families if name.endswith("_created")]     # gauges have none


@pytest.mark.parametrize("text", [
    "orphan 1\n",
    "# TYPE x counter\nx{a=b} 1\n",
    "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0\n",
    "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\nh_sum 0\n",
])
def test_the_reader_refuses_bad_exposition(text: str) -> None:
    with pytest.raises(ExpositionError):
        parse(text)
