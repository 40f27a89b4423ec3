"""Node speed over time (issue 19, docs/spec.md "Speed over time"): speed schedules and antagonists.

- the spec's schedules expand to the timed speed changes docs/spec.md states (steps, the ramp's staircase,
  composition with slow faults, a node's own schedule), checked against hand-computed lists;
- an antagonist's switching times are those of its stated law, drawn here independently from the stated
  stream, and over a long horizon its on share, its periods and its state at time 0 follow the law
  (confidence intervals);
- the simulator serves each task over the speed profile (FCFS completion times computed here);
- bad keys are one line naming the key; the theory withholds its values.
"""

from __future__ import annotations

import csv
import math
import random
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.theory.predict import predict
from lbtestbed.experiment.runner import ejection_warning
from lbtestbed.model.conditions import SpeedChange, speed_changes, speed_varies
from lbtestbed.model.reader import SpecError
from lbtestbed.model.workload import PoissonWorkload
from lbtestbed.spec import parse_spec

LBT = (sys.executable, "-m", "lbtestbed.cli")
BASE = """
name = "speeds"
seed = 11
[[classes]]
name = "a"
count = 2
discipline = "fcfs"
[[classes]]
name = "b"
count = 1
discipline = "fcfs"
speed = 2
[workload]
load = 0.3
[policy]
name = "power_of_d"
d = 2
[run]
warmup = 10.0
duration = 90.0
"""


def doc(**class_a: Any) -> dict[str, Any]:
    d = tomllib.loads(BASE)
    d["classes"][0].update(class_a)
    return d


def changes_of(d: dict[str, Any]) -> list[tuple[float, int, float]]:
    return [(c.at, c.node, c.factor) for c in speed_changes(parse_spec(d))]


def close(got: Sequence[tuple[float, int, float]], want: Sequence[tuple[float, int, float]]) -> None:
    assert len(got) == len(want), got
    for g, w in zip(got, want, strict=True):
        assert g[1] == w[1] and g[0] == pytest.approx(w[0], abs=1e-12) and g[2] == pytest.approx(w[2]), (g, w)


# ================================================================================ schedules, by hand


def test_steps_apply_to_every_node_of_the_class_and_a_level_of_one_changes_nothing() -> None:
    d = doc(
        speed_schedule=[{"at": 10.0, "factor": 0.5}, {"at": 20.0, "factor": 2.0}, {"at": 30.0, "factor": 2}]
    )
    close(changes_of(d), [(10, 0, 0.5), (10, 1, 0.5), (20, 0, 2.0), (20, 1, 2.0)])
    d = doc(speed_schedule=[{"at": 5.0, "factor": 1.0}])
    assert changes_of(d) == []
    assert speed_varies(parse_spec(d)) is None


def test_a_ramp_is_the_staircase_of_its_means() -> None:
    """From 1 to 0.5 over [10, 20) in 5 steps of 2 s: the linear ramp's mean over each step, 0.95, 0.85,
    0.75, 0.65, 0.55, then 0.5 from 20 on."""
    d = doc(speed_schedule=[{"start": 10.0, "end": 20.0, "from": 1.0, "to": 0.5, "steps": 5}])
    want = [(t, 0, f) for t, f in ((10, 0.95), (12, 0.85), (14, 0.75), (16, 0.65), (18, 0.55), (20, 0.5))]
    close([c for c in changes_of(d) if c[1] == 0], want)


def test_a_ramp_without_from_starts_at_the_level_in_effect_and_defaults_to_ten_steps() -> None:
    """0.4 from t = 0 (before the warm-up ends), then a ramp to 0.8 over [10, 14) in 2 steps: 0.5 on
    [10, 12), 0.7 on [12, 14), 0.8 from 14; a default ramp has 10 steps (11 changes)."""
    d = doc(speed_schedule=[{"at": 0.0, "factor": 0.4}, {"start": 10.0, "end": 14.0, "to": 0.8, "steps": 2}])
    close([c for c in changes_of(d) if c[1] == 0], [(0, 0, 0.4), (10, 0, 0.5), (12, 0, 0.7), (14, 0, 0.8)])
    d = doc(speed_schedule=[{"start": 10.0, "end": 20.0, "to": 0.0 + 2.0}])
    got = [c for c in changes_of(d) if c[1] == 0]
    close(got, [(10 + j, 0, 1 + (j + 0.5) / 10) for j in range(10)] + [(20, 0, 2.0)])


