"""What a load run measured, client side: one record per request, and their summary.

    report = LoadReport.from_records(records, duration=60.0)
    report.ttft.p99, report.to_text(), report.to_dict()
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """One request as the client saw it (seconds since the run started, durations in seconds)."""

    target: str
    sent_at: float
    prompt_tokens: int
    max_tokens: int
    temperature: float
    status: int = 0                      # HTTP status; 0 when no answer came
    error: str | None = None
    ttft: float | None = None            # sent -> first chunk with text
    e2e: float | None = None             # sent -> last byte
    output_tokens: int = 0               # usage.completion_tokens, else text chunks' words
    chunk_gaps: list[float] = field(default_factory=list)   # between consecutive text chunks

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.e2e is not None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Summary:
    """Count, mean and percentiles of one latency (seconds); NaN where there were no values."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        ordered = sorted(values)
        return cls(len(ordered), sum(ordered) / len(ordered), percentile(ordered, 50), percentile(ordered, 90),
                   percentile(ordered, 99), ordered[-1])

    def to_dict(self) -> dict[str, float | int | None]:
        return {key: (None if isinstance(value, float) and math.isnan(value) else value)
                for key, value in self.__dict__.items()}


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile of sorted values."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass(frozen=True)
class LoadReport:
    sent: int
    ok: int
    failed: int
    unfinished: int                     # still running when the run ended
    duration: float                     # seconds from the start to the last answer
    output_tokens: int
    ttft: Summary
    itl: Summary                        # gaps between streamed chunks (a chunk may hold several tokens)
    tpot: Summary                       # per request: (e2e - ttft) / (tokens - 1)
    e2e: Summary
    by_target: dict[str, int]
    errors: dict[str, int]
    records: list[RequestRecord] = field(repr=False, default_factory=list)

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], duration: float, unfinished: int = 0) -> LoadReport:
        good = [record for record in records if record.ok]
        errors = Counter(record.error or f"HTTP {record.status}" for record in records if not record.ok)
        return cls(
            sent=len(records) + unfinished, ok=len(good), failed=len(records) - len(good), unfinished=unfinished,
            duration=duration, output_tokens=sum(record.output_tokens for record in good),
            ttft=Summary.of([record.ttft for record in good if record.ttft is not None]),
            itl=Summary.of([gap for record in good for gap in record.chunk_gaps]),
            tpot=Summary.of([value for record in good if (value := record.tpot) is not None]),
            e2e=Summary.of([record.e2e for record in good if record.e2e is not None]),
            by_target=dict(Counter(record.target for record in records)),
            errors=dict(errors),
            records=list(records),
        )

    @property
    def requests_per_second(self) -> float:
        return self.ok / self.duration if self.duration > 0 else math.nan

    @property
    def output_tokens_per_second(self) -> float:
        return self.output_tokens / self.duration if self.duration > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent, "ok": self.ok, "failed": self.failed, "unfinished": self.unfinished,
            "durationSeconds": round(self.duration, 3), "outputTokens": self.output_tokens,
            "requestsPerSecond": round(self.requests_per_second, 3),
            "outputTokensPerSecond": round(self.output_tokens_per_second, 1),
            "ttftSeconds": self.ttft.to_dict(), "itlSeconds": self.itl.to_dict(),
            "tpotSeconds": self.tpot.to_dict(), "e2eSeconds": self.e2e.to_dict(),
            "byTarget": self.by_target, "errors": self.errors,
        }

    def to_text(self) -> str:
        lines = [
            f"requests: {self.sent} sent, {self.ok} ok, {self.failed} failed, {self.unfinished} unfinished "
            f"in {self.duration:.1f} s ({self.requests_per_second:.2f} req/s, "
            f"{self.output_tokens_per_second:.0f} output tok/s)",
            f"{'':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
        ]
        for label, summary, scale in (("TTFT ms", self.ttft, 1e3), ("ITL ms", self.itl, 1e3),
                                      ("TPOT ms", self.tpot, 1e3), ("E2E s", self.e2e, 1.0)):
            cells = (summary.mean, summary.p50, summary.p90, summary.p99, summary.max)
            lines.append(f"{label:<10}" + "".join(f"{value * scale:>10.1f}" for value in cells))
        if len(self.by_target) > 1:
            lines.append("per target: " + ", ".join(f"{target} {count}" for target, count in self.by_target.items()))
        for error, count in sorted(self.errors.items(), key=lambda item: -item[1]):
            lines.append(f"error ({count}x): {error}")
        return "\n".join(lines)
