"""The acceptance floor: the lowest vLLM acceptance rate at which speculation still pays, from the cost model.

    floor = plan.acceptance_floor(batch_size=running_sequences_per_pod)    # planning/plan.py
    if floor is not None and measured_rate < floor.rate: ...   # speculation no longer pays
    floor.describe()   # "Auto: break-even 0.09 at batch 1 for eagle3 k=3 (draft 9% of a target step on
                       #  H100-80GB), floor 0.11 with the 5% margin"

`spec.analysis.checks.minAcceptanceRate` set: the floor is that number ("Fixed"). Unset ("Auto"): the
floor comes from the plan's cost model (planning.speedup's `SpeculationCost`, built once by the plan from the
models as they were resolved: catalog, Hub, ConfigMap or spec) for the spec's method, k, drafter, target,
tensor parallelism and GPU, at the batch size the pods run. With B the baseline step, S the speculative step (k
drafting passes + verifying k+1 tokens per sequence), c = one drafting pass ÷ B, and vLLM's acceptance
rate r = accepted ÷ drafted = (E[tokens] − 1) ÷ k, SpeculationCost.speedup(batch, α, k) = E[tokens] × B ÷ S
depends on α only through E[tokens] = 1 + k·r, so the rate at which it equals s is

    r(s) = (s × S ÷ B − 1) ÷ k  =  s·c + (s × V ÷ B − 1) ÷ k        (V: the verify step, with overhead)
    break_even = r(1)                       = c + (V − B) ÷ (k·B)
    rate       = r(1 + AUTO_MARGIN), clamped to [0, 1]

in closed form (no bisection needed; tests check that cost.speedup at the α behind each rate is 1 and
1 + AUTO_MARGIN). While the verify pass is memory-bound, V = B and the break-even is exactly c: a drafted
token must be accepted at least as often as it costs. Past the compute ridge V grows with the batch and
so does the break-even. (Below the ridge a drafter with a fixed per-pass overhead, such as an EAGLE head,
gets slightly cheaper relative to a slower baseline step, so its break-even falls a little with the
batch until the ridge; a draft model, whose own KV reads grow with the batch, does not.)

A constant 0.5 is wrong both ways: a healthy EAGLE-3 head on Llama-3.1-8B at k=3 measures about 0.47 and
still gives ~2.4 tokens per step (break-even 0.09 at batch 1), while a draft model at a large batch needs
far more than 0.5 to pay.

The batch is the running sequences per pod; None (nothing measured, or `specdeploy plan`) means batch
1, the planning default (the lowest floor of the memory-bound region). It is rounded and clamped to
[1, spec.serving.maxNumSeqs].

If the speedup stays below 1 even when every drafted token is accepted, speculation cannot pay at that
batch: break_even and rate are both 1.0 and `pays` is False. If it reaches 1 but not 1 + AUTO_MARGIN,
break_even is below 1 and the floor is 1.0.

The plan answers None when speculation is disabled in the spec (there is no acceptance to check). A Fixed
floor carries the model's break-even beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.planning.speedup import SpeculationCost

__all__ = ["AUTO", "AUTO_MARGIN", "DEFAULT_BATCH_SIZE", "FIXED", "AcceptanceFloor", "acceptance_floor"]

# The Auto floor is the acceptance at which the model predicts speculation buys 5% more tokens per second,
# not the one where it buys nothing.
# - The margin is on the speedup, not on the rate: it means the same for every method and batch, and it
#   is defined where the break-even is ~0 (ngram and suffix draft for free on the CPU, so at batch 1 any
#   acceptance breaks even; × (1 + margin) would leave the floor at 0).
# - 5% is the model's error where it is calibrated at small batches (docs/speedup-model.md: 158.6 vs
#   158.34 tok/s without speculation, 1.49x vs 1.5x for the blog's draft model): a predicted gain below
#   that cannot be told from none. A larger margin would fail healthy deployments where the floor climbs
#   steeply (a 70B target with an 8B draft on 2×H100 at batch 64: break-even 0.57, floor 0.61 at 5%, 0.65
#   at 10%), and the P99 latency checks against Control already measure the real slowdown.
AUTO_MARGIN = 0.05
# The batch size used when none was measured: one running sequence, as `specdeploy plan` predicts.
DEFAULT_BATCH_SIZE = 1
AUTO = "Auto"
FIXED = "Fixed"


@dataclass(frozen=True)
class AcceptanceFloor:
    """The acceptance floor of one spec at one batch size, in vLLM's accepted ÷ drafted tokens."""

    rate: float                 # the floor, in [0, 1]
    break_even: float           # the rate where the predicted speedup is 1
    batch_size: int             # running sequences per pod it was computed at
    source: str                 # AUTO or FIXED
    method: str = ""            # the following describe the model's numbers
    k: int = 0
    draft_cost_ratio: float | None = None   # one drafting pass in target steps at batch_size
    gpu: str = ""
    pays: bool = True           # False: below speedup 1 even at acceptance 1 at this batch
    margin: float = AUTO_MARGIN

    @property
    def fixed(self) -> bool:
        """minAcceptanceRate as written, not the cost model's."""
        return self.source == FIXED

    def describe(self) -> str:
        """One sentence for status, evidence and `specdeploy plan`."""
        if self.fixed:
            return f"Fixed: minAcceptanceRate {self.rate:.2f}"
        where = (f"at batch {self.batch_size} for {self.method} k={self.k} "
                 f"({self._draft_words()} on {self.gpu})")
        if not self.pays:
            return (f"Auto: speculation never pays {where}, even with every drafted token accepted; "
                    f"floor {self.rate:.2f}")
        if self.rate >= 1.0:
            return (f"Auto: break-even {self.break_even:.2f} {where}; the {self.margin:.0%} margin is out of "
                    f"reach even with every drafted token accepted, floor {self.rate:.2f}")
        return f"Auto: break-even {self.break_even:.2f} {where}, floor {self.rate:.2f} with the {self.margin:.0%} margin"

    def to_wire(self) -> dict[str, Any]:
        """The `acceptanceFloor` object of `specdeploy plan -o json` (floats to 3 decimals)."""
        return {
            "rate": round(self.rate, 3),
            "breakEven": round(self.break_even, 3),
            "batchSize": self.batch_size,
            "source": self.source,
        }

    def _draft_words(self) -> str:
        ratio = self.draft_cost_ratio or 0.0
        if ratio == 0.0:
            return "drafting takes no GPU time"
        return f"draft {ratio:.0%} of a target step" if ratio >= 0.01 else f"draft {ratio:.1%} of a target step"