def test_factors_multiply_with_a_slow_fault_and_a_node_may_have_its_own_schedule() -> None:
    """Class a: 0.5 from 10. Node 0 is also slowed to 0.25 over [15, 25): 0.125 there, 0.5 after. Node 1
    has its own schedule (3 from 40) instead of its class's; node 2 (class b) gets one with [[nodes]]."""
    d = doc(speed_schedule=[{"at": 10.0, "factor": 0.5}])
    d["faults"] = [{"kind": "slow", "node": 0, "speed": 0.25, "at": 15.0, "until": 25.0}]
    d["nodes"] = [
        {"node": 1, "speed_schedule": [{"at": 40.0, "factor": 3.0}]},
        {"node": 2, "speed_schedule": [{"at": 50.0, "factor": 0.2}]},
    ]
    close(changes_of(d), [(10, 0, 0.5), (15, 0, 0.125), (25, 0, 0.5), (40, 1, 3.0), (50, 2, 0.2)])
    d["nodes"] = [{"node": 1, "speed_schedule": []}]  # takes the class's away
    close(changes_of(d), [(10, 0, 0.5), (15, 0, 0.125), (25, 0, 0.5)])


def test_changes_of_one_node_at_one_instant_apply_together() -> None:
    """A step at the instant a ramp ends replaces its last level; a slow fault ending as a step begins
    gives one change."""
    d = doc(speed_schedule=[{"start": 0.0, "end": 10.0, "to": 0.5, "steps": 1}, {"at": 10.0, "factor": 0.25}])
    close([c for c in changes_of(d) if c[1] == 0], [(0, 0, 0.75), (10, 0, 0.25)])
    d = doc(speed_schedule=[{"at": 20.0, "factor": 0.5}])
    d["faults"] = [{"kind": "slow", "node": 0, "speed": 0.5, "at": 10.0, "until": 20.0}]
    assert [c for c in changes_of(d) if c[1] == 0] == [(10.0, 0, 0.5)]


# ================================================================================ antagonists


def law(
    seed: int, node: int, factor: float, mean_on: float, mean_off: float, horizon: float, rep: int = 0
) -> list[tuple[float, float]]:
    """docs/spec.md's antagonist, drawn from its stated stream: [(time, factor)] of node ``node``."""
    rng = random.Random(int(np.random.SeedSequence([seed, rep, 11, node]).generate_state(1)[0]))
    on = rng.random() < mean_on / (mean_on + mean_off)
    out = [(0.0, factor)] if on else []
    t = 0.0
    while True:
        t += rng.expovariate(1 / (mean_on if on else mean_off))
        if t >= horizon:
            return out
        on = not on
        out.append((t, factor if on else 1.0))


def test_an_antagonist_switches_as_its_law_says_on_its_own_stream() -> None:
    d = doc(antagonist={"factor": 0.25, "mean_on": 3.0, "mean_off": 5.0})
    exp = parse_spec(d)
    horizon = 10.0 + 2 * 90.0
    got = speed_changes(exp)
    for k in (0, 1):
        want = law(11, k, 0.25, 3.0, 5.0, horizon)
        assert len(want) > 20
        assert [(c.at, c.factor) for c in got if c.node == k] == want
    assert not [c for c in got if c.node == 2]  # class b has none
    # a node host draws its own nodes' alone: the same changes
    assert speed_changes(exp, nodes=[1, 2]) == tuple(c for c in got if c.node in (1, 2))
    # another replication draws another antagonist; the same replication the same one
    assert [(c.at, c.factor) for c in speed_changes(exp, 1) if c.node == 0] == law(
        11, 0, 0.25, 3, 5, horizon, 1
    )
    assert speed_changes(exp, 1) != got and speed_changes(exp) == got


def test_an_antagonist_times_a_schedule() -> None:
    """Schedule 0.5 from 30 on; the antagonist's factor 0.25 while on: the product at every instant."""
    d = doc(
        antagonist={"factor": 0.25, "mean_on": 3.0, "mean_off": 5.0},
        speed_schedule=[{"at": 30.0, "factor": 0.5}],
    )
    switches = law(11, 0, 0.25, 3.0, 5.0, 190.0)
    want: list[tuple[float, float]] = []
    events = sorted([(t, "a", f) for t, f in switches] + [(30.0, "s", 0.5)])
    level, a = 1.0, 1.0
    for t, kind, f in events:
        if kind == "s":
            level = f
        else:
            a = f
        want.append((t, level * a))
    got = [(c.at, c.factor) for c in speed_changes(parse_spec(d)) if c.node == 0]
    assert got == want


