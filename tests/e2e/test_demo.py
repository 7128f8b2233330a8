"""The README's main command: `specdeploy demo --no-tty` shows a rollback end to end, then a load ramp on an
Auto-scheduled SD: k 0 at the peak, drafting again after it, with the same pods and no rollback."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


#: A line of the ramp's table: time, load, the speculative engine's batch and k in use, the control's batch,
#: status.speculation.active, the speedup column, the verdict.
RAMP_ROW = re.compile(r"^ +\d+s +(low|peak|low again) +(\d+) +(\d+) +(\d+) +(\S+) +(\S+) +(\S+)$", re.MULTILINE)


def test_demo_shows_a_rollback_end_to_end(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "demo", "--no-tty", "--cleanup", "--state-dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=540, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for text in ("helm install", "STATUS: deployed", "operator pid", "Rolled back: InterTokenLatencyRegressed",
                 "vs the control, above maxP99InterTokenLatencyRatio 1.10", "(95% interval",
                 "SpeculationRolledBack", '"alertname": "SpeculationRolledBack"',
                 "now runs the same target without speculation", "demo finished"):
        assert text in output, f"{text!r} missing from the demo's output:\n{output[-6000:]}"
    # Before the collapse, with the default limits, the speculative pods were measured faster than control.
    healthy = output.split("Injecting an acceptance collapse", 1)[0]
    speedups = [float(cell[:-1]) for cell in healthy.split() if cell.endswith("×") and cell[:-1].replace(".", "").isdigit()]
    assert speedups and max(speedups) > 1.2, healthy[-3000:]
    assert "--speculative-config" not in output.split("without speculation", 1)[1].split("operator metric")[0]

    ramp = output.split("kubectl apply: demo/llama-70b-auto", 1)[1]
    _check_ramp(ramp)


def _check_ramp(ramp: str) -> None:
    """The load ramp: the derived table has a k = 0 range; at low load the engine drafts and the speedup column is
    above 1; at the peak the engine's batch reaches that range, drafting stops and the column falls below 0.9;
    back at low load drafting and the speedup return; the same two pods throughout, no restart, no rollback."""
    assert "batch 288–320  k 0" in ramp and '"num_speculative_tokens_per_batch_size":' in ramp.replace("\n", ""), ramp
    rows: dict[str, list[tuple[int, int, str, float]]] = {"low": [], "peak": [], "low again": []}
    for load, spec_batch, k, _control_batch, speculating, speedup, _verdict in RAMP_ROW.findall(ramp):
        assert speculating == "True", ramp
        rows[load].append((int(spec_batch), int(k), speedup, float(speedup[:-1]) if speedup.endswith("×") else 0.0))
    low, peak, after = rows["low"], rows["peak"], rows["low again"]
    assert low and peak and after, ramp
    assert all(k > 0 for _, k, _, _ in low), low
    assert any(k == 0 and batch >= 288 for batch, k, _, _ in peak), peak
    assert after[-1][1] > 0 and after[-1][0] < 79, after
    assert low[-1][3] > 1.15 and after[-1][3] > 1.15 and 0 < peak[-1][3] < 0.9, (low[-1], peak[-1], after[-1])
    # The pods named at the apply and after each phase: the same names, no restart, no rollback.
    pods = re.findall(r"pods:? ((?:\S+ \(restarts \d+\)(?:, )?)+)", ramp.replace("\n", " "))
    assert len(pods) == 4 and len(set(pods)) == 1 and pods[0].count("(restarts 0)") == 2, pods
    assert ramp.count("rollbacks 0, lastRollback None") == 3 and "CHANGED" not in ramp, ramp
