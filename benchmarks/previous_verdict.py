"""The verdict as it was before the judgment rewrite (979bd3b): operator/specdeploy/judgment/verdict.py at 896965e
(`git show 896965e:operator/specdeploy/judgment/verdict.py`), for `benchmarks/decisions.py --policy previous`.
Changed: `checks.min_acceptance_rate` None (now "Auto") means the old default 0.5 (PREVIOUS_MIN_ACCEPTANCE_RATE);
the verdict types come from today's module (they did not change), the check outcomes and the request gate are the
old ones, here; nothing else. It reads only the signals that existed then (the speculative and control pods' acceptance
rate, P99s and request counts), which the samples still carry.

The original docstring:

The verdict on one sample: Healthy, Failing(reason, evidence) or Inconclusive(reason, message).

    verdict(sample, spec.analysis.checks, spec.analysis.baseline.mode, spec.analysis.min_requests,
            previous=snapshot)
    # Failing(AcceptanceBelowMinimum, "acceptance rate 0.31 < minAcceptanceRate 0.50 over 5m (1,234 requests)")

A pure function of the measurements and the limits (as Argo Rollouts' evaluate.go): no clock, no I/O.
What cannot be measured is never a failure — no series, NaN, fewer than `minRequests` requests, a
Prometheus error: Inconclusive, with the reason (Flagger counts those as failures and rolls back idle
endpoints; that is the behaviour we do not copy). A check fails only on valid numbers, so one signal's
Prometheus error does not hide another signal's clear failure: Failing wins over Inconclusive, which
wins over Healthy.

Baselines: Control compares with the control pods in the same window (both must have `minRequests`);
Previous with a snapshot of the same pods before speculation, only when the load is within
LOAD_TOLERANCE of the snapshot's; None runs the absolute checks alone (acceptance and the SLO).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from specdeploy.api.reasons import FailureReason, InconclusiveReason
from specdeploy.api.spec import BaselineMode, Checks
from specdeploy.judgment import evidence
from specdeploy.judgment.samples import DeploymentSample, Signal, SignalValues

# The verdict types, their labels and messages are the same then and now: one definition.
from specdeploy.judgment.verdict import (  # noqa: F401 (message: for decisions.py)
    _ERROR_REASONS,
    Failing,
    Healthy,
    Inconclusive,
    Verdict,
    message,
)

PREVIOUS_MIN_ACCEPTANCE_RATE = 0.5
"""The default of `checks.minAcceptanceRate` before it became optional (None: Auto)."""

LOAD_TOLERANCE = 0.30
"""Previous: compare only when requests/s is within ±30% of the snapshot's. Latency grows with batch size
(planning/roofline.py), so a P99 measured at other load says more about the load than about speculation;
30% keeps the batch-size effect on step time well under the default 1.10 ITL limit for decode-bound steps."""


@dataclass(frozen=True)
class PreviousBaseline:
    """What the pods measured without speculation; the Previous mode's yardstick (kept in status)."""

    taken_at: str
    requests_per_second: float
    p99_inter_token_latency_seconds: float | None
    p99_e2e_latency_seconds: float | None
    p99_time_to_first_token_seconds: float | None

    def values(self) -> SignalValues:
        return SignalValues(
            p99_inter_token_latency_seconds=self.p99_inter_token_latency_seconds,
            p99_e2e_latency_seconds=self.p99_e2e_latency_seconds,
            p99_time_to_first_token_seconds=self.p99_time_to_first_token_seconds,
        )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def previous_baseline(sample: DeploymentSample, min_requests: int, now: datetime) -> PreviousBaseline | None:
    """A snapshot of a sample taken without speculation; None when it has too few requests to stand for anything."""
    requests = _finite(sample.speculative.requests)
    rate = sample.requests_per_second
    if requests is None or rate is None or requests < max(min_requests, 1):
        return None
    values = sample.speculative
    return PreviousBaseline(
        taken_at=evidence.rfc3339(now),
        requests_per_second=rate,
        p99_inter_token_latency_seconds=_finite(values.p99_inter_token_latency_seconds),
        p99_e2e_latency_seconds=_finite(values.p99_e2e_latency_seconds),
        p99_time_to_first_token_seconds=_finite(values.p99_time_to_first_token_seconds),
    )


# -- one check's outcome ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pass:
    text: str


@dataclass(frozen=True)
class _Fail:
    reason: FailureReason
    text: str


@dataclass(frozen=True)
class _Unknown:
    reason: InconclusiveReason
    text: str


_Outcome = _Pass | _Fail | _Unknown