def test_over_a_long_horizon_an_antagonist_follows_its_law() -> None:
    """300 nodes, on for Exp(2), off for Exp(6), over [0, 800): the share of time on (1/4), the share of
    nodes on at time 0 (1/4: the stationary start) and the mean on and off periods (2, 6) lie within
    99.9 % confidence intervals (nodes are independent; exponential periods have sd = mean)."""
    d = doc(antagonist={"factor": 0.5, "mean_on": 2.0, "mean_off": 6.0}, count=300)
    d["run"] = {"warmup": 0.0, "duration": 400.0}
    exp = parse_spec(d)
    horizon = 800.0
    by_node: dict[int, list[SpeedChange]] = {}
    for c in speed_changes(exp):
        by_node.setdefault(c.node, []).append(c)
    z = 3.29
    shares: list[float] = []
    at_zero = 0
    periods: dict[float, list[float]] = {0.5: [], 1.0: []}
    for k in range(300):
        cs = by_node.get(k, [])
        on0 = bool(cs) and cs[0].at == 0.0
        at_zero += on0
        times = [0.0] + [c.at for c in cs if c.at > 0] + [horizon]
        states = [0.5 if on0 else 1.0] + [c.factor for c in cs if c.at > 0]
        on_time = sum(b - a for a, b, f in zip(times[:-1], times[1:], states, strict=True) if f == 0.5)
        shares.append(on_time / horizon)
        periods[0.5] += [
            b - a for a, b, f in zip(times[1:-2], times[2:-1], states[1:-1], strict=True) if f == 0.5
        ]
        periods[1.0] += [
            b - a for a, b, f in zip(times[1:-2], times[2:-1], states[1:-1], strict=True) if f == 1.0
        ]
    mean = float(np.mean(shares))
    assert abs(mean - 0.25) < z * float(np.std(shares, ddof=1)) / math.sqrt(300), mean
    assert abs(at_zero / 300 - 0.25) < z * math.sqrt(0.25 * 0.75 / 300), at_zero
    for factor, m in ((0.5, 2.0), (1.0, 6.0)):
        p = periods[factor]
        assert len(p) > 10_000
        assert abs(np.mean(p) - m) < z * m / math.sqrt(len(p)), (factor, np.mean(p))


# ================================================================================ the simulator


ONE_FCFS = """
name = "one-fcfs"
seed = 2
[[classes]]
name = "only"
count = 1
discipline = "fcfs"
speed_schedule = [{ at = 20.0, factor = 0.5 }, { start = 50.0, end = 70.0, to = 2.0, steps = 4 }]
[workload]
arrival_rate = 0.4
[policy]
name = "random"
[run]
warmup = 0.0
duration = 120.0
batches = 4
"""

#: ONE_FCFS's speed profile, by hand: (from, speed); the ramp from 0.5 to 2 in 4 steps of 5 s
PROFILE = [
    (0.0, 1.0),
    (20.0, 0.5),
    (50.0, 0.6875),
    (55.0, 1.0625),
    (60.0, 1.4375),
    (65.0, 1.8125),
    (70.0, 2.0),
]


def served(start: float, work: float) -> float:
    """When ``work`` begun at ``start`` is done under PROFILE."""
    t, left = start, work
    for i, (_, speed) in enumerate(PROFILE):
        until = PROFILE[i + 1][0] if i + 1 < len(PROFILE) else math.inf
        if until <= t:
            continue
        if left <= (until - t) * speed:
            return t + left / speed
        left -= (until - t) * speed
        t = until
    raise AssertionError


