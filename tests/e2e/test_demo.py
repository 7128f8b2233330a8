"""The README's main command: `specdeploy demo --no-tty` shows a rollback end to end (the chart's dashboard has data in
every panel the demo can fill: devcluster/dashboard.py), then a load ramp on an
Auto-scheduled SD: drafting stops inside the engine at the peak and starts again after it, with the same pods and
no rollback."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

#: A line of the ramp's table: time, load, the speculative engine's batch and k in use, the control's batch,
#: status.speculation.active, the speedup column (value and interval), the verdict and its reason.
RAMP_ROW = re.compile(r"^ +\d+s +(low|peak|low again) +(\d+) +(\d+) +(\d+) +(\S+) +(\S+×) \((\S+)–(\S+)\) +(\S+) +(\S+)$",
                      re.MULTILINE)


def test_demo_shows_a_rollback_end_to_end(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "demo", "--no-tty", "--cleanup", "--state-dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=900, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    flat = " ".join(output.split())     # the console wraps long lines at its width
    for text in ("helm install", "STATUS: deployed", "operator pid", "EAGLE-3 head drafting k = 3", "(95% interval",
                 "SpeculationRolledBack", '"alertname": "SpeculationRolledBack"',
                 "now runs the same target without speculation", "dashboard: every panel has data", "demo finished"):
        assert text in flat, f"{text!r} missing from the demo's output:\n{output[-6000:]}"
    # The collapse at k 3 costs ~15-20% per token on the simulator's hardware profile (the measured H100 table: three
    # EAGLE-3 passes of ~0.3 ms and a 4-token verify on a ~6.4 ms step; it was ~10% on the planner's roofline), above
    # the 1.10 limit: the ratio check usually rolls it back (measured +17%, InterTokenLatencyRegressed), and the
    # measured loss with the acceptance surely below its floor may come first.
    rolled = re.search(r"Rolled back: (\w+) evidence: (.*?) \$ kubectl get sd", flat)
    assert rolled is not None, output[-6000:]
    reason, evidence = rolled.groups()
    assert reason in ("SlowerBelowAcceptanceFloor", "InterTokenLatencyRegressed"), rolled[0]
    assert "vs the control" in evidence and "(95% interval" in evidence, evidence
    if reason == "SlowerBelowAcceptanceFloor":
        assert "is below the acceptance floor" in evidence and "drafts cost more than they save" in evidence, evidence
    print(f"the collapse at k 3 rolled back on {reason}: {evidence[:400]}")
    # Before the collapse, with the default limits, the speculative pods were measured faster than control.
    healthy = output.split("Injecting an acceptance collapse", 1)[0]
    speedups = [float(cell[:-1]) for cell in healthy.split() if cell.endswith("×") and cell[:-1].replace(".", "").isdigit()]
    assert speedups and max(speedups) > 1.2, healthy[-3000:]
    assert "--speculative-config" not in output.split("without speculation", 1)[1].split("operator metric")[0]

    # The ramp: each phase ends on the row that met it — low: drafting, faster with confidence; peak: both pods
    # near maxNumSeqs, the engine at k 0, no loss; low again: drafting, faster again. The same pods throughout.
    ramp = output.split("Low load, ", 1)[1]
    last = {}
    for match in RAMP_ROW.finditer(ramp):
        last[match[1]] = (int(match[2]), int(match[3]), int(match[4]), match[5], float(match[6][:-1]),
                          float(match[7]), f"{match[9]} {match[10]}")
    assert set(last) == {"low", "peak", "low again"}, ramp[-6000:]
    for phase in ("low", "low again"):
        _, k, _, active, _, low, _ = last[phase]
        assert k > 0 and active == "True" and low > 1.2, (phase, last[phase])
    batch, k, control, active, speedup, _, verdict = last["peak"]
    assert batch >= 270 and control >= 270 and k == 0 and active == "True", last["peak"]
    assert speedup >= 0.97 and not verdict.startswith("Failing"), last["peak"]
    checkpoints = [line for line in ramp.splitlines() if line.startswith("after ")]
    assert [line.split(":")[0] for line in checkpoints] == ["after low load", "after the peak", "after the ramp"]
    for line in checkpoints:
        assert line.endswith(": the same pods, restarts 0, rollbacks 0"), line
    assert "rendered into the speculative pod's TensorRT-LLM config: draft_len_schedule" in output, ramp[:3000]
    assert "No restart and no rollback" in ramp
    verdicts = sorted({(match[1], match[9], match[10]) for match in RAMP_ROW.finditer(ramp)})
    print(f"the ramp's phases ended on (batch, k, control batch, active, speedup, low, verdict): {last}; "
          f"verdicts seen: {verdicts}")
