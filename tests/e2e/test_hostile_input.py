"""Hostile SpeculativeDeployments against the real apiserver and a running operator process.

Each manifest (tests/unit/hostile_strategies.py: the issue's named cases, then hypothesis' examples) is
applied as `kubectl apply --server-side` does. It is either refused with a message — and Python's
`parse_resource` refuses it too — or accepted: Python accepts it too, and the operator writes a status
for its generation; if that status rejects it, no child exists for it. Afterwards the operator is alive,
logged no traceback, and idles. SPECDEPLOY_HOSTILE_EXAMPLES sets how many generated manifests (100 by default).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from specdeploy.api.resource import GROUP, PLURAL, VERSION, InvalidResource, parse_resource
from specdeploy.devcluster import DevCluster, wait_for

if TYPE_CHECKING:
    from conftest import OperatorProcess

pytestmark = pytest.mark.e2e

GENERATED_EXAMPLES = int(os.environ.get("SPECDEPLOY_HOSTILE_EXAMPLES", "100"))
STATUS_TIMEOUT = 90.0
RESYNC_SECONDS = 30
IDLE_SECONDS = float(RESYNC_SECONDS)
"""Idle is measured over one whole resync period, so the window holds one resync of every SD (about 1.1 s
of CPU for the ~37 SDs this test leaves), not zero or one depending on when the window starts."""
IDLE_CPU_LIMIT = 0.10       # of one core: a hot loop or a leak shows far above it
CHILD_KINDS = (("apis/apps/v1", "deployments"), ("api/v1", "services"), ("api/v1", "configmaps"))


def _strategies() -> ModuleType:
    """tests/unit/hostile_strategies.py (pure; shared with the unit test of the same manifests)."""
    if "hostile_strategies" in sys.modules:
        return sys.modules["hostile_strategies"]
    path = Path(__file__).resolve().parents[1] / "unit" / "hostile_strategies.py"
    spec = importlib.util.spec_from_file_location("hostile_strategies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_strategies"] = module
    spec.loader.exec_module(module)
    return module


def _has_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(v is None or _has_null(v) for v in value.values())
    return isinstance(value, list) and any(_has_null(v) for v in value)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Trial:
    """Applies manifests in one namespace and checks how each was handled."""

    client: httpx2.Client
    namespace: str
    operator: OperatorProcess
    ran: set[str] = field(default_factory=set)       # names some generation of which was planned to run
    outcomes: list[str] = field(default_factory=list)

    def _path(self, name: str = "") -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}" + (f"/{name}" if name else "")

    def _children(self, name: str) -> list[str]:
        found = []
        for prefix, kind in CHILD_KINDS:
            listing = self.client.get(f"/{prefix}/namespaces/{self.namespace}/{kind}",
                                      params={"labelSelector": "specdeploy.io/name"}).json()
            found += [f"{kind}/{item['metadata']['name']}" for item in listing["items"]
                      if item["metadata"]["labels"]["specdeploy.io/name"] == name]
        return found

    def run(self, label: str, document: dict[str, Any]) -> None:
        assert self.operator.process.poll() is None, "the operator died:\n" + self.operator.output()[-4000:]
        name = str(document["metadata"].get("name") or "")
        try:
            parse_resource(document)
            python_error = ""
        except InvalidResource as error:
            python_error = str(error)
        response = self.client.patch(
            self._path(name or "unnamed"), content=json.dumps(document, ensure_ascii=False).encode(),
            params={"fieldManager": "hostile-input", "force": "true", "fieldValidation": "Strict"},
            headers={"Content-Type": "application/apply-patch+yaml"}, timeout=60,
        )
        what = f"{label} ({name[:60]!r}): {json.dumps(document.get('spec'), ensure_ascii=False)[:400]}"
        if response.is_success:
            assert not python_error, f"the apiserver accepted what Python refuses ({python_error}): {what}"
            self._handled(name, response.json()["metadata"]["generation"], what)
            return
        message = response.json().get("message", "") if "json" in response.headers.get("content-type", "") else ""
        assert response.status_code in (400, 413, 422, 500) and (message or response.status_code == 413), (
            f"{response.status_code} {response.text[:300]}: {what}")
        if response.status_code != 413 and not _has_null(document.get("spec")):
            assert python_error, f"Python accepts what the apiserver refuses ({message[:300]}): {what}"
        if name not in self.ran:
            assert not self._children(name), f"children exist for a refused SD: {what}"
        self.outcomes.append(f"refused {response.status_code}")

    def _handled(self, name: str, generation: int, what: str) -> None:
        def observed() -> dict[str, Any] | None:
            obj = self.client.get(self._path(name)).json()
            return obj if (obj.get("status") or {}).get("observedGeneration") == generation else None

        try:
            obj = wait_for(observed, STATUS_TIMEOUT, f"status of generation {generation}", interval=0.2)
        except TimeoutError as error:
            raise AssertionError(f"no status for an accepted SD: {what}\n{self.operator.output()[-3000:]}") from error
        conditions = {c["type"]: c for c in obj["status"].get("conditions", [])}
        runs = all(conditions.get(t, {}).get("status") == "True" for t in ("MemoryFits", "Compatible"))
        for wanted in ("MemoryFits", "Compatible", "Ready"):
            assert conditions.get(wanted, {}).get("message"), f"{wanted} has no message: {what}"
        if runs:
            self.ran.add(name)
            self.outcomes.append("accepted, runs")
        else:
            if name not in self.ran:
                assert not self._children(name), f"children exist for a rejected SD: {what}"
            self.outcomes.append("accepted, rejected by the operator")


def test_hostile_manifests_are_refused_or_handled(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., OperatorProcess]
) -> None:
    dev_cluster.kubectl("create", "quota", "no-pods", "--hard=pods=0", "-n", namespace)  # 10,000 replicas stay on paper
    operator = operator_processes("hostile", "--resync-seconds", str(RESYNC_SECONDS))
    strategies = _strategies()
    started = time.monotonic()
    with dev_cluster.api_client() as client:
        trial = Trial(client, namespace, operator)
        for label, document in strategies.named_cases():
            trial.run(label, document)

        @settings(max_examples=GENERATED_EXAMPLES, derandomize=True, deadline=None, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(strategies.hostile_documents())
        def apply_generated(document: dict[str, Any]) -> None:
            trial.run("generated", document)

        apply_generated()
    applied = time.monotonic() - started
    counts = {outcome: trial.outcomes.count(outcome) for outcome in sorted(set(trial.outcomes))}
    print(f"{len(trial.outcomes)} manifests in {applied:.0f} s: {counts}", file=sys.stderr)
    assert counts.get("accepted, runs") and counts.get("accepted, rejected by the operator"), counts

    before = _cpu_seconds(operator.process.pid)
    time.sleep(IDLE_SECONDS)  # measuring an idle period: nothing to wait for
    busy = (_cpu_seconds(operator.process.pid) - before) / IDLE_SECONDS
    print(f"operator CPU while idle: {busy:.1%} of a core", file=sys.stderr)
    assert operator.process.poll() is None, operator.output()[-4000:]
    assert busy < IDLE_CPU_LIMIT
    assert "Traceback" not in operator.output(), operator.output()[-6000:]
