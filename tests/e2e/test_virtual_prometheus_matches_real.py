"""benchmarks/virtual_prometheus.py answers the operator's queries as the real Prometheus does, on the same scrapes.

A loopback server plays eleven engine pods of four SDs (vLLM, SGLang and TensorRT-LLM, speculative and control
variants), each exposition a fixed text per scrape whose counters and histograms advance by seeded random steps:
one pod restarts (its counters start again near 0), one stops exposing anything (its series go stale), one starts
late (its series begin inside the windows). A real Prometheus (/usr/bin/prometheus, its own, not the dev cluster's)
scrapes them every second until each has served SCRAPES expositions. The virtual Prometheus then ingests exactly
what each real scrape read — the text served by that request, at the timestamp Prometheus gave the scrape (read
back from the `up` series and a sequence number in each exposition), an empty text for a scrape that failed — and
both answer every query template of every engine (judgment/queries.py: each signal, the "group by" of the pods
behind the series, one SD's pinned selector) at a few instants, two windows each, and the raw samples.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml
from benchmark_modules import load_virtual_prometheus
from loopback_exposition import expositions_on_loopback

from specdeploy.api.spec import EngineKind
from specdeploy.clients.prometheus import PrometheusClient
from specdeploy.devcluster import wait_for
from specdeploy.devcluster.monitoring import PROMETHEUS
from specdeploy.devcluster.processes import free_port
from specdeploy.judgment.assembly import Sample
from specdeploy.judgment.queries import SELECTOR, pinned_selector, queries_for, series_pods_query

pytestmark = pytest.mark.e2e

SCRAPES = 22                 # per pod, one a second
WINDOWS = (10.0, 5.0)        # 5 s: slices of 500 ms, durations in ms
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)
SEQUENCE = "harness_exposition_sequence"
REL, ABS = 1e-9, 1e-12


# --- the engine pods: expositions advancing in seeded steps ------------------------------------------------------

_SELECTED = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)" + re.escape(SELECTOR))
_GAUGE = re.compile(r"(?:avg_over_time\(|count by \([^)]*\) \()([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


@dataclass(frozen=True)
class Names:
    """What one engine's queries read, by kind (from the query texts, so that they follow the templates)."""

    histograms: tuple[str, ...]             # base names with _bucket, _sum and _count
    sums_and_counts: tuple[str, ...]        # base names with _sum and _count only
    gauges: tuple[str, ...]
    counters: tuple[str, ...]
    per_position: dict[str, str]            # counter -> its position label


def engine_names(engine: EngineKind) -> Names:
    queries = [q for window in WINDOWS for q in queries_for(engine, window)]
    selected = {name for q in queries for name in _SELECTED.findall(q.promql)}
    gauges = {name for q in queries for name in _GAUGE.findall(q.promql)}
    per_position = {_SELECTED.findall(q.promql)[0]: q.position_label for q in queries if q.position_label}
    histograms = {name.removesuffix("_bucket") for name in selected if name.endswith("_bucket")}
    parts = {name.rsplit("_", 1)[0] for name in selected if name.endswith(("_sum", "_count"))} - histograms
    taken = gauges | set(per_position) | {f"{base}_{part}" for base in histograms | parts
                                          for part in ("bucket", "sum", "count")}
    return Names(tuple(sorted(histograms)), tuple(sorted(parts)), tuple(sorted(gauges)),
                 tuple(sorted(selected - taken)), per_position)


