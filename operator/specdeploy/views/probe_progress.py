"""`specdeploy probe`'s progress while it runs (up to its deadline): each cell's requests answered so far and the
acceptance they show. The probe sends the i-th request of every cell before the (i+1)-th of any, so every cell
fills in at once: on a terminal a table redrawn per answer, elsewhere one line per round of requests."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table

from specdeploy.judgment.probe import ProbeOutcome

Cell = tuple[str, float]


class ProbeProgress:
    """Fed each outcome as it comes (`on_outcome`); a context manager around the probe."""

    def __init__(self, workloads: Sequence[str], temperatures: Sequence[float], per_cell: int,
                 console: Console) -> None:
        self.cells: list[Cell] = [(w, t) for w in workloads for t in temperatures]
        self.per_cell = per_cell
        self.console = console
        self.answered = dict.fromkeys(self.cells, 0)
        self.failed = dict.fromkeys(self.cells, 0)
        self.drafted = dict.fromkeys(self.cells, 0)
        self.accepted = dict.fromkeys(self.cells, 0)
        self.sent = 0
        self._live = Live(self.table(), console=console, auto_refresh=False, transient=False) \
            if console.is_terminal else None

    def __enter__(self) -> ProbeProgress:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def acceptance(self, cell: Cell) -> float | None:
        return self.accepted[cell] / self.drafted[cell] if self.drafted[cell] else None

    def add(self, outcome: ProbeOutcome) -> None:
        cell = (outcome.request.workload, outcome.request.temperature)
        self.sent += 1
        if cell in self.answered:
            if outcome.counts is not None:
                self.answered[cell] += 1
                self.drafted[cell] += outcome.counts.drafted
                self.accepted[cell] += outcome.counts.accepted
            else:
                self.failed[cell] += 1
        if self._live is not None:
            self._live.update(self.table(), refresh=True)
        elif self.sent % len(self.cells) == 0:
            self.console.print(self.line(), soft_wrap=True)

    def line(self) -> str:
        """One round's summary: every cell's acceptance so far."""
        cells = ", ".join(f"{w}@{t:g} {'-' if self.acceptance((w, t)) is None else f'{self.acceptance((w, t)):.2f}'}"
                          for w, t in self.cells)
        return f"probe round {self.sent // len(self.cells)}/{self.per_cell}: {cells}"

    def table(self) -> Table:
        table = Table(box=None, pad_edge=False, title=f"probing: {self.sent}/{len(self.cells) * self.per_cell} "
                      "requests", title_justify="left")
        for column in ("WORKLOAD", "TEMPERATURE", "ANSWERED", "FAILED", "ACCEPTANCE SO FAR"):
            table.add_column(column)
        for cell in self.cells:
            rate = self.acceptance(cell)
            table.add_row(cell[0], f"{cell[1]:g}", f"{self.answered[cell]}/{self.per_cell}", str(self.failed[cell]),
                          "-" if rate is None else f"{rate:.2f}")
        return table
