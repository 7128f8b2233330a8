"""Conformance: the simulator exposes the metrics the analysis reads as real vLLM does.

The same rendered `vllm serve` command (a small SD of each method in METHODS through the operator's own renderer)
runs twice on loopback, with no cluster, one after the other: by the project's simulator, and by real vLLM's CPU
build through the dev cluster's translations (devcluster.vllm_serve: stand-in models and heads, no GPU flags).
Both get the same few completions; then every metric family the analysis reads — the vLLM metric table (`metric_names(EngineKind.VLLM)`)
and every metric its PromQL names (`analysis.queries.queries_for`) — must be in both expositions with the same
type, label names and histogram bucket boundaries. A metric renamed in engines/vllm.py renames the simulator's
too (it names its metrics from that table), and real vLLM does not follow: this test is what catches it.

It needs vLLM's CPU build in its cached environment (~6 GiB; `make real-vllm` installs it) and 1–3 minutes of
two cores, so it runs only with SPECDEPLOY_REAL_VLLM=1, which `make test` (CI) sets.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdeploy.api.resource import load_resource
from specdeploy.api.spec import EngineKind
from specdeploy.devcluster import processes
from specdeploy.devcluster.standins import PREDICTABLE, prompt_words
from specdeploy.devcluster.vllm_serve import local_server, standin_vllm
from specdeploy.engines import metric_names
from specdeploy.judgment.queries import queries_for
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, engine_command
from specdeploy_engine.sim.exposition import ParsedFamily, parse

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("SPECDEPLOY_REAL_VLLM") != "1",
                       reason="real vLLM (CPU build, minutes to start): set SPECDEPLOY_REAL_VLLM=1"),
]

SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: conformance}}
spec:
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation: {speculation}
  serving: {{maxModelLen: 2048, maxNumSeqs: 4}}
"""
METHODS = {
    # The methods the CPU build runs with stand-ins: a draft model, n-gram prompt lookup (no weights), and EAGLE
    # and EAGLE-3 heads (the head named maps to the stand-in head of its method, standins.py). MTP needs a
    # target with MTP layers, which the Llama stand-in has not: vLLM refuses it (docs/dev-cluster.md).
    "draft_model": "{method: draft_model, draft: {name: meta-llama/Llama-3.2-1B-Instruct}, numSpeculativeTokens: 3}",
    "eagle": "{method: eagle, draft: {name: yuhuili/EAGLE-LLaMA3.1-Instruct-8B}, numSpeculativeTokens: 3}",
    "eagle3": "{method: eagle3, draft: {name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}, numSpeculativeTokens: 3}",
    "ngram": "{method: ngram, numSpeculativeTokens: 3}",
}
REQUESTS = 4
MAX_TOKENS = 16
SIM_START_SECONDS = 60.0
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")
_METRIC_IN_PROMQL = re.compile(r"\b(vllm:[a-zA-Z0-9_:]+)")


def rendered_argv(method: str) -> list[str]:
    """The speculative pod's command line for `method`, as the operator renders it."""
    plan = make_plan(load_resource(SD.format(speculation=METHODS[method])).spec)
    return engine_command(plan, Variant.SPECULATIVE, speculate=True).argv()


def analysed_metrics() -> set[str]:
    """Every metric the analysis reads: the metric table and every name its queries use."""
    names = set(metric_names(EngineKind.VLLM).names())
    for query in queries_for(EngineKind.VLLM, 60.0):
        names |= set(_METRIC_IN_PROMQL.findall(query.promql))
    return names


def family_of(name: str, families: dict[str, ParsedFamily]) -> ParsedFamily | None:
    """The family a name in a query belongs to (`X_bucket`, `X_sum`, `X_count` are histogram X's)."""
    if name in families:
        return families[name]
    for part in HISTOGRAM_PARTS:
        base = name.removesuffix(part)
        if base != name and base in families and families[base].kind == "histogram":
            return families[base]
    return None


def shape(family: ParsedFamily) -> tuple[str, tuple[str, ...], tuple[float, ...]]:
    """What must agree: type, label names (without `le`), bucket boundaries."""
    labels = sorted({key for _, pairs in family.samples for key, _ in pairs if key != "le"})
    buckets = sorted({float(dict(pairs)["le"]) for sample, pairs in family.samples if sample.endswith("_bucket")})
    return family.kind, tuple(labels), tuple(buckets)