def test_the_simulator_serves_each_task_over_the_schedule() -> None:
    """One FCFS node with a step and a ramp: every sojourn is the Lindley recursion's over PROFILE (each
    task starts when it arrives or when the one before leaves, and is served at the speeds of the time)."""
    exp = parse_spec(tomllib.loads(ONE_FCFS))
    assert [(c.at, c.factor) for c in speed_changes(exp)] == PROFILE[1:]
    raw = Simulator(exp).run()
    workload = PoissonWorkload(exp)
    expected, free = [], 0.0
    while (task := workload.next())[0] < exp.run.duration:
        a, w = task
        free = served(max(a, free), w)
        expected.append(free - a)
    got = sorted(s for batch in raw.sojourns for s in batch)
    assert len(got) == len(expected) > 30
    assert got == pytest.approx(sorted(expected), rel=1e-9, abs=1e-12)


def speed_integral(a: float, b: float) -> float:
    """The integral of PROFILE's speed over [a, b)."""
    total = 0.0
    for i, (at, speed) in enumerate(PROFILE):
        until = PROFILE[i + 1][0] if i + 1 < len(PROFILE) else math.inf
        lo, hi = max(a, at), min(b, until)
        if hi > lo:
            total += (hi - lo) * speed
    return total


def test_idle_capacity_integrates_the_speed_the_node_had_while_idle() -> None:
    """ONE_FCFS's measured idle capacity is the integral of PROFILE's speed over the times the node held no
    task (from the Lindley recursion), batch by batch: the speed of each moment, not the speed at the end."""
    exp = parse_spec(tomllib.loads(ONE_FCFS))
    raw = Simulator(exp).run()
    workload = PoissonWorkload(exp)
    busy: list[tuple[float, float]] = []
    free = 0.0
    while (task := workload.next())[0] < exp.run.duration:
        a, w = task
        start = max(a, free)
        free = served(start, w)
        if busy and start == busy[-1][1]:
            busy[-1] = (busy[-1][0], free)
        else:
            busy.append((a, free))
    bounds = [30.0 * b for b in range(5)]
    num, den = raw.ratios["idle_capacity"]
    for b in range(4):
        lo, hi = bounds[b], bounds[b + 1]
        idle = speed_integral(lo, hi) - sum(
            speed_integral(max(lo, s), min(hi, e)) for s, e in busy if e > lo and s < hi
        )
        assert float(num[b]) == pytest.approx(idle, rel=1e-9), b
        assert float(den[b]) == pytest.approx(30.0)


@pytest.mark.parametrize("discipline", ["fcfs", "ps", "pool"])
def test_a_node_model_integrates_its_speed_while_idle(discipline: str) -> None:
    """Idle at speed 1 over [0, 2), at 0.5 over [2, 3); a task of work 1 from 3 to 5; idle at 0.5 over
    [5, 6) and at 2 over [6, 7): 2 + 0.5 + 0.5 + 2 = 5."""
    from lbtestbed.model.nodes import make_node
    from lbtestbed.model.workload import Task

    node = make_node(discipline, 1.0)
    node.set_speed(2.0, 0.5)
    node.arrive(Task(0, 1.0, 3.0), 3.0)
    assert node.next_completion() == pytest.approx(5.0)
    node.complete(5.0)
    node.set_speed(6.0, 2.0)
    node.advance(7.0)
    assert node.idle_capacity_seconds() == pytest.approx(5.0, rel=1e-12)
    assert node.time_at[0] == pytest.approx(5.0)


# ================================================================================ bad input


