"""Tables that read right at any terminal width (``ps``): a value is never cut.

rich shrinks every column of a table wider than the terminal, cutting ids (``15`` printed as
``1``) and numbers (``0.0005369`` as ``0.000``). :func:`fit` decides instead: each column is as
wide as its widest value; a column of prose (the scheduler's reason, a note) wraps down to a
floor; past that, whole columns are dropped, the least useful first, and :func:`render` names
them on one line under the table. Columns marked ``keep`` (a job's id, its progress) are never
dropped. :func:`number` writes a number with its significant digits (``5.37e-04``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainhouse.cli.render import shown

GAP = 2  # characters between two columns
WRAP_FLOOR = 24  # the narrowest a prose column wraps to before it is dropped instead


def number(value: float) -> str:
    """A number as a table shows it, its significant digits kept: integers whole (``270``,
    ``12345678``), ordinary magnitudes with up to four significant digits (``0.3142``,
    ``12.5``), very small or very large ones in scientific notation (``5.37e-04``,
    ``1.23e+07``)."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.2e}"


@dataclass
class Column:
    """One column: its head, its cells (plain text or rich Text), whether it is never
    dropped (``keep``), whether its text may wrap (``wrap``: prose), and ``rank``: columns of
    a lower rank are dropped first."""

    head: str
    cells: list[Text] = field(default_factory=list)
    keep: bool = False
    wrap: bool = False
    rank: int = 0

    def add(self, cell: str | Text) -> None:
        """A cell: plain text is a job's or a user's words (a reason from its log, an hparam's
        value), shown as text with its control characters escaped (:func:`.render.shown`)."""
        self.cells.append(cell if isinstance(cell, Text) else shown(cell))

    def natural(self) -> int:
        """The width of its widest value (or its head)."""
        return max([len(self.head), *(c.cell_len for c in self.cells)])


def fit(columns: Sequence[Column], width: int) -> tuple[list[tuple[Column, int]], list[Column]]:
    """The columns shown, in their order, each with its width, and the ones dropped (in their
    order) so that the rest fit in ``width`` characters, no value cut: prose columns wrap down
    to :data:`WRAP_FLOOR`, then the lowest-ranked column that is not ``keep`` goes, and so on
    until they fit (or only the kept ones are left)."""
    shown = list(columns)
    dropped: list[Column] = []

    def total(cols: list[Column]) -> int:
        fixed = sum(c.natural() if not c.wrap else min(c.natural(), WRAP_FLOOR) for c in cols)
        return fixed + GAP * max(len(cols) - 1, 0)

    while total(shown) > width:
        candidates = [c for c in shown if not c.keep]
        if not candidates:
            break
        # the lowest rank goes first; of equal ranks, the rightmost
        worst = min(reversed(candidates), key=lambda c: c.rank)
        shown.remove(worst)
        dropped.append(worst)
    widths = {id(c): c.natural() for c in shown}
    spare = width - sum(widths.values()) - GAP * max(len(shown) - 1, 0)
    if spare < 0:  # prose columns give up what they must, down to their floor, last first
        for c in reversed(shown):
            if c.wrap and spare < 0:
                give = min(-spare, widths[id(c)] - WRAP_FLOOR)
                if give > 0:
                    widths[id(c)] -= give
                    spare += give
    order = [c for c in columns if c not in dropped]
    return [(c, widths[id(c)]) for c in order], [c for c in columns if c in dropped]


def render(console: Console, columns: Sequence[Column]) -> None:
    """Print the columns as a table that fits the console's width, then a line naming the
    columns left out (if any; it wraps in a terminal too narrow for it)."""
    shown, dropped = fit(columns, console.width)
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, GAP // 2))
    for col, width in shown:
        table.add_column(
            col.head, width=width, no_wrap=not col.wrap, overflow="fold" if col.wrap else "ignore"
        )
    rows = len(columns[0].cells) if columns else 0
    for i in range(rows):
        table.add_row(*(col.cells[i] for col, _ in shown))
    console.print(table, highlight=False)
    if dropped:
        names = ", ".join(c.head for c in dropped)
        console.print(
            f"({len(dropped)} column{'s' if len(dropped) != 1 else ''} left out to fit "
            f"{console.width} characters: {names})",
            highlight=False,
            markup=False,
        )
