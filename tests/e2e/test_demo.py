"""The README's main command: `specdeploy demo --no-tty` shows a rollback end to end."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


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
