"""`specdeploy get NAME [-w]`: one SD as a person watches it — its pods per variant with their k, the acceptance
against its floor, the speedup with its interval, the verdicts, the last rollback and the SD's Events.

Everything is read from the SD's status, its pods and its Events (no Prometheus): what the operator decided and
what runs. The verdicts the operator keeps only the last of; `VerdictHistory` remembers the ones this view saw.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from specdeploy.api.status import AnalysisStatus, SpeculativeDeploymentStatus, VerdictKind
from specdeploy.reconcile.children import LABEL_VARIANT

_VERDICT_STYLE = {VerdictKind.HEALTHY: "green", VerdictKind.FAILING: "red", VerdictKind.INCONCLUSIVE: "yellow"}
EVENTS_SHOWN = 6


@dataclass(frozen=True)
class SeenVerdict:
    at: str
    verdict: str
    reason: str | None
    consecutive_failures: int


@dataclass
class VerdictHistory:
    """The verdict of each sample this view saw (status keeps the last only), newest last, at most `keep`."""

    keep: int = 8
    seen: list[SeenVerdict] = field(default_factory=list)

    def record(self, body: Mapping[str, Any]) -> None:
        """Remember the verdict of the SD's last sample, once per sample."""
        analysis = SpeculativeDeploymentStatus.model_validate(body.get("status") or {}).analysis
        if analysis is None or analysis.verdict is None or analysis.last_sample_at is None:
            return
        if self.seen and self.seen[-1].at == analysis.last_sample_at:
            return
        self.seen.append(SeenVerdict(analysis.last_sample_at, analysis.verdict.value, analysis.verdict_reason,
                                     analysis.consecutive_failures))
        del self.seen[:-self.keep]


