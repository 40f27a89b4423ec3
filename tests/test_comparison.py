"""Paired and unpaired verdicts, checked against hand computations (scipy.stats for the quantiles).

Paired: two runs on the same tasks, compared batch by batch (analysis/comparison/paired.py). The tests
build the runs' batch data by hand, so every expected number is computed here from the data, not taken
from the code under test.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

from lbtestbed.analysis.comparison.compare import Side, compare, compare_scalar, run_agrees
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import summarize
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import parse_spec

SPEC = {
    "name": "paired",
    "seed": 1,
    "classes": [{"name": "a", "count": 4, "discipline": "fcfs"}],
    "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
    "policy": {"name": "random"},
    "run": {"warmup": 1.0, "duration": 10.0, "batches": 10},
}


def experiment() -> Experiment:
    return parse_spec(SPEC)


def run_with(
    per_batch: dict[str, np.ndarray], sojourns: list[list[float]], positions: list[int] | None = None
) -> RawRun:
    """A RawRun whose ratio metrics take the given per-batch values (denominator 1)."""
    b = len(sojourns)
    raw = RawRun(batches=b, message_kinds=())
    for key, values in per_batch.items():
        raw.ratios[key] = (np.asarray(values, float), np.ones(b))
    raw.ratios["tail:0:0"] = (np.ones(b), np.ones(b))
    raw.sojourns = sojourns
    raw.batch_of = positions or []
    return raw


def workload_like(rng: np.random.Generator, b: int) -> np.ndarray:
    """Per-batch means that vary a lot from batch to batch, as a workload's do."""
    return 1.0 + 0.3 * rng.standard_normal(b)


def test_a_three_percent_gap_hidden_unpaired_is_seen_paired() -> None:
    """The issue's example: both runs saw the same tasks, the cluster is 3 % slower in every batch. The
    batch-to-batch spread (30 %) hides it in two unpaired intervals; the paired interval sees it."""
    rng = np.random.default_rng(7)
    b = 20
    shared = workload_like(rng, b)
    sim = shared * (1 + 0.002 * rng.standard_normal(b))
    clu = shared * 1.03 * (1 + 0.002 * rng.standard_normal(b))
    sojourns = [[1.0, 2.0]] * b
    exp = experiment()
    a = run_with({"mean_sojourn": clu}, sojourns)
    s = run_with({"mean_sojourn": sim}, sojourns)
    ra, rs = summarize(exp, [a], "cluster"), summarize(exp, [s], "simulation")
    unpaired = compare(Side(ra), Side(rs))
    paired = compare(Side(ra, a), Side(rs, s))
    u = next(v for v in unpaired if v.metric == "mean_sojourn")
    p = next(v for v in paired if v.metric == "mean_sojourn")
    assert u.agrees is True and not u.paired  # the gap is inside the unpaired interval
    assert p.paired and p.agrees is False
    # by hand: the mean log ratio and its t interval on b - 1 degrees of freedom
    d = np.log(clu / sim)
    se = d.std(ddof=1) / math.sqrt(b)
    assert p.df == b - 1
    assert p.distance == pytest.approx(abs(d.mean()) / se, rel=1e-9)
    assert p.relative == pytest.approx(math.expm1(d.mean()), rel=1e-9)
    half = stats.t.ppf(0.975, b - 1) * se
    assert p.relative_ci95 == pytest.approx(
        max(
            math.expm1(d.mean() + half) - math.expm1(d.mean()),
            math.expm1(d.mean()) - math.expm1(d.mean() - half),
        ),
        rel=1e-9,
    )
    assert 0.02 < (p.relative or 0) < 0.04
    assert not run_agrees([p])


