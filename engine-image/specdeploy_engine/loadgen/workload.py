"""What a load test sends and when: open-loop Poisson arrivals at a QPS schedule, prompt and output
lengths, a temperature mix. Pure and seeded: the same seed gives the same requests.

    workload = Workload(qps=QpsSchedule.parse("0-60s:2,60-120s:8"), prompt=Lengths.parse("lognormal:220,0.6"),
                        output=Lengths.parse("128"), temperatures=TemperatureMix.parse("0:0.7,1.0:0.3"))
    for planned in workload.plan(duration=120.0, max_requests=1000, seed=1): ...

Exceptions:

    ValueError
     └── WorkloadError   a schedule, length or temperature text that does not parse; the message shows the
                         accepted forms
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass


class WorkloadError(ValueError):
    """A workload description that does not parse."""


@dataclass(frozen=True)
class QpsSegment:
    start: float
    end: float          # math.inf for the last, open segment
    qps: float


@dataclass(frozen=True)
class QpsSchedule:
    """Requests per second as a step function of time since the start."""

    segments: tuple[QpsSegment, ...]

    @classmethod
    def constant(cls, qps: float) -> QpsSchedule:
        if not qps >= 0:
            raise WorkloadError(f"a QPS must be 0 or more, got {qps!r}")
        return cls((QpsSegment(0.0, math.inf, float(qps)),))

    @classmethod
    def parse(cls, text: str) -> QpsSchedule:
        """"4" (constant), or "0-60s:2,60-120s:8" (QPS per time range; seconds, "s" optional; gaps send
        nothing, the last range ends the schedule)."""
        text = text.strip()
        try:
            return cls.constant(float(text))
        except ValueError:
            pass
        segments = []
        for part in text.split(","):
            match = re.fullmatch(r"\s*([\d.]+)s?\s*-\s*([\d.]+)s?\s*:\s*([\d.]+)\s*", part)
            if match is None:
                raise WorkloadError(
                    f"cannot read the QPS schedule {text!r}: write a number (\"4\") or ranges with a QPS each, "
                    "\"0-60s:2,60-120s:8\"")
            start, end, qps = (float(group) for group in match.groups())
            if end <= start:
                raise WorkloadError(f"the range {part.strip()!r} of the QPS schedule must end after it starts")
            segments.append(QpsSegment(start, end, qps))
        segments.sort(key=lambda segment: segment.start)
        for earlier, later in zip(segments, segments[1:], strict=False):
            if later.start < earlier.end:
                raise WorkloadError(f"the ranges of the QPS schedule {text!r} overlap")
        return cls(tuple(segments))

    @property
    def end(self) -> float:
        return self.segments[-1].end if self.segments else 0.0

    def qps_at(self, t: float) -> float:
        return next((segment.qps for segment in self.segments if segment.start <= t < segment.end), 0.0)

    def arrivals(self, rng: random.Random, horizon: float) -> Iterator[float]:
        """Poisson arrival times in [0, horizon): exponential gaps at each segment's rate (the process
        is memoryless, so a gap that crosses a boundary is redrawn from the boundary at the new rate)."""
        for segment in self.segments:
            t, end = segment.start, min(segment.end, horizon)
            if segment.qps <= 0:
                continue
            while True:
                t += rng.expovariate(segment.qps)
                if t >= end:
                    break
                yield t


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: fixed, uniform, normal or lognormal, clipped to [low, high]."""

    kind: str
    a: float
    b: float = 0.0
    low: int = 1
    high: int = 1_000_000

    @classmethod
    def parse(cls, text: str) -> Lengths:
        """"256"; "100-300" (uniform); "normal:2048,1024[,10,4096]" (mean, stddev, [low, high]);
        "lognormal:220,0.6[,4,4096]" (mean, sigma of the log, [low, high])."""
        text = text.strip()
        if re.fullmatch(r"\d+", text):
            return cls("fixed", float(text), low=max(1, int(text)))
        match = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if high < low or low < 1:
                raise WorkloadError(f"the length range {text!r} must be at least 1 and not decreasing")
            return cls("uniform", low, high, low, high)
        match = re.fullmatch(r"(normal|lognormal):([\d.]+),([\d.]+)(?:,(\d+),(\d+))?", text)
        if match:
            kind, a, b = match.group(1), float(match.group(2)), float(match.group(3))
            low = int(match.group(4)) if match.group(4) else 1
            high = int(match.group(5)) if match.group(5) else 1_000_000
            if a <= 0 or high < low:
                raise WorkloadError(f"the length distribution {text!r} needs a positive mean and low <= high")
            return cls(kind, a, b, max(1, low), high)
        raise WorkloadError(
            f"cannot read the length {text!r}: write \"256\", \"100-300\", \"normal:MEAN,STDDEV[,LOW,HIGH]\" "
            "or \"lognormal:MEAN,SIGMA[,LOW,HIGH]\"")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(self.a), int(self.b))
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:   # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
            value = rng.lognormvariate(math.log(self.a) - self.b**2 / 2, self.b)
        return int(min(self.high, max(self.low, round(value))))

    @property
    def mean(self) -> float:
        """The nominal mean (before clipping)."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


@dataclass(frozen=True)
class TemperatureMix:
    """Sampling temperatures with weights."""

    choices: tuple[tuple[float, float], ...]    # (temperature, weight)

    @classmethod
    def parse(cls, text: str) -> TemperatureMix:
        """"0.7" (every request), or "0:0.5,0.7:0.3,1.0:0.2" (temperature:weight pairs)."""
        text = text.strip()
        try:
            return cls(((_temperature(float(text), text), 1.0),))
        except ValueError:
            pass
        choices = []
        for part in text.split(","):
            match = re.fullmatch(r"\s*([\d.]+)\s*:\s*([\d.]+)\s*", part)
            if match is None:
                raise WorkloadError(
                    f"cannot read the temperature mix {text!r}: write \"0.7\" or temperature:weight pairs, "
                    "\"0:0.5,0.7:0.3,1.0:0.2\"")
            choices.append((_temperature(float(match.group(1)), text), float(match.group(2))))
        if sum(weight for _, weight in choices) <= 0:
            raise WorkloadError(f"the weights of the temperature mix {text!r} must not all be 0")
        return cls(tuple(choices))

    def sample(self, rng: random.Random) -> float:
        if len(self.choices) == 1:
            return self.choices[0][0]
        temperatures, weights = zip(*self.choices, strict=True)
        return rng.choices(temperatures, weights)[0]


def _temperature(value: float, text: str) -> float:
    if not 0.0 <= value <= 2.0:
        raise WorkloadError(f"a temperature must be between 0 and 2, got {value!r} in {text!r}")
    return value


@dataclass(frozen=True)
class PlannedRequest:
    at: float               # seconds after the start
    prompt_tokens: int
    output_tokens: int
    temperature: float


@dataclass(frozen=True)
class Workload:
    qps: QpsSchedule
    prompt: Lengths = Lengths("fixed", 256, low=256)
    output: Lengths = Lengths("fixed", 128, low=128)
    temperatures: TemperatureMix = TemperatureMix(((0.0, 1.0),))

    def plan(self, duration: float, max_requests: int | None = None, seed: int = 0) -> list[PlannedRequest]:
        """The requests of a run: arrivals in [0, duration), at most `max_requests`."""
        arrivals_rng = random.Random(f"arrivals:{seed}")
        shapes_rng = random.Random(f"shapes:{seed}")
        planned: list[PlannedRequest] = []
        for at in self.qps.arrivals(arrivals_rng, duration):
            if max_requests is not None and len(planned) >= max_requests:
                break
            planned.append(PlannedRequest(at, self.prompt.sample(shapes_rng), self.output.sample(shapes_rng),
                                          self.temperatures.sample(shapes_rng)))
        return planned