@pytest.mark.parametrize(
    ("change", "key", "says"),
    [
        ({"speed_schedule": 3}, "classes[0].speed_schedule", "must be an array"),
        ({"speed_schedule": [1.0]}, "classes[0].speed_schedule[0]", "must be a table"),
        ({"speed_schedule": [{"factor": 0.5}]}, "classes[0].speed_schedule[0].at", "missing"),
        ({"speed_schedule": [{"at": 1.0}]}, "classes[0].speed_schedule[0].factor", "missing"),
        ({"speed_schedule": [{"at": 1.0, "factor": 0}]}, "classes[0].speed_schedule[0].factor", "positive"),
        ({"speed_schedule": [{"at": -1.0, "factor": 2}]}, "classes[0].speed_schedule[0].at", "negative"),
        (
            {"speed_schedule": [{"at": 1.0, "factor": 2, "steps": 3}]},
            "classes[0].speed_schedule[0].steps",
            "unknown",
        ),
        (
            {"speed_schedule": [{"start": 5.0, "end": 5.0, "to": 2}]},
            "classes[0].speed_schedule[0].end",
            "after",
        ),
        ({"speed_schedule": [{"start": 1.0, "end": 5.0}]}, "classes[0].speed_schedule[0].to", "missing"),
        (
            {"speed_schedule": [{"start": 1.0, "end": 5.0, "to": 2, "steps": 0}]},
            "classes[0].speed_schedule[0].steps",
            "at least 1",
        ),
        (
            {"speed_schedule": [{"at": 5.0, "factor": 2}, {"at": 3.0, "factor": 1}]},
            "classes[0].speed_schedule[1].at",
            "previous",
        ),
        (
            {"speed_schedule": [{"start": 0.0, "end": 10.0, "to": 2}, {"at": 5.0, "factor": 1}]},
            "classes[0].speed_schedule[1].at",
            "previous",
        ),
        (
            {"speed_schedule": [{"at": 100.5, "factor": 2}]},
            "classes[0].speed_schedule[0].at",
            "within the run",
        ),
        (
            {"speed_schedule": [{"start": 50.0, "end": 101.0, "to": 2}]},
            "classes[0].speed_schedule[0].end",
            "within the run",
        ),
        ({"antagonist": 0.5}, "classes[0].antagonist", "must be a table"),
        ({"antagonist": {"factor": 0.5, "mean_on": 1.0}}, "classes[0].antagonist.mean_off", "missing"),
        (
            {"antagonist": {"factor": 0.5, "mean_on": 1.0, "mean_off": 0}},
            "classes[0].antagonist.mean_off",
            "positive",
        ),
        (
            {"antagonist": {"factor": 0.5, "mean_on": 1, "mean_off": 1, "on": 1}},
            "classes[0].antagonist.on",
            "unknown",
        ),
        (
            {"antagonist": {"factor": 0.5, "mean_on": 1e-5, "mean_off": 1e-5}},
            "classes[0].antagonist",
            "speed changes",
        ),
        # class a (two nodes of speed 1) is on 99 % of the time at a tenth of its speed: its long-run
        # speed is 0.109 each; with b's 2 the nodes serve 2.218 < the 2.4 of load 0.8
        ({"antagonist": {"factor": 0.1, "mean_on": 99, "mean_off": 1}, "load": 0.8}, "workload", "long run"),
    ],
)
def test_a_bad_schedule_or_antagonist_is_one_line_naming_its_key(
    change: dict[str, Any], key: str, says: str
) -> None:
    d = doc(**{k: v for k, v in change.items() if k != "load"})
    if "load" in change:
        d["workload"]["load"] = change["load"]
    with pytest.raises(SpecError) as err:
        parse_spec(d, "s.toml")
    assert err.value.key == key and says in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("nodes", "key", "says"),
    [
        (
            [{"node": 3, "antagonist": {"factor": 0.5, "mean_on": 1, "mean_off": 1}}],
            "nodes[0].node",
            "at most 2",
        ),
        ([{"node": 1}], "nodes[0].speed_schedule", "missing"),
        ([{"node": 1, "speed": 2}], "nodes[0].speed", "unknown"),
        (
            [{"node": 1, "speed_schedule": []}, {"node": 1, "speed_schedule": []}],
            "nodes[1].node",
            "another [[nodes]]",
        ),
        ({"node": 1}, "nodes", "array of [[nodes]]"),
    ],
)
def test_a_bad_nodes_table_is_one_line_naming_its_key(nodes: Any, key: str, says: str) -> None:
    d = doc()
    d["nodes"] = nodes
    with pytest.raises(SpecError) as err:
        parse_spec(d, "s.toml")
    assert err.value.key == key and says in str(err.value), str(err.value)


def test_lbt_refuses_a_bad_schedule_with_exit_code_2_and_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(BASE.replace('name = "a"\n', 'name = "a"\nspeed_schedule = [{ at = 5.0 }]\n'))
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "simulate", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.strip().count("\n") == 0 and "classes[0].speed_schedule[0].factor: missing" in proc.stderr
    )


# ================================================================================ theory and warnings