def test_the_same_batches_agree_paired() -> None:
    rng = np.random.default_rng(3)
    b = 12
    shared = workload_like(rng, b)
    a = run_with({"utility": shared + 0.001 * rng.standard_normal(b)}, [[1.0]] * b)
    s = run_with({"utility": shared + 0.001 * rng.standard_normal(b)}, [[1.0]] * b)
    exp = experiment()
    v = next(
        v
        for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
        if v.metric == "utility"
    )
    d = a.ratios["utility"][0] - s.ratios["utility"][0]
    se = d.std(ddof=1) / math.sqrt(b)
    assert v.paired and v.relative is None  # utility: compared by its difference, not its ratio
    assert v.difference == pytest.approx(d.mean(), rel=1e-12)
    assert v.difference_ci95 == pytest.approx(stats.t.ppf(0.975, b - 1) * se, rel=1e-9)
    assert v.agrees is bool(abs(d.mean()) <= stats.t.ppf(0.975, b - 1) * se)


def test_pairs_are_the_batches_both_runs_kept() -> None:
    """A cluster run that left batches out (a fault) is paired by window position."""
    rng = np.random.default_rng(5)
    full = workload_like(rng, 10)
    kept = [0, 1, 2, 5, 6, 7, 8, 9]
    a = run_with({"idle_nodes": full[kept] + 0.5}, [[1.0]] * len(kept), positions=kept)
    s = run_with({"idle_nodes": full}, [[1.0]] * 10)
    exp = experiment()
    v = next(
        v
        for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
        if v.metric == "idle_nodes"
    )
    assert v.df == len(kept) - 1
    assert v.difference == pytest.approx(0.5, rel=1e-12)  # exactly 0.5 in every batch kept
    assert v.agrees is False and v.distance == math.inf


def test_quantiles_are_paired_batch_by_batch() -> None:
    rng = np.random.default_rng(11)
    b = 10
    base = [list(rng.exponential(1.0, 200)) for _ in range(b)]
    slower = [[x * 1.1 for x in s] for s in base]
    a = run_with({}, slower)
    s = run_with({}, base)
    exp = experiment()
    v = next(
        v
        for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
        if v.metric == "sojourn_p99"
    )
    assert v.relative == pytest.approx(0.1, rel=1e-9)  # every batch's p99 is exactly 10 % larger
    assert v.agrees is False


def test_unpaired_intervals_use_their_degrees_of_freedom() -> None:
    """Each side's standard error is its half-width over ITS t quantile; the difference's interval has
    Welch–Satterthwaite's degrees of freedom (not the normal's 1.96)."""
    a = {"value": 10.0, "ci95": 1.0, "df": 4}
    b = {"value": 8.5, "ci95": 0.5, "df": 9}
    v = compare_scalar("mean_sojourn", a, b, "simulation", True)
    sa, sb = 1.0 / stats.t.ppf(0.975, 4), 0.5 / stats.t.ppf(0.975, 9)
    se = math.hypot(sa, sb)
    df = se**4 / (sa**4 / 4 + sb**4 / 9)
    assert v.df == pytest.approx(df, rel=1e-9)
    assert v.distance == pytest.approx(1.5 / se, rel=1e-9)
    assert v.difference_ci95 == pytest.approx(stats.t.ppf(0.975, df) * se, rel=1e-9)
    assert v.agrees is bool(stats.t.ppf(0.975, df) * se >= 1.5)
    # against a theory value (no interval): the measurement's own t standard error
    t = compare_scalar("mean_sojourn", a, {"value": 9.2}, "theory", True)
    assert t.distance == pytest.approx(0.8 / sa, rel=1e-9)
    assert t.agrees is True


def test_paired_tail_is_family_wise_with_t_quantiles() -> None:
    """Two levels of the tail; the second is off by a constant in every batch but one: its |t| is large,
    and the Bonferroni t quantile for two points on b - 1 df decides."""
    rng = np.random.default_rng(2)
    b = 10
    level1 = 0.5 + 0.05 * rng.standard_normal(b)
    level2 = 0.2 + 0.05 * rng.standard_normal(b)
    shift = np.full(b, 0.01)
    shift[0] = 0.0
    a = run_with({}, [[1.0]] * b)
    s = run_with({}, [[1.0]] * b)
    for raw, extra in ((a, shift), (s, np.zeros(b))):
        raw.ratios["tail:0:1"] = (level1.copy(), np.ones(b))
        raw.ratios["tail:0:2"] = (level2 + extra, np.ones(b))
    exp = experiment()
    v = next(
        v
        for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
        if v.metric.startswith("occupancy_tail")
    )
    d = shift
    t_worst = abs(d.mean()) / (d.std(ddof=1) / math.sqrt(b))
    z = stats.t.ppf(1 - 0.025 / 2, b - 1)
    assert v.worst_j == 2 and v.distance == pytest.approx(t_worst, rel=1e-9)
    assert v.agrees is bool(t_worst <= z)
    assert f"|t| <= {z:.2f}" in v.why and "2 points" in v.why


