"""What a reader of ``lbt run``'s table and plots relies on (issue 18, "Readable numbers", "Plots a reader can
use"): the table says what its verdict counts, every row has a unit, no value is printed ``± 0``, the theory
carries no interval, and a tail row's values are all at the level its label names; every plot's title names
the run, the policy and (when several) the dispatchers; the occupancy tail has integer levels, draws the
theory's zero, keeps the sources apart and has a labelled y axis; legends name only what is drawn and stay
off the lines; a sweep's plots take a log axis when their values span decades.

The figures are inspected as matplotlib objects, caught just before they are written.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lbtestbed.analysis.comparison.compare import Side
from lbtestbed.analysis.report import plots
from lbtestbed.analysis.report import run_report as report
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import METRICS, Result
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import parse_spec

SPEC = """
name = "readable-run"
seed = 3

[[classes]]
name = "fast"
count = 4
discipline = "fcfs"

[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "jsq"
dispatchers = 2

[run]
warmup = 1.0
duration = 10.0
"""


def experiment(text: str = SPEC) -> Experiment:
    return parse_spec(tomllib.loads(text), "readable.toml")


def est(value: float | None, ci95: float | None = None, **more: Any) -> dict[str, Any]:
    return {"value": value, "ci95": ci95, **more}


def result(source: str, tails: dict[str, list[dict[str, Any]]], **values: dict[str, Any]) -> Result:
    metrics: dict[str, Any] = {m: est(None) for m in METRICS if m != "occupancy_tail"}
    metrics.update(values)
    metrics["occupancy_tail"] = tails
    return Result("readable-run", "jsq", source, metrics, {"settings": {"dispatchers": 2}}, {})


class Figures:
    """Catches every figure ``plots`` writes (by file name), drawn, before it is closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_name: dict[str, Any] = {}
        original = plots._save

        def catch(fig: Any, path: Path) -> Path:
            written = original(fig, path)  # lays out and draws: positions are final
            self.by_name[path.name] = fig
            return written

        monkeypatch.setattr(plots, "_save", catch)


def tail(*values: float | None, ci: float | None = 0.01) -> list[dict[str, Any]]:
    return [est(1.0, 0.0), *(est(v, ci) for v in values)]


def theory_tail(*values: float) -> list[dict[str, Any]]:
    return [est(1.0, None, regime="exact"), *(est(v, None, regime="exact") for v in values)]


# ============================================================================================ the table


def pair_report(twin: bool = False) -> report.RunReport:
    """Cluster, simulation (and twin) with batches, theory by hand. Tail levels (cluster / simulation /
    theory): j=1 0.5 / 0.5 / 0.5, j=2 0.2 / 0.2 / 0.1, j=3 0.05 / 0.02 / - (the theory stops: 0 there)."""
    exp = experiment()
    batches = 4

    def raw(tail_values: list[list[float]], wait: list[float]) -> RawRun:
        r = RawRun(batches=batches)
        r.ratios["wait_probability"] = (np.array(wait), np.ones(batches))
        r.ratios["mean_sojourn"] = (np.array([1.0, 1.1, 0.9, 1.0]), np.ones(batches))
        for j, per_batch in enumerate([[1.0] * batches, *tail_values]):
            r.ratios[f"tail:0:{j}"] = (np.array(per_batch), np.ones(batches))
        r.sojourns = [[1.0]] * batches
        return r

    cluster_raw = raw([[0.5] * 4, [0.2] * 4, [0.04, 0.06, 0.05, 0.05]], [0.0] * 4)
    sim_raw = raw([[0.5] * 4, [0.2] * 4, [0.02, 0.02, 0.03, 0.01]], [0.0] * 4)
    cluster = result(
        "cluster",
        {"fast": tail(0.5, 0.2, 0.05)},
        wait_probability=est(0.0, 0.0),
        mean_sojourn=est(1.0, 0.1),
    )
    sim = result(
        "simulation",
        {"fast": tail(0.5, 0.2, 0.02)},
        wait_probability=est(0.0, 0.0),
        mean_sojourn=est(1.0, 0.1),
    )
    theory = result(
        "theory",
        {"fast": theory_tail(0.5, 0.1)},
        wait_probability=est(0.0, None, regime="exact", error=0.0),
        mean_sojourn=est(1.0, None, regime="finite_n", error=0.001),
    )
    twin_side = None
    if twin:
        twin_result = result(
            "twin",
            {"fast": tail(0.5, 0.2, 0.05)},
            wait_probability=est(0.0, 0.0),
            mean_sojourn=est(1.0, 0.1),
        )
        twin_side = Side(twin_result, cluster_raw)
    return report.build(exp, Side(cluster, cluster_raw), Side(sim, sim_raw), theory, {}, twin=twin_side)


@pytest.mark.parametrize("twin", [False, True])
def test_every_row_has_a_unit_and_no_value_reads_plus_minus_zero(twin: bool) -> None:
    rep = pair_report(twin)
    rows = report.comparison_rows(rep)
    assert all(r[1] for r in rows[1:]), rows  # the unit column is never empty
    by = {r[0]: r for r in rows[1:]}
    assert by["wait_probability"][1] == "probability"
    # every batch waited 0 on both sides: a zero-width interval, said so
    assert by["wait_probability"][2] == "0 (every batch)"
    text = report.terminal(rep)
    assert "± 0 " not in text and not any(line.rstrip().endswith("± 0") for line in text.splitlines())
    assert "+-0 " not in text and "+-0]" not in text  # a stated error of 0 is no error
    theory_cells = [r[-2] for r in rows[1:]]
    assert not any("±" in c for c in theory_cells)  # a theory value has no interval
    assert by["wait_probability"][-2] == "0 [exact]"
    assert by["mean_sojourn"][-2] == "1 [finite_n +-0.001]"


@pytest.mark.parametrize("twin", [False, True])
def test_a_tail_row_shows_every_source_at_the_level_its_label_names(twin: bool) -> None:
    rep = pair_report(twin)
    rows = report.comparison_rows(rep)
    tail_rows = [r for r in rows[1:] if r[0].startswith("occupancy_tail[fast]")]
    # paired against the simulation the worst level is j=3 (0.05 against 0.02; the others are equal); against
    # the twin (equal everywhere) the first, j=1; the theory's worst is j=2 (0.2 against 0.1)
    main = rep.verdict("occupancy_tail[fast]", "twin" if twin else "simulation")
    against_theory = rep.verdict("occupancy_tail[fast]", "theory", "simulation" if twin else "cluster")
    assert main is not None and against_theory is not None
    assert main.worst_j == (1 if twin else 3)
    assert against_theory.worst_j == 2  # |0.2 - 0.1| is the theory's largest gap
    labels = [r[0] for r in tail_rows]
    assert f"occupancy_tail[fast] at j={main.worst_j}" in labels
    assert "occupancy_tail[fast] at j=2" in labels
    head = rows[0]
    by_level = {int(r[0].rpartition("=")[2]): dict(zip(head, r, strict=True)) for r in tail_rows}
    cluster_at = {1: "0.5", 2: "0.2", 3: "0.05"}
    theory_at = {1: "0.5", 2: "0.1", 3: "0"}  # beyond the theory's end: no node holds that many
    for j, row in by_level.items():
        assert row["cluster"].split(" ")[0] == cluster_at[j]
        assert row["theory"].split(" ")[0] == theory_at[j]
    theory_col = "sim vs theory" if twin else rows[0][-1]
    theory_verdicts = [r[-1] for r in tail_rows]
    # the theory's verdict sits in the j=2 row; any other row points there
    assert by_level[2][theory_col] not in ("-", "see j=2")
    assert all(v == "see j=2" for j, v in zip(labels, theory_verdicts, strict=True) if not j.endswith("=2"))
    if twin:  # the net cost's worst level (j=3, 0.05 against 0.02) has no row: its cell names it
        assert by_level[1]["net cost"].endswith(" at j=3") and by_level[2]["net cost"] == "see j=1"


def test_the_headline_says_what_it_counted() -> None:
    rep = pair_report(twin=False)
    counted = [v for v in rep.verdicts if v.counts and v.agrees is not None]
    line = report.headline(rep)
    assert f"{len(counted)} comparisons that decide" in line
    by_pair: dict[tuple[str, str], int] = {}
    for v in counted:
        by_pair[(v.subject, v.reference)] = by_pair.get((v.subject, v.reference), 0) + 1
    for (subject, reference), n in by_pair.items():
        assert f"{n} metric{'s' if n != 1 else ''} {subject} vs {reference}" in line
    assert sum(by_pair.values()) == len(counted)
    assert report.COUNTING in " ".join(report.terminal(rep).split())  # wrapped to the terminal's width
    assert report.COUNTING in report.markdown(rep, []).splitlines()


# ============================================================================================ the plots


def test_every_plot_of_a_run_names_the_run_the_policy_and_the_dispatchers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = Figures(monkeypatch)
    rep = pair_report(twin=True)
    raws = {"cluster": RawRun(batches=2), "simulation": RawRun(batches=2)}
    for raw in raws.values():
        raw.ratios["tasks_in_system"] = (np.array([1.0, 2.0]), np.ones(2))
        raw.sojourns = [[0.5, 1.0], [2.0]]
    for r in (rep.cluster, rep.twin, rep.simulation):
        assert r is not None
        r.metrics["messages_per_task"] = est(1.0, 0.0, by_kind={"departure": 1.0})
    report.write(tmp_path, rep, raws, [])
    assert set(figures.by_name) == {"occupancy_tail.png", "over_time.png", "messages.png", "sojourn.png"}
    for name, fig in figures.by_name.items():
        title = fig.get_suptitle()
        assert "readable-run" in title and "policy=jsq" in title and "dispatchers=2" in title, name
    # one dispatcher: no dispatcher count in the title
    assert plots.run_title("x", "jiq", 1) == "x · policy=jiq"


def tail_figure(tmp_path: Path, figures: Figures, theory_values: tuple[float, ...]) -> Any:
    exp_tails = {
        "fast": tail(0.9, 0.5, 0.2),
        "slow": tail(0.95, 0.6),  # within one decade: a log axis would show one or two labels
    }
    cluster = result("cluster", exp_tails)
    sim = result("simulation", exp_tails)  # the same values: they must not hide each other
    theory = result("theory", {"fast": theory_tail(*theory_values), "slow": theory_tail(1.0, 1.0)})
    plots.occupancy_tail(tmp_path, [cluster, sim, theory], run="r")
    return figures.by_name["occupancy_tail.png"]


def test_occupancy_tail_has_integer_levels_and_draws_the_theory_zero_at_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = Figures(monkeypatch)
    fig = tail_figure(tmp_path, figures, (0.9, 0.5))  # the theory is 0 from j = 3 on
    fast, slow = fig.axes
    for ax in (fast, slow):
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
    floor = fast.get_ylim()[0]
    zero = [line for line in fast.get_lines() if "theory: 0 from j = 3" in str(line.get_label())]
    assert len(zero) == 1
    assert list(zero[0].get_xdata()) == [3] and list(zero[0].get_ydata()) == [floor]
    assert floor < 0.2  # below every value drawn
    labels = [t.get_text() for t in fast.get_legend().get_texts()]
    assert labels[0] == "theory (exact)" and "cluster" in labels and "simulation" in labels


def test_occupancy_tail_keeps_equal_sources_apart_and_labels_a_narrow_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = Figures(monkeypatch)
    fig = tail_figure(tmp_path, figures, (0.9, 0.5, 0.2))
    slow = fig.axes[1]
    lines = {str(c.get_label()): c.lines[0] for c in slow.containers}  # each source's data line
    cluster, sim = lines["cluster"], lines["simulation"]
    assert cluster.get_marker() != sim.get_marker() and cluster.get_linestyle() != sim.get_linestyle()
    assert not np.allclose(cluster.get_xdata(), sim.get_xdata())  # drawn a little apart sideways
    low, high = slow.get_ylim()
    labelled = [
        t for t in slow.yaxis.get_majorticklabels() if t.get_text() and low <= t.get_position()[1] <= high
    ]
    assert len(labelled) >= 3, [t.get_text() for t in labelled]


def test_sojourn_legend_has_theory_entries_only_for_the_values_the_theory_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = Figures(monkeypatch)
    samples = {"cluster": [0.5, 1.0, 2.0], "simulation": [0.5, 1.0, 2.0]}
    ps = result("theory", {}, mean_sojourn=est(1.75, None, regime="limit"))  # no quantiles on PS
    plots.sojourn(tmp_path, samples, ps, run="r")
    texts = [t.get_text() for t in figures.by_name["sojourn.png"].axes[0].get_legend().get_texts()]
    assert texts == ["cluster (3 tasks)", "simulation (3 tasks)"]
    fcfs = result("theory", {}, sojourn_p50=est(0.69, None, regime="exact"))
    plots.sojourn(tmp_path, samples, fcfs, run="r")
    texts = [t.get_text() for t in figures.by_name["sojourn.png"].axes[0].get_legend().get_texts()]
    assert texts[2:] == ["theory p50 (exact)"]


def test_over_time_legend_stays_off_the_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = Figures(monkeypatch)
    raw = RawRun(batches=3)
    raw.ratios["utility"] = (np.array([2.70, 2.71, 2.72]), np.ones(3))
    theory = result("theory", {})
    theory.extras["bounds"] = {"utility_upper": 2.72, "utility_poisson_jensen": 2.715}
    plots.over_time(tmp_path, 1.0, 3.0, {"cluster": raw}, theory, run="r")
    (ax,) = figures.by_name["over_time.png"].axes
    box = ax.get_legend().get_window_extent()
    assert box.x0 >= ax.get_window_extent().x1  # beside the axes: it covers no line and no bound


def sweep_points(means: list[float]) -> list[tuple[dict[str, str], Result]]:
    points = []
    for policy, loads in (("jsq", means[:2]), ("random", means[2:])):
        for load, mean in zip(("0.5", "0.9"), loads, strict=True):
            r = result("simulation", {}, mean_sojourn=est(mean, 0.01), messages_per_task=est(1.0, 0.0))
            r.policy = policy
            points.append(({"policy.name": policy, "workload.load": load}, r))
    return points


def label(settings: dict[str, str]) -> str:
    return " ".join(f"{k.rpartition('.')[2]}={v}" for k, v in settings.items())


@pytest.mark.parametrize(
    ("means", "scale"), [([1.0, 1.1, 2.0, 9.9], "linear"), ([1.0, 1.1, 2.0, 10.0], "log")]
)
def test_sweep_plots_take_a_log_axis_when_values_span_a_decade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, means: list[float], scale: str
) -> None:
    figures = Figures(monkeypatch)
    points = sweep_points(means)
    plots.tradeoff(tmp_path, points, "policy.name", label)
    plots.against(tmp_path, points, "workload.load", "policy.name")
    for name in ("tradeoff.png", "against_workload_load.png"):
        (ax,) = figures.by_name[name].axes
        assert ax.get_yscale() == scale, name
        title = figures.by_name[name].get_suptitle()
        assert "readable-run" in title and "policy=jsq, random" in title and "dispatchers=2" in title


