#!/usr/bin/env python3
"""Generate the figures under docs/figures/ from the examples (needs the `plot` extra):

    python scripts/figures.py [--out docs/figures]

- plan-llama-70b-fp8-tp2.png: `specdeploy plan --plot` of examples/llama-70b-fp8-tp2.yaml as it is.
- plan-llama-70b-fp8-tp2-auto.png: the same with `schedule: {mode: Auto}` and maxNumSeqs 256, so the picture
  shows a break-even and the schedule's k by batch.

Every figure is drawn by the code `--plot` runs (specdeploy/views/plots.py), so docs show what users get. The
cost model against measured H100 step times waits for tests/data/h100-step-times.json in the repository.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from specdeploy.api.resource import load_resource
from specdeploy.planning.plan import make_plan
from specdeploy.views.plots import write_plan_figure

REPO = Path(__file__).resolve().parents[1]
#: (figure name, example, changes to its spec)
PLAN_FIGURES: list[tuple[str, str, dict[str, Any]]] = [
    ("plan-llama-70b-fp8-tp2.png", "llama-70b-fp8-tp2.yaml", {}),
    ("plan-llama-70b-fp8-tp2-auto.png", "llama-70b-fp8-tp2.yaml",
     {"serving": {"maxNumSeqs": 256}, "speculation": {"schedule": {"mode": "Auto"}}}),
]


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merged(base.get(key) or {}, value) if isinstance(value, dict) else value
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "figures")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for figure, example, changes in PLAN_FIGURES:
        document = yaml.safe_load((REPO / "examples" / example).read_text())
        document["spec"] = _merged(document["spec"], changes)
        resource = load_resource(yaml.safe_dump(document))
        curves = write_plan_figure(resource.metadata.name, make_plan(resource.spec), out / figure)
        print(f"{out / figure}: k={curves.k}, break-even at batch {curves.break_even_batch or 'none'}, "
              f"{(out / figure).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
