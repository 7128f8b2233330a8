"""The Prometheus text exposition format (version 0.0.4): counters, gauges and histograms with labels,
written as prometheus_client writes them, and a strict reader for tests and tools.

    registry = Registry()
    drafts = registry.counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
                              ("model_name", "engine"))
    drafts.inc(("llama", "0"))
    text = registry.render()
    parse(text)["vllm:spec_decode_num_drafts_total"].samples

The simulator writes its own exposition (no prometheus_client dependency): a few families, rendered on
every scrape. Counters are named with their `_total` suffix, as prometheus_client exposes them.

Exceptions:

    ValueError
     └── ExpositionError   text that is not valid exposition format (raised by `parse`)
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Labels = tuple[str, ...]


def _format_value(value: float) -> str:
    """Go-style float text as prometheus_client writes it: 1.0, 0.25, +Inf, NaN."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True)) + "}"


@dataclass
class Family:
    name: str
    kind: str                    # counter, gauge, histogram
    help: str
    labelnames: Labels

    def render(self) -> list[str]:
        raise NotImplementedError


@dataclass
class Scalar(Family):
    """A counter or gauge: one value per label set."""

    values: dict[Labels, float] = field(default_factory=dict)

    def touch(self, labels: Labels) -> None:
        """Create the series at 0, as engines do for series they pre-register."""
        self.values.setdefault(labels, 0.0)

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        if self.kind == "counter" and amount < 0:
            raise ValueError(f"counter {self.name} cannot decrease (by {amount})")
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{_label_text(self.labelnames, labels)} {_format_value(value)}"
                  for labels, value in self.values.items()]
        return lines


@dataclass
class Histogram(Family):
    """Cumulative buckets per label set, with _sum and _count."""

    bounds: tuple[float, ...] = ()
    series: dict[Labels, list[float]] = field(default_factory=dict)   # per-bucket counts (+Inf last), sum

    def touch(self, labels: Labels) -> list[float]:
        found = self.series.get(labels)
        if found is None:
            found = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        return found

    def observe(self, labels: Labels, value: float, weight: float = 1.0, total: float | None = None) -> None:
        """Count `value` `weight` times and add `total` (default value × weight) to the sum; the weighted
        form is SGLang's, which counts a step's tokens at the per-token interval."""
        counts = self.touch(labels)
        counts[bisect_left(self.bounds, value)] += weight
        counts[-1] += value * weight if total is None else total

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        names = (*self.labelnames, "le")
        for labels, counts in self.series.items():
            cumulative = 0.0
            for bound, count in zip((*self.bounds, math.inf), counts, strict=False):
                cumulative += count
                lines.append(f"{self.name}_bucket{_label_text(names, (*labels, _format_value(bound)))} "
                             f"{_format_value(cumulative)}")
            base = _label_text(self.labelnames, labels)
            lines.append(f"{self.name}_count{base} {_format_value(cumulative)}")
            lines.append(f"{self.name}_sum{base} {_format_value(counts[-1])}")
        return lines


FamilyT = TypeVar("FamilyT", bound=Family)


class Registry:
    """The families of one process, rendered in registration order."""

    def __init__(self) -> None:
        self.families: list[Family] = []

    def counter(self, name: str, help: str, labelnames: Labels) -> Scalar:
        return self._add(Scalar(name, "counter", help, labelnames))

    def gauge(self, name: str, help: str, labelnames: Labels) -> Scalar:
        return self._add(Scalar(name, "gauge", help, labelnames))

    def histogram(self, name: str, help: str, labelnames: Labels, bounds: Sequence[float]) -> Histogram:
        return self._add(Histogram(name, "histogram", help, labelnames, bounds=tuple(bounds)))

    def _add(self, family: FamilyT) -> FamilyT:
        if any(existing.name == family.name for existing in self.families):
            raise ValueError(f"metric {family.name} is registered twice")
        self.families.append(family)
        return family

    def render(self) -> str:
        return "\n".join(line for family in self.families for line in family.render()) + "\n"


# --- reading ----------------------------------------------------------------------------------------------

class ExpositionError(ValueError):
    """Text that is not valid Prometheus exposition format; the message names the line."""


@dataclass
class ParsedFamily:
    name: str
    kind: str
    help: str
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def value(self, sample: str | None = None, **labels: str) -> float:
        """The value of the sample `sample` (default: the family name) whose labels include `labels`;
        the sum over every match when several do."""
        wanted = sample or self.name
        found = [value for (name, pairs), value in self.samples.items()
                 if name == wanted and set(labels.items()) <= set(pairs)]
        if not found:
            raise KeyError(f"no sample {wanted}{labels} in {self.name}")
        return sum(found)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$')
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
_SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


def _pairs(text: str, line: str) -> tuple[tuple[str, str], ...]:
    pairs, position = [], 0
    while position < len(text):
        match = _PAIR.match(text, position)
        if match is None:
            raise ExpositionError(f"bad labels in line {line!r}")
        pairs.append((match.group(1), match.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")))
        position = match.end()
    return tuple(pairs)


def parse(text: str) -> dict[str, ParsedFamily]:
    """Families by name; every sample must follow its family's # TYPE line, histograms must be cumulative
    and end with +Inf equal to _count."""
    families: dict[str, ParsedFamily] = {}
    helps: dict[str, str] = {}
    current: ParsedFamily | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            helps[name] = help_text
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            if kind not in ("counter", "gauge", "histogram", "summary", "untyped"):
                raise ExpositionError(f"unknown type in line {line!r}")
            if name in families:
                raise ExpositionError(f"family {name} declared twice")
            current = families[name] = ParsedFamily(name, kind, helps.get(name, ""))
            continue
        if line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ExpositionError(f"bad sample line {line!r}")
        sample, labels, value = match.group(1), match.group(3) or "", match.group(4)
        if current is None or not (sample == current.name or sample in
                                   {current.name + suffix for suffix in _SUFFIXES.get(current.kind, ())}):
            raise ExpositionError(f"sample {sample} outside its family's # TYPE block")
        try:
            number = float(value)
        except ValueError:
            raise ExpositionError(f"bad value in line {line!r}") from None
        current.samples[(sample, _pairs(labels, line))] = number
    for family in families.values():
        if family.kind == "histogram":
            _check_histogram(family)
    return families


def _check_histogram(family: ParsedFamily) -> None:
    by_series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for (sample, pairs), value in family.samples.items():
        if sample.endswith("_bucket"):
            le = dict(pairs).get("le")
            if le is None:
                raise ExpositionError(f"{family.name}: a bucket without le")
            rest = tuple(pair for pair in pairs if pair[0] != "le")
            by_series.setdefault(rest, []).append((float(le), value))
    for rest, buckets in by_series.items():
        buckets.sort()
        counts = [count for _, count in buckets]
        if counts != sorted(counts):
            raise ExpositionError(f"{family.name}{dict(rest)}: buckets are not cumulative")
        if buckets[-1][0] != math.inf:
            raise ExpositionError(f"{family.name}{dict(rest)}: no +Inf bucket")
        if family.samples.get((family.name + "_count", rest)) != buckets[-1][1]:
            raise ExpositionError(f"{family.name}{dict(rest)}: _count differs from the +Inf bucket")