_WHAT = {
    Signal.ACCEPTANCE_RATE: "acceptance rate",
    Signal.P99_INTER_TOKEN_LATENCY: "P99 inter-token latency",
    Signal.P99_E2E_LATENCY: "P99 end-to-end latency",
    Signal.P99_TIME_TO_FIRST_TOKEN: "P99 time to first token",
    Signal.REQUESTS: "request count",
}


def _measured(sample: DeploymentSample, values: SignalValues, signal: Signal, whose: str) -> float | _Unknown:
    """The value of `signal`, or why there is none (a query error, no series, NaN)."""
    error = sample.errors.get(signal)
    if error is not None:
        return _Unknown(_ERROR_REASONS[error.kind], f"the {_WHAT[signal]} query failed: {error.message}")
    value = values.get(signal)
    if value is None:
        return _Unknown(InconclusiveReason.NO_DATA, f"Prometheus has no {_WHAT[signal]} of the {whose}")
    if not math.isfinite(value):
        return _Unknown(InconclusiveReason.NOT_A_NUMBER,
                        f"the {_WHAT[signal]} of the {whose} is {evidence.number(value)} (nothing measured)")
    return value


def _request_gate(sample: DeploymentSample, values: SignalValues, min_requests: int, whose: str,
                  too_few: InconclusiveReason) -> float | _Unknown:
    requests = _measured(sample, values, Signal.REQUESTS, whose)
    if isinstance(requests, _Unknown):
        return requests
    if requests < min_requests:
        return _Unknown(too_few, f"the {whose} finished {evidence.count(requests)} requests in "
                                 f"{evidence.window(sample.window_seconds)}, fewer than minRequests {min_requests}")
    return requests


def _acceptance(sample: DeploymentSample, checks: Checks) -> _Outcome:
    value = _measured(sample, sample.speculative, Signal.ACCEPTANCE_RATE, "speculative pods")
    if isinstance(value, _Unknown):
        return value
    minimum = checks.min_acceptance_rate if checks.min_acceptance_rate is not None else PREVIOUS_MIN_ACCEPTANCE_RATE
    shown, limit = evidence.compared(value, minimum)
    if value < minimum:
        return _Fail(FailureReason.ACCEPTANCE_BELOW_MINIMUM, f"acceptance rate {shown} < minAcceptanceRate {limit}")
    return _Pass(f"acceptance rate {shown}")


def _slo(sample: DeploymentSample, checks: Checks) -> _Outcome | None:
    limit = checks.max_p99_e2e_latency_seconds
    if limit is None:
        return None
    value = _measured(sample, sample.speculative, Signal.P99_E2E_LATENCY, "speculative pods")
    if isinstance(value, _Unknown):
        return value
    if value > limit:
        return _Fail(FailureReason.E2E_LATENCY_ABOVE_SLO,
                     f"P99 end-to-end latency {evidence.seconds(value)} > maxP99E2ELatencySeconds "
                     f"{evidence.seconds(limit)}")
    return _Pass(f"P99 end-to-end latency {evidence.seconds(value)} within the SLO")


@dataclass(frozen=True)
class _RatioCheck:
    signal: Signal
    limit: Callable[[Checks], float]
    limit_name: str
    reason: FailureReason


_RATIO_CHECKS = (
    _RatioCheck(Signal.P99_INTER_TOKEN_LATENCY, lambda c: c.per_token_latency_ratio,
                "maxP99InterTokenLatencyRatio", FailureReason.INTER_TOKEN_LATENCY_REGRESSED),
    _RatioCheck(Signal.P99_E2E_LATENCY, lambda c: c.inference_time_ratio,
                "maxP99E2ELatencyRatio", FailureReason.E2E_LATENCY_REGRESSED),
    _RatioCheck(Signal.P99_TIME_TO_FIRST_TOKEN, lambda c: c.prefill_time_ratio,
                "maxP99TimeToFirstTokenRatio", FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED),
)


@dataclass(frozen=True)
class _Baseline:
    values: SignalValues
    whose: str           # "control pods" / "Previous baseline"
    possessive: str      # "the control's" / "the Previous baseline's"
    requests: float | None = None


