"""The second answer of a run: is it representative of the model? (analysis/comparison/representative.py)

Each case builds the twin-against-simulation verdicts by hand (the net costs) and works the expected answer
out from the rule in docs/run.md, "Two answers": representative when every cost's whole 95 % interval lies
within the tolerance; otherwise the time scale that would be is the run's times the worst bound over the
tolerance, rounded up on the 1-2-5 grid.
"""

from __future__ import annotations

import pytest

from lbtestbed.analysis.comparison.compare import Verdict
from lbtestbed.analysis.comparison.representative import judge
from lbtestbed.model.reader import SpecError
from lbtestbed.spec import load_spec

EXAMPLE = "examples/jiq.toml"


def cost(
    metric: str,
    relative: float | None = None,
    rel_ci: float | None = None,
    diff: float | None = None,
    diff_ci: float | None = None,
    expected: float = 1.0,
    subject: str = "twin",
) -> Verdict:
    """A paired twin-against-simulation verdict with the given gap."""
    v = Verdict(metric, "simulation", expected, 0.1, expected, 0.1, True, 0.5, False, subject=subject)
    v.paired = True
    v.relative, v.relative_ci95 = relative, rel_ci
    v.difference = diff if diff is not None else (relative or 0.0) * expected
    v.difference_ci95 = diff_ci
    return v


def test_costs_whose_intervals_stay_inside_the_tolerance_are_representative() -> None:
    rep = judge([cost("mean_sojourn", 0.02, 0.01), cost("sojourn_p99", -0.03, 0.015)], 0.05, 0.1)
    assert rep.holds is True
    assert rep.worst is not None and rep.worst.metric == "sojourn_p99"  # its bound 0.045 is the largest
    assert rep.suggested_time_scale() is None
    line = rep.line()
    assert line is not None and line.startswith("REPRESENTATIVE: every net cost within ±5 %")


def test_an_interval_that_reaches_past_the_tolerance_is_not_representative_and_names_a_time_scale() -> None:
    # utility 8 % below the model, +-1.5 %: its bound 0.095 is beyond 0.05; the time scale that would be is
    # 0.02 x 0.095 / 0.05 = 0.038, rounded up on the 1-2-5 grid: 0.05
    rep = judge(
        [cost("utility", diff=-0.24, diff_ci=0.045, expected=3.0), cost("mean_sojourn", 0.01, 0.004)],
        0.05,
        0.02,
    )
    assert rep.holds is False
    assert rep.suggested_time_scale() == pytest.approx(0.05)
    line = rep.line()
    assert line is not None and line.startswith(
        "NOT REPRESENTATIVE: the emulation's own delays cost utility -8 %"
    )
    assert "time_scale 0.05 would be" in line and "mean_sojourn" not in line  # only what is beyond


def test_the_point_estimate_alone_does_not_make_a_run_representative() -> None:
    rep = judge([cost("mean_sojourn", 0.045, 0.01)], 0.05, 1.0)  # inside, but its interval reaches 0.055
    assert rep.holds is False and rep.suggested_time_scale() == pytest.approx(2.0)


def test_the_wait_probability_costs_probability_points() -> None:
    rep = judge([cost("wait_probability", diff=0.03, diff_ci=0.01, expected=0.2)], 0.05, 0.1)
    assert rep.holds is True  # 0.04 points, although 20 % relative to 0.2
    assert rep.costs[0].absolute and rep.costs[0].bound == pytest.approx(0.04)


def test_only_net_costs_count_and_the_check_can_be_turned_off() -> None:
    cluster_row = cost("mean_sojourn", 0.5, 0.01, subject="cluster")  # cluster vs simulation: not a net cost
    assert judge([cluster_row], 0.05, 0.1).holds is None
    off = judge([cost("mean_sojourn", 0.5, 0.01)], None, 0.1)
    assert off.holds is None and off.line() is None


def test_the_spec_takes_a_tolerance_or_off() -> None:
    assert load_spec(EXAMPLE).run.tolerance == 0.05
    assert load_spec(EXAMPLE, ["run.tolerance=0.1"]).run.tolerance == 0.1
    assert load_spec(EXAMPLE, ['run.tolerance="off"']).run.tolerance is None
    for bad in ("0", "1.5", '"none"'):
        with pytest.raises(SpecError) as info:
            load_spec(EXAMPLE, [f"run.tolerance={bad}"])
        assert info.value.key == "run.tolerance"


def test_an_interval_wider_than_the_tolerance_asks_for_a_longer_run() -> None:
    """The demo's SLTA run: messages per task +5.4 % +- 7.4 % at time scale 1, tolerance 5 %. No time scale
    alone can make that interval fit: a run (0.074 / 0.025)^2 = 8.8 times longer, 10 on the grid, narrows it
    to 0.074 / sqrt(10) = 2.3 %, beside which the point estimate must shrink to 2.7 %: time scale
    0.054 / 0.0266 = 2.03, 5 on the grid."""
    rep = judge([cost("messages_per_task", 0.054, 0.074)], 0.05, 1.0)
    assert rep.holds is False
    assert rep.suggested_duration_factor() == pytest.approx(10.0)
    assert rep.suggested_time_scale() == pytest.approx(5.0)
    line = rep.line()
    assert line is not None and "a run 10 times longer (run.duration)" in line
    assert "time_scale 5 would be (this run: 1)" in line
    assert rep.to_json()["suggested_duration_factor"] == pytest.approx(10.0)


def test_a_small_cost_with_a_wide_interval_needs_only_a_longer_run() -> None:
    """+1 % +- 8 %: (0.08 / 0.025)^2 = 10.2 times longer, 20 on the grid; then 0.01 fits beside 0.08 /
    sqrt(20) = 1.8 % at the run's own time scale, so no time scale is named."""
    rep = judge([cost("mean_sojourn", 0.01, 0.08)], 0.05, 0.1)
    assert rep.suggested_duration_factor() == pytest.approx(20.0)
    assert rep.suggested_time_scale() is None
    line = rep.line()
    assert line is not None and "20 times longer" in line and "time_scale" not in line.split(";")[1]


def test_an_interval_inside_the_tolerance_asks_for_no_longer_run() -> None:
    rep = judge([cost("utility", diff=-0.24, diff_ci=0.045, expected=3.0)], 0.05, 0.02)
    assert rep.suggested_duration_factor() is None
    assert rep.to_json()["suggested_duration_factor"] is None
