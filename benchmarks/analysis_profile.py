"""Where an analysis cycle's time goes with many SDs: API calls by verb and kind, the pure steps, CPU.

    python benchmarks/analysis_profile.py [--count 1000] [--cycles 2] [--top 20]

Starts its own dev cluster with monitoring, creates `--count` idle SDs (`replicas: 0`, baseline None,
one query group) and runs the operator's reconciler and analysis loop in this process, without kopf:
first every SD is reconciled once (as the operator does when they appear) and sampled once, then
`--cycles` analysis cycles are run one reconcile at a time, so that the wall time of each step adds up
to the cycle's, and then as many with the operator's `CONCURRENT_RECONCILES`. For the one-at-a-time cycles it prints the
API calls (count per SD, milliseconds per SD, share of the cycle), the pure steps (plan, render,
status), this process' CPU beside kube-apiserver's and etcd's, the functions that took most CPU
(cProfile, own time), and what one read of an SD's children costs when asked in other ways.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient, KubeConfig
from process_usage import Mark, load_average, machine

from specdeploy.api import names as names_module
from specdeploy.api.resource import GROUP, PLURAL, VERSION
from specdeploy.clients import kube
from specdeploy.controller import analysis_loop
from specdeploy.controller import reconciler as reconciler_module
from specdeploy.controller.reconciler import Reconciler
from specdeploy.controller.watched import SD
from specdeploy.devcluster import DevCluster
from specdeploy.reconcile import decide as decide_module
from specdeploy.reconcile.children import LABEL_NAME

NAMESPACE = "bench"
INTERVAL = 3.0
SD_SPEC = {
    "replicas": 0,
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
    "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
    "analysis": {"interval": f"{INTERVAL:g}s", "window": "20s", "baseline": {"mode": "None"}},
}
PURE_STEPS = (
    (reconciler_module, "plan_resource"), (decide_module, "desired_children"),
    (decide_module, "next_status"), (decide_module, "step_speculation"), (reconciler_module, "decide"),
    (analysis_loop, "_validated_due"),
)
API_STEPS = (
    (kube, "get_resource"), (kube, "read_deployments"), (kube, "read_children"), (kube, "engine_pods"),
    (kube, "apply_children"), (kube, "prune_children"), (kube, "write_status"),
    (analysis_loop, "query_all"),
)


class Timings:
    """Wall seconds and calls per named step, summed."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: defaultdict[str, int] = defaultdict(int)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name] += 1

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def _timed_coroutine(function: Callable[..., Awaitable[Any]], name: str, timings: Timings) -> Callable[..., Any]:
    @functools.wraps(function)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await function(*args, **kwargs)
        finally:
            timings.add(name, time.perf_counter() - started)
    return timed


def _timed_function(function: Callable[..., Any], name: str, timings: Timings) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            timings.add(name, time.perf_counter() - started)
    return timed


def _kind(resource: Any) -> str:
    """The kind a lightkube call is about: its resource class, or the object's kind."""
    return resource.__name__ if isinstance(resource, type) else str(getattr(resource, "kind", "?"))


