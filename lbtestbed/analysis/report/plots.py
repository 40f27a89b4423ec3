"""PNG plots of a run: cluster against simulation and theory, with axes, units and legends.

Every function takes the result objects (and the raw batch measurements where a time series is drawn),
writes one file and returns its path, or None when the plot does not apply to the policy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result
from lbtestbed.policies import Learned

COLORS = {"cluster": "tab:blue", "twin": "tab:green", "simulation": "tab:orange", "theory": "black"}
#: how each source is drawn, so that sources lying on one another stay apart: the cluster wide and solid
#: underneath, the twin dashed with hollow squares, the simulation dotted with triangles
STYLES: dict[str, dict[str, Any]] = {
    "cluster": {"linestyle": "-", "marker": "o", "lw": 2.6, "ms": 6, "alpha": 0.75},
    "twin": {"linestyle": "--", "marker": "s", "lw": 1.4, "ms": 6, "mfc": "none", "mew": 1.3},
    "simulation": {"linestyle": ":", "marker": "^", "lw": 1.8, "ms": 5},
}
#: sideways offsets (in units of the spacing of the x values) of the sources' points, so that equal
#: values do not hide one another's markers and intervals
OFFSETS = {"cluster": -0.08, "twin": 0.0, "simulation": 0.08}
#: the markers of a sweep's settings (beyond them its points are labelled in the plot)
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">")
#: values spanning at least this ratio get a log axis
DECADE_RATIO = 10.0


def style(source: str, lines: bool = True, markers: bool = True) -> dict[str, Any]:
    """Keyword arguments for matplotlib drawing ``source`` (colour, line style and width, marker)."""
    out: dict[str, Any] = {"color": COLORS.get(source, "gray"), **STYLES.get(source, {})}
    if not markers:
        out = {k: v for k, v in out.items() if k not in ("marker", "ms", "mfc", "mew")}
    if not lines:
        out["linestyle"] = "none"
    return out


def run_title(name: str, policy: str, dispatchers: int = 1) -> str:
    """What every plot's title says first: the run's name, the policy and, when several ran, how many
    dispatchers."""
    text = f"{name} · policy={policy}"
    return text if dispatchers == 1 else f"{text} · dispatchers={dispatchers}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or in CI
    import matplotlib.pyplot as plt

    return plt


def _title(fig: Any, run: str) -> None:
    fig.suptitle(run, fontsize=11, fontweight="bold")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # legends beside the axes included
    _pyplot().close(fig)
    return path


def _spans_decades(values: Sequence[float]) -> bool:
    """Positive values whose largest is at least DECADE_RATIO times the smallest: a log axis shows them."""
    v = [x for x in values if x is not None and np.isfinite(x)]
    return bool(v) and min(v) > 0 and max(v) >= DECADE_RATIO * min(v)


def _log_axis(axis: Any, low: float, high: float) -> None:
    """Ticks a reader can use on a log axis from ``low`` to ``high``: 1-2-5 steps written as plain numbers
    when it spans fewer than three decades (matplotlib would label one or two powers of ten), powers of
    ten otherwise."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    if high / low >= 1000.0:
        return
    ticks = [
        m * 10.0**e
        for e in range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
        for m in (1, 2, 5)
        if low <= m * 10.0**e <= high
    ]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(NullFormatter())


