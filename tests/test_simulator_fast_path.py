"""The simulator's fast path for power-of-d changes nothing but speed.

``PowerOfDDispatcher.instant_probe`` fuses ``dispatch`` and ``resolve`` for a driver whose probes are
answered at once, and the kernel's loop routes by it in place of its general arrival handler. Both must
give exactly what the general path gives, to the last bit: the same random draws in the same order, the
same node for every task, the same measurements. These tests compare the two paths on the same seeds
(each side is the other's oracle, so no expected value comes from either), and pin the node-model promise
the fast path relies on: a task that waits leaves ``next_completion()`` alone.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.model.nodes import make_node
from lbtestbed.model.workload import Task
from lbtestbed.policies import Probe, make_dispatcher
from lbtestbed.policies.sampling import PowerOfDDispatcher
from lbtestbed.spec import parse_spec


def spec(
    classes: list[dict[str, Any]],
    policy: dict[str, Any],
    *,
    load: float = 0.9,
    service: dict[str, Any] | None = None,
    duration: float = 60.0,
) -> dict[str, Any]:
    return {
        "name": "fast-path",
        "seed": 3,
        "classes": classes,
        "workload": {"load": load, "service": service or {"dist": "exponential", "mean": 1.0}},
        "policy": policy,
        "run": {"warmup": 5.0, "duration": duration, "batches": 10},
    }


def fcfs(count: int, name: str = "q", speed: Any = 1) -> dict[str, Any]:
    return {"name": name, "count": count, "discipline": "fcfs", "speed": speed}


# ------------------------------------------------------------------------------------ the policy


@pytest.mark.parametrize(
    ("n", "d", "replace"),
    [
        (10, 1, False),
        (10, 2, False),
        (1000, 2, False),
        (10, 3, False),
        (9, 3, True),
        (12, 5, False),
        (6, 6, False),
    ],
)
def test_instant_probe_picks_what_dispatch_and_resolve_pick(n: int, d: int, replace: bool) -> None:
    """Two dispatchers on equal seeds, one driven through Probe/resolve and one through pick(), over
    occupancies that change between tasks (with many ties): every choice and the generator's state agree."""
    exp = parse_spec(spec([fcfs(n)], {"name": "power_of_d", "d": d, "replace": replace}))
    slow = make_dispatcher(exp, random.Random(11))
    fast = make_dispatcher(exp, random.Random(11))
    assert isinstance(fast, PowerOfDDispatcher)
    occupancy = [0] * n
    instant = fast.instant_probe(occupancy)
    assert instant is not None and instant.probes == d and instant.outcome == "probed"
    states = random.Random(5)
    for _ in range(3000):
        for k in range(n):  # small occupancies: ties are common, which is where a tie-break could differ
            occupancy[k] = states.randrange(4)
        probe = slow.dispatch()
        assert isinstance(probe, Probe)
        route = slow.resolve(probe, [occupancy[k] for k in probe.nodes])
        assert instant.pick() == route.node
        assert route.outcome == instant.outcome
    assert slow.rng.getstate() == fast.rng.getstate()


@pytest.mark.parametrize("tie_break", ["fastest", "slowest"])
def test_instant_probe_leaves_speed_ties_to_the_general_path(tie_break: str) -> None:
    exp = parse_spec(spec([fcfs(4)], {"name": "power_of_d", "d": 2, "tie_break": tie_break}))
    disp = make_dispatcher(exp, random.Random(1))
    assert isinstance(disp, PowerOfDDispatcher)
    assert disp.instant_probe([0] * 4) is None


# ------------------------------------------------------------------------------------ the simulator


def run(spec_dict: dict[str, Any], fast: bool) -> tuple[Simulator, RawRun]:
    sim = Simulator(parse_spec(spec_dict))
    if not fast:
        sim.dispatcher.instant_probe = lambda occupancy: None  # type: ignore[attr-defined]
    return sim, sim.run()


def assert_same_run(a: RawRun, b: RawRun) -> None:
    assert a.ratios.keys() == b.ratios.keys()
    for key, (num, den) in a.ratios.items():
        # bitwise: the same floats, not merely close ones
        assert num.tobytes() == b.ratios[key][0].tobytes(), key
        assert den.tobytes() == b.ratios[key][1].tobytes(), key
    assert a.sojourns == b.sojourns
    assert list(a.decisions.items()) == list(b.decisions.items())
    assert (a.events, a.censored, a.message_kinds) == (b.events, b.censored, b.message_kinds)