@dataclass
class Pod:
    """One engine pod's metrics, advanced one step per scrape; `expositions` holds every text served, in order."""

    name: str
    sd: str
    namespace: str
    variant: str
    engine: EngineKind
    restart_at: int | None = None        # the counters start again near 0 at this scrape
    silent_from: int | None = None       # nothing exposed from this scrape on
    starts_at: int = 0                   # nothing exposed before this scrape
    expositions: list[str] = field(default_factory=list)
    state: dict[tuple[str, str], float] = field(default_factory=dict)   # (name, extra labels) -> value

    def __post_init__(self) -> None:
        self.rng = random.Random(self.name)
        self.names = engine_names(self.engine)
        self.lock = threading.Lock()

    def serve(self) -> str:
        with self.lock:
            n = len(self.expositions)
            text = self._render(n)
            self.expositions.append(text)
            return text

    def _render(self, n: int) -> str:
        if n < self.starts_at or (self.silent_from is not None and n >= self.silent_from):
            return "# nothing to expose\n"
        if n == self.restart_at:
            self.state.clear()
        self._advance()
        labels = 'model_name="meta-llama/Llama-3.1-8B-Instruct",engine="0"'
        lines = [f"{SEQUENCE} {n}"]
        for (name, extra), value in sorted(self.state.items()):
            lines.append(f"{name}{{{labels}{extra}}} {value!r}")
        return "\n".join(lines) + "\n"

    def _speculates(self, name: str) -> bool:
        return self.variant == "speculative" or "spec" not in name

    def _advance(self) -> None:
        rng, state, names = self.rng, self.state, self.names
        for base in names.histograms + names.sums_and_counts:
            observed = [rng.lognormvariate(-2.5, 1.5) for _ in range(rng.randrange(0, 6))]
            for part, added in (("count", float(len(observed))), ("sum", math.fsum(observed))):
                state[f"{base}_{part}", ""] = state.get((f"{base}_{part}", ""), 0.0) + added
            if base in names.histograms:
                for bound in (*BUCKETS, math.inf):
                    le = "+Inf" if math.isinf(bound) else repr(bound)
                    key = (f"{base}_bucket", f',le="{le}"')
                    state[key] = state.get(key, 0.0) + sum(1 for v in observed if v <= bound)
        for name in names.counters:
            if self._speculates(name):
                state[name, ""] = state.get((name, ""), 0.0) + rng.randrange(0, 40)
        for name, label in names.per_position.items():
            if self._speculates(name):
                for position in range(4):
                    key = (name, f',{label}="{position}"')
                    state[key] = state.get(key, 0.0) + rng.randrange(0, 12 - 2 * position)
        for name in names.gauges:
            if self._speculates(name):
                state[name, ""] = float(rng.randrange(0, 9)) if "req" in name else rng.uniform(0.2, 3.5)


PODS = [
    Pod("alpha-7d9f8-s0", "alpha", "team-a", "speculative", EngineKind.VLLM),
    Pod("alpha-7d9f8.s1", "alpha", "team-a", "speculative", EngineKind.VLLM, restart_at=9),
    Pod("alpha-5c4b2-c0", "alpha", "team-a", "control", EngineKind.VLLM),
    Pod("beta-6f7a1-s0", "beta", "team-b", "speculative", EngineKind.VLLM),
    Pod("beta-6f7a1-c0", "beta", "team-b", "control", EngineKind.VLLM, silent_from=14),
    Pod("beta-6f7a1-c1", "beta", "team-b", "control", EngineKind.VLLM, starts_at=13),
    Pod("gamma-8e2d3-s0", "gamma", "team-a", "speculative", EngineKind.SGLANG),
    Pod("gamma-8e2d3-s1", "gamma", "team-a", "speculative", EngineKind.SGLANG, restart_at=12),
    Pod("gamma-8e2d3-c0", "gamma", "team-a", "control", EngineKind.SGLANG),
    Pod("delta-9a0b4-s0", "delta", "team-a", "speculative", EngineKind.TRTLLM),
    Pod("delta-9a0b4-c0", "delta", "team-a", "control", EngineKind.TRTLLM, starts_at=4),
]


# --- the real Prometheus scraping them ---------------------------------------------------------------------------

@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[str]:
    """The pods served and scraped by a real Prometheus until each has served SCRAPES texts; yields its URL."""
    with expositions_on_loopback({f"/{pod.name}/metrics": pod.serve for pod in PODS}) as address:
        port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "engines", "static_configs": [
                {"targets": [address], "labels": {"namespace": pod.namespace, "pod": pod.name,
                                                  "specdeploy_io_name": pod.sd,
                                                  "specdeploy_io_variant": pod.variant,
                                                  "__metrics_path__": f"/{pod.name}/metrics"}}
                for pod in PODS]}],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "prometheus.log").open("w")
        process = subprocess.Popen([str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}",
                                    f"--web.listen-address=127.0.0.1:{port}"],
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: min(len(pod.expositions) for pod in PODS) >= SCRAPES, timeout=60,
                     what=f"{SCRAPES} scrapes of each engine pod by {PROMETHEUS}",
                     describe=lambda: (tmp_path / "prometheus.log").read_text()[-2000:], interval=0.5)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


# --- the same scrapes into the virtual Prometheus -----------------------------------------------------------------

async def _replay(client: PrometheusClient, vp: ModuleType) -> tuple[Any, list[Sample]]:
    """A virtual Prometheus holding what each real scrape read, and the `up` series of the real one (its scrapes)."""
    version = int((await _buildinfo(client.base_url))["version"].split(".")[0])
    virtual = vp.VirtualPrometheus(version=version)
    ups = await client.query('up{job="engines"}[5m]')
    sequences = await client.query(f'{SEQUENCE}{{job="engines"}}[5m]')
    by_pod = {pod.name: pod for pod in PODS}
    numbers = {s.labels["pod"]: {at: int(n) for at, n in s.points} for s in sequences}
    scrapes = []
    for up in ups:
        labels = {k: v for k, v in up.labels.items() if k != "__name__"}
        pod, target = by_pod[labels["pod"]], virtual.add_target(labels, lambda: "")
        for at, _ in up.points:
            n = numbers.get(pod.name, {}).get(at)
            scrapes.append((at, target, pod.expositions[n] if n is not None else ""))
    for at, target, text in sorted(scrapes, key=lambda s: s[0]):
        virtual.ingest(target, text, at)
    assert len(ups) == len(PODS)
    return virtual, ups


