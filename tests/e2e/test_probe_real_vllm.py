"""The probe against real vLLM: its requests sent to the CPU build serving the stand-in target with the stand-in
EAGLE-3 head and `--per-request-spec-decode-metrics summary`, each answer's own `metrics.speculative_decoding`
read, and the cells they make — a workload the head predicts and one it does not, at temperatures 0 and 1.

No cluster: the pod command line runs by the dev cluster's translations on loopback (devcluster.vllm_serve), as
the conformance test does. It runs only with SPECDEPLOY_REAL_VLLM=1, which `make test` (CI) sets.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from specdeploy.clients.engine_probe import send_probe
from specdeploy.devcluster.standins import PREDICTABLE, UNPREDICTABLE, prompt_words
from specdeploy.devcluster.vllm_serve import standin_vllm
from specdeploy.judgment.probe import ProbeBudget, ProbeOutcome, not_paying, probe_cells, probe_requests

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("SPECDEPLOY_REAL_VLLM") != "1",
                       reason="real vLLM (CPU build, minutes to start): set SPECDEPLOY_REAL_VLLM=1"),
]

ARGV = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama", "--max-model-len", "512",
        "--speculative-config",
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}',
        "--per-request-spec-decode-metrics", "summary"]
WORKLOADS = {"predictable": [" ".join(prompt_words(PREDICTABLE, 8, seed)) for seed in range(3)],
             "unpredictable": [" ".join(prompt_words(UNPREDICTABLE, 8, seed)) for seed in range(3)]}
BREAK_EVEN = 0.3


def test_the_probe_reads_real_vllms_per_request_counts(tmp_path: Path) -> None:
    budget = ProbeBudget(requests_per_cell=3, max_tokens=16, requests_per_second=2.0)
    requests = probe_requests(WORKLOADS, (0.0, 1.0), budget)
    with standin_vllm(ARGV, tmp_path / "vllm.log", timeout=900) as server:
        async def probe() -> list[ProbeOutcome]:
            async with httpx.AsyncClient() as client:
                return await send_probe(client, server.base_url, "llama", requests, budget, deadline_seconds=300)

        outcomes = asyncio.run(probe())
    assert [o.error for o in outcomes] == [None] * len(requests)
    cells = {(c.workload, c.temperature): c for c in probe_cells(outcomes, k=3, break_even=BREAK_EVEN)}
    print("\n".join(str(c) for c in cells.values()), file=sys.stderr)
    cold, hot = cells[("predictable", 0.0)], cells[("predictable", 1.0)]
    assert cold.acceptance_rate == 1.0 and cold.mean_acceptance_length == 4.0 and cold.pays
    assert hot.acceptance_rate is not None and hot.acceptance_rate < cold.acceptance_rate
    assert cells[("unpredictable", 0.0)].acceptance_rate == 0.0
    assert any(s.startswith("unpredictable at temperature 0: acceptance 0.00 is below the break-even")
               for s in not_paying(cells.values(), BREAK_EVEN))