def test_tail_levels_rare_on_both_sides_are_not_compared() -> None:
    """A level that almost every node reaches (the complement under 0.1 %) is as rare an event as one
    that almost none reaches: left out, however far apart the two runs' few such moments are."""
    b = 10
    a = run_with({}, [[1.0]] * b)
    s = run_with({}, [[1.0]] * b)
    for raw, level1 in ((a, 0.9995), (s, 0.9999)):  # 5 and 1 in ten thousand node-seconds below level 1
        raw.ratios["tail:0:1"] = (np.full(b, level1), np.ones(b))
        raw.ratios["tail:0:2"] = (np.full(b, 0.4), np.ones(b))
    s.ratios["tail:0:2"] = (np.full(b, 0.4) + np.linspace(-0.01, 0.01, b), np.ones(b))
    exp = experiment()
    v = next(
        v
        for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
        if v.metric.startswith("occupancy_tail")
    )
    assert v.worst_j == 2 and "1 points" in v.why  # level 1 left out, level 2 compared


@pytest.mark.parametrize(("metric", "value"), [("mean_sojourn", 1.7), ("utility", 7.4), ("idle_nodes", 0.0)])
def test_identical_batches_summed_in_another_order_agree(metric: str, value: float) -> None:
    """A twin that replayed every decision differs from its cluster only in the last digits of each batch
    (its sums ran in another order). Rounding that leans one way in every batch is no gap: the comparison
    agrees at distance 0. A real gap of a millionth, in every batch, still disagrees."""
    b = 10
    rng = np.random.default_rng(2)
    base = value + rng.random(b)
    noise = base * (1 + 1e-13 * (1 + rng.random(b)))  # always above: a t test alone calls that a gap
    exp = experiment()
    sojourns = [[1.0]] * b

    def verdict(cluster: np.ndarray) -> object:
        a, s = run_with({metric: cluster}, sojourns), run_with({metric: base}, sojourns)
        return next(
            v
            for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
            if v.metric == metric
        )

    same = verdict(noise)
    assert same.paired and same.agrees is True and same.distance == 0.0
    gap = verdict(base * (1 + 1e-6))
    assert gap.agrees is False


def test_a_divergence_confined_to_one_batch_is_seen() -> None:
    """One batch of twenty 30 % slower (a stall the twin did not see): the mean moves by 1.5 % and its
    interval widens as much, so the mean's test alone cannot tell; the batch stands apart (Grubbs)."""
    rng = np.random.default_rng(11)
    b = 20
    shared = workload_like(rng, b)
    sim = shared * (1 + 0.004 * rng.standard_normal(b))
    clu = shared * (1 + 0.004 * rng.standard_normal(b))
    clu[7] *= 1.3
    exp = experiment()
    a, s = run_with({"mean_sojourn": clu}, [[1.0]] * b), run_with({"mean_sojourn": sim}, [[1.0]] * b)
    v = next(
        v
        for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
        if v.metric == "mean_sojourn"
    )
    d = np.log(clu / sim)
    se = d.std(ddof=1) / math.sqrt(b)
    t_mean = abs(d.mean()) / se
    assert t_mean < stats.t.ppf(0.975, b - 1)  # the mean's test alone agrees
    # Grubbs by hand: G, its t on b - 2 degrees of freedom, Bonferroni over the b batches, two-sided
    g = np.abs(d - d.mean()).max() / d.std(ddof=1)
    t = math.sqrt(b * (b - 2) * g * g / ((b - 1) ** 2 - b * g * g))
    p_out = min(1.0, 2 * b * stats.t.sf(t, b - 2))
    p_mean = 2 * stats.t.sf(t_mean, b - 1)
    assert v.own_p == pytest.approx(min(1.0, 2 * min(p_mean, p_out)), rel=1e-6)
    assert p_out < 0.025 and v.agrees is False
    assert v.outlier_batch == 7 and "batch 7" in v.word