def test_the_theory_withholds_every_value_but_a_fixed_message_count() -> None:
    d = doc(antagonist={"factor": 0.5, "mean_on": 3.0, "mean_off": 5.0})
    r = predict(parse_spec(d))
    assert r.metrics["messages_per_task"]["value"] == 4.0  # 2d: d probes, d replies, whatever the speeds
    for name, m in r.metrics.items():
        if name not in ("messages_per_task", "occupancy_tail"):
            assert m["value"] is None, name
    assert all(not tail for tail in r.metrics["occupancy_tail"].values())
    nulls = {n["metric"]: n["null"] for n in r.extras["notes"] if "null" in n}
    assert (
        "classes[0].antagonist" in nulls["mean_sojourn"] and "constant node speeds" in nulls["mean_sojourn"]
    )
    # JIQ's tokens per task assume a stationary load: withheld too
    d["policy"] = {"name": "jiq"}
    assert predict(parse_spec(d)).metrics["messages_per_task"]["value"] is None
    # an antagonist of factor 1 changes nothing: the theory applies as without it
    d = doc(antagonist={"factor": 1.0, "mean_on": 3.0, "mean_off": 5.0})
    d["classes"][1]["speed"] = 1
    assert predict(parse_spec(d)).metrics["mean_sojourn"]["value"] is not None


def test_lbt_run_warns_when_a_speed_factor_falls_below_the_outlier_share() -> None:
    d = doc(antagonist={"factor": 0.4, "mean_on": 3.0, "mean_off": 5.0})
    text = ejection_warning(parse_spec(d))
    assert text is not None and "0.4 of its speed" in text and "slow_share = 0.5" in text
    d["health"] = {"slow_share": 0.0}
    assert ejection_warning(parse_spec(d)) is None
    assert (
        ejection_warning(parse_spec(doc(antagonist={"factor": 0.6, "mean_on": 3.0, "mean_off": 5.0}))) is None
    )


# ================================================================================ lbt run on a cluster

RUN_SPEC = """
name = "speeds-run"
seed = 7
[[classes]]
name = "fast"
count = 3
discipline = "fcfs"
speed = 2.0
speed_schedule = [{ at = 0.0, factor = 0.5 }, { start = 40.0, end = 80.0, to = 1.0, steps = 4 }]
[[classes]]
name = "slow"
count = 3
discipline = "fcfs"
speed = 1.0
antagonist = { factor = 0.4, mean_on = 10.0, mean_off = 20.0 }
[[nodes]]
node = 5
speed_schedule = [{ at = 5.0, factor = 1.5 }]
[workload]
load = 0.6
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "power_of_d"
d = 2
[run]
warmup = 10.0
duration = 100.0
time_scale = 0.25
batches = 10
[health]
slow_share = 0.0
"""

#: model seconds around a task's stay within which a speed change of its node makes it ambiguous (the node
#: host's clock and the legs' stamps differ from the run's model time by well under this)
MARGIN = 0.05


