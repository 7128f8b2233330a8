"""Reach the simulators of one SpeculativeDeployment: their base URLs, and their run-time knobs.

    endpoints(cluster, "demo/llama", "control")                 # ["http://127.80.0.3:8000"]
    sim_admin(cluster, "demo/llama", "speculative", {"acceptance": 0.3, "oom": True})

The simulators are the pod runner's (``<state>/podrunner/sims.json``); knobs go to each one's
`POST /admin/knobs` as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from specdeploy.devcluster.errors import DevClusterError
from specdeploy.devcluster.simregistry import SimulatorEndpoint, parse_sd

if TYPE_CHECKING:
    from specdeploy.devcluster.cluster import DevCluster

KNOBS_PATH = "/admin/knobs"
VARIANTS = ("speculative", "control")


class NoSimulators(DevClusterError):
    """No simulator matches the SD (and variant) asked for."""


@dataclass(frozen=True)
class KnobResult:
    """What one simulator answered to a knob change: its knobs after the change, or the error."""

    endpoint: SimulatorEndpoint
    knobs: dict[str, Any] | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def parse_knob(assignment: str) -> tuple[str, Any]:
    """`acceptance=0.3` → ("acceptance", 0.3); values are JSON scalars (true, 0.05, "x"), else plain text."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"a knob is set as KEY=VALUE (e.g. acceptance=0.3), got {assignment!r}")
    try:
        value = json.loads(text)
    except ValueError:
        return key, text
    if isinstance(value, dict | list):
        raise ValueError(f"knob {key!r} must be a number, true/false, null or text, got {text!r}")
    return key, value


def matching(cluster: DevCluster, sd: str, variant: str | None = None) -> list[SimulatorEndpoint]:
    """The simulators of `sd` (NAMESPACE/NAME) that serve (not a group's workers), of one variant when given;
    raises NoSimulators when none."""
    namespace, name = parse_sd(sd)
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    found = [s for s in cluster.simulators(namespace=namespace, sd=name, variant=variant) if s.serves]
    if not found:
        which = f" variant {variant}" if variant else ""
        raise NoSimulators(f"no simulators for {namespace}/{name}{which}; is the pod runner running "
                           "(`dev-cluster up --monitoring`) and are the SD's pods Running?")
    return found


def endpoints(cluster: DevCluster, sd: str, variant: str | None = None) -> list[str]:
    """Base URLs of the ready simulators of `sd` — the pods its Service would send traffic to."""
    return [s.url for s in matching(cluster, sd, variant) if s.ready]


def sim_admin(cluster: DevCluster, sd: str, variant: str | None, knobs: dict[str, Any],
              timeout: float = 5.0) -> list[KnobResult]:
    """POST `knobs` to every running simulator of `sd` (one variant when given); one result per simulator."""
    results = []
    with httpx.Client(timeout=timeout) as client:
        for sim in matching(cluster, sd, variant):
            if not sim.pid:
                results.append(KnobResult(sim, None, f"not running ({sim.state})"))
                continue
            try:
                response = client.post(f"{sim.url}{KNOBS_PATH}", json=knobs)
                if response.is_error:
                    results.append(KnobResult(sim, None, f"HTTP {response.status_code}: {response.text.strip()[:500]}"))
                    continue
                body = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                results.append(KnobResult(sim, None, f"{type(exc).__name__}: {exc}"))
                continue
            results.append(KnobResult(sim, body if isinstance(body, dict) else {"response": body}))
    return results
