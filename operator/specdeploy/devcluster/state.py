"""What a running dev cluster leaves on disk: ``<state>/state.json`` with every process and address.

Why on disk: `status`, `env` and `down` run in other processes than `up` (the CLI, a test session,
the demo), and `down` must find every pid even after `up` failed half-way.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: What the pod runner runs for engine pods: the simulator for all, or real vLLM (CPU build, stand-in models)
#: for the pods that run `vllm serve` (`dev-cluster up --engine vllm`).
ENGINES = ("sim", "vllm")


def default_state_dir() -> Path:
    """``$SPECDEPLOY_DEV_CLUSTER_DIR``, else ``$XDG_STATE_HOME/specdeploy/dev-cluster``, else ~/.local/state/…."""
    if env := os.environ.get("SPECDEPLOY_DEV_CLUSTER_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "specdeploy" / "dev-cluster"


@dataclass
class ComponentRecord:
    """One started process: pid (= its process group), start time, log file, where it listens."""

    name: str
    pid: int
    started: int | None
    log: str
    address: str = ""


@dataclass
class ClusterState:
    """Everything `status`, `env` and `down` need."""

    components: dict[str, ComponentRecord] = field(default_factory=dict)
    kubeconfig: str = ""
    apiserver_url: str = ""
    prometheus_url: str = ""
    alertmanager_url: str = ""
    nodes: list[str] = field(default_factory=list)
    kubernetes_version: str = ""
    engine: str = "sim"      # one of ENGINES
    ready: bool = False

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ClusterState | None:
        """The saved state, or None when there is none (or it is unreadable)."""
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        components = {name: ComponentRecord(**record) for name, record in raw.pop("components", {}).items()}
        return cls(components=components, **raw)