def _tail_arrays(tail: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    j = np.arange(len(tail))
    v = np.array([np.nan if e["value"] is None else e["value"] for e in tail], float)
    ci = np.array([e.get("ci95") or 0.0 for e in tail], float)
    return j, v, ci


def occupancy_tail(directory: Path, results: Sequence[Result], *, run: str) -> Path:
    """Fraction of each class's nodes holding at least j tasks, log scale, one panel per class: the
    measured sources with 95% intervals (each with its own marker and line, a little apart sideways), the
    theory as a dashed staircase that drops to the axis floor where it is zero (a log axis has no 0)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    names = list(results[0].metrics["occupancy_tail"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.6 * len(names), 5.4), squeeze=False)
    theory = next((r for r in results if r.source == "theory"), None)
    for ax, name in zip(axes[0], names, strict=True):
        drawn: list[float] = []  # every positive value and interval end drawn: the axis floor goes below
        last = 1
        for res in results:
            tail = (res.metrics["occupancy_tail"] or {}).get(name)
            if res.source == "theory" or not tail:
                continue
            j, v, ci = _tail_arrays(tail)
            keep = (j >= 1) & (v > 0)
            low = np.minimum(ci[keep], 0.9 * v[keep])  # a log axis cannot show an interval below 0
            x = j[keep] + OFFSETS.get(res.source, 0.0)
            ax.errorbar(
                x, v[keep], yerr=np.vstack([low, ci[keep]]), capsize=2, label=res.source, **style(res.source)
            )
            drawn += [*v[keep], *(v[keep] - low)]
            last = max(last, int(j[keep].max(initial=1)))
        tail = ((theory.metrics["occupancy_tail"] or {}).get(name) if theory is not None else None) or []
        j, v, _ = _tail_arrays(tail)
        zero = next((k for k in range(1, len(v)) if not v[k] > 0), len(v))  # the theory's first 0
        # the floor: a decade below what was measured (the theory's own values only when nothing was)
        base = [x for x in drawn if x > 0] or [x for x in v[1:zero] if x > 0]
        floor = 10.0 ** np.floor(np.log10(min(base) * 0.8)) if base else 1e-3
        if len(tail) > 1:
            regime = tail[0].get("regime")
            label = f"theory ({regime})" if regime else "theory"
            below = next((k for k in range(1, zero) if v[k] < floor), None)
            if below is None:
                # a staircase centred on each j, dropping to the floor at the theory's first zero
                edges = np.arange(0.5, zero + 1.0)
                ax.stairs(
                    [*v[1:zero], floor], edges, baseline=None, color="black", ls="--", lw=1.3, label=label
                )
                ax.plot(
                    [zero],
                    [floor],
                    "v",
                    color="black",
                    ms=8,
                    clip_on=False,
                    label=f"theory: 0 from j = {zero} on (drawn at the floor)",
                )
                last = max(last, zero)
            else:  # a tail fading below what was measured leaves through the floor
                edges = np.arange(0.5, below + 1.0)
                ax.stairs(v[1 : below + 1], edges, baseline=None, color="black", ls="--", lw=1.3, label=label)
                last = max(last, below)
        ax.set_yscale("log")
        ax.set_ylim(floor, 1.3)
        _log_axis(ax.yaxis, floor, 1.3)
        ax.set_xlim(0.5, last + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("j (tasks at a node)")
        ax.set_ylabel("fraction of nodes with ≥ j tasks")
        ax.set_title(f"occupancy tail, class {name}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        # under the panel: a legend inside would sit on some run's tail
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    _title(fig, run)
    return _save(fig, directory / "occupancy_tail.png")


def _batch_series(raw: RawRun, key: str) -> np.ndarray | None:
    if key not in raw.ratios:
        return None
    num, den = raw.ratios[key]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def over_time(
    directory: Path,
    warmup: float,
    duration: float,
    raws: dict[str, RawRun],
    theory: Result | None,
    batches: int | None = None,
    *,
    run: str,
) -> Path:
    """Utility per node batch by batch with its bounds (pools), or tasks in the system (queues);
    ``batches``: how many the window has (a run with faults keeps only some). The legend sits beside the
    plot, off the lines and the bounds."""
    plt = _pyplot()
    key = "utility" if all("utility" in r.ratios for r in raws.values()) else "tasks_in_system"
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    for source, raw in raws.items():
        y = _batch_series(raw, key)
        if y is None:
            continue
        B = len(y)
        if raw.batch_of:  # batches a fault disturbed are left out: a gap in the line
            B = batches or max(raw.batch_of) + 1
            full = np.full(B, np.nan)
            full[np.array(raw.batch_of)] = y
            y = full
        t = warmup + duration * (np.arange(B) + 0.5 + OFFSETS.get(source, 0.0)) / B
        ax.plot(t, y, label=f"{source} (batch means)", **style(source))
    bounds = (theory.extras.get("bounds") if theory is not None else None) or {}
    if key == "utility":
        if bounds.get("utility_upper") is not None:
            ax.axhline(bounds["utility_upper"], color="black", linestyle="--", label="upper bound u(q*)")
        if bounds.get("utility_poisson_jensen") is not None:
            ax.axhline(
                bounds["utility_poisson_jensen"],
                color="gray",
                linestyle="-.",
                label="Poisson-Jensen bound (finite n)",
            )
        ax.set_ylabel("utility per node")
        ax.set_title("utility over time against its bound", fontsize=10)
    else:
        value = theory.value("tasks_in_system") if theory is not None else None
        if value is not None:
            ax.axhline(value, color="black", linestyle="--", label="theory")
        ax.set_ylabel("tasks in the system")
        ax.set_title("tasks in the system over time", fontsize=10)
    ax.set_xlabel("model time (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: off the bound lines
    _title(fig, run)
    return _save(fig, directory / "over_time.png")


def learned(
    directory: Path,
    what: Learned,
    cluster_series: Sequence[tuple[float, float]],
    sim: RawRun | None,
    theory: Result | None,
    *,
    run: str,
) -> Path | None:
    """What the policy learns (``what``, a ``unit.Learned``) over model time: the cluster's sampled gauge, the
    simulator's path and the theory's value; ``<name>.png``."""
    if not cluster_series and (sim is None or not sim.r_series):
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    if cluster_series:
        t, r = zip(*cluster_series, strict=True)
        ax.step(t, r, where="post", label="cluster (sampled)", **style("cluster", markers=False))
    if sim is not None and sim.r_series:
        t, r = zip(*sim.r_series, strict=True)
        ax.step(t, r, where="post", label="simulation", **style("simulation", markers=False))
    value = theory.value(what.name) if theory is not None else None
    if value is not None:
        ax.axhline(value, color="black", linestyle="--", label="theory", zorder=1)  # beneath the paths
    ax.set_xlabel("model time (s)")
    ax.set_ylabel(f"{what.label} ({what.unit})")
    if what.unit == "index":
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{what.label} over time", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    _title(fig, run)
    return _save(fig, directory / f"{what.name}.png")


def messages(directory: Path, results: Sequence[Result], *, run: str) -> Path | None:
    """Messages per task by kind, one bar per source, with 95% intervals."""
    kinds = list(results[0].metrics["messages_per_task"].get("by_kind") or {})
    if not kinds:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(kinds) + 2), 4.2))
    shown = [r for r in results if r.metrics["messages_per_task"].get("by_kind")]
    width = 0.8 / max(len(shown), 1)
    x = np.arange(len(kinds))
    hatches = {"twin": "//", "simulation": ".."}
    for i, res in enumerate(shown):
        by_kind = res.metrics["messages_per_task"]["by_kind"]
        cis = res.metrics["messages_per_task"].get("by_kind_ci95") or {}
        v = [by_kind.get(k) or 0.0 for k in kinds]
        e = [cis.get(k) or 0.0 for k in kinds]
        ax.bar(
            x + i * width,
            v,
            width,
            yerr=e,
            capsize=3,
            color=COLORS.get(res.source),
            hatch=hatches.get(res.source),
            edgecolor="white",
            label=res.source,
        )
    ax.set_xticks(x + width * (len(shown) - 1) / 2, kinds)
    ax.set_xlabel("message kind")
    ax.set_ylabel("messages per task")
    ax.set_title("what the policy costs in messages", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: off the bars
    _title(fig, run)
    return _save(fig, directory / "messages.png")


def sojourn(
    directory: Path, samples: Mapping[str, Sequence[float]], theory: Result | None, *, run: str
) -> Path | None:
    """Complementary distribution of the sojourn time (model seconds), log scale, with the theory's p50 and
    p99 where it has them (none in the legend where it has none)."""
    if not any(len(s) for s in samples.values()):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    for i, (source, s) in enumerate(samples.items()):
        if not len(s):
            continue
        x = np.sort(np.asarray(s, float))
        p = 1.0 - np.arange(1, len(x) + 1) / len(x)  # P(S > x) just after each sorted sample
        # markers every half decade of P, each source at its own phase: curves lying on one another still
        # show one marker of each source
        levels = 10.0 ** -(np.arange(0.25 + i / 6, np.log10(len(x)), 0.5))
        marks = sorted({min(len(x) - 1, int((1.0 - q) * len(x))) for q in levels})
        ax.step(x, p, where="post", markevery=marks, label=f"{source} ({len(x)} tasks)", **style(source))
    for q, key, marker in ((0.5, "sojourn_p50", "x"), (0.01, "sojourn_p99", "+")):
        v = theory.value(key) if theory is not None else None
        if v is not None:
            regime = theory.metrics[key].get("regime") if theory is not None else None
            what = f" ({regime})" if regime else ""
            ax.plot(
                [v],
                [q],
                marker,
                color="black",
                ms=10,
                mew=2,
                linestyle="none",
                label=f"theory {key[-3:]}{what}",
            )
    ax.set_yscale("log")
    ax.set_xlabel("sojourn time (model s)")
    ax.set_ylabel("P(sojourn > x)")
    ax.set_title("sojourn time distribution", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    _title(fig, run)
    return _save(fig, directory / "sojourn.png")


def sweep_title(points: Sequence[tuple[dict[str, str], Result]], policy_key: str) -> str:
    """A sweep's plots' title: the spec's name, the policies in the order swept, the dispatchers when more
    than one ran somewhere, and the source of the values."""
    results = [r for _, r in points]
    names = list(dict.fromkeys(r.name for r in results))
    policies = list(dict.fromkeys(s.get(policy_key, r.policy) for s, r in points))
    ks = list(dict.fromkeys((r.context.get("settings") or {}).get("dispatchers", 1) for r in results))
    text = f"{' / '.join(names)} · policy={', '.join(policies)}"
    if any(k != 1 for k in ks):
        text += f" · dispatchers={','.join(str(k) for k in ks)}"
    return f"{text} ({results[0].source})"


def _groups(
    points: Sequence[tuple[dict[str, str], Result]], policy_key: str
) -> dict[str, list[tuple[dict[str, str], Result]]]:
    groups: dict[str, list[tuple[dict[str, str], Result]]] = {}
    for settings, result in points:
        groups.setdefault(settings.get(policy_key, result.policy), []).append((settings, result))
    return groups


def _curves(
    points: Sequence[tuple[dict[str, str], Result]], key: str, policy_key: str
) -> dict[str, list[tuple[dict[str, str], Result]]]:
    """One curve per combination of the settings swept other than ``key`` (two variants of one policy,
    `--set 'policy={name="least_request"},{name="least_request",weights="speed"}'`, are two curves),
    named by those settings, or by the policy when nothing else is swept."""
    curves: dict[str, list[tuple[dict[str, str], Result]]] = {}
    for settings, result in points:
        others = [v for k, v in settings.items() if k != key]
        name = ", ".join(others) if others else settings.get(policy_key, result.policy)
        curves.setdefault(name, []).append((settings, result))
    return curves


#: how far apart sideways the trade-off plot draws its points at most, a share of the x range
SPREAD = 0.06


#: the y axis of a panel of tradeoff.png
TRADEOFF_Y = {
    "utility": "utility per node",
    "mean_sojourn": "mean sojourn (model s)",
    "sojourn_p50": "median sojourn (model s)",
    "sojourn_p99": "99th percentile of the sojourn (model s)",
}


def _tradeoff_axes(ax: Any, y_key: str, ys: Sequence[float], alone: bool) -> None:
    """A tradeoff panel's scales, labels and title (a log y axis when its values span a decade or more)."""
    if _spans_decades(ys):
        ax.set_yscale("log")
        _log_axis(ax.yaxis, min(ys) / 1.3, max(ys) * 1.3)
    ax.set_xlabel(
        f"state messages per task (points drawn up to {100 * SPREAD:g}% of the range apart)", fontsize=8
    )
    ax.set_ylabel(TRADEOFF_Y[y_key])
    title = "what each policy buys with its messages" if alone else TRADEOFF_Y[y_key].partition(" (")[0]
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def tradeoff(
    directory: Path,
    points: Sequence[tuple[dict[str, str], Result]],
    policy_key: str,
    label: Callable[[dict[str, str]], str],
) -> Path:
    """Messages per task against what they buy: utility for pools; for queues one panel each for the mean,
    the median and the 99th percentile of the sojourn (those the points have). One point per policy and
    setting, with 95% intervals both ways. The colour is the policy, the marker the other settings (both
    in the legend, so no label overprints another); a log y axis when a panel's values span a decade or
    more. Points without a value are left out."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    pools = all(r.metrics["utility"].get("value") is not None for _, r in points)
    y_keys = ["utility"] if pools else ["mean_sojourn"]
    if not pools:
        y_keys += [
            k
            for k in ("sojourn_p50", "sojourn_p99")
            if any((r.metrics.get(k) or {}).get("value") is not None for _, r in points)
        ]
    others = [k for k in points[0][0] if k != policy_key]
    combos = list(dict.fromkeys(label({k: s[k] for k in others}) for s, _ in points)) if others else []
    marker_of = {c: MARKERS[i] for i, c in enumerate(combos)} if len(combos) <= len(MARKERS) else {}
    fig, axes = plt.subplots(1, len(y_keys), figsize=(5.0 + 4.5 * len(y_keys), 5.2), squeeze=False)
    groups = _groups(points, policy_key)
    x_all = [r.metrics["messages_per_task"]["value"] or 0.0 for _, r in points]
    span = (max(x_all) - min(x_all)) or 1.0
    # every point (policy and setting) a little apart sideways, within SPREAD of the x range: equal message
    # counts (0 for every policy that sends none; JIQ's one token per task at two loads) with equal values
    # do not put one point on another
    slots = max(1, len(_groups(points, policy_key)) * max(1, len(combos)))
    step = min(0.01, SPREAD / max(1, slots - 1)) * span
    policy_handles = []
    for ax, y_key in zip(axes[0], y_keys, strict=True):
        ys_all: list[float] = []
        for i, (policy, members) in enumerate(groups.items()):
            color = f"C{i % 10}"
            shown = [
                (s, r)
                for s, r in members
                if r.metrics["messages_per_task"]["value"] is not None
                and (r.metrics.get(y_key) or {}).get("value") is not None
            ]
            if not shown:
                continue

            def shift(s: dict[str, str], i: int = i) -> float:
                j = combos.index(label({o: s[o] for o in others})) if others else 0
                return (i * max(1, len(combos)) + j - (slots - 1) / 2) * step

            xs = [r.metrics["messages_per_task"]["value"] + shift(s) for s, r in shown]
            ys = [r.metrics[y_key]["value"] for _, r in shown]
            xe = [r.metrics["messages_per_task"].get("ci95") or 0.0 for _, r in shown]
            ye = [r.metrics[y_key].get("ci95") or 0.0 for _, r in shown]
            ys_all += ys
            ax.plot(xs, ys, color=color, lw=1, alpha=0.6)
            if y_key == y_keys[0]:
                policy_handles.append(Line2D([], [], color=color, marker="o", label=policy))
            for k, ((s, _), x, y) in enumerate(zip(shown, xs, ys, strict=True)):
                combo = label({o: s[o] for o in others}) if others else ""
                ax.errorbar(
                    [x],
                    [y],
                    xerr=[xe[k]],
                    yerr=[ye[k]],
                    color=color,
                    marker=marker_of.get(combo, "o"),
                    ms=7,
                    capsize=2,
                    linestyle="none",
                )
                if combo and not marker_of:  # too many settings for markers: labels, alternately placed
                    dx, dy = ((6, 6), (6, -12), (-6, 6), (-6, -12))[k % 4]
                    ha = "left" if dx > 0 else "right"
                    ax.annotate(combo, (x, y), fontsize=7, xytext=(dx, dy), textcoords="offset points", ha=ha)
        _tradeoff_axes(ax, y_key, ys_all, alone=len(y_keys) == 1)
    # one legend (matplotlib lays out one beside the axes): the policies' colours, then the settings'
    # markers
    setting_handles = [
        Line2D([], [], color="gray", marker=m, linestyle="none", label=c) for c, m in marker_of.items()
    ]
    axes[0][-1].legend(
        handles=policy_handles + setting_handles,
        title="colour: policy, marker: setting" if setting_handles else "policy",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        title_fontsize=8,
    )
    _title(fig, sweep_title(points, policy_key))
    return _save(fig, directory / "tradeoff.png")


def against(
    directory: Path,
    points: Sequence[tuple[dict[str, str], Result]],
    key: str,
    policy_key: str,
) -> Path | None:
    """Mean sojourn (utility for pools) against the numeric setting ``key`` (the number of dispatchers, a
    load), one line per policy with its own marker and line style (a little apart sideways, so that equal
    curves both show), with 95% intervals; a log y axis when the values span a decade or more. None when
    ``key``'s values are not all numbers."""
    try:
        xs_all = [float(s[key]) for s, _ in points]
    except (KeyError, ValueError):
        return None
    plt = _pyplot()
    pools = all(r.metrics["utility"].get("value") is not None for _, r in points)
    y_key = "utility" if pools else "mean_sojourn"
    log_x = key == "policy.dispatchers"
    levels = sorted(set(xs_all))
    step = min((b - a for a, b in itertools.pairwise(levels)), default=1.0)
    fig, ax = plt.subplots(figsize=(9.5, 5.2))
    groups = _curves(points, key, policy_key)
    ys_all: list[float] = []
    lines = ("-", "--", ":", "-.")
    for i, (policy, members) in enumerate(groups.items()):
        shift = (i - (len(groups) - 1) / 2) * 0.06  # in units of the spacing of the x values
        shown = sorted(
            ((float(s[key]), r) for s, r in members if r.metrics[y_key]["value"] is not None),
            key=lambda p: p[0],
        )
        if shown:
            xs = [x * 2.0**shift if log_x else x + shift * step for x, _ in shown]
            ys = [r.metrics[y_key]["value"] for _, r in shown]
            ye = [r.metrics[y_key].get("ci95") or 0.0 for _, r in shown]
            ys_all += ys
            ax.errorbar(
                xs,
                ys,
                yerr=ye,
                marker=MARKERS[i % len(MARKERS)],
                linestyle=lines[i % len(lines)],
                capsize=2,
                label=policy,
                color=f"C{i % 10}",
            )
    if log_x:
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [f"{x:g}" for x in levels])
    if _spans_decades(ys_all):
        ax.set_yscale("log")
        _log_axis(ax.yaxis, min(ys_all) / 1.3, max(ys_all) * 1.3)
    ax.set_xlabel(f"{key} (policies drawn a little apart)")
    ax.set_ylabel("utility per node" if pools else "mean sojourn (model s)")
    ax.set_title(f"{y_key.replace('_', ' ')} against {key}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="policy", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _title(fig, sweep_title(points, policy_key))
    return _save(fig, directory / f"against_{key.replace('.', '_')}.png")


#: the fault windows of faults.png: grey, each its own hatching
BAND_GREY, BAND_EDGE = (0.5, 0.5, 0.5, 0.12), (0.45, 0.45, 0.45, 0.6)
HATCHES = ("//", "\\\\", "xx", "..", "++", "--")


def _outages(ax: Any, outages: Sequence[Mapping[str, Any]], end: float) -> None:
    """Each observed outage as a hatched band along the bottom of the plot: from the first check that found
    its process out to the first that found it serving again (the end of the run if it never did); an
    unplanned one in red."""
    for o in outages:
        planned = o.get("fault") is not None
        stop = o["end"] if o.get("end") is not None else end
        what = f"fault {o['fault']}" if planned else "unplanned"
        ax.axvspan(
            o["start"], stop, ymin=0.0, ymax=0.06, facecolor="none", hatch="///",
            edgecolor="tab:gray" if planned else "tab:red",
            label=f"{o['process']} observed out ({what}: {o['cause']})",
        )  # fmt: skip


def fault_timeline(
    directory: Path,
    end: float,
    completed: Sequence[tuple[float, int]],
    failures: Sequence[tuple[float, str, int]],
    actions: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    *,
    run: str,
    outages: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Tasks per model second by intended arrival time: completed (all, and at each faulty process's
    nodes) and not completed, with the fault windows shaded as scheduled, the processes' observed outages
    (``outages``: planned or not, experiment.watch) hatched beneath, and the dispatchers' down/up
    marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    edges = np.linspace(0.0, end, 121)
    width = edges[1] - edges[0]

    def rate(times: Sequence[float]) -> np.ndarray:
        return np.histogram(np.asarray(times, float), bins=edges)[0] / width

    mid = (edges[:-1] + edges[1:]) / 2
    ax.plot(mid, rate([t for t, _ in completed]), color="tab:blue", label="completed (all nodes)")
    windows: dict[int, dict[str, Any]] = {}
    for a in actions:
        w = windows.setdefault(int(a["fault"]), {"kind": a["kind"], "nodes": a.get("nodes") or []})
        w[a["action"]] = float(a["model_time"])
    # the fault windows grey, told apart by their hatching, so that no band has the colour of a line (a
    # band coloured as its nodes' line read as part of it); the nodes' lines in colours of their own
    colors = iter(["tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink", "tab:orange"])
    for i, w in sorted(windows.items()):
        nodes = set(w["nodes"])
        where = f" (nodes {min(nodes)}-{max(nodes)})" if nodes else ""
        ax.axvspan(
            w.get("start", 0.0),
            w.get("end", end),
            facecolor=BAND_GREY,
            edgecolor=BAND_EDGE,
            hatch=HATCHES[i % len(HATCHES)],
            lw=0.0,
            label=f"fault {i}: {w['kind']}{where}",
        )
        if nodes:
            ax.plot(
                mid,
                rate([t for t, k in completed if k in nodes]),
                color=next(colors, "tab:olive"),
                label=f"completed at nodes {min(nodes)}-{max(nodes)} (fault {i})",
            )
    _outages(ax, outages, end)
    bad = [t for t, _, _ in failures]
    if bad:
        ax.plot(mid, rate(bad), color="tab:red", label="lost, refused or failed")
    for e in events:
        style = {"down": ("tab:red", "--"), "up": ("tab:green", ":")}.get(str(e.get("to")), ("black", "-"))
        ax.axvline(float(e["model_time"]), color=style[0], linestyle=style[1], lw=1)
    ax.plot([], [], color="tab:red", linestyle="--", lw=1, label="marked down")
    ax.plot([], [], color="tab:green", linestyle=":", lw=1, label="back up")
    ax.set_xlabel("model time of arrival (s)")
    ax.set_ylabel("tasks per model second")
    ax.set_title("faults: routing and outcomes over time", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: the lines fill the box
    _title(fig, run)
    return _save(fig, directory / "faults.png")
