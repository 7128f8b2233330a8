"""What the judgment asks of the plan: the numbers derived from the models, read through a frozen view.

    floor = plan.acceptance_floor(batch, k)        # None: speculation disabled
    plan.schedule.k_at(batch)                      # the k the pods' schedule drafts there
    plan.predicted_speedup(acceptance, batch, k)   # tokens per second ÷ without speculation
    plan.derive_schedule(acceptance)               # Auto's table under a measured acceptance per position
    plan.base_step_seconds(batch, factor)          # a step without speculation on GPUs factor × the prior's
    plan.with_hardware_factor(factor)              # priced on a fitted GPU time, the pods' schedule kept
    plan.derived_schedule()                        # the table its cost model derives (judgment/hardware.py)

The Plan (planning/plan.py) is built once per pass from the models as they were resolved — catalog, Hub,
ConfigMap or spec — and holds the one cost model; it implements these protocols. The judgment names only them,
so it imports nothing from planning and can neither rebuild a cost model nor resolve a model again
(tests/unit/test_layout.py checks the imports).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specdeploy.api.spec import ScheduleMode


class ScheduleRange(Protocol):
    """k for the batch sizes min_batch..max_batch (both included), with the predicted speedup at each end."""

    @property
    def min_batch(self) -> int: ...
    @property
    def max_batch(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def speedup_at_min_batch(self) -> float: ...
    @property
    def speedup_at_max_batch(self) -> float: ...


class Schedule(Protocol):
    """k per batch range, covering 1..maxNumSeqs in ascending order."""

    @property
    def mode(self) -> ScheduleMode: ...
    @property
    def ranges(self) -> tuple[ScheduleRange, ...]: ...

    def k_at(self, batch: int) -> int:
        """The k drafted at `batch`; past the last range, the last range's (as vLLM reads a table)."""
        ...


class AcceptanceFloor(Protocol):
    """The lowest acceptance rate (accepted ÷ drafted) at which speculation still pays, at one batch size."""

    @property
    def rate(self) -> float: ...
    @property
    def break_even(self) -> float: ...
    @property
    def fixed(self) -> bool:
        """minAcceptanceRate as written, not the cost model's."""
        ...

    def describe(self) -> str:
        """One sentence for status and evidence: where the floor comes from."""
        ...


class PlanView(Protocol):
    """The plan the pods run, as the judgment reads it."""

    @property
    def schedule(self) -> Schedule | None:
        """The schedule the pods run; None without speculation."""
        ...

    @property
    def calibration_key(self) -> str:
        """What a measured acceptance per draft position is valid for (the engine, the target, the speculation)."""
        ...

    def acceptance_floor(self, batch_size: float | None = None, k: int | None = None) -> AcceptanceFloor | None:
        """The floor at `batch_size` running sequences per pod (None: batch 1) drafting `k` (None:
        numSpeculativeTokens); None when speculation is disabled."""
        ...

    def predicted_speedup(self, position_acceptance: Sequence[float], batch: int, k: int) -> float:
        """The predicted speedup at `batch` drafting `k`, under an acceptance per draft position."""
        ...

    def derive_schedule(self, position_acceptance: Sequence[float]) -> Schedule:
        """The Auto schedule the cost model derives under an acceptance per draft position."""
        ...

    @property
    def hardware_factor(self) -> float | None:
        """The GPU time the plan's cost model uses, × the prior's; None: the prior's."""
        ...

    @property
    def model_error(self) -> float:
        """The prior's stated error on a step time and a speedup, ± this fraction."""
        ...

    def base_step_seconds(self, batch: int, hardware_factor: float | None = None) -> float:
        """One step without speculation at `batch` on GPUs `hardware_factor` × the prior's time (None: the prior)."""
        ...

    def with_hardware_factor(self, factor: float | None) -> PlanView:
        """The plan priced on GPUs `factor` × the prior's time (None: the prior's): its floor and predictions; the
        schedule stays the one the pods run."""
        ...

    def derived_schedule(self) -> Schedule | None:
        """The Auto table this plan's cost model derives under the acceptance in force; None without speculation."""
        ...