def engine_k(pod: Mapping[str, Any]) -> str:
    """The k a pod's engine drafts, read from its command line: a number, a table by batch, `off` without
    speculation, or `in config` where the engine reads it from a file (TensorRT-LLM)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        value = _flag(argv, "--speculative-config")
        if value is not None:
            try:
                config = json.loads(value)
            except ValueError:
                return "?"
            table = config.get("num_speculative_tokens_per_batch_size")
            if table:
                return " ".join(f"{start}-{end}:{k}" for start, end, k in table)
            return str(config.get("num_speculative_tokens", "?"))
        steps = _flag(argv, "--speculative-num-steps")
        if steps is not None:
            return steps
        draft_tokens = _flag(argv, "--speculative-num-draft-tokens")   # SGLang n-gram: k + 1 verified per step
        if draft_tokens is not None and draft_tokens.isdigit():
            return str(int(draft_tokens) - 1)
        if any(word.endswith((".yaml", ".yml")) and "speculative" in word for word in argv):
            return "in config"
    return "off"


def _flag(argv: Sequence[str], name: str) -> str | None:
    for index, word in enumerate(argv):
        if word == name and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _pod_row(pod: Mapping[str, Any], batch: str) -> tuple[str, ...]:
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    restarts = sum(c.get("restartCount") or 0 for c in status.get("containerStatuses") or [])
    phase = "Terminating" if metadata.get("deletionTimestamp") else status.get("phase") or "Pending"
    return ((metadata.get("labels") or {}).get(LABEL_VARIANT, "?"), metadata.get("name", "?"), phase,
            "yes" if ready else "no", str(restarts), engine_k(pod), batch)


def _pods_table(pods: Sequence[Mapping[str, Any]], observed_batch: int | None) -> Table:
    table = Table(box=None, pad_edge=False, title="pods", title_justify="left", title_style="bold")
    for column in ("VARIANT", "POD", "PHASE", "READY", "RESTARTS", "K", "BATCH"):
        table.add_column(column)
    rows = sorted(_pod_row(pod, "-") for pod in pods)
    for row in rows:
        batch = str(observed_batch) if observed_batch is not None and row[0] == "speculative" else "-"
        table.add_row(*row[:-1], batch)
    if not rows:
        table.add_row("-", "no engine pods", "", "", "", "", "")
    return table


def _analysis(analysis: AnalysisStatus | None) -> Text:
    text = Text()
    if analysis is None or analysis.last_sample_at is None:
        return text.append("analysis: no sample yet\n", style="dim")
    text.append(f"analysis at {analysis.last_sample_at}", style="bold")
    if analysis.objective:
        text.append(f" (objective {analysis.objective})")
    text.append("\n")
    if analysis.acceptance_rate is not None:
        floor = analysis.acceptance_floor
        below = floor is not None and analysis.acceptance_rate < floor
        text.append("  acceptance ")
        text.append(f"{analysis.acceptance_rate:.2f}", style="red" if below else "green")
        text.append(f" against floor {floor:.2f}" if floor is not None else " (no floor)")
        if analysis.acceptance_floor_basis:
            text.append(f" — {analysis.acceptance_floor_basis}", style="dim")
        if analysis.mean_acceptance_length is not None:
            text.append(f"; mean length {analysis.mean_acceptance_length:.2f}")
        text.append("\n")
    speedup = analysis.speedup
    if speedup is not None:
        text.append("  speedup ")
        text.append(f"{speedup.value:.2f}×", style="green" if speedup.low > 1 else "red" if speedup.high < 1 else "")
        text.append(f" [{speedup.low:.2f}–{speedup.high:.2f}] against {speedup.baseline}, "
                    f"{speedup.requests:.0f} ÷ {speedup.baseline_requests:.0f} requests\n")
    elif analysis.per_token_latency:
        text.append(f"  per-token latency {analysis.per_token_latency}\n")
    if analysis.verdict is not None:
        text.append("  verdict ")
        text.append(analysis.verdict.value, style=_VERDICT_STYLE[analysis.verdict])
        if analysis.verdict_reason:
            text.append(f" {analysis.verdict_reason}")
        if analysis.consecutive_failures:
            text.append(f" ({analysis.consecutive_failures} in a row)")
        if analysis.message:
            text.append(f": {analysis.message}", style="dim")
        text.append("\n")
    return text


def _history(history: VerdictHistory) -> Text:
    text = Text()
    if not history.seen:
        return text
    text.append("verdicts seen", style="bold")
    text.append(" (newest last)\n")
    for seen in history.seen:
        text.append(f"  {seen.at}  ")
        text.append(seen.verdict, style=_VERDICT_STYLE.get(VerdictKind(seen.verdict), ""))
        text.append(f" {seen.reason or ''}\n")
    return text


def _events(events: Sequence[Mapping[str, Any]]) -> Table | None:
    if not events:
        return None
    table = Table(box=None, pad_edge=False, title="events", title_justify="left", title_style="bold")
    for column in ("LAST SEEN", "TYPE", "REASON", "MESSAGE"):
        table.add_column(column, overflow="fold")
    for event in events[-EVENTS_SHOWN:]:
        when = event.get("lastTimestamp") or event.get("eventTime") or ""
        style = "yellow" if event.get("type") == "Warning" else ""
        table.add_row(str(when), str(event.get("type", "")), str(event.get("reason", "")),
                      str(event.get("message", ""))[:300], style=style)
    return table


def sd_view(body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
            history: VerdictHistory) -> RenderableType:
    """The whole view of one SD as the apiserver has it now."""
    metadata = body.get("metadata") or {}
    status = SpeculativeDeploymentStatus.model_validate(body.get("status") or {})
    parts: list[RenderableType] = []
    head = Text()
    head.append(f"{metadata.get('namespace')}/{metadata.get('name')}", style="bold")
    head.append(f"  phase {status.phase.value if status.phase else '-'} · ready {status.ready or '-'} · "
                f"generation {metadata.get('generation')} (observed {status.observed_generation})")
    parts.append(head)
    speculation = status.speculation
    observed_batch = None
    if speculation is not None:
        line = Text("speculation ")
        line.append("on" if speculation.decided else "off", style="green" if speculation.decided else "red")
        line.append(f" (decided), running on {speculation.speculating_pods} pod(s)")
        if speculation.decided != speculation.active:
            line.append(" — rollout in progress", style="yellow")
        line.append(f" · rollbacks {speculation.rollbacks}")
        if speculation.trial:
            line.append(" · trial after re-enable")
        parts.append(line)
        decision = speculation.calibration.last_decision if speculation.calibration else None
        observed_batch = decision.batch if decision is not None else None
    parts.append(_pods_table(pods, observed_batch))
    parts.append(_analysis(status.analysis))
    parts.append(_history(history))
    rollback = speculation.last_rollback if speculation is not None else None
    if rollback is not None:
        text = Text()
        text.append("last rollback", style="bold red")
        text.append(f" {rollback.at}: {rollback.reason} — {rollback.evidence}\n")
        parts.append(text)
    events_table = _events(events)
    if events_table is not None:
        parts.append(events_table)
    return Group(*parts)