def _ratio(sample: DeploymentSample, check: _RatioCheck, baseline: _Baseline, checks: Checks) -> _Outcome:
    value = _measured(sample, sample.speculative, check.signal, "speculative pods")
    if isinstance(value, _Unknown):
        return value
    base = _measured(sample, baseline.values, check.signal, baseline.whose)
    if isinstance(base, _Unknown):
        return base
    what = _WHAT[check.signal]
    if base <= 0:
        return _Unknown(InconclusiveReason.NOT_A_NUMBER, f"the {what} of the {baseline.whose} is 0")
    ratio, limit = value / base, check.limit(checks)
    shown, shown_limit = evidence.compared(ratio, limit)
    if ratio > limit:
        return _Fail(check.reason, f"{what} {evidence.seconds(value)} is {shown}× {baseline.possessive} "
                                   f"{evidence.seconds(base)}, above {check.limit_name} {shown_limit}")
    return _Pass(f"{what} {shown}× {baseline.possessive}")


def _baseline(sample: DeploymentSample, mode: BaselineMode, min_requests: int,
              previous: PreviousBaseline | None) -> _Baseline | _Unknown | None:
    """What the ratio checks compare with, why there is nothing to compare with, or None (mode None)."""
    if mode == BaselineMode.NONE:
        return None
    if mode == BaselineMode.CONTROL:
        requests = sample.control.requests
        if requests is None and not sample.errors.get(Signal.REQUESTS):
            return _Unknown(InconclusiveReason.NO_CONTROL_DATA,
                            "Prometheus has no series of the control pods (specdeploy_io_variant=\"control\")")
        gate = _request_gate(sample, sample.control, min_requests, "control pods",
                             InconclusiveReason.CONTROL_TOO_FEW_REQUESTS)
        if isinstance(gate, _Unknown):
            return gate
        return _Baseline(sample.control, "control pods", "the control's", gate)
    if previous is None:
        return _Unknown(InconclusiveReason.NO_PREVIOUS_BASELINE,
                        "no Previous baseline yet: the pods have not been measured without speculation")
    now = sample.requests_per_second or 0.0
    then = previous.requests_per_second
    if then <= 0 or abs(now / then - 1.0) > LOAD_TOLERANCE:
        return _Unknown(InconclusiveReason.LOAD_DIFFERS_FROM_PREVIOUS,
                        f"load {now:.2f} requests/s differs from the Previous baseline's {then:.2f} requests/s "
                        f"(taken at {previous.taken_at}) by more than {LOAD_TOLERANCE:.0%}")
    return _Baseline(previous.values(), "Previous baseline", "the Previous baseline's")


def _context(sample: DeploymentSample, requests: float, baseline: _Baseline | None) -> str:
    extra = f"; control {evidence.count(baseline.requests)}" if baseline and baseline.requests is not None else ""
    return f"over {evidence.window(sample.window_seconds)} ({evidence.count(requests)} requests{extra})"


def verdict(sample: DeploymentSample, checks: Checks, baseline_mode: BaselineMode, min_requests: int,
            previous: PreviousBaseline | None = None) -> Verdict:
    """The verdict on `sample` under `checks`; `previous` is the snapshot the Previous mode compares with."""
    requests = _request_gate(sample, sample.speculative, min_requests, "speculative pods",
                             InconclusiveReason.TOO_FEW_REQUESTS)
    if isinstance(requests, _Unknown):
        return Inconclusive(requests.reason, requests.text)
    outcomes: list[_Outcome] = [_acceptance(sample, checks)]
    baseline = _baseline(sample, baseline_mode, min_requests, previous)
    if isinstance(baseline, _Unknown):
        outcomes.append(baseline)
    elif baseline is not None:
        outcomes.extend(_ratio(sample, check, baseline, checks) for check in _RATIO_CHECKS)
    slo = _slo(sample, checks)
    if slo is not None:
        outcomes.append(slo)
    context = _context(sample, requests, baseline if isinstance(baseline, _Baseline) else None)
    failures = [o for o in outcomes if isinstance(o, _Fail)]
    if failures:
        return Failing(failures[0].reason, "; ".join(f.text for f in failures) + f" {context}")
    unknowns = [o for o in outcomes if isinstance(o, _Unknown)]
    if unknowns:
        return Inconclusive(unknowns[0].reason, "; ".join(u.text for u in unknowns) + f" {context}")
    return Healthy("; ".join(o.text for o in outcomes if isinstance(o, _Pass)) + f" {context}")


def baseline_p99_inter_token_latency(sample: DeploymentSample, mode: BaselineMode,
                                     previous: PreviousBaseline | None) -> float | None:
    """The ITL the sample was compared with (for status.analysis), whatever the verdict."""
    if mode == BaselineMode.CONTROL:
        return _finite(sample.control.p99_inter_token_latency_seconds)
    if mode == BaselineMode.PREVIOUS and previous is not None:
        return previous.p99_inter_token_latency_seconds
    return None