CASES = {
    "fcfs_1000": spec([fcfs(1000)], {"name": "power_of_d", "d": 2}, duration=8.0),
    "fcfs_d3_replace": spec([fcfs(30)], {"name": "power_of_d", "d": 3, "replace": True}),
    "two_classes_fcfs_ps": spec(
        [
            fcfs(20, "slow", 1),
            {
                "name": "fast",
                "count": 10,
                "discipline": "ps",
                "speed": {"dist": "uniform", "low": 1.5, "high": 2.5},
            },
        ],
        {"name": "power_of_d", "d": 2},
    ),
    "pools_deterministic": spec(
        [{"name": "p", "count": 20, "discipline": "pool"}],
        {"name": "power_of_d", "d": 2},
        load=3.0,
        service={"dist": "deterministic", "mean": 1.0},
    ),
    "ps_hyperexponential": spec(
        [{"name": "q", "count": 25, "discipline": "ps"}],
        {"name": "power_of_d", "d": 2},
        service={"dist": "hyperexponential", "mean": 1.0, "scv": 4.0},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_gives_the_general_paths_run(case: str) -> None:
    fast_sim, fast = run(CASES[case], fast=True)
    slow_sim, slow = run(CASES[case], fast=False)
    assert fast.events > 1000 and sum(len(s) for s in fast.sojourns) > 500  # the window saw real work
    assert_same_run(fast, slow)
    assert fast_sim.now == slow_sim.now
    assert fast_sim.measure.in_system == slow_sim.measure.in_system
    assert fast_sim.measure.msg_counts == slow_sim.measure.msg_counts
    assert fast_sim.measure.sojourn_class == slow_sim.measure.sojourn_class


def test_the_fast_path_is_taken() -> None:
    """Guards the comparison above: the fast side really routes by the instant probe's ``pick``, the
    other by ``dispatch`` and ``resolve``."""
    calls: list[str] = []
    for fast in (True, False):
        sim = Simulator(parse_spec(CASES["fcfs_d3_replace"]))
        disp = sim.dispatcher
        assert isinstance(disp, PowerOfDDispatcher)
        instant_probe, dispatch = disp.instant_probe, disp.dispatch

        def spied(occupancy: Any, instant_probe: Any = instant_probe) -> Any:
            fast_path = instant_probe(occupancy)

            def pick() -> int:
                calls.append("pick")
                return int(fast_path.pick())

            return fast_path._replace(pick=pick)

        def spied_dispatch(dispatch: Any = dispatch) -> Any:
            calls.append("dispatch")
            return dispatch()

        disp.instant_probe = spied if fast else (lambda occupancy: None)  # type: ignore[method-assign]
        disp.dispatch = spied_dispatch  # type: ignore[method-assign]
        sim.run()
        calls.append("end")
    assert (
        calls[0] == "pick"
        and calls[calls.index("end") - 1] == "pick"
        and "dispatch" not in calls[: calls.index("end")]
    )
    second = calls[calls.index("end") + 1 : -1]
    assert second and set(second) == {"dispatch"}


# ---------------------------------------------------------------------------------- node models


@pytest.mark.parametrize("discipline", ["fcfs", "ps", "pool"])
def test_a_waiting_task_leaves_the_next_completion_alone(discipline: str) -> None:
    """NodeModel.arrive's promise: when it returns True the next completion has not moved (the fast loop
    then does not ask). Random arrivals and completions, speed 1.5."""
    node = make_node(discipline, 1.5)
    rng = np.random.default_rng(4)
    now, waited, tasks = 0.0, 0, 0
    for _ in range(5000):
        nxt = node.next_completion()
        gap = float(rng.exponential(0.5))
        if now + gap < nxt:
            now += gap
            tasks += 1
            before = node.next_completion()
            if node.arrive(Task(tasks, float(rng.exponential(1.0)), now), now):
                waited += 1
                assert node.next_completion() == before
        else:
            now = nxt
            node.complete(now)
    if discipline == "fcfs":
        assert waited > 1000  # the promise was exercised
    else:
        assert waited == 0  # nobody waits in a pool or under processor sharing