def test_lbt_run_applies_schedules_and_antagonists_and_agrees_with_its_twin(tmp_path: Path) -> None:
    """A step at model time 0 and a ramp on the fast class, an antagonist on the slow class, node 5's own
    step at 5 (before the warm-up ends), on two node processes. Every task that did not wait and saw no
    speed change while at its node stayed exactly work / (speed x factor at its arrival): the node hosts
    applied the profile from the run's origin. The cluster agrees with its twin, paired batch by batch
    (the twin applies the same changes to the same tasks); the theory gives no sojourn."""
    from test_run import lbt_run, paired_by_hand, verdict

    spec = tmp_path / "spec.toml"
    spec.write_text(RUN_SPEC)
    exp = parse_spec(tomllib.loads(RUN_SPEC))
    rc, out, err = lbt_run(spec, tmp_path / "report", "--node-processes", "2")
    assert rc in (0, 1), err
    load = out["results"]["cluster"]["load"]
    assert load["completed"] == load["scheduled"], load

    # the profile each node served at, per task (fcfs, did not wait: stay = work / speed exactly)
    changes = speed_changes(exp)
    by_node: dict[int, list[SpeedChange]] = {}
    for c in changes:
        by_node.setdefault(c.node, []).append(c)
    # the schedule's levels by hand for the fast class; node 5's own step; the slow class's antagonist as
    # its law gives it (checked above against an independent draw)
    fast = [(0.0, 0.5), (40.0, 0.5625), (50.0, 0.6875), (60.0, 0.8125), (70.0, 0.9375), (80.0, 1.0)]
    for k in (0, 1, 2):
        assert [(c.at, c.factor) for c in by_node[k]] == fast
    # node 5: its own step to 1.5 at 5 replaces its class's schedule (none); its class's antagonist stays
    assert {c.factor for c in by_node[5] if c.at >= 5.0} == {1.5, 1.5 * 0.4}
    assert {c.factor for k in (3, 4) for c in by_node[k]} == {0.4, 1.0}

    def factor_at(k: int, t: float) -> float:
        f = 1.0
        for c in by_node.get(k, []):
            if c.at <= t:
                f = c.factor
        return f

    with open(tmp_path / "report" / "tasks.csv") as f:
        rows = list(csv.DictReader(f))
    checked: dict[int, set[float]] = {}
    for r in rows:
        if r["waited"] != "0":
            continue
        k = int(r["node"])
        arrival = float(r["t"]) + float(r["arrive"]) + float(r["decide"]) + float(r["forward"])
        stay, work = float(r["stay"]), float(r["work"])
        if any(arrival - MARGIN <= c.at <= arrival + stay + MARGIN for c in by_node.get(k, [])):
            continue
        factor = factor_at(k, arrival)
        assert stay == pytest.approx(work / (exp.node_speeds[k] * factor), rel=1e-6), (r, factor)
        checked.setdefault(k, set()).add(factor)
    assert set(checked) == set(range(6))
    assert all(len(checked[k]) >= 3 for k in (0, 1, 2)), checked  # several steps of the ramp
    assert all(len(checked[k]) >= 2 for k in (3, 4)), checked  # the antagonist on and off

    for metric in ("mean_sojourn", "messages_per_task"):
        v = verdict(out, metric)
        assert v["paired"] and v["counts"] and v["verdict"] == "agrees", v
        mean, _, df = paired_by_hand(out, metric, "cluster", "twin")
        assert v["df"] == df == 9
        assert v["relative"] == pytest.approx(math.expm1(mean), rel=1e-9, abs=1e-12)
    theory = out["results"]["theory"]["metrics"]
    assert theory["mean_sojourn"]["value"] is None and theory["messages_per_task"]["value"] == 4.0


def test_lbt_load_warns_that_it_sets_no_clock_for_the_speed_changes(tmp_path: Path) -> None:
    """lbt load sends no run origin, so the node hosts apply no schedules or antagonists: it says so (and
    says nothing when the spec has none)."""
    for antagonist, warned in (
        ("antagonist = { factor = 0.5, mean_on = 1.0, mean_off = 3.0 }\n", True),
        ("", False),
    ):
        spec = tmp_path / "s.toml"
        spec.write_text(BASE.replace('name = "a"\n', f'name = "a"\n{antagonist}'))
        proc = subprocess.run(
            [*LBT, "load", str(spec), "--dispatcher", "http://127.0.0.1:9", "--duration", "1", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 2, proc.stderr
        said = "lbt: warning: classes[0].antagonist changes the speed" in proc.stderr
        assert said == warned and ("does not set the run's clock" in proc.stderr) == warned, proc.stderr


def test_a_node_host_maps_the_run_clock_through_the_monotonic_clock_when_it_can() -> None:
    """ONE_FCFS's step at 20 on a host started at monotonic 50 (Unix 1e6): with the origin at monotonic 57
    the step is due at the host's model time 27; given in Unix time only (1e6 + 10), at 30."""
    import asyncio

    from lbtestbed.model.nodes import make_node
    from lbtestbed.server_node.host import NodeHost
    from lbtestbed.transport.process import machine

    exp = parse_spec(tomllib.loads(ONE_FCFS))
    loop = asyncio.new_event_loop()
    try:
        for monotonic, due in ((57.0, 27.0), (0.0, 30.0)):
            host = NodeHost(exp, [0], ["http://127.0.0.1:9"], "token")
            host.loop, host.t0, host.t0_unix = loop, 50.0, 1e6
            host.now = lambda: 0.0  # type: ignore[method-assign]
            host.models[0] = make_node("fcfs", 1.0)
            assert host.set_origin(1e6 + 10.0, monotonic) == 6  # the step and the ramp's five levels
            assert host.core.changes[0][0] == (due, 0.5)
            loop.run_until_complete(host.stop())  # its completion alarms
    finally:
        loop.close()
    assert len(machine()) == 36  # a Linux boot id: a UUID
