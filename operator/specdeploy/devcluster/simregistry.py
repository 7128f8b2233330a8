"""Where the pod runner's simulators are: ``<state>/podrunner/sims.json``, written atomically by the runner.

    registry = load(path)
    [s.url for s in registry.select(namespace="demo", sd="llama", variant="control") if s.ready]

Why a file: the load generator, `sim-admin`, tests and `down` run in other processes than the runner;
`down` also needs every simulator's pid and start time to stop what a killed runner left behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

#: States of one simulator: waiting for its ConfigMap, started but not answering /health yet,
#: answering, or waiting out a crash-loop back-off.
PENDING, STARTING, RUNNING, BACK_OFF = "Pending", "Starting", "Running", "BackOff"


@dataclass(frozen=True)
class SimulatorEndpoint:
    """One engine pod's simulator."""

    namespace: str
    pod: str
    uid: str
    sd: str
    variant: str
    engine: str
    address: str               # podIP:containerPort, where the pod's engine listens (a loopback address); "" for
                               # a group's worker, which serves nothing
    metrics_path: str
    health_path: str
    pid: int = 0
    started: int | None = None  # the process's start time (clock ticks since boot), to tell a reused pid
    state: str = PENDING
    restarts: int = 0
    log: str = ""
    role: str = ""             # leader or worker of a LeaderWorkerSet's group; "" for a pod of a Deployment

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.80.0.3:8000 (what the pod's Service would send traffic to)."""
        return f"http://{self.address}"

    @property
    def ready(self) -> bool:
        return self.state == RUNNING

    @property
    def serves(self) -> bool:
        """A group's worker runs no engine that answers: what sends it traffic or knobs skips it."""
        return bool(self.address)


@dataclass
class Registry:
    """The runner's pid, whether it has seen every pod once, and its simulators by pod uid."""

    runner_pid: int = 0
    synced: bool = False
    simulators: dict[str, SimulatorEndpoint] = field(default_factory=dict)

    def select(self, namespace: str | None = None, sd: str | None = None,
               variant: str | None = None) -> list[SimulatorEndpoint]:
        """Simulators matching every filter given, ordered by namespace and pod name."""
        found = [s for s in self.simulators.values()
                 if (namespace is None or s.namespace == namespace) and (sd is None or s.sd == sd)
                 and (variant is None or s.variant == variant)]
        return sorted(found, key=lambda s: (s.namespace, s.sd, s.variant, s.pod))

    def save(self, path: Path) -> None:
        """Write atomically: a reader sees the old file or the new one, never half of one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {"runnerPid": self.runner_pid, "synced": self.synced,
                    "simulators": [asdict(s) for s in self.select()]}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(document, indent=1) + "\n")
        tmp.replace(path)


_FIELDS = frozenset(f.name for f in fields(SimulatorEndpoint))


def _endpoint(raw: dict[str, Any]) -> SimulatorEndpoint:
    return SimulatorEndpoint(**{k: v for k, v in raw.items() if k in _FIELDS})


def load(path: Path) -> Registry:
    """The registry at `path`; an empty one when there is none (no runner, or not started yet)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return Registry()
    simulators = {s["uid"]: _endpoint(s) for s in raw.get("simulators", [])}
    return Registry(int(raw.get("runnerPid", 0)), bool(raw.get("synced", False)), simulators)


def parse_sd(reference: str) -> tuple[str, str]:
    """`NAMESPACE/NAME` → (namespace, name); a bare NAME is in `default`."""
    namespace, sep, name = reference.partition("/")
    if not sep:
        namespace, name = "default", reference
    if not namespace or not name or "/" in name:
        raise ValueError(f"a SpeculativeDeployment is named NAMESPACE/NAME (or NAME in default), got {reference!r}")
    return namespace, name