def test_tradeoff_labels_settings_in_the_legend_not_over_the_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = Figures(monkeypatch)
    plots.tradeoff(tmp_path, sweep_points([1.0, 1.0, 1.0, 1.0]), "policy.name", label)  # all on one spot
    (ax,) = figures.by_name["tradeoff.png"].axes
    assert len(ax.texts) == 0  # no annotation to overprint
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["jsq", "random", "load=0.5", "load=0.9"]
    # equal message counts and values: every point (two policies at two loads) drawn apart sideways, no
    # marker on another (issue 30: two loads of one policy lay on one another), all within the spread
    centres = [(float(c.lines[0].get_xdata()[0]), float(c.lines[0].get_ydata()[0])) for c in ax.containers]
    assert len(centres) == 4
    fig = figures.by_name["tradeoff.png"]
    pixels = [ax.transData.transform(c) for c in centres]
    marker = 7 * fig.dpi / 72  # the markers' size, ms = 7 points
    for a, pa in enumerate(pixels):
        for pb in pixels[a + 1 :]:
            assert abs(pa[0] - pb[0]) >= marker, (pixels, marker)
    xs = [x for x, _ in centres]
    assert max(xs) - min(xs) <= plots.SPREAD * 1.0 + 1e-12  # the x range is 0 here: a span of 1


