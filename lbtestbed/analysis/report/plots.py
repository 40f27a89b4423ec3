"""PNG plots of a run: cluster against simulation and theory, with axes, units and legends.

Every function takes the result objects (and the raw batch measurements where a time series is drawn),
writes one file and returns its path, or None when the plot does not apply to the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result

COLORS = {"cluster": "tab:blue", "twin": "tab:green", "simulation": "tab:orange", "theory": "black"}
#: the twin lies on the cluster where the emulation is faithful: dashed, so that both show
LINES = {"twin": "--"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or in CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def occupancy_tail(directory: Path, results: Sequence[Result]) -> Path:
    """Fraction of each class's nodes holding at least j tasks, log scale, one panel per class."""
    plt = _pyplot()
    names = list(results[0].metrics["occupancy_tail"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for res in results:
            tail = (res.metrics["occupancy_tail"] or {}).get(name)
            if not tail:
                continue
            j = np.arange(len(tail))
            v = np.array([np.nan if e["value"] is None else e["value"] for e in tail], float)
            ci = np.array([e.get("ci95") or 0.0 for e in tail], float)
            keep = (j >= 1) & (v > 0)
            style = {"color": COLORS.get(res.source, "gray"), "label": res.source}
            if res.source == "theory":
                ax.step(j[keep], v[keep], where="mid", linestyle="--", **style)
            else:
                low = np.minimum(ci[keep], 0.9 * v[keep])  # a log axis cannot show an interval below 0
                yerr = np.vstack([low, ci[keep]])
                line = LINES.get(res.source, "-")
                ax.errorbar(j[keep], v[keep], yerr=yerr, marker="o", ms=3, capsize=2, linestyle=line, **style)
        ax.set_yscale("log")
        ax.set_xlabel("j (tasks at a node)")
        ax.set_ylabel("fraction of nodes with ≥ j tasks")
        ax.set_title(f"occupancy tail, class {name}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
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
) -> Path:
    """Utility per node batch by batch with its bounds (pools), or tasks in the system (queues);
    ``batches``: how many the window has (a run with faults keeps only some)."""
    plt = _pyplot()
    key = "utility" if all("utility" in r.ratios for r in raws.values()) else "tasks_in_system"
    fig, ax = plt.subplots(figsize=(7.5, 4))
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
        t = warmup + duration * (np.arange(B) + 0.5) / B
        ax.plot(t, y, marker="o", ms=3, color=COLORS.get(source), label=f"{source} (batch means)")
    bounds = (theory.extras.get("bounds") if theory is not None else None) or {}
    if key == "utility":
        if bounds.get("utility_upper") is not None:
            ax.axhline(bounds["utility_upper"], color="black", linestyle="--", label="upper bound u(q*)")
        if bounds.get("utility_poisson_jensen") is not None:
            ax.axhline(
                bounds["utility_poisson_jensen"],
                color="gray",
                linestyle=":",
                label="Poisson-Jensen bound (finite n)",
            )
        ax.set_ylabel("utility per node")
        ax.set_title("utility over time against its bound")
    else:
        value = theory.value("tasks_in_system") if theory is not None else None
        if value is not None:
            ax.axhline(value, color="black", linestyle="--", label="theory")
        ax.set_ylabel("tasks in the system")
        ax.set_title("tasks in the system over time")
    ax.set_xlabel("model time (s)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, directory / "over_time.png")


def slta_r(
    directory: Path, cluster_series: Sequence[tuple[float, float]], sim: RawRun | None, theory: Result | None
) -> Path | None:
    """SLTA's learned index r over model time: the cluster's sampled gauge and the simulator's path."""
    if not cluster_series and (sim is None or not sim.r_series):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    if cluster_series:
        t, r = zip(*cluster_series, strict=True)
        ax.step(t, r, where="post", color=COLORS["cluster"], label="cluster (sampled)")
    if sim is not None and sim.r_series:
        t, r = zip(*sim.r_series, strict=True)
        ax.step(t, r, where="post", color=COLORS["simulation"], label="simulation")
    r_star = theory.value("slta_r") if theory is not None else None
    if r_star is not None:
        ax.axhline(r_star, color="black", linestyle="--", label="r* (theory)")
    ax.set_xlabel("model time (s)")
    ax.set_ylabel("r (learned threshold index)")
    ax.set_title("SLTA's r over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, directory / "slta_r.png")


def messages(directory: Path, results: Sequence[Result]) -> Path | None:
    """Messages per task by kind, one bar per source, with 95% intervals."""
    kinds = list(results[0].metrics["messages_per_task"].get("by_kind") or {})
    if not kinds:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(kinds) + 2), 4))
    shown = [r for r in results if r.metrics["messages_per_task"].get("by_kind")]
    width = 0.8 / max(len(shown), 1)
    x = np.arange(len(kinds))
    for i, res in enumerate(shown):
        by_kind = res.metrics["messages_per_task"]["by_kind"]
        cis = res.metrics["messages_per_task"].get("by_kind_ci95") or {}
        v = [by_kind.get(k) or 0.0 for k in kinds]
        e = [cis.get(k) or 0.0 for k in kinds]
        ax.bar(x + i * width, v, width, yerr=e, capsize=3, color=COLORS.get(res.source), label=res.source)
    ax.set_xticks(x + width * (len(shown) - 1) / 2, kinds)
    ax.set_xlabel("message kind")
    ax.set_ylabel("messages per task")
    ax.set_title("what the policy costs in messages")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, directory / "messages.png")


