"""What the benchmarks print about the machine and about a process' CPU and memory, read from /proc.

CPU is user + system time of the process (not its children), so `cpu_per_wall` over a phase is how
many cores it kept busy on average; on a shared machine the load average says how much else ran.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) ": state is field 3, utime 14, stime 15
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND


def rss_kib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of `pid`, in KiB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@dataclass(frozen=True)
class Mark:
    """One moment of a process: wall clock and CPU seconds used."""

    wall: float
    cpu: float

    @classmethod
    def of(cls, pid: int) -> Mark:
        return cls(time.monotonic(), cpu_seconds(pid))

    def cpu_per_wall(self, later: Mark) -> float:
        """Cores kept busy on average between this mark and `later`."""
        return (later.cpu - self.cpu) / max(later.wall - self.wall, 1e-9)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine() -> str:
    """CPU model, cores, Python and the date: what a recorded figure needs beside it."""
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")]
    model = models[0] if models else platform.processor() or "unknown CPU"
    return (f"{model}, {os.cpu_count()} cores ({platform.machine()}), Python {platform.python_version()}, "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")


@dataclass(frozen=True)
class ApiserverRequests:
    """One reading of the apiserver's own request counters, by (verb, resource[/subresource])."""

    counts: dict[tuple[str, str], float]    # apiserver_request_total
    seconds: dict[tuple[str, str], float]   # apiserver_request_duration_seconds_sum (watches excluded)


def apiserver_requests(api: object) -> ApiserverRequests:
    """The apiserver's own count of the requests it served so far and the seconds they took, from its /metrics:
    every client's, the operator's and the controllers' alike."""
    text = api.get("/metrics", timeout=60).raise_for_status().text   # type: ignore[attr-defined]
    reading = ApiserverRequests({}, {})
    for line in text.splitlines():
        for family, into in (("apiserver_request_total{", reading.counts),
                             ("apiserver_request_duration_seconds_sum{", reading.seconds)):
            if not line.startswith(family):
                continue
            labels_text, value = line[len(family):].rsplit("} ", 1)
            labels = {key: raw.strip('"') for key, raw in (part.split("=", 1) for part in labels_text.split(","))}
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key = (labels.get("verb", ""), resource)
            into[key] = into.get(key, 0.0) + float(value)
    return reading


def request_deltas(before: ApiserverRequests, after: ApiserverRequests, top: int = 12) -> str:
    """The `top` largest differences of two `apiserver_requests` readings, one per line, with the mean
    time each kind of request took."""
    deltas = sorted(((count - before.counts.get(k, 0.0), k) for k, count in after.counts.items()), reverse=True)
    total = sum(d for d, _ in deltas)
    lines = []
    for delta, key in deltas[:top]:
        if delta <= 0:
            continue
        seconds = after.seconds.get(key, 0.0) - before.seconds.get(key, 0.0)
        lines.append(f"  {delta:8.0f}  {key[0]} {key[1]}" + (f"  (mean {1000 * seconds / delta:.0f} ms, "
                                                           f"{seconds:.0f} s in all)" if seconds else ""))
    return f"  {total:8.0f}  in all\n" + "\n".join(lines)