def test_a_theory_tail_fading_below_the_measured_ones_has_no_zero_marker_and_sets_no_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = Figures(monkeypatch)
    measured = {"servers": tail(0.5, 0.05, 0.004)}  # intervals of 0.01: the lowest end drawn is 0.1 * 0.004
    geometric = theory_tail(*(0.5**k for k in range(1, 40)))  # down to 2e-12, then the theory stops
    plots.occupancy_tail(
        tmp_path,
        [result("cluster", measured), result("theory", {"servers": geometric})],
        run="r",
    )
    (ax,) = figures.by_name["occupancy_tail.png"].axes
    assert ax.get_ylim()[0] == pytest.approx(1e-4)  # a decade under 0.0004, not at the theory's 2e-12
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any(t.startswith("theory: 0") for t in labels)  # it fades below the axis; it is not 0
    assert ax.get_xlim()[1] < 15  # the axis ends where the theory leaves it (0.5^14 < 1e-4), not at j=40


def test_two_variants_of_one_policy_are_two_curves_against_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--set 'policy={name="least_request"},{name="least_request",weights="speed"}' --set
    policy.dispatchers=1,4`: both variants are least_request; each is its own curve (even where their
    values coincide), named by its setting."""
    figures = Figures(monkeypatch)
    points = []
    variants = ('{name="least_request"}', '{name="least_request",weights="speed"}')
    for variant in variants:
        for k in ("1", "4"):
            r = result("simulation", {}, mean_sojourn=est(2.0, 0.1), messages_per_task=est(0.0, 0.0))
            r.policy = "least_request"
            points.append(({"policy": variant, "policy.dispatchers": k}, r))
    plots.against(tmp_path, points, "policy.dispatchers", "policy.name")
    (ax,) = figures.by_name["against_policy_dispatchers.png"].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(variants)
    assert len(ax.containers) == 2


def test_a_queue_sweeps_tradeoff_shows_mean_median_and_p99_against_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proxy engineers weigh the tail: with the quantiles measured, the trade-off plot has a panel each for
    the mean, the median and the 99th percentile, every one against messages per task."""
    figures = Figures(monkeypatch)
    points = []
    for policy, msgs in (("prequal", 6.0), ("jiq", 0.9)):
        r = result(
            "simulation",
            {},
            mean_sojourn=est(2.0, 0.1),
            sojourn_p50=est(1.0, 0.05),
            sojourn_p99=est(15.0 if policy == "prequal" else 11.0, 0.7),
            messages_per_task=est(msgs, 0.0),
        )
        r.policy = policy
        points.append(({"policy.name": policy}, r))
    plots.tradeoff(tmp_path, points, "policy.name", label)
    axes = figures.by_name["tradeoff.png"].axes
    assert [ax.get_ylabel() for ax in axes] == [
        "mean sojourn (model s)",
        "median sojourn (model s)",
        "99th percentile of the sojourn (model s)",
    ]
    p99 = axes[2]
    ys = sorted(float(c.lines[0].get_ydata()[0]) for c in p99.containers)
    assert ys == [11.0, 15.0]


def test_no_fault_band_has_the_colour_of_a_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """faults.png: the fault windows are grey bands told apart by their hatching; no band has the colour
    of a line (the pause band once had the colour of its nodes' line, and read as part of it)."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Polygon, Rectangle

    figures = Figures(monkeypatch)
    completed = [(t / 10, (t % 12)) for t in range(4000)]
    failures = [(90.0 + t / 10, "lost", 1) for t in range(50)]
    actions = [
        {"fault": 0, "kind": "kill", "action": "start", "model_time": 85.0, "nodes": [0, 1, 2, 3]},
        {"fault": 0, "kind": "kill", "action": "end", "model_time": 125.0, "nodes": [0, 1, 2, 3]},
        {"fault": 1, "kind": "pause", "action": "start", "model_time": 205.0, "nodes": [8, 9, 10, 11]},
        {"fault": 1, "kind": "pause", "action": "end", "model_time": 285.0, "nodes": [8, 9, 10, 11]},
        {"fault": 2, "kind": "drop", "action": "start", "model_time": 330.0, "nodes": []},
        {"fault": 2, "kind": "drop", "action": "end", "model_time": 360.0, "nodes": []},
    ]
    events = [{"model_time": 86.0, "to": "down"}, {"model_time": 140.0, "to": "up"}]
    plots.fault_timeline(tmp_path, 400.0, completed, failures, actions, events, run="faults")
    (ax,) = figures.by_name["faults.png"].axes
    bands = [p for p in ax.patches if isinstance(p, Polygon | Rectangle)]
    assert len(bands) == 3
    lines = {to_rgb(line.get_color()) for line in ax.get_lines()}
    for band in bands:
        assert to_rgb(band.get_facecolor()) not in lines, band.get_label()
    assert len({b.get_hatch() for b in bands}) == 3  # each fault its own
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fault 1: pause (nodes 8-11)" in labels and "completed at nodes 8-11 (fault 1)" in labels
