"""Durations ("30s", "5m", "1h30m") and memory sizes ("80Gi", 80, "81920Mi") as the resource writes them.

Both are parsed into plain floats (seconds, GiB) so the planner and the analysis loop do arithmetic on
numbers, and written back in the short form a user would type.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# Kubernetes resource.Quantity suffixes (binary and decimal); a bare number means GiB here.
QUANTITY_PATTERN = r"^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|K|k|M|G|T)?$"
ZERO_QUANTITY_PATTERN = r"^0+([.]0+)?[A-Za-z]*$"
QUANTITY_MESSAGE = "must be a memory size: a positive number of GiB or a quantity such as 80Gi or 81920Mi"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|K|k|M|G|T)?$")
_QUANTITY_BYTES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "K": 10**3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
}
GIB = 2**30


def parse_duration(value: Any) -> float:
    """Seconds in `value`: a number of seconds or a Go-style duration such as "30s", "5m", "1h30m"."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '30s' or '5m', got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"a duration must be a non-negative number of seconds, got {value!r}")
        return float(value)
    if isinstance(value, str) and re.fullmatch(DURATION_PATTERN, value):
        return sum(float(n) * _DURATION_UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))
    raise ValueError(f"expected a duration such as '30s', '5m' or '1h30m', got {value!r}")


def format_duration(seconds: float) -> str:
    """The shortest of "90s" / "5m" / "1h30m" that says `seconds` exactly (to the millisecond)."""
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis}ms"
    whole = millis // 1000
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"


def parse_gib(value: Any) -> float:
    """GiB in `value`: a number (GiB) or a Kubernetes quantity such as "80Gi", "81920Mi" or "85G"."""
    if isinstance(value, bool):
        raise ValueError(f"{QUANTITY_MESSAGE}, got {value!r}")
    if isinstance(value, int | float):
        if value <= 0 or not math.isfinite(value):
            raise ValueError(f"{QUANTITY_MESSAGE}, got {value!r}")
        return float(value)
    if isinstance(value, str):
        match = _QUANTITY.fullmatch(value)
        if match:
            number, suffix = match.groups()
            gib = float(number) * (_QUANTITY_BYTES[suffix] / GIB if suffix else 1.0)
            if gib <= 0:
                raise ValueError(f"{QUANTITY_MESSAGE}, got {value!r}")
            return gib
    raise ValueError(f"{QUANTITY_MESSAGE}, got {value!r}")


def format_gib(gib: float) -> int | str:
    """A whole number of GiB as a number, anything else as a "…Gi" string."""
    return int(gib) if float(gib).is_integer() else f"{gib:g}Gi"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "maxLength": 32}),
]
"""Seconds, written as a duration string ("30s", "5m")."""

MemoryGiB = Annotated[
    float,
    BeforeValidator(parse_gib),
    PlainSerializer(format_gib),
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "x-kubernetes-validations": [{
            "rule": f"type(self) == int ? self > 0 : (self.matches('{QUANTITY_PATTERN}') "
                    f"&& !self.matches('{ZERO_QUANTITY_PATTERN}'))",
            "message": QUANTITY_MESSAGE,
        }],
    }),
]
"""GiB, written as a number of GiB or a Kubernetes quantity ("80Gi")."""
