"""`specdeploy probe FILE --url URL` against the simulator on loopback: the table per workload and temperature,
the workload below the cost model's break-even named, counter deltas where the answers carry no counts, and an
engine that does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from click.testing import CliRunner
from simulated import simulator_on_loopback

from specdeploy.cli import main
from specdeploy_engine.sim.knobs import Knobs

SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: chat}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: eagle3, draft: {name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}, numSpeculativeTokens: 3}
  resources: {gpu: {product: H100-80GB}}
"""
ARGV = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama", "--speculative-config",
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}']
WORKLOADS = "code: ['[code] def parse(text):', '[code] class Cache:']\nsupport: ['[support] Where is my refund?']\n"


@contextlib.contextmanager
def simulator_thread(argv: list[str]) -> Iterator[str]:
    """The simulator on loopback in a thread of its own (the CLI runs its own event loop); its base URL."""
    started: queue.Queue[str] = queue.Queue()
    stopping: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def serve() -> None:
        knobs = Knobs()
        knobs.update({"workloadAcceptance": {"[code]": 0.85, "[support]": 0.03}})  # the break-even is 0.09
        stop = asyncio.Event()
        stopping.append((asyncio.get_running_loop(), stop))
        async with simulator_on_loopback(argv, knobs, seed=5, time_scale=0.05) as base:
            started.put(base)
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.get(timeout=30)
    finally:
        loop, stop = stopping[0]
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)


def _probe(tmp_path: Path, url: str, *extra: str) -> tuple[int, str]:
    """The exit code and what was printed: stdout alone for `-o json`, else stdout and stderr (the progress)."""
    (tmp_path / "sd.yaml").write_text(SD)
    (tmp_path / "workloads.yaml").write_text(WORKLOADS)
    result = CliRunner().invoke(main, ["probe", str(tmp_path / "sd.yaml"), "--url", url, "--offline",
                                       "--workloads", str(tmp_path / "workloads.yaml"), "--requests-per-cell", "4",
                                       "--rate", "100", *extra], env={"COLUMNS": "240"})
    return result.exit_code, result.stdout if "json" in extra else result.output


def test_the_probe_prints_each_cell_and_names_the_workload_that_would_not_pay(tmp_path: Path) -> None:
    with simulator_thread([*ARGV, "--per-request-spec-decode-metrics", "summary"]) as url:
        code, text = _probe(tmp_path, url)
        json_code, document = _probe(tmp_path, url, "-o", "json")
    assert code == 0, text
    assert "counts from each answer's metrics.speculative_decoding" in text
    assert "break-even: Auto: break-even 0.09 at batch 1 for eagle3 k=3" in text
    assert text.count("not paying: support at temperature") == 3 and "not paying: code" not in text
    assert "probe round 4/4: code@0 0.8" in text   # progress per round of requests, each cell's acceptance so far
    assert json_code == 0
    cells = {(c["workload"], c["temperature"]): c for c in json.loads(document)["cells"]}
    assert len(cells) == 6 and all(c["requests"] == 4 for c in cells.values())
    assert cells[("code", 0.0)]["acceptanceRate"] > cells[("code", 1.0)]["acceptanceRate"]


def test_counter_deltas_stand_in_for_an_engine_without_per_request_metrics(tmp_path: Path) -> None:
    with simulator_thread(ARGV) as url:
        code, text = _probe(tmp_path, url, "--temperatures", "0")
    assert code == 0, text
    assert "counts from the engine's counters around each request" in text
    assert "not paying: support at temperature 0" in text


def test_an_engine_that_does_not_answer_is_an_error_with_the_reason(tmp_path: Path) -> None:
    code, text = _probe(tmp_path, "http://127.0.0.1:9", "--temperatures", "0")
    assert code == 2 and "does not answer /v1/models" in text
