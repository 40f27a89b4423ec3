"""Text for a terminal: tables that fit its width, and paragraphs wrapped to it.

Every table ``lbt`` prints goes through ``table``: rich lays it out in the width given (the terminal's,
or ``DEFAULT_WIDTH`` when the output is not a terminal), the columns a caller marks optional are left
out, in the order given, until the rest fits, and the columns marked ``wrap`` (labels, verdicts) wrap
within their cells before any other does. ``--wide`` (``Fit.wide``) shows every column at its full width
whatever the terminal's. A line under a table that left columns out names them. ``paragraph`` wraps a
note with a hanging indent.
"""

from __future__ import annotations

import io
import shutil
import sys
import textwrap
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TextIO

#: the width fitted when the output is not a terminal (a file, a pipe, a test)
DEFAULT_WIDTH = 100
GAP = 2  # spaces between two columns


@dataclass(frozen=True)
class Fit:
    """What a table must fit: ``width`` characters, unless ``wide`` (every column, full width)."""

    width: int = DEFAULT_WIDTH
    wide: bool = False


def terminal_width(stream: TextIO | None = None) -> int:
    """The width of the terminal ``stream`` (default stdout) writes to; ``DEFAULT_WIDTH`` when it is not
    a terminal."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        tty = False
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns if tty else DEFAULT_WIDTH


def natural_width(rows: Sequence[Sequence[str]]) -> int:
    """The width of ``rows`` laid out without wrapping: every column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return sum(widths) + GAP * (len(widths) - 1)


def _without(rows: Sequence[Sequence[str]], column: int) -> list[list[str]]:
    return [[c for i, c in enumerate(r) if i != column] for r in rows]


def table(
    rows: Sequence[Sequence[str]],
    fit: Fit = Fit(),
    *,
    wrap: Collection[str] = (),
    drop: Sequence[str] = (),
) -> str:
    """``rows`` (the header first) as a table of ``fit.width`` characters at most. ``drop``: header names
    of the columns to leave out, first to last, while the table is wider than that; ``wrap``: header
    names of the columns whose cells may wrap (the others keep each cell on one line while a wrapping
    column can still give way)."""
    rows = [list(r) for r in rows]
    left_out: list[str] = []
    if not fit.wide:
        for name in drop:
            if natural_width(rows) <= fit.width:
                break
            if name in rows[0]:
                rows = _without(rows, rows[0].index(name))
                left_out.append(name)
    widths = _widths(rows, None if fit.wide else fit.width, wrap)
    # a narrow terminal: every column wraps at its words, and at the last words are cut (folded)
    for words in (True, False):
        if fit.wide or sum(widths) + GAP * (len(widths) - 1) <= fit.width:
            break
        widths = _widths(rows, fit.width, rows[0], words)
    text = _rich(rows, widths)
    if left_out:
        note = f"(left out to fit {fit.width} columns: {', '.join(left_out)}; --wide shows them)"
        text += "\n" + paragraph(note, fit)
    return text


def _widths(
    rows: Sequence[Sequence[str]], width: int | None, wrap: Collection[str], words: bool = True
) -> list[int]:
    """Each column's width: its widest cell, the wrapping columns narrowed (the widest first, never below
    their longest word, or with ``words`` False below 4 characters) until the table fits ``width`` (None:
    no limit)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def narrowest(i: int) -> int:
        if rows[0][i] not in wrap:
            return widths[i]
        if not words:
            return min(4, widths[i])
        return max(len(word) for r in rows for word in r[i].split() or [""])

    least = [narrowest(i) for i in range(len(widths))]
    excess = sum(widths) + GAP * (len(widths) - 1) - (width or 0) if width else 0
    while excess > 0:
        give = [i for i in range(len(widths)) if widths[i] > least[i]]
        if not give:
            break  # even at their narrowest the columns do not fit: rich folds the widest
        widths[max(give, key=lambda i: widths[i])] -= 1
        excess -= 1
    return widths


def _rich(rows: Sequence[Sequence[str]], widths: Sequence[int]) -> str:
    from rich.box import Box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # no frame, a line of dashes under the header, two spaces between columns
    head_rule = Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
    t = Table(box=head_rule, show_edge=False, pad_edge=False, padding=(0, GAP - 1, 0, 0), header_style="")
    for name, w in zip(rows[0], widths, strict=True):
        t.add_column(Text(name), width=w, overflow="fold")
    for r in rows[1:]:
        t.add_row(*(Text(c) for c in r))
    out = io.StringIO()
    width = sum(widths) + GAP * (len(widths) - 1)
    console = Console(
        file=out, width=width, color_system=None, highlight=False, markup=False, emoji=False, soft_wrap=False
    )
    console.print(t)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())


def paragraph(text: str, fit: Fit = Fit(), indent: str = "", hanging: str = "  ") -> str:
    """``text`` wrapped to ``fit.width``: its first line at ``indent``, the next ones further in by
    ``hanging``; words longer than a line (a path) are kept whole."""
    return textwrap.fill(
        text,
        width=max(fit.width, len(indent) + len(hanging) + 20),
        initial_indent=indent,
        subsequent_indent=indent + hanging,
        break_long_words=False,
        break_on_hyphens=False,
    )
