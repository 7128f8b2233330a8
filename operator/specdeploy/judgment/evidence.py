"""Numbers as people read them in Events, conditions and alerts: "0.31", "41.2 ms", "1,234 requests".

Evidence must survive being read by someone woken at night: the measured value, the limit it broke and
the window, with enough digits that the two never print the same.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from specdeploy.judgment.queries import promql_duration


def number(value: float, digits: int = 2) -> str:
    """`value` with `digits` decimals ("0.31", "1.37"); "NaN" / "+Inf" for what is not a number."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.{digits}f}"


def compared(value: float, limit: float) -> tuple[str, str]:
    """`value` and `limit` with the fewest decimals (2 to 6) at which they print differently."""
    for digits in range(2, 7):
        shown = number(value, digits), number(limit, digits)
        if shown[0] != shown[1] or value == limit:
            return shown
    return number(value, 6), number(limit, 6)


def seconds(value: float) -> str:
    """A latency: "41.2 ms" below a second, "12.3 s" above."""
    if not math.isfinite(value):
        return number(value)
    if abs(value) < 1.0:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s"


def count(value: float) -> str:
    """A request count, whole and with thousands separators ("1,234")."""
    return f"{value:,.0f}" if math.isfinite(value) else number(value)


def window(seconds_: float) -> str:
    """The analysis window as the user wrote it in spirit ("5m", "90s")."""
    return promql_duration(seconds_)


def rfc3339(moment: datetime) -> str:
    """The status' time format: UTC, whole seconds, "Z" (as the reconciler writes it)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime:
    """A status timestamp back as an aware datetime; raises ValueError on anything else."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"expected an RFC 3339 time with a zone such as 2026-01-01T00:00:00Z, got {text!r}")
    return moment