def acceptance_floor(spec: SpeculativeDeploymentSpec, cost: SpeculationCost, batch_size: float | None = None,
                     k: int | None = None) -> AcceptanceFloor:
    """The acceptance floor of `spec`, whose speculation `cost` prices, at `batch_size` running sequences per pod
    (None: DEFAULT_BATCH_SIZE).

    Fixed when `spec.analysis.checks.minAcceptanceRate` is set, else Auto from the cost model (see the module
    docstring). `k`: the tokens drafted per step at that batch — under a schedule, the table's k there (the
    engine's accepted ÷ drafted counts the drafts of the k in force); None: `numSpeculativeTokens`.
    """
    batch = _batch(batch_size, spec.serving.max_num_seqs)
    drafted = k if k is not None and k > 0 else spec.speculation.num_speculative_tokens
    break_even = _rate_where(cost, batch, drafted, 1.0)
    fixed = spec.analysis.checks.min_acceptance_rate
    return AcceptanceFloor(
        rate=min(max(_rate_where(cost, batch, drafted, 1.0 + AUTO_MARGIN), 0.0), 1.0) if fixed is None else fixed,
        break_even=min(max(break_even, 0.0), 1.0), batch_size=batch, source=AUTO if fixed is None else FIXED,
        method=spec.speculation.enabled_method.value, k=drafted, draft_cost_ratio=cost.draft_cost_ratio(batch),
        gpu=cost.gpu.name, pays=break_even <= 1.0,
    )


def _batch(batch_size: float | None, max_num_seqs: int) -> int:
    """`batch_size` rounded and clamped to [1, max_num_seqs]; None or NaN: DEFAULT_BATCH_SIZE."""
    if batch_size is None or math.isnan(batch_size):
        return min(DEFAULT_BATCH_SIZE, max_num_seqs)
    return int(round(min(max(float(batch_size), 1.0), float(max_num_seqs))))


def _rate_where(cost: SpeculationCost, batch: int, k: int, speedup: float) -> float:
    """The acceptance rate at which `cost` predicts `speedup` at `batch` (unclamped: above 1, out of reach).

    SpeculationCost.speedup is E[tokens] × baseline ÷ speculative step, and only E[tokens] depends on the
    acceptance, as E = 1 + k × rate; so the rate is solved in closed form rather than by bisection on α.
    """
    baseline, speculative = cost.baseline_step_seconds(batch), cost.speculative_step_seconds(batch, k)
    return (speedup * speculative / baseline - 1.0) / k