def _timed_verb(method: Callable[..., Awaitable[Any]], verb: str, calls: Timings) -> Callable[..., Any]:
    """`verb` timed per kind; a patch also by its type (server-side apply is a patch of type apply)."""
    async def timed(resource: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await method(resource, *args, **kwargs)
        finally:
            patch_type = kwargs.get("patch_type")
            kind = f"{_kind(resource)} ({patch_type.value})" if patch_type is not None else _kind(resource)
            calls.add(f"{verb} {kind}", time.perf_counter() - started)
    return timed


def _timed_event(function: Callable[..., Awaitable[Any]], steps: Timings) -> Callable[..., Any]:
    """`kube.post_event` timed per Event reason: which Events an unchanged SD posts every cycle."""
    @functools.wraps(function)
    async def timed(client: Any, body: Any, event: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await function(client, body, event, *args, **kwargs)
        finally:
            steps.add(f"post_event {event.reason}", time.perf_counter() - started)
    return timed


def instrument(client: AsyncClient, steps: Timings, calls: Timings) -> None:
    """Time the reconciler's steps (module functions) and every API call (by verb and kind) from now on."""
    for module, name in API_STEPS:
        setattr(module, name, _timed_coroutine(getattr(module, name), name, steps))
    for module, name in PURE_STEPS:
        setattr(module, name, _timed_function(getattr(module, name), name, steps))

    kube.post_event = _timed_event(kube.post_event, steps)
    for verb in ("get", "patch", "create", "delete"):
        setattr(client, verb, _timed_verb(getattr(client, verb), verb, calls))
    original_list = client.list

    def timed_list(resource: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async def listing() -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for item in original_list(resource, *args, **kwargs):
                    yield item
            finally:
                calls.add(f"list {_kind(resource)}", time.perf_counter() - started)
        return listing()

    setattr(client, "list", timed_list)  # noqa: B010 - replacing a bound method on this one client


def _table(title: str, timings: Timings, count: int, cycles: int, cycle_seconds: float) -> None:
    print(f"| {title} | calls per SD | ms per SD | share of the cycle |")
    print("| --- | --- | --- | --- |")
    for name, seconds in sorted(timings.seconds.items(), key=lambda item: -item[1]):
        per_sd = seconds / (count * cycles) * 1000
        print(f"| {name} | {timings.calls[name] / (count * cycles):.2f} | {per_sd:.2f} | "
              f"{seconds / (cycle_seconds * cycles):.0%} |")


async def _cycle(reconciler: Reconciler, prometheus_url: str, count: int) -> None:
    """One analysis cycle, as the operator runs it; every SD must have been due. Without kopf's watch the
    SDs the loop looks at are listed here first (not timed: the operator's watch delivers them)."""
    async for sd in reconciler.client.list(kube.SpeculativeDeploymentResource, namespace=NAMESPACE):
        reconciler.watched.seen(SD, sd.to_dict())
    sampled = await analysis_loop.analyse_once(reconciler, [NAMESPACE], prometheus_url)
    if sampled != count:
        print(f"warning: {sampled} of {count} SDs sampled", file=sys.stderr)


def read_costs(cluster: DevCluster, count: int, samples: int) -> None:
    """What one read of an SD's children costs, by how it is asked: a label-selector list (what
    `kube.engine_pods` does, and the Deployments' read once did), the same from the apiserver's watch cache
    (`resourceVersion=0`), or a get by the child's known name; each alone, and each right after a write
    (a status patch of another SD), as in a cycle, where a consistent list waits for the watch cache to
    catch up with the write."""
    names = [f"sd-{i:04d}" for i in range(0, count, max(1, count // samples))][:samples]
    deployments = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    ways: dict[str, Callable[[str], tuple[str, dict[str, str]]]] = {
        "list Deployment by label (consistent read)": lambda n: (deployments, {"labelSelector": f"{LABEL_NAME}={n}"}),
        "list Deployment by label, resourceVersion=0": lambda n: (
            deployments, {"labelSelector": f"{LABEL_NAME}={n}", "resourceVersion": "0"}),
        "get Deployment by name": lambda n: (f"{deployments}/{names_module.engine_deployment_name(n)}", {}),
        "list Pod by label (consistent read)": lambda n: (pods, {"labelSelector": f"{LABEL_NAME}={n}"}),
        "list Pod by label, resourceVersion=0": lambda n: (
            pods, {"labelSelector": f"{LABEL_NAME}={n}", "resourceVersion": "0"}),
    }
    written = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}/{names[0]}/status"
    print(f"\n| one read, {count} SDs' children in the namespace (httpx, one at a time) | ms alone "
          "| ms right after a write |")
    print("| --- | --- | --- |")
    with cluster.api_client() as api:
        for way, request in ways.items():
            costs = []
            for after_write in (False, True):
                seconds = 0.0
                for index, name in enumerate(names):
                    if after_write:
                        api.patch(written, json={"status": {"observedGeneration": index}}, timeout=60,
                                  headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
                    path, params = request(name)
                    started = time.perf_counter()
                    api.get(path, params=params, timeout=60).raise_for_status()
                    seconds += time.perf_counter() - started
                costs.append(seconds / len(names) * 1000)
            print(f"| {way} | {costs[0]:.1f} | {costs[1]:.1f} |")


async def profile(cluster: DevCluster, count: int, cycles: int, top: int) -> None:
    client = AsyncClient(config=KubeConfig.from_file(cluster.kubeconfig), field_manager=kube.FIELD_MANAGER)
    reconciler = Reconciler(client)
    pids = {c.name: c.pid for c in cluster.status().components if c.name in ("kube-apiserver", "etcd")}
    started = time.monotonic()
    limit = asyncio.Semaphore(analysis_loop.CONCURRENT_RECONCILES)

    async def first(name: str) -> None:
        async with limit:
            await reconciler.reconcile(NAMESPACE, name)

    await asyncio.gather(*(first(f"sd-{i:04d}") for i in range(count)))
    print(f"first reconcile of {count} SDs, {analysis_loop.CONCURRENT_RECONCILES} at a time, in this process: "
          f"{time.monotonic() - started:.1f} s ({count / (time.monotonic() - started):.1f} SDs/s)")
    await asyncio.sleep(INTERVAL)
    await _cycle(reconciler, cluster.prometheus_url, count)   # the first sample's changes (Ready, analysis)
    steps, calls = Timings(), Timings()
    instrument(client, steps, calls)
    concurrent = analysis_loop.CONCURRENT_RECONCILES
    for concurrency in (1, concurrent):
        analysis_loop.CONCURRENT_RECONCILES = concurrency
        steps.clear()
        calls.clear()
        durations, cpu = [], 0.0
        marks = {name: Mark.of(pid) for name, pid in pids.items()}
        for _ in range(cycles):
            await asyncio.sleep(INTERVAL)   # every SD due again
            began, began_cpu = time.monotonic(), time.process_time()
            await _cycle(reconciler, cluster.prometheus_url, count)
            durations.append(time.monotonic() - began)
            cpu += time.process_time() - began_cpu
        wall = sum(durations)
        busy = {name: marks[name].cpu_per_wall(Mark.of(pid)) * (wall + cycles * INTERVAL) / wall
                for name, pid in pids.items()}
        mean = wall / cycles
        print(f"\n### {concurrency} reconcile(s) at a time: cycle {mean:.1f} s mean "
              f"({', '.join(f'{d:.1f}' for d in durations)}), {mean / count * 1000:.1f} ms per SD; "
              f"CPU cores busy during the cycles: this process {cpu / wall:.2f}, "
              + ", ".join(f"{name} {value:.2f}" for name, value in busy.items())
              + " (the last two over cycles and the sleeps between them, scaled to the cycles)")
        if concurrency == 1:
            print()
            _table("step (wall, nested: apply_children holds the apply calls)", steps, count, cycles, mean)
            print()
            _table("API call", calls, count, cycles, mean)
    analysis_loop.CONCURRENT_RECONCILES = 1
    await asyncio.sleep(INTERVAL)
    profiler = cProfile.Profile()
    profiler.enable()
    await _cycle(reconciler, cluster.prometheus_url, count)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print("\nCPU by function (cProfile, own time, one more cycle, one reconcile at a time):")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))
    await client.close()


def run(count: int, cycles: int, top: int) -> None:
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-profile-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=1, monitoring=True,
                             progress=lambda m: print(m, file=sys.stderr))
        cluster.up()
        try:
            repo = Path(__file__).resolve().parents[1]
            cluster.kubectl("apply", "--server-side", "-f", str(repo / "crds"))
            cluster.kubectl("wait", "--for", "condition=established", "crd/speculativedeployments.specdeploy.io")
            cluster.kubectl("create", "namespace", NAMESPACE)
            documents = [{"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
                          "metadata": {"name": f"sd-{i:04d}", "namespace": NAMESPACE}, "spec": SD_SPEC}
                         for i in range(count)]
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(documents), timeout=1800)
            print(f"machine: {machine()}; load average before {load_before}")
            asyncio.run(profile(cluster, count, cycles, top))
            read_costs(cluster, count, samples=100)
        finally:
            cluster.down()
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--top", type=int, default=20, help="functions listed by CPU")
    arguments = parser.parse_args()
    run(arguments.count, arguments.cycles, arguments.top)
