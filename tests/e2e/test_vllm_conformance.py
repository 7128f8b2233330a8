"""Conformance: the simulator exposes the metrics the analysis reads as real vLLM does.

The same rendered `vllm serve` command (a small draft_model SD through the operator's own renderer) runs twice on
loopback, with no cluster: by the project's simulator, and by real vLLM's CPU build through the dev cluster's
translations (devcluster.vllm_pods: stand-in models, no GPU flags). Both get the same few completions; then every
metric family the analysis reads — the vLLM metric table (`metric_names(EngineKind.VLLM)`) and every metric its
PromQL names (`analysis.queries.queries_for`) — must be in both expositions with the same type, label names and
histogram bucket boundaries. A metric renamed in engines/vllm.py renames the simulator's too (it names its metrics
from that table), and real vLLM does not follow: this test is what catches it.

Not in CI yet: it needs vLLM's CPU build in its cached environment (~6 GiB; `specdeploy dev-cluster up --engine
vllm` installs it) and 1–3 minutes of two cores, so it runs only with SPECDEPLOY_REAL_VLLM=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from specdeploy.analysis.queries import queries_for
from specdeploy.api.resource import load_resource
from specdeploy.api.spec import EngineKind
from specdeploy.devcluster import processes, vllm_env
from specdeploy.devcluster.standins import PREDICTABLE, prompt_words
from specdeploy.devcluster.vllm_pods import cpu_serve
from specdeploy.engines import metric_names
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
metadata: {name: conformance}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: draft_model, draft: {name: meta-llama/Llama-3.2-1B-Instruct}, numSpeculativeTokens: 3}
  serving: {maxModelLen: 2048, maxNumSeqs: 4}
"""
REQUESTS = 4
MAX_TOKENS = 16
VLLM_START_SECONDS = 600.0
SIM_START_SECONDS = 60.0
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")
_METRIC_IN_PROMQL = re.compile(r"\b(vllm:[a-zA-Z0-9_:]+)")


def rendered_argv() -> list[str]:
    """The speculative pod's command line, as the operator renders it."""
    plan = make_plan(load_resource(SD).spec)
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


@contextmanager
def server(argv: Sequence[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` in a session of its own; its whole process group is stopped on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        processes.stop(proc.pid, grace=20.0)
        proc.wait(timeout=30)


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path, deadline_s: float) -> float:
    """Seconds until /health answers 200; fails with the log's tail when the server exits first."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if proc.poll() is not None:
            pytest.fail(f"{log.name} exited {proc.returncode}:\n{processes.log_tail(log, 30)}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{log.name} not healthy after {deadline_s:.0f}s:\n{processes.log_tail(log, 30)}")


def complete(base: str, model: str) -> str:
    """REQUESTS greedy completions of stand-in words (text the stand-ins' tokenizer knows); the exposition after."""
    with httpx.Client(base_url=base, timeout=120) as client:
        for seed in range(REQUESTS):
            prompt = " ".join(prompt_words(PREDICTABLE, length=8, seed=seed))
            reply = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                         "temperature": 0.0, "ignore_eos": True})
            reply.raise_for_status()
        return client.get("/metrics").text


def test_the_simulator_exposes_the_analysed_metrics_as_real_vllm(tmp_path: Path) -> None:
    argv = rendered_argv()
    served_name = argv[argv.index("--served-model-name") + 1]
    real = vllm_env.ensure_real_vllm()
    vllm_port, sim_port = processes.free_port(), processes.free_port()
    vllm_argv = cpu_serve(argv, vllm=real.vllm, port=vllm_port, standins=real.standins).argv
    vllm_environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    vllm_environment |= vllm_env.cpu_environment(real.kv_cache_gib, real.threads)
    sim_argv = [sys.executable, "-m", "specdeploy_engine.sim", "--host", "127.0.0.1", "--port", str(sim_port),
                "--", *argv]
    with (server(vllm_argv, vllm_environment, tmp_path / "vllm.log") as vllm_proc,
          server(sim_argv, dict(os.environ), tmp_path / "sim.log") as sim_proc):
        wait_healthy(sim_proc, f"http://127.0.0.1:{sim_port}", tmp_path / "sim.log", SIM_START_SECONDS)
        simulated = parse(complete(f"http://127.0.0.1:{sim_port}", served_name))
        wait_healthy(vllm_proc, f"http://127.0.0.1:{vllm_port}", tmp_path / "vllm.log", VLLM_START_SECONDS)
        real_families = parse(complete(f"http://127.0.0.1:{vllm_port}", served_name))

    differences = []
    for name in sorted(analysed_metrics()):
        ours, theirs = family_of(name, simulated), family_of(name, real_families)
        if ours is None or theirs is None:
            differences.append(f"{name}: {'absent' if ours is None else 'present'} in the simulator, "
                               f"{'absent' if theirs is None else 'present'} in real vLLM")
        elif shape(ours) != shape(theirs):
            differences.append(f"{name}: simulator {shape(ours)} != real vLLM {shape(theirs)}")
    assert not differences, "\n".join(differences)
