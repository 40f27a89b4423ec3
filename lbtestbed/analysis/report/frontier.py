"""``frontier.png``: messages per task against delay, one curve per policy knob, the theory beside the
measurements and the frontier (for each message budget, the best measured point) as a staircase.

A row of panels per source (the simulation, and the cluster when it ran), a column per delay (mean wait,
99th percentile of the sojourn). The x axis is symmetric-log, linear near 0 so that policies sending no
messages sit at 0 beside those sending tens; the y axis is logarithmic when the values span a decade.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lbtestbed.analysis.comparison.frontier import Measured, Step
from lbtestbed.analysis.report.plots import _log_axis, _pyplot, _save, _spans_decades, _title

#: a marker per curve; not "v", which marks a theory value of 0 at the axis floor
MARKERS = ("o", "s", "^", "D", "P", "X", "*", "h", "<", ">", "p", "d")


@dataclass(frozen=True)
class FrontierPanel:
    """One panel: a source's points for one delay, the theory's for the same, and the frontier's steps."""

    source: str  # "simulation" or "cluster"
    ylabel: str  # "mean wait (model s)"
    measured: Sequence[Measured]
    theory: Sequence[Measured]
    steps: Sequence[Step]
    #: the cluster's row: the simulation of each run's own tasks and window, without the cluster's delays
    same_tasks: Sequence[Measured] = ()


def _colors(curves: Sequence[str]) -> dict[str, Any]:
    """A colour per curve: matplotlib's ten but its grey (the legend's grey says what a line style
    means), then tab20's lighter ones."""
    light = _pyplot().get_cmap("tab20")
    palette: list[Any] = [f"C{i}" for i in range(10) if i != 7]
    palette += [light(2 * i + 1) for i in range(10) if i != 7]
    return {c: palette[i % len(palette)] for i, c in enumerate(curves)}


def _x_axis(ax: Any, xs: Sequence[float]) -> float:
    """A symmetric-log x axis, linear below the smallest positive value's decade, ticks at 0 and 1-2-5
    (or powers of ten over many decades); the right end of the axis."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    positive = [x for x in xs if x > 0]
    low = 10.0 ** np.floor(np.log10(min(positive))) if positive else 1.0
    high = max(positive, default=1.0) * 1.6
    ax.set_xscale("symlog", linthresh=low, linscale=0.5)
    ax.set_xlim(-0.4 * low, high)
    decades = range(int(np.log10(low)), int(np.ceil(np.log10(high))) + 1)
    steps = (1, 2, 5) if len(decades) <= 4 else (1,)
    ticks = [0.0, *(m * 10.0**e for e in decades for m in steps if low <= m * 10.0**e <= high)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    return high


def _by_curve(points: Sequence[Measured]) -> dict[str, list[Measured]]:
    out: dict[str, list[Measured]] = {}
    for m in points:
        out.setdefault(m.curve, []).append(m)
    return {c: sorted(ms, key=lambda m: m.messages) for c, ms in out.items()}


def _draw_panel(ax: Any, panel: FrontierPanel, colors: dict[str, Any], markers: dict[str, str]) -> bool:
    """The panel's points, theory and frontier; whether a theory value of 0 was drawn at the floor."""
    values = [m.value for m in (*panel.measured, *panel.same_tasks)]
    values += [m.value for m in panel.theory if m.value > 0]
    log = _spans_decades(values)
    lows = [m.value - (m.ci95 or 0.0) for m in panel.measured]
    floor = min([v for v in (*lows, *values) if v > 0], default=1.0) / 1.6
    right = _x_axis(ax, [m.messages for m in (*panel.measured, *panel.theory)])
    for curve, ms in _by_curve(panel.measured).items():
        x = [m.messages for m in ms]
        y = np.array([m.value for m in ms])
        ci = np.array([m.ci95 or 0.0 for m in ms])
        low = np.minimum(ci, 0.9 * y) if log else ci  # a log axis cannot show an interval below 0
        ax.errorbar(
            x,
            y,
            yerr=np.vstack([low, ci]),
            xerr=[m.messages_ci95 or 0.0 for m in ms],
            color=colors[curve],
            marker=markers[curve],
            ms=6,
            lw=1.4,
            capsize=2,
            zorder=3,
        )
        for m in ms:
            if m.knob:
                ax.annotate(
                    m.knob,
                    (m.messages, m.value),
                    xytext=(4, 3),
                    textcoords="offset points",
                    fontsize=6.5,
                    color=colors[curve],
                )
    for curve, ms in _by_curve(panel.same_tasks).items():
        ms = [m for m in ms if m.value > 0 or not log]
        ax.plot(
            [m.messages for m in ms],
            [m.value for m in ms],
            ls=":",
            lw=1.2,
            color=colors.get(curve, "gray"),
            marker="x",
            ms=6,
            zorder=2,
        )
    zero_drawn = False
    for curve, ms in _by_curve(panel.theory).items():
        ax.plot(
            [m.messages for m in ms],
            [m.value if (m.value > 0 or not log) else floor for m in ms],
            ls="--",
            lw=1.1,
            color=colors.get(curve, "gray"),
            marker=markers.get(curve, "o"),
            mfc="none",
            ms=9,
            mew=1.3,
            zorder=4,  # hollow, over the measured points: both show where they agree
        )
        at_floor = [(m.messages, floor) for m in ms if log and m.value <= 0]
        if at_floor:
            zero_drawn = True
            ax.plot(*zip(*at_floor, strict=True), "v", color=colors.get(curve, "gray"), ms=8, clip_on=False)
    _draw_steps(ax, panel.steps, right, colors)
    if log:
        ax.set_yscale("log")
        top = max([m.value + (m.ci95 or 0.0) for m in panel.measured] + values, default=1.0)
        ax.set_ylim(floor, top * 1.3)
        _log_axis(ax.yaxis, floor, top * 1.3)
    ax.grid(True, which="both", alpha=0.3)
    return zero_drawn


