"""`specdeploy get`'s view of one SD, from its status, pods and Events as the apiserver returns them."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from specdeploy.views.live import VerdictHistory, engine_k, sd_view


def _pod(name: str, variant: str, argv: list[str], ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"specdeploy.io/variant": variant}},
            "spec": {"containers": [{"name": "engine", "args": argv}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}],
                       "containerStatuses": [{"restartCount": 1}]}}


@pytest.mark.parametrize(("argv", "k"), [
    (["vllm", "serve", "m", "--speculative-config", json.dumps({"method": "eagle3", "num_speculative_tokens": 3})], "3"),
    (["vllm", "serve", "m", "--speculative-config",
      json.dumps({"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 1]]})],
     "1-8:4 9-64:1"),
    (["python3", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2"], "2"),
    (["python3", "-m", "sglang.launch_server", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"],
     "4"),
    (["vllm", "serve", "m"], "off"),
])
def test_the_k_a_pod_drafts_is_read_from_its_command_line(argv: list[str], k: str) -> None:
    assert engine_k(_pod("p", "speculative", argv)) == k


STATUS = {
    "phase": "RolledBack", "ready": "2/2", "observedGeneration": 1,
    "speculation": {"decided": False, "active": False, "speculatingPods": 0, "rollbacks": 1,
                    "lastRollback": {"at": "2026-12-05T22:00:09Z", "reason": "AcceptanceBelowMinimum",
                                     "evidence": "acceptance 0.05 below the floor 0.11 for 3 samples"}},
    "analysis": {"lastSampleAt": "2026-12-05T22:00:09Z", "acceptanceRate": 0.05, "acceptanceFloor": 0.11,
                 "acceptanceFloorBasis": "Auto: break-even 0.09", "verdict": "Failing",
                 "verdictReason": "AcceptanceBelowMinimum", "consecutiveFailures": 3,
                 "speedup": {"value": 0.91, "low": 0.85, "high": 0.97, "baseline": "control", "requests": 120,
                             "baselineRequests": 118}},
}


def _text(body: dict[str, Any], history: VerdictHistory, events: list[dict[str, Any]] | None = None) -> str:
    out = io.StringIO()
    pods = [_pod("chat-speculative-0", "speculative", ["vllm", "serve", "m"]),
            _pod("chat-control-0", "control", ["vllm", "serve", "m"])]
    Console(file=out, width=200).print(sd_view(body, pods, events or [], history))
    return out.getvalue()


def test_the_view_shows_acceptance_against_floor_speedup_interval_and_the_last_rollback() -> None:
    body = {"metadata": {"name": "chat", "namespace": "team-a", "generation": 1}, "status": STATUS}
    history = VerdictHistory()
    history.record(body)
    event = {"type": "Warning", "reason": "SpeculationRolledBack", "message": "acceptance 0.05 below 0.11",
             "lastTimestamp": "2026-12-05T22:00:10Z"}
    text = _text(body, history, [event])
    assert "team-a/chat  phase RolledBack" in text
    assert "acceptance 0.05 against floor 0.11" in text
    assert "speedup 0.91× [0.85–0.97] against control" in text
    assert "last rollback 2026-12-05T22:00:09Z: AcceptanceBelowMinimum" in text
    assert "Failing AcceptanceBelowMinimum (3 in a row)" in text
    assert "SpeculationRolledBack" in text
    assert "speculative  chat-speculative-0" in text and " off " in text


def test_the_history_keeps_one_verdict_per_sample_newest_last() -> None:
    history = VerdictHistory(keep=2)
    for at, verdict in (("t1", "Healthy"), ("t1", "Healthy"), ("t2", "Failing"), ("t3", "Failing")):
        history.record({"status": {"analysis": {"lastSampleAt": at, "verdict": verdict}}})
    assert [(s.at, s.verdict) for s in history.seen] == [("t2", "Failing"), ("t3", "Failing")]
