"""``lbt frontier``: the frontier's envelope by hand, the points read from the policies' declarations, the
policies a spec cannot hold left out with their reason, the command's exit codes and JSON, one small
simulated frontier end to end and one cluster point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lbtestbed.analysis.comparison.frontier import Measured, envelope
from lbtestbed.experiment.errors import BadInput
from lbtestbed.experiment.frontier import (
    CLUSTER_OVERHEAD,
    cluster_lengths,
    mean_service_time,
    plan,
    settings_of,
)
from lbtestbed.experiment.sweep import with_overrides
from lbtestbed.policies import CATALOG
from lbtestbed.policies.memory import PowerOfDMemory
from lbtestbed.policies.unit import Curve
from lbtestbed.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
name = "small-frontier"
seed = 4

[[classes]]
name = "servers"
count = 10
discipline = "fcfs"
speed = {speed}

[workload]
load = 0.7
service = {{ dist = "exponential", mean = 1.0 }}

[policy]
{policy}

[run]
warmup = {warmup}
duration = {duration}
time_scale = 0.05
batches = 10
"""


def spec(tmp_path: Path, policy: str = 'name = "random"', speed: float = 1.0, **run: float) -> Path:
    path = tmp_path / "spec.toml"
    lengths = {"warmup": 50.0, "duration": 500.0, **run}
    path.write_text(SPEC.format(policy=policy, speed=speed, **lengths))
    return path


