"""Run-time knobs of the simulator: base acceptance, noise, extra latency, and a CUDA OOM crash.

    knobs = Knobs.from_env(os.environ)            # SPECDEPLOY_SIM_KNOBS='{"acceptance": 0.8}'
    knobs.update({"acceptance": 0.3, "extraLatencySeconds": 0.05})
    knobs.to_wire()                               # what GET /admin/knobs returns

Exceptions:

    ValueError
     └── KnobError   a knob document the simulator cannot apply; the message names the knob and what it
                     accepts
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_VAR = "SPECDEPLOY_SIM_KNOBS"
WIRE_NAMES = {
    "acceptance": "acceptance",
    "extraLatencySeconds": "extra_latency_seconds",
    "oom": "oom",
    "exitCode": "exit_code",
    "noise": "noise",
}


class KnobError(ValueError):
    """A knob value the simulator cannot use."""


@dataclass
class Knobs:
    """acceptance: vLLM acceptance rate (accepted ÷ drafted) of a greedy request at the engine's k; None
    keeps the method's default. noise: standard deviation of each request's deviation from it.
    extra_latency_seconds: added to every engine step. oom: crash with a CUDA out-of-memory error and exit
    with exit_code."""

    acceptance: float | None = None
    extra_latency_seconds: float = 0.0
    oom: bool = False
    exit_code: int = 1
    noise: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Knobs:
        """Knobs from SPECDEPLOY_SIM_KNOBS (a JSON object), defaults when it is unset or empty."""
        knobs = cls()
        text = environ.get(ENV_VAR, "").strip()
        if text:
            try:
                document = json.loads(text)
            except json.JSONDecodeError as error:
                raise KnobError(f"{ENV_VAR} must be a JSON object such as '{{\"acceptance\": 0.7}}': {error}") from None
            knobs.update(document)
        return knobs

    def update(self, document: Any) -> None:
        """Apply a JSON object of knobs; all or nothing (a bad knob changes none)."""
        if not isinstance(document, dict):
            raise KnobError(f"knobs must be a JSON object, got {document!r}")
        changes = {}
        for name, value in document.items():
            attribute = WIRE_NAMES.get(name)
            if attribute is None:
                raise KnobError(f"unknown knob {name!r}: expected one of {', '.join(WIRE_NAMES)}")
            changes[attribute] = _checked(name, value)
        for attribute, value in changes.items():
            setattr(self, attribute, value)

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, attribute) for name, attribute in WIRE_NAMES.items()}


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise KnobError(f"knob {name!r} must be a number, got {value!r}")
    if not low <= value <= high:
        raise KnobError(f"knob {name!r} must be between {low:g} and {high:g}, got {value!r}")
    return float(value)


def _checked(name: str, value: Any) -> Any:
    if name == "acceptance":
        return None if value is None else _number(name, value, 0.0, 1.0)
    if name == "noise":
        return _number(name, value, 0.0, 1.0)
    if name == "extraLatencySeconds":
        return _number(name, value, 0.0, 60.0)
    if name == "oom":
        if not isinstance(value, bool):
            raise KnobError(f"knob 'oom' must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise KnobError(f"knob 'exitCode' must be an integer from 0 to 255, got {value!r}")
    return value
