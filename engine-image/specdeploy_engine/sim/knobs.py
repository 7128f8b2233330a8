"""Run-time knobs of the simulator: base acceptance (per workload too), noise, extra latency, the cost of
a vLLM step that drafts nothing, hardware slower or faster than its profile, and a CUDA OOM crash.

    knobs = Knobs.from_env(os.environ)            # SPECDEPLOY_SIM_KNOBS='{"acceptance": 0.8}'
    knobs.update({"acceptance": 0.3, "extraLatencySeconds": 0.05})
    knobs.update({"hardwareSlowdown": 1.25})      # every pass 25% slower than the hardware profile says
    knobs.update({"workloadAcceptance": {"[code]": 0.85, "[support]": 0.3}})
    knobs.update({"workloadAcceptance": "[code]=0.85,[support]=0.3"})     # the same, as one line of text
    knobs.workload_rate("fix this [code] please")                        # 0.85
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
from dataclasses import dataclass, field
from typing import Any

ENV_VAR = "SPECDEPLOY_SIM_KNOBS"
WIRE_NAMES = {
    "acceptance": "acceptance",
    "extraLatencySeconds": "extra_latency_seconds",
    "oom": "oom",
    "exitCode": "exit_code",
    "noise": "noise",
    "workloadAcceptance": "workload_acceptance",
    "zeroDraftOverhead": "zero_draft_overhead",
    "hardwareSlowdown": "hardware_slowdown",
}
# A vLLM step that drafts nothing under num_speculative_tokens_per_batch_size costs this much more than the
# same step without speculation: vllm#49986 measures 20-31% at k = 0 (the drafter's forward still runs,
# vllm#49548). 0.25 is the middle of that range, not a measurement of ours.
ZERO_DRAFT_OVERHEAD = 0.25
MAX_WORKLOADS = 32              # markers in workloadAcceptance
MAX_MARKER_CHARS = 200


class KnobError(ValueError):
    """A knob value the simulator cannot use."""


@dataclass
class Knobs:
    """acceptance: vLLM acceptance rate (accepted ÷ drafted) of a greedy request at the engine's k; None
    keeps the method's default. noise: standard deviation of each request's deviation from it.
    extra_latency_seconds: added to every engine step. oom: crash with a CUDA out-of-memory error and exit
    with exit_code. workload_acceptance: marker -> acceptance rate, in order; a request whose prompt text
    contains a marker (the first one found, in this order) has that rate instead of `acceptance` (noise and
    temperature still apply). update() replaces the mapping, never changes it in place (the engine keys a
    request's lookup on the mapping's identity). zero_draft_overhead: the extra cost of a vLLM step whose k
    schedule drafts nothing, as a fraction of the step without speculation. hardware_slowdown: every step's time
    times this factor — GPUs that are not what their profile (the datasheet, the measured table) says, the case
    the operator's fit of its hardware from the control pods exists for."""

    acceptance: float | None = None
    extra_latency_seconds: float = 0.0
    oom: bool = False
    exit_code: int = 1
    noise: float = 0.0
    workload_acceptance: dict[str, float] = field(default_factory=dict)
    zero_draft_overhead: float = ZERO_DRAFT_OVERHEAD
    hardware_slowdown: float = 1.0

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
        wire = {name: getattr(self, attribute) for name, attribute in WIRE_NAMES.items()}
        wire["workloadAcceptance"] = dict(self.workload_acceptance)
        return wire

    def workload_rate(self, text: str) -> float | None:
        """The workloadAcceptance rate of a prompt: that of the first marker (in the knob's order) the text
        contains, None when it contains none."""
        if text:
            for marker, rate in self.workload_acceptance.items():
                if marker in text:
                    return rate
        return None


def _number(name: str, value: Any, low: float, high: float, what: str | None = None) -> float:
    what = what or f"knob {name!r}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise KnobError(f"{what} must be a number, got {value!r}")
    if not low <= value <= high:
        raise KnobError(f"{what} must be between {low:g} and {high:g}, got {value!r}")
    return float(value)


def _workloads(value: Any) -> dict[str, float]:
    """workloadAcceptance: a JSON object {marker: rate}, or the same as text "MARKER=RATE,MARKER=RATE" (what
    a KEY=VALUE command line can carry); null or "" clears it."""
    name = "workloadAcceptance"
    if value is None:
        return {}
    if isinstance(value, str):
        pairs: list[tuple[Any, Any]] = []
        for item in value.split(","):
            if not item.strip():
                continue
            marker, sep, text = item.strip().rpartition("=")
            if not sep:
                raise KnobError(f"knob {name!r} as text is MARKER=RATE[,MARKER=RATE...], got {item.strip()!r}")
            try:
                rate: Any = float(text)
            except ValueError:
                rate = text
            pairs.append((marker.strip(), rate))
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise KnobError(f"knob {name!r} must be an object of marker -> acceptance rate, got {value!r}")
    if len(pairs) > MAX_WORKLOADS:
        raise KnobError(f"knob {name!r} takes at most {MAX_WORKLOADS} markers, got {len(pairs)}")
    checked: dict[str, float] = {}
    for marker, rate in pairs:
        if not isinstance(marker, str) or not marker.strip() or len(marker) > MAX_MARKER_CHARS:
            raise KnobError(f"knob {name!r}: a marker must be a non-empty string of at most "
                            f"{MAX_MARKER_CHARS} characters, got {marker!r}")
        if marker in checked:
            raise KnobError(f"knob {name!r}: marker {marker!r} is given twice")
        checked[marker] = _number(name, rate, 0.0, 1.0, f"knob {name!r}: the rate of {marker!r}")
    return checked


def _checked(name: str, value: Any) -> Any:
    if name == "workloadAcceptance":
        return _workloads(value)
    if name == "acceptance":
        return None if value is None else _number(name, value, 0.0, 1.0)
    if name in ("noise", "zeroDraftOverhead"):
        return _number(name, value, 0.0, 1.0)
    if name == "extraLatencySeconds":
        return _number(name, value, 0.0, 60.0)
    if name == "hardwareSlowdown":
        return _number(name, value, 0.25, 4.0)
    if name == "oom":
        if not isinstance(value, bool):
            raise KnobError(f"knob 'oom' must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise KnobError(f"knob 'exitCode' must be an integer from 0 to 255, got {value!r}")
    return value