def lbt(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def m(policy: str, messages: float, value: float, ci: float | None = 0.1, curve: str = "") -> Measured:
    return Measured(policy, curve or policy, "", messages, value, ci)


# ------------------------------------------------------------------------------------------ the envelope


def test_the_envelope_steps_down_at_each_point_that_beats_every_cheaper_one() -> None:
    a, b, c, d = m("a", 0.0, 5.0), m("b", 0.5, 3.0), m("c", 1.0, 4.0), m("d", 2.0, 1.0)
    steps = envelope([d, c, b, a])  # the order given does not matter
    # a holds from 0 until b (cheaper than c, and better); c is beaten by b, which is cheaper; d holds on
    assert [(s.start, s.end, s.winner) for s in steps] == [(0.0, 0.5, a), (0.5, 2.0, b), (2.0, None, d)]
    # the runner-up is the best point of another policy within the step's budget range
    assert steps[0].runner_up is None  # nothing else sends under 0.5
    assert steps[1].runner_up == c  # a (5.0) and c (4.0) send under 2: c is the better
    assert steps[2].runner_up == b


def test_equal_messages_keep_the_lower_delay_and_an_equal_delay_costlier_is_no_step() -> None:
    low, high = m("x", 1.0, 2.0), m("y", 1.0, 3.0)
    same = m("z", 4.0, 2.0)  # as good as x for four times the messages: no step
    steps = envelope([high, same, low])
    assert [s.winner for s in steps] == [low]
    assert steps[0].end is None and steps[0].runner_up == same  # z (2.0) is better than y (3.0)
    assert steps[0].clear is False  # and ties x


def test_a_win_is_clear_only_when_the_intervals_do_not_touch() -> None:
    cheap = m("cheap", 0.0, 2.0, ci=0.3)
    tight = m("tight", 1.0, 1.0, ci=0.2)  # 1.2 < 1.7: clear
    steps = envelope([cheap, tight])
    assert steps[1].clear is True
    loose = m("loose", 1.0, 1.0, ci=0.8)  # 1.8 >= 1.7: within the intervals
    assert envelope([cheap, loose])[1].clear is False
    unknown = m("unknown", 1.0, 1.0, ci=None)
    assert envelope([cheap, unknown])[1].clear is None
    assert envelope([cheap])[0].clear is None  # no runner-up


def test_the_runner_up_is_another_policy_not_the_winners_other_settings() -> None:
    d2 = Measured("power_of_d", "JSQ(d)", "d=2", 4.0, 1.6, 0.05)
    d3 = Measured("power_of_d", "JSQ(d)", "d=3", 6.0, 1.1, 0.05)
    rnd = m("random", 0.0, 9.0)
    steps = envelope([rnd, d2, d3])
    assert [s.winner for s in steps] == [rnd, d2, d3]
    assert steps[2].runner_up == rnd  # d=2 is the same policy


# ------------------------------------------------------------------------------- points from declarations


def test_a_curve_runs_each_value_of_its_knob_with_its_fixed_keys(tmp_path: Path) -> None:
    exp = load_spec(spec(tmp_path, 'name = "random"\ndispatchers = 2'))

    class Declared(PowerOfDMemory):
        frontier = (Curve("memory of two", "d", (2, 3), {"m": 2}),)

    settings = settings_of(Declared(), exp)
    assert [(s.curve, s.key, s.value) for s in settings] == [
        ("power_of_d_memory: memory of two", "d", 2),
        ("power_of_d_memory: memory of two", "d", 3),
    ]
    for s, d in zip(settings, (2, 3), strict=True):
        point = with_overrides(exp, s.overrides)
        assert point.policy.name == "power_of_d_memory"
        assert (point.policy.d, point.policy.m) == (d, 2)  # type: ignore[attr-defined]
        assert point.policy.dispatchers == 2  # the spec's own, kept for every policy


def test_every_policy_of_the_catalog_is_planned_as_it_declares(tmp_path: Path) -> None:
    """Each value of each curve, or one point; every point run or left out, none lost."""
    exp = load_spec(spec(tmp_path))
    for policy in CATALOG:
        runs, left = plan(exp, [policy.name])
        declared = [(f"{policy.name}: {c.label}", c.key, v) for c in policy.frontier for v in c.values]
        assert len(runs) + len(left) == (len(declared) or 1), policy.name
        for s, point in runs:
            assert point.policy.name == policy.name
            if declared:
                assert (s.curve, s.key, s.value) in declared
                assert getattr(point.policy, s.key) == s.value
            else:
                assert (s.curve, s.key) == (policy.name, None)


def test_the_specs_own_policy_keeps_its_table_and_others_start_from_their_defaults(tmp_path: Path) -> None:
    exp = load_spec(spec(tmp_path, 'name = "jiq"\ntie_break = "longest_idle"'))
    runs = dict((s.policy, point) for s, point in plan(exp, ["jiq", "jsq"])[0])
    assert runs["jiq"].policy.tie_break == "longest_idle"  # type: ignore[attr-defined]
    default = load_spec(spec(tmp_path, 'name = "jsq"'))
    assert runs["jsq"].policy == default.policy


def test_a_policy_the_spec_cannot_hold_is_left_out_with_its_reason(tmp_path: Path) -> None:
    exp = load_spec(spec(tmp_path))
    runs, left = plan(exp, ["jlmu", "random"])
    assert [s.policy for s, _ in runs] == ["random"]
    assert [(o.policy, o.where) for o in left] == [("jlmu", "everywhere")]
    assert "pool" in left[0].reason and "classes[0].discipline" in left[0].reason


def test_the_wait_needs_one_service_time_and_pools_have_no_frontier(tmp_path: Path) -> None:
    assert mean_service_time(load_spec(spec(tmp_path, speed=2.0))) == 0.5
    mixed = load_spec(spec(tmp_path, speed=2.0), ['classes[0].speed={dist="uniform", low=1, high=2}'])
    assert mean_service_time(mixed) is None  # the left panel shows the mean sojourn then
    with pytest.raises(BadInput, match="pool"):
        mean_service_time(load_spec(ROOT / "examples" / "slta_two_classes.toml"))


def test_the_cluster_lengths_fit_the_budget_or_refuse(tmp_path: Path) -> None:
    exp = load_spec(spec(tmp_path))
    lengths = cluster_lengths(exp, 2.0, 4)  # 30 s a point, CLUSTER_OVERHEAD of it not load, at 0.05
    model = (30.0 - CLUSTER_OVERHEAD) / 0.05
    assert lengths["warmup"] + lengths["duration"] <= model * 1.01
    assert lengths["warmup"] + lengths["duration"] >= model * 0.95  # two digits of rounding
    with pytest.raises(BadInput, match="--cluster-minutes"):
        cluster_lengths(exp, 0.5, 20)


# ------------------------------------------------------------------------------------------ the command


def _check_envelope(points: list[dict[str, Any]], steps: list[dict[str, Any]], source: str, key: str) -> None:
    """The steps against a brute force: at each point's budget, the best point sending no more."""
    values = [(p[source]["messages_per_task"]["value"], p[source][key]["value"], p) for p in points]
    for budget, _, _ in values:
        best = min(v for msgs, v, _ in values if msgs <= budget)
        step = next(s for s in steps if s["from"] <= budget and (s["to"] is None or budget < s["to"]))
        assert step["winner"]["value"] == best


def test_a_small_simulated_frontier_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [
        "frontier",
        str(spec(tmp_path)),
        "--policies",
        "random,jiq,power_of_d,jlmu",
        "--replications",
        "2",
    ]
    done = lbt(*args, "--json", "--quiet", "--out", str(out), "--jobs", "2")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert {"spec", "name", "delay", "mean_service", "replications", "points", "left_out", "frontier"} <= set(
        doc
    )
    assert doc["delay"] == "mean_wait" and doc["mean_service"] == 1.0 and doc["replications"] == 2
    assert [o["policy"] for o in doc["left_out"]] == ["jlmu"]
    curves = [(p["policy"], p["value"]) for p in doc["points"]]
    assert curves == [("jiq", None), *(("power_of_d", d) for d in (1, 2, 3, 5)), ("random", None)]
    for p in doc["points"]:
        sim = p["simulation"]
        # the wait is the sojourn less the mean service time, with the sojourn's interval
        assert sim["mean_wait"]["value"] == pytest.approx(sim["mean_sojourn"]["value"] - 1.0)
        assert sim["mean_wait"]["ci95"] == sim["mean_sojourn"]["ci95"] > 0
        assert p["cluster"] is None
        assert set(p["theory"]) >= {"messages_per_task", "mean_wait", "sojourn_p99", "regime"}
    by = {(p["policy"], p["value"]): p for p in doc["points"]}
    assert by[("power_of_d", 2)]["simulation"]["messages_per_task"]["value"] == 4.0
    assert by[("random", None)]["simulation"]["messages_per_task"]["value"] == 0.0
    for key in ("mean_wait", "sojourn_p99"):
        _check_envelope(doc["points"], doc["frontier"]["simulation"][key], "simulation", key)
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "frontier.json").read_text())["points"] == doc["points"]
    table = lbt(*args, "--out", str(tmp_path / "again"), "--quiet")
    assert table.returncode == 0 and "frontier (simulation, mean wait):" in table.stdout
    assert "left out: jlmu" in table.stdout


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--policies", "nope"], "nope"),
        (["--policies", "jlmu"], "no policy runs"),
        (["--replications", "0"], "--replications"),
        (["--cluster-minutes", "0"], "--cluster-minutes"),
        (["--cluster", "--cluster-minutes", "0.2"], "--cluster-minutes"),
        (["--set", "workload.load=2"], "workload"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, extra: list[str], named: str
) -> None:
    path = spec(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    done = lbt("frontier", str(path), *extra, cwd=work, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "error" in lines[0] and named in lines[0], done.stderr
    assert done.stdout == "" and list(work.iterdir()) == []


def test_a_pools_spec_is_bad_input(tmp_path: Path) -> None:
    done = lbt("frontier", str(ROOT / "examples" / "slta_two_classes.toml"), cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "pool" in done.stderr and list(tmp_path.iterdir()) == []


def test_one_cluster_point(tmp_path: Path) -> None:
    """random on a cluster of 10 nodes within a 0.4-minute budget: the point measured there, beside the
    simulation of its own tasks, and its report."""
    out = tmp_path / "out"
    args = ["frontier", str(spec(tmp_path)), "--policies", "random", "--replications", "2", "--cluster"]
    done = lbt(*args, "--cluster-minutes", "0.4", "--json", "--quiet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (point,) = doc["points"]
    lengths = doc["cluster_run"]
    assert point["cluster"]["messages_per_task"]["value"] == 0.0
    assert point["cluster"]["mean_wait"]["ci95"] > 0
    assert point["same_tasks"]["mean_wait"]["value"] is not None
    report = json.loads((Path(point["cluster_directory"]) / "results.json").read_text())
    settings = report["results"]["cluster"]["settings"]
    assert (settings["warmup"], settings["duration"]) == (lengths["warmup"], lengths["duration"])
    assert "twin" not in report["results"] and "simulation" in report["results"]  # no twin: see docstring
    assert [s["winner"]["policy"] for s in doc["frontier"]["cluster"]["mean_wait"]] == ["random"]
