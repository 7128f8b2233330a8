"""Every reason the analysis gives, in one place: why a sample fails, why it says nothing, why speculation
was rolled back or comes back, why an Auto schedule changed or stayed. In api/ because status carries them: the CRD
lists each as an enum.

Reasons are one CamelCase word and stable: status, Events, alert labels and the operator's metrics carry
them, and dashboards and alert routes match on them. Add new ones; never rename one.
"""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    """A check broke on valid numbers: the sample is Failing."""

    ACCEPTANCE_BELOW_MINIMUM = "AcceptanceBelowMinimum"
    INTER_TOKEN_LATENCY_REGRESSED = "InterTokenLatencyRegressed"
    E2E_LATENCY_REGRESSED = "E2ELatencyRegressed"
    TIME_TO_FIRST_TOKEN_REGRESSED = "TimeToFirstTokenRegressed"
    E2E_LATENCY_ABOVE_SLO = "E2ELatencyAboveSLO"
    QUEUE_TIME_REGRESSED = "QueueTimeRegressed"                        # objective Throughput / Both
    OUTPUT_THROUGHPUT_REGRESSED = "OutputThroughputRegressed"          # tokens per second per GPU
    NO_SCHEDULE_PAYS = "NoSchedulePays"    # Auto: measurably slower, and no k pays at the measured acceptance
    SLOWER_BELOW_ACCEPTANCE_FLOOR = "SlowerBelowAcceptanceFloor"   # any k: slower beyond noise, acceptance surely
                                                                   # below its floor, inside the ratio limit


class InconclusiveReason(StrEnum):
    """Nothing can be concluded from the sample; never a failure."""

    NO_DATA = "NoData"
    NOT_A_NUMBER = "NotANumber"
    TOO_FEW_REQUESTS = "TooFewRequests"
    CONTROL_TOO_FEW_REQUESTS = "ControlTooFewRequests"
    NO_CONTROL_DATA = "NoControlData"
    NO_PREVIOUS_BASELINE = "NoPreviousBaseline"
    LOAD_DIFFERS_FROM_PREVIOUS = "LoadDiffersFromPrevious"
    NOT_ENOUGH_EVIDENCE = "NotEnoughEvidence"      # a latency interval that holds its limit
    NOT_DRAFTING = "NotDrafting"                   # the engine drafts nothing at this batch size: not counted
    PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
    PROMETHEUS_REFUSED = "PrometheusRefused"
    PROMETHEUS_BAD_QUERY = "PrometheusBadQuery"
    PROMETHEUS_BAD_RESPONSE = "PrometheusBadResponse"
    PROMETHEUS_URL_NOT_ALLOWED = "PrometheusUrlNotAllowed"   # outside the operator's allow-list: never asked


class RollbackReason(StrEnum):
    """Why speculation was taken away: a failure reason, or one of the two that are not about a sample."""

    ACCEPTANCE_BELOW_MINIMUM = FailureReason.ACCEPTANCE_BELOW_MINIMUM.value
    INTER_TOKEN_LATENCY_REGRESSED = FailureReason.INTER_TOKEN_LATENCY_REGRESSED.value
    E2E_LATENCY_REGRESSED = FailureReason.E2E_LATENCY_REGRESSED.value
    TIME_TO_FIRST_TOKEN_REGRESSED = FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED.value
    E2E_LATENCY_ABOVE_SLO = FailureReason.E2E_LATENCY_ABOVE_SLO.value
    QUEUE_TIME_REGRESSED = FailureReason.QUEUE_TIME_REGRESSED.value
    OUTPUT_THROUGHPUT_REGRESSED = FailureReason.OUTPUT_THROUGHPUT_REGRESSED.value
    NO_SCHEDULE_PAYS = FailureReason.NO_SCHEDULE_PAYS.value
    SLOWER_BELOW_ACCEPTANCE_FLOOR = FailureReason.SLOWER_BELOW_ACCEPTANCE_FLOOR.value
    SPECULATIVE_POD_OUT_OF_MEMORY = "SpeculativePodOutOfMemory"
    INCONCLUSIVE_TOO_LONG = "InconclusiveTooLong"


class ReenableReason(StrEnum):
    """Why speculation comes back after a rollback."""

    SPECULATION_SPEC_CHANGED = "SpeculationSpecChanged"
    RETRY_REQUESTED = "RetryRequested"
    COOLDOWN_ELAPSED = "CooldownElapsed"


class CalibrationReason(StrEnum):
    """Why the last calibration of an Auto schedule changed it, or kept the one running (judgment/calibration.py)."""

    SCHEDULE_RECALIBRATED = "ScheduleRecalibrated"   # changed: the Event's reason too
    NOT_AUTO = "NotAuto"                          # Fixed and Table schedules are the user's
    NO_POSITION_COUNTS = "NoPositionCounts"       # SGLang, or no drafts in the window
    TOO_FEW_DRAFTS = "TooFewDrafts"               # position 1's interval is wider than MAX_HALF_WIDTH
    SAME_SCHEDULE = "SameSchedule"                # the measurement derives the table running
    NEVER_PAYS = "NeverPays"                      # the measurement derives k = 0 at every batch size
    LOSES_AT_LOAD = "LosesAtLoad"                 # the derived table is predicted below 1× at the observed batch
    GAIN_BELOW_MINIMUM = "GainBelowMinimum"       # under MIN_RELATIVE_GAIN at the observed batch
    WITHIN_MINIMUM_PERIOD = "WithinMinimumPeriod"  # the last change is less than MIN_PERIOD_SECONDS ago
    NOT_EXPRESSIBLE = "NotExpressible"
    """No longer given (since 104d3b3 the derived table is always one the engine can run); status written before
    may hold it, and must stay valid."""