def test_agreeing_batches_disagree_no_more_often_than_the_level() -> None:
    """The two tests share the 5 %: over many pairs of runs that differ only by noise, about 5 % or fewer
    disagree (a binomial 3-sigma bound over 4,000 pairs; seeded)."""
    from lbtestbed.analysis.comparison import paired

    rng = np.random.default_rng(2024)
    trials, b, level = 4000, 20, 0.05
    rejected = 0
    for _ in range(trials):
        shared = workload_like(rng, b)
        x = {i: float(v) for i, v in enumerate(shared * (1 + 0.01 * rng.standard_normal(b)))}
        y = {i: float(v) for i, v in enumerate(shared * (1 + 0.01 * rng.standard_normal(b)))}
        p = paired.pair(x, y, log_scale=True)
        assert p is not None and p.p() is not None
        rejected += p.p() <= level
    assert rejected / trials <= level + 3 * math.sqrt(level * (1 - level) / trials)


def test_a_twin_that_parts_from_the_cluster_in_one_batch_by_a_few_percent_agrees() -> None:
    """A twin replays most batches to the last digit; where a decision fell the other way a batch differs
    by a few percent (the chaos of queueing, not a bug). Such a batch stands apart by Grubbs' test, but its
    gap is below the 10 % that counts: the comparison agrees. The same batch 30 % apart disagrees."""
    rng = np.random.default_rng(4)
    b = 10
    sim = workload_like(rng, b)
    exp = experiment()
    words = []
    for factor in (1.045, 1.3):
        clu = sim.copy()
        clu[9] *= factor
        a, s = run_with({"mean_sojourn": clu}, [[1.0]] * b), run_with({"mean_sojourn": sim}, [[1.0]] * b)
        v = next(
            v
            for v in compare(Side(summarize(exp, [a], "cluster"), a), Side(summarize(exp, [s]), s))
            if v.metric == "mean_sojourn"
        )
        # by hand: nine gaps of exactly 0 and one of log(factor): Grubbs' G is (nearly) its largest possible
        # value, so the batch stands apart whatever its size
        found = re.search(r"batch 9 furthest apart \(.*Grubbs p = ([0-9.e+-]+)", v.why)
        assert found is not None and float(found.group(1)) < 1e-6, v.why
        words.append(v.word)
    assert words == ["agrees", "disagrees (batch 9 apart)"]


def test_only_sojourns_on_pools_with_the_same_tasks_are_fixed_by_the_twin() -> None:
    """``fixed_by_twin``: on pool nodes the twin's sojourns are the cluster's (docs/run.md, "Which rows
    decide"), but only where both runs hold the same tasks in every batch; under fcfs or ps, or in a mix
    with pools, nothing is fixed."""
    from pathlib import Path

    from lbtestbed.analysis.comparison.compare import SOJOURNS, fixed_by_twin
    from lbtestbed.spec import load_spec

    examples = Path(__file__).resolve().parents[1] / "examples"
    pools = load_spec(str(examples / "jlmu_fast.toml"))
    fcfs = load_spec(str(examples / "jiq.toml"))
    mixed = load_spec(
        str(examples / "jiq.toml"),
        ['classes=[{name="a", count=5, discipline="pool"}, {name="b", count=5, discipline="ps"}]'],
    )

    def raw(tasks: list[int]) -> RawRun:
        return RawRun(batches=len(tasks), sojourns=[[1.0] * k for k in tasks])

    assert set(fixed_by_twin(pools, raw([3, 4, 5]), raw([3, 4, 5]))) == set(SOJOURNS)
    assert fixed_by_twin(pools, raw([3, 4, 5]), raw([3, 5, 5])) == {}  # a task the cluster lost
    assert fixed_by_twin(fcfs, raw([3, 4, 5]), raw([3, 4, 5])) == {}
    assert fixed_by_twin(mixed, raw([3, 4, 5]), raw([3, 4, 5])) == {}