def _draw_steps(ax: Any, steps: Sequence[Step], right: float, colors: dict[str, Any]) -> None:
    """The frontier as a staircase under the points, each step's winner named at its start."""
    if not steps:
        return
    xs, ys = [], []
    for s in steps:
        end = s.end if s.end is not None else right
        xs += [s.start, end]
        ys += [s.winner.value, s.winner.value]
    ax.plot(xs, ys, color="black", lw=3.2, alpha=0.35, solid_capstyle="butt", zorder=1)
    for k, s in enumerate(steps):
        ax.annotate(
            s.winner.name,
            (s.start, s.winner.value),
            xytext=(3, -12 if k % 2 == 0 else 9),
            textcoords="offset points",
            fontsize=7.5,
            fontweight="bold",
            color=colors.get(s.winner.curve, "black"),
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
            zorder=4,
        )


def frontier(path: Path, title: str, panels: Sequence[Sequence[FrontierPanel]], *, replications: int) -> Path:
    """Write the plot: ``panels`` is a row per source, a panel per delay; one legend beside the top row
    names every curve (colour and marker) and what the line styles mean."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    flat = [p for row in panels for p in row]
    curves = list(dict.fromkeys(m.curve for p in flat for m in (*p.measured, *p.theory)))
    colors = _colors(curves)
    markers = {c: MARKERS[i % len(MARKERS)] for i, c in enumerate(curves)}
    rows, cols = len(panels), max(len(r) for r in panels)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols + 3.0, 4.9 * rows), squeeze=False)
    zero = False
    for r, row in enumerate(panels):
        for c, panel in enumerate(row):
            ax = axes[r][c]
            zero = _draw_panel(ax, panel, colors, markers) or zero
            what = panel.ylabel.partition(" (")[0]
            ax.set_title(f"{_source_name(panel.source, replications)}: {what}", fontsize=10)
            ax.set_ylabel(panel.ylabel)
            ax.set_xlabel("state messages per task (symmetric log scale)")
    knobs = {
        c: sorted(
            {m.knob.partition("=")[2] for p in flat for m in p.measured if m.curve == c} - {""}, key=float
        )
        for c in curves
    }
    handles = [
        Line2D(
            [],
            [],
            color=colors[c],
            marker=markers[c],
            label=f"{c}" + (f" ({', '.join(knobs[c])})" if knobs[c] else ""),
        )
        for c in curves
    ]
    handles += [
        Line2D([], [], color="gray", marker="o", label="measured, with 95 % intervals"),
        Line2D([], [], color="gray", ls="--", marker="o", mfc="none", label="theory (lbt predict)"),
        Line2D(
            [],
            [],
            color="black",
            lw=3.2,
            alpha=0.35,
            label="frontier: the best measured point\nat or below each message budget",
        ),
    ]
    if any(p.same_tasks for p in flat):
        handles.append(
            Line2D(
                [],
                [],
                color="gray",
                ls=":",
                marker="x",
                label="simulation of the cluster's own tasks\n(its window, no delays)",
            )
        )
    if zero:
        handles.append(
            Line2D([], [], color="gray", marker="v", ls="none", label="theory: 0 (drawn at the floor)")
        )
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    _title(fig, title)
    return _save(fig, path)


def _source_name(source: str, replications: int) -> str:
    if source == "simulation":
        return f"simulation ({replications} replications)" if replications > 1 else "simulation (batch means)"
    return "cluster (batch means)" if source == "cluster" else source