async def _buildinfo(base_url: str) -> dict[str, str]:
    async with httpx.AsyncClient() as http:
        answer = (await http.get(f"{base_url}/api/v1/status/buildinfo")).json()
    data: dict[str, str] = answer["data"]
    return data


# --- the comparison -----------------------------------------------------------------------------------------------

def _queries() -> list[str]:
    texts = []
    for engine in EngineKind:
        for window in WINDOWS:
            texts += [q.promql for q in queries_for(engine, window)]
            texts.append(series_pods_query(engine, window))
    pinned = pinned_selector("team-a", "alpha", ["alpha-7d9f8-s0", "alpha-7d9f8.s1", "alpha-5c4b2-c0"])
    texts += [q.promql for q in queries_for(EngineKind.VLLM, WINDOWS[0], pinned)]
    texts.append('{__name__=~"vllm:.+|sglang:.+|trtllm_.+",specdeploy_io_name!=""}[30s]')   # the raw samples
    return list(dict.fromkeys(texts))


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


@dataclass
class Tally:
    answers: int = 0
    empty: int = 0
    values: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: list[str] = field(default_factory=list)

    def value(self, where: str, real: float, virtual: float) -> None:
        self.values += 1
        if math.isfinite(real) and math.isfinite(virtual):
            self.max_abs = max(self.max_abs, abs(real - virtual))
            self.max_rel = max(self.max_rel, abs(real - virtual) / max(abs(real), abs(virtual), 1e-300))
        if not _close(real, virtual):
            self.mismatches.append(f"{where}: real {real!r}, virtual {virtual!r}")

    def answer(self, where: str, real: list[Sample], virtual: list[Sample]) -> None:
        self.answers += 1
        self.empty += not real
        def keyed(samples: list[Sample]) -> dict[frozenset[tuple[str, str]], Sample]:
            return {frozenset(s.labels.items()): s for s in samples}
        mine, theirs = keyed(virtual), keyed(real)
        if mine.keys() != theirs.keys():
            self.mismatches.append(f"{where}: series only real {sorted(map(sorted, theirs.keys() - mine.keys()))}, "
                                   f"only virtual {sorted(map(sorted, mine.keys() - theirs.keys()))}")
            return
        for key, sample in theirs.items():
            other = mine[key]
            if sample.points or other.points:
                if [t for t, _ in sample.points] != [t for t, _ in other.points]:
                    self.mismatches.append(f"{where} {dict(key)}: instants differ")
                    continue
                for (t, real), (_, virtual) in zip(sample.points, other.points, strict=True):
                    self.value(f"{where} {dict(key)} @{t}", real, virtual)
            else:
                self.value(f"{where} {dict(key)}", sample.value, other.value)


def test_the_virtual_prometheus_answers_every_operator_query_as_the_real_one(scraped: str) -> None:
    vp = load_virtual_prometheus()

    async def compare() -> tuple[Tally, list[float]]:
        async with PrometheusClient(scraped, timeout=10.0) as client:
            virtual, ups = await _replay(client, vp)
            newest = min(up.points[-1][0] for up in ups)     # every pod was scraped by then
            # Four instants: the newest, two between scrapes, and one whose 10 s range starts exactly on a scrape
            # (where left-open and closed ranges differ).
            instants = [newest, round(newest - 2.317, 3), round(newest - 4.5, 3), ups[0].points[6][0] + WINDOWS[0]]
            assert all(at <= newest for at in instants)
            tally = Tally()
            for promql in _queries():
                for at in instants:
                    tally.answer(f"{promql} @{at}", await client.query(promql, at), await virtual.query(promql, at))
            return tally, instants

    tally, instants = asyncio.run(compare())
    print(f"\n{len(_queries())} queries × {len(instants)} instants: {tally.answers} answers ({tally.empty} empty), "
          f"{tally.values} values compared; largest difference {tally.max_abs:.3g} absolute, "
          f"{tally.max_rel:.3g} relative")
    assert not tally.mismatches, "\n".join(tally.mismatches[:20])
    assert tally.values > 3000 and tally.empty < tally.answers / 4   # the answers carry data, not empty vectors