def sojourn(directory: Path, samples: Mapping[str, Sequence[float]], theory: Result | None) -> Path | None:
    """Complementary distribution of the sojourn time (model seconds), log scale."""
    if not any(len(s) for s in samples.values()):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for source, s in samples.items():
        if not len(s):
            continue
        x = np.sort(np.asarray(s, float))
        p = 1.0 - np.arange(1, len(x) + 1) / len(x)  # P(S > x) just after each sorted sample
        ax.step(
            x,
            p,
            where="post",
            color=COLORS.get(source),
            linestyle=LINES.get(source, "-"),
            label=f"{source} ({len(x)} tasks)",
        )
    if theory is not None:
        for q, key in ((0.5, "sojourn_p50"), (0.01, "sojourn_p99")):
            v = theory.value(key)
            if v is not None:
                ax.plot([v], [q], "kx", ms=8)
        ax.plot([], [], "kx", label="theory p50 / p99")
    ax.set_yscale("log")
    ax.set_xlabel("sojourn time (model s)")
    ax.set_ylabel("P(sojourn > x)")
    ax.set_title("sojourn time distribution")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, directory / "sojourn.png")


def tradeoff(
    directory: Path,
    points: Sequence[tuple[dict[str, str], Result]],
    policy_key: str,
    label: Callable[[dict[str, str]], str],
) -> Path:
    """Messages per task against mean sojourn (utility for pools): one point per policy and setting, with
    95% intervals both ways, labelled with the other settings. Points without a value are left out."""
    plt = _pyplot()
    pools = all(r.metrics["utility"].get("value") is not None for _, r in points)
    y_key = "utility" if pools else "mean_sojourn"
    others = [k for k in points[0][0] if k != policy_key]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    groups: dict[str, list[tuple[dict[str, str], Result]]] = {}
    for settings, result in points:
        groups.setdefault(settings.get(policy_key, result.policy), []).append((settings, result))
    for policy, members in groups.items():
        shown = [
            (s, r)
            for s, r in members
            if r.metrics["messages_per_task"]["value"] is not None and r.metrics[y_key]["value"] is not None
        ]
        if not shown:
            continue
        xs = [r.metrics["messages_per_task"]["value"] for _, r in shown]
        ys = [r.metrics[y_key]["value"] for _, r in shown]
        xe = [r.metrics["messages_per_task"].get("ci95") or 0.0 for _, r in shown]
        ye = [r.metrics[y_key].get("ci95") or 0.0 for _, r in shown]
        ax.errorbar(xs, ys, xerr=xe, yerr=ye, marker="o", linestyle="-", capsize=2, label=policy)
        for (s, _), x, y in zip(shown, xs, ys, strict=True):
            if others:
                text = label({k: s[k] for k in others})
                ax.annotate(text, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("state messages per task")
    ax.set_ylabel("utility per node" if pools else "mean sojourn (model s)")
    ax.set_title(f"what each policy buys with its messages ({points[0][1].source})")
    ax.grid(True, alpha=0.3)
    ax.legend(title="policy")
    return _save(fig, directory / "tradeoff.png")


def against(
    directory: Path,
    points: Sequence[tuple[dict[str, str], Result]],
    key: str,
    policy_key: str,
) -> Path | None:
    """Mean sojourn (utility for pools) against the numeric setting ``key`` (the number of dispatchers, a
    load), one line per policy, with 95% intervals; None when ``key``'s values are not all numbers."""
    try:
        xs_all = [float(s[key]) for s, _ in points]
    except (KeyError, ValueError):
        return None
    plt = _pyplot()
    pools = all(r.metrics["utility"].get("value") is not None for _, r in points)
    y_key = "utility" if pools else "mean_sojourn"
    fig, ax = plt.subplots(figsize=(7.5, 5))
    groups: dict[str, list[tuple[float, Result]]] = {}
    for (settings, result), x in zip(points, xs_all, strict=True):
        groups.setdefault(settings.get(policy_key, result.policy), []).append((x, result))
    for policy, members in groups.items():
        shown = sorted((x, r) for x, r in members if r.metrics[y_key]["value"] is not None)
        if shown:
            ys = [r.metrics[y_key]["value"] for _, r in shown]
            ye = [r.metrics[y_key].get("ci95") or 0.0 for _, r in shown]
            ax.errorbar([x for x, _ in shown], ys, yerr=ye, marker="o", capsize=2, label=policy)
    if key == "policy.dispatchers":
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(xs_all)), [f"{x:g}" for x in sorted(set(xs_all))])
    ax.set_xlabel(key)
    ax.set_ylabel("utility per node" if pools else "mean sojourn (model s)")
    ax.set_title(f"{y_key.replace('_', ' ')} against {key} ({points[0][1].source})")
    ax.grid(True, alpha=0.3)
    ax.legend(title="policy")
    return _save(fig, directory / f"against_{key.replace('.', '_')}.png")


def fault_timeline(
    directory: Path,
    end: float,
    completed: Sequence[tuple[float, int]],
    failures: Sequence[tuple[float, str, int]],
    actions: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
) -> Path:
    """Tasks per model second by intended arrival time: completed (all, and at each faulty process's
    nodes) and not completed, with the fault windows shaded and the dispatchers' down/up marked."""
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
    colors = iter(["tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink", "tab:gray"])
    for i, w in sorted(windows.items()):
        color = next(colors, "tab:gray")
        ax.axvspan(
            w.get("start", 0.0), w.get("end", end), color=color, alpha=0.15, label=f"fault {i}: {w['kind']}"
        )
        if w["nodes"]:
            nodes = set(w["nodes"])
            ax.plot(
                mid,
                rate([t for t, k in completed if k in nodes]),
                color=color,
                label=f"completed at nodes {min(nodes)}-{max(nodes)}",
            )
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
    ax.set_title("faults: routing and outcomes over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: the lines fill the box
    return _save(fig, directory / "faults.png")