def complete(base: str, model: str) -> str:
    """REQUESTS greedy completions of stand-in words (text the stand-ins' tokenizer knows); the exposition after."""
    with httpx.Client(base_url=base, timeout=120) as client:
        for seed in range(REQUESTS):
            prompt = " ".join(prompt_words(PREDICTABLE, length=8, seed=seed))
            reply = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                         "temperature": 0.0, "ignore_eos": True})
            reply.raise_for_status()
        return client.get("/metrics").text


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_simulator_exposes_the_analysed_metrics_as_real_vllm(method: str, tmp_path: Path) -> None:
    argv = rendered_argv(method)
    served_name = argv[argv.index("--served-model-name") + 1]
    sim_port = processes.free_port()
    sim_argv = [sys.executable, "-m", "specdeploy_engine.sim", "--host", "127.0.0.1", "--port", str(sim_port),
                "--", *argv]
    with local_server("simulator", sim_argv, tmp_path / "sim.log", sim_port, timeout=SIM_START_SECONDS) as sim:
        simulated = parse(complete(sim.base_url, served_name))
    with standin_vllm(argv, tmp_path / "vllm.log") as vllm:
        real_families = parse(complete(vllm.base_url, served_name))

    differences = []
    for name in sorted(analysed_metrics()):
        ours, theirs = family_of(name, simulated), family_of(name, real_families)
        if ours is None or theirs is None:
            differences.append(f"{name}: {'absent' if ours is None else 'present'} in the simulator, "
                               f"{'absent' if theirs is None else 'present'} in real vLLM")
        elif shape(ours) != shape(theirs):
            differences.append(f"{name}: simulator {shape(ours)} != real vLLM {shape(theirs)}")
    assert not differences, "\n".join(differences)


SCHEDULED = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: scheduled}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation:
    method: draft_model
    draft: {name: meta-llama/Llama-3.2-1B-Instruct}
    numSpeculativeTokens: 3
    schedule: {mode: Table, table: [{minBatch: 1, maxBatch: 2, k: 3}, {minBatch: 3, maxBatch: 4, k: 0}]}
  serving: {maxModelLen: 2048, maxNumSeqs: 4}
  analysis: {probe: {}}
"""


def test_real_vllm_runs_the_rendered_schedule_and_answers_with_its_own_counts(tmp_path: Path) -> None:
    """What the operator renders for a batch-size schedule (num_speculative_tokens_per_batch_size) and for its
    probe (--per-request-spec-decode-metrics summary) starts real vLLM, which drafts at batch 1 (k = 3) and
    returns each answer's own counts — the simulator the same. (A draft model: n-gram lookup proposes nothing
    when the stand-in's greedy text repeats no n-gram of the prompt, and vLLM then counts no step.)"""
    plan = make_plan(load_resource(SCHEDULED).spec)
    argv = engine_command(plan, Variant.SPECULATIVE, speculate=True).argv()
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 4, 0]]
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    served_name = argv[argv.index("--served-model-name") + 1]
    sim_port = processes.free_port()
    sim_argv = [sys.executable, "-m", "specdeploy_engine.sim", "--host", "127.0.0.1", "--port", str(sim_port),
                "--", *argv]
    with local_server("simulator", sim_argv, tmp_path / "sim.log", sim_port, timeout=SIM_START_SECONDS) as sim:
        simulated = _one_answer(sim.base_url, served_name)
    with standin_vllm(argv, tmp_path / "vllm.log") as vllm:
        real = _one_answer(vllm.base_url, served_name)
    for answer in (simulated, real):
        counts = answer["metrics"]["speculative_decoding"]
        assert counts["num_spec_steps"] > 0 and counts["num_draft_tokens"] > 0, answer["metrics"]


def _one_answer(base: str, model: str) -> dict[str, Any]:
    """One greedy completion of predictable stand-in words, alone (batch 1: the schedule's k = 3)."""
    prompt = " ".join(prompt_words(PREDICTABLE, length=8, seed=0))
    with httpx.Client(base_url=base, timeout=120) as client:
        reply = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                     "temperature": 0.0, "ignore_eos": True})
        reply.raise_for_status()
        return dict(reply.json())
