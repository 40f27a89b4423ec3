"""The rates kernel (``lbtestbed/analysis/simulator/rates.py``; docs/simulator.md, "The rates kernel").

It draws other random numbers than the event kernel, so the two are compared in distribution: for each
spec, ``REPS`` independent replications of each kernel (fixed seeds), paired by replication (a pair shares
its arrival times: the spec's stream, which both kernels read), and every metric's mean difference must lie
within ``Z`` standard errors of 0 (the paired t statistic). Two controls show that the comparison can
fail: the rates kernel on a spec 5 % more loaded, and one that lets a PS node's tasks leave in arrival
order (the same counts, other sojourns). Beside it, an exact formula (M/M/1), the refusals, and the
CLI's one line.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.simulator.rates import RatesSimulator, Unsupported, unsupported
from lbtestbed.experiment.errors import BadInput
from lbtestbed.experiment.simulate import simulate
from lbtestbed.spec import parse_spec

#: replications of each kernel per spec, and the largest mean difference in standard errors: under the null
#: a comparison exceeds 4 with probability 6e-4 (Student's t, 23 degrees of freedom); the metrics of a spec
#: move together, so the chance that any of a case's comparisons does is of that order, not 15 times it;
#: the seeds are fixed, so a pass is a pass for good
REPS = 24
Z = 4.0

FCFS = [{"name": "q", "count": 20, "discipline": "fcfs"}]
BASE: dict[str, Any] = {
    "name": "rates",
    "seed": 11,
    "classes": FCFS,
    "workload": {"load": 0.9},
    "run": {"warmup": 20.0, "duration": 200.0, "batches": 10},
}
#: the paths of the kernel: the instant probe (power_of_d), node messages (jiq's tokens, jsq's departure
#: notices), task ends heard by the dispatcher (least_request: FCFS tasks followed to their end; peak_ewma,
#: whose dispatcher reads the clock too), two classes of other speeds and disciplines (a PS class: its
#: departures chosen among its tasks)
CASES: dict[str, dict[str, Any]] = {
    "power_of_d": {"policy": {"name": "power_of_d", "d": 2}},
    "jiq": {"policy": {"name": "jiq"}},
    "jsq": {"policy": {"name": "jsq"}},
    "least_request": {"policy": {"name": "least_request"}},
    "peak_ewma": {"policy": {"name": "peak_ewma"}},
    "two_classes_ps": {
        "policy": {"name": "power_of_d", "d": 2},
        "classes": [
            {"name": "q", "count": 14, "discipline": "fcfs"},
            {"name": "p", "count": 6, "discipline": "ps", "speed": 2},
        ],
    },
}


def metrics(raw: RawRun, classes: int) -> dict[str, float]:
    """One run's whole-window values: every ratio of the metrics both kernels claim, and the 90th and 99th
    percentiles of the sojourns."""
    out: dict[str, float] = {}
    keys = ["mean_sojourn", "mean_tasks_per_node", "tasks_in_system", "idle_nodes", "messages_per_task"]
    keys += [k for k in ("wait_probability", "idle_capacity") if k in raw.ratios]
    keys += [f"sojourn:{c}" for c in range(classes)] + [
        f"tail:{c}:{j}" for c in range(classes) for j in (1, 3)
    ]
    for key in keys:
        if key not in raw.ratios:  # a tail no node reached in this run: no time there
            out[key] = 0.0
            continue
        num, den = raw.ratios[key]
        out[key] = float(num.sum() / den.sum())
    sojourns = np.concatenate([np.asarray(b) for b in raw.sojourns])
    out["p90"], out["p99"] = (float(q) for q in np.quantile(sojourns, [0.9, 0.99]))
    return out


def replications(make: Callable[[int], RawRun], classes: int) -> dict[str, list[float]]:
    runs = [metrics(make(r), classes) for r in range(REPS)]
    return {key: [m[key] for m in runs] for key in runs[0]}


def distances(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, float]:
    """Per metric, the mean of the paired differences a_r - b_r in standard errors; 0 where every
    difference is 0 (the messages of a policy that sends a fixed number per task)."""
    out = {}
    for key, xs in a.items():
        d = np.array(xs) - np.array(b[key])
        se = float(np.std(d, ddof=1)) / math.sqrt(len(d))
        diff = float(np.mean(d))
        out[key] = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return out


def spec(case: str, **changes: Any) -> dict[str, Any]:
    return {**BASE, **CASES[case], **changes}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_rates_kernel_agrees_with_the_event_kernel(case: str) -> None:
    exp = parse_spec(spec(case))
    classes = len(exp.classes)
    rates = replications(lambda r: RatesSimulator(exp, r).run(), classes)
    events = replications(lambda r: Simulator(exp, r).run(), classes)
    far = {k: round(z, 2) for k, z in distances(rates, events).items() if abs(z) > Z}
    assert not far, f"{case}: metrics more than {Z} standard errors apart: {far}"


@pytest.mark.slow
def test_the_comparison_tells_a_load_5_percent_off() -> None:
    """The control: the rates kernel on a spec 5 % more loaded is told from the event kernel."""
    exp = parse_spec(spec("power_of_d"))
    slower = parse_spec(spec("power_of_d", workload={"load": 0.9 * 1.05}))
    rates = replications(lambda r: RatesSimulator(slower, r).run(), 1)
    events = replications(lambda r: Simulator(exp, r).run(), 1)
    z = distances(rates, events)
    assert z["mean_sojourn"] > Z and z["mean_tasks_per_node"] > Z


@pytest.mark.slow
def test_the_comparison_tells_ps_departures_in_arrival_order() -> None:
    """The control of the sojourns: PS and FCFS nodes hold the same counts in law, so only the sojourns'
    spread tells a PS node whose tasks left first come, first served; the comparison does."""
    exp = parse_spec(spec("power_of_d", classes=[{"name": "p", "count": 20, "discipline": "ps"}]))

    def in_order(r: int) -> RawRun:
        sim = RatesSimulator(exp, r)
        sim.fifo = [True]  # the wrong rule: the first task leaves (its sojourn is followed all the same)
        return sim.run()

    wrong = replications(in_order, 1)
    events = replications(lambda r: Simulator(exp, r).run(), 1)
    z = distances(wrong, events)
    assert abs(z["mean_tasks_per_node"]) < Z  # the counts agree ...
    assert z["p99"] < -Z  # ... the sojourns' tail does not: first come, first served cuts it


@pytest.mark.parametrize("discipline", ["fcfs", "ps"])
def test_mm1_mean_sojourn_and_tasks(discipline: str) -> None:
    """One node at load 1/2: E[N] = rho / (1 - rho) = 1 and E[T] = 1 / (mu - lambda) = 2 under either
    discipline, the wait probability rho (Kleinrock, Queueing Systems I, 1975, section 3.2). The estimates
    of 12 replications lie within 4 standard errors of them."""
    exp = parse_spec(
        {
            "name": "mm1",
            "seed": 3,
            "classes": [{"name": "q", "count": 1, "discipline": discipline}],
            "workload": {"load": 0.5},
            "policy": {"name": "random"},
            "run": {"warmup": 50.0, "duration": 2000.0},
        }
    )
    runs = [metrics(RatesSimulator(exp, r).run(), 1) for r in range(12)]
    exact = {"mean_sojourn": 2.0, "mean_tasks_per_node": 1.0}
    if discipline == "fcfs":
        exact["wait_probability"] = 0.5
    for key, value in exact.items():
        xs = [m[key] for m in runs]
        se = float(np.std(xs, ddof=1)) / math.sqrt(len(xs))
        assert abs(float(np.mean(xs)) - value) < Z * se, (key, np.mean(xs), se)


def test_a_run_is_its_seed() -> None:
    """The same seed and replication give the same run; another replication another one."""
    exp = parse_spec(spec("jiq"))
    a, b, c = (RatesSimulator(exp, r).run() for r in (0, 0, 1))
    assert [list(s) for s in a.sojourns] == [list(s) for s in b.sojourns] != [list(s) for s in c.sojourns]


def test_simulate_once_runs_the_kernel_asked_for() -> None:
    exp = parse_spec(spec("power_of_d", run={"warmup": 2.0, "duration": 10.0, "batches": 4}))
    rates = simulate_once(exp, 0, None, "rates")
    assert [list(s) for s in rates.sojourns] == [list(s) for s in RatesSimulator(exp).run().sojourns]
    assert [list(s) for s in simulate_once(exp).sojourns] != [list(s) for s in rates.sojourns]


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "deterministic": (
        {"workload": {"load": 0.9, "service": {"dist": "deterministic", "mean": 1.0}}},
        "workload.service is deterministic(mean=1): it needs exponential work",
    ),
    "pool": (
        {"classes": [{"name": "p", "count": 4, "discipline": "pool"}], "workload": {"load": 2.0}},
        "classes[0] ('p') is a pool: it serves fcfs and ps nodes",
    ),
    "speeds_drawn": (
        {
            "classes": [
                {
                    "name": "q",
                    "count": 4,
                    "discipline": "fcfs",
                    "speed": {"dist": "uniform", "low": 0.5, "high": 1.5},
                }
            ]
        },
        "classes[0] ('q') draws each node's speed (uniform(0.5, 1.5)): it needs one per class",
    ),
    "delay": ({"network": {"delay": 0.01}}, "network.delay: its messages and probes arrive at once"),
    "faults": (
        {"faults": [{"kind": "kill", "node": 0, "at": 30.0, "until": 40.0}]},
        "the spec injects faults (kill first)",
    ),
    "dispatchers": ({"policy": {"name": "jiq", "dispatchers": 2}}, "policy.dispatchers = 2: it drives one"),
    "timer": ({"policy": {"name": "sparse_jsq"}}, "sparse_jsq's nodes speak on a timer of their own"),
    "latency": ({"policy": {"name": "prequal"}}, "prequal's nodes learn each task's latency at the node"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_spec_it_cannot_simulate_exactly_is_refused(case: str) -> None:
    changes, reason = REFUSED[case]
    exp = parse_spec({**BASE, "policy": {"name": "power_of_d"}, **changes})
    assert (unsupported(exp) or "").startswith(reason)
    with pytest.raises(Unsupported):
        RatesSimulator(exp)
    with pytest.raises(BadInput, match=r"^--kernel rates: "):
        simulate(exp, kernel="rates", quiet=True)


def test_a_kernel_that_does_not_exist_is_refused() -> None:
    """lbt.simulate(kernel="rate") ran the event kernel: a misspelt kernel is bad input, not a default."""
    with pytest.raises(BadInput, match=r"^kernel 'rate': one of events, rates$"):
        simulate(parse_spec(spec("power_of_d")), kernel="rate", quiet=True)


def test_records_need_the_event_kernel(tmp_path: Path) -> None:
    exp = parse_spec(spec("power_of_d"))
    with (
        open(tmp_path / "r.csv", "w") as f,
        pytest.raises(BadInput, match="--records needs the event kernel"),
    ):
        simulate(exp, kernel="rates", records=f, quiet=True)


def test_cli_refuses_a_non_markovian_spec_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "x"\n[[classes]]\nname = "q"\ncount = 4\ndiscipline = "fcfs"\n'
        '[workload]\nload = 0.5\nservice = { dist = "lognormal", mean = 1.0, scv = 4.0 }\n'
        '[policy]\nname = "power_of_d"\n[run]\nduration = 5.0\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "simulate", str(path), "--kernel", "rates", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "LBT_SIMULATOR": "python"},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "lbt: error: --kernel rates: workload.service is lognormal(mean=1, scv=4): it needs exponential work"
    ), lines


def test_cli_runs_the_rates_kernel(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "x"\n[[classes]]\nname = "q"\ncount = 4\ndiscipline = "fcfs"\n'
        '[workload]\nload = 0.5\n[policy]\nname = "jiq"\n[run]\nduration = 20.0\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtestbed.cli",
            "simulate",
            str(path),
            "--kernel",
            "rates",
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "LBT_SIMULATOR": "python"},
    )
    assert proc.returncode == 0, proc.stderr
    assert '"kernel": "rates"' in proc.stdout
