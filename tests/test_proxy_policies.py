"""The policies production proxies run, and the clock and latencies their dispatcher sides read.

``DispatcherSide.now`` and ``on_task_done(node, latency)`` (policies/base.py): the dispatcher process sets
the clock before each call and measures a task's latency from its forwarding to its answer.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from lbtestbed.dispatcher.app import build_app as build_dispatcher_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.policies.base import Route
from lbtestbed.policies.edf import EdfScheduler
from lbtestbed.policies.peak_ewma import PeakEwmaDispatcher
from lbtestbed.policies.sampling import LeastRequestDispatcher
from lbtestbed.server_node.app import build_app as build_node_app
from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import parse_spec

TOKEN = "test-token"
NOWHERE = "http://127.0.0.1:1"


class ClockedLeastRequest(LeastRequestDispatcher):
    """least_request reading the clock, recording what its driver tells it (also test_simulator's)."""

    uses_clock = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.dispatched: list[float] = []
        self.done: list[tuple[float, float]] = []  # (now, latency)

    def dispatch(self) -> Any:
        self.dispatched.append(self.now)
        return super().dispatch()

    def on_task_done(self, node: int, latency: float) -> None:
        self.done.append((self.now, latency))
        super().on_task_done(node, latency)


async def test_the_dispatcher_process_tells_a_clocked_side_the_time_and_the_latency() -> None:
    """One task of work 2 on an idle FCFS node of speed 1 (20 ms of wall time per model second): it
    stays 2 model seconds at the node, so its latency at the dispatcher is at least 2 and at most the
    sojourn the dispatcher reports (which also holds the decision); the clock advanced by the latency."""
    exp = parse_spec(
        {
            "name": "clock",
            "seed": 1,
            "classes": [{"name": "s", "count": 1, "discipline": "fcfs"}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "least_request", "d": 1},
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.02},
        }
    )
    node_host = NodeHost(exp, [0], [NOWHERE], TOKEN)
    servers: list[TestServer] = []
    try:
        servers.append(TestServer(build_node_app(node_host), host="127.0.0.1"))
        await servers[-1].start_server()
        disp = DispatcherHost(exp, 0, 1, [f"http://127.0.0.1:{servers[0].port}/v1/nodes/0"], TOKEN)
        side = disp.policy = ClockedLeastRequest(exp, disp.policy.rng, 0)
        servers.append(TestServer(build_dispatcher_app(disp), host="127.0.0.1"))
        await servers[-1].start_server()
        before = (time.monotonic() - disp.started) / exp.run.time_scale
        await disp.ready.wait()
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{servers[-1].port}/v1/tasks"
            async with session.post(url, json={"work": 2.0}) as resp:
                assert resp.status == 200
                answer = await resp.json()
        after = (time.monotonic() - disp.started) / exp.run.time_scale
    finally:
        for server in servers:
            await server.close()
    assert len(side.dispatched) == 1 and len(side.done) == 1
    (t0,), ((t1, latency),) = side.dispatched, side.done
    assert before <= t0 <= t1 <= after  # model seconds since the dispatcher started
    assert 2.0 <= latency <= answer["sojourn"]
    assert t1 - t0 >= latency - 1e-9  # the task was forwarded after its dispatch call


def test_a_side_that_keeps_no_time_is_not_told_it() -> None:
    """A policy without ``uses_clock`` keeps now = 0: the drivers skip it (no cost on the hot path)."""
    exp = parse_spec(
        {
            "name": "clock",
            "seed": 1,
            "classes": [{"name": "s", "count": 2, "discipline": "fcfs"}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "least_request", "d": 2},
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.02},
        }
    )
    disp = DispatcherHost(exp, 0, 1, [f"{NOWHERE}/v1/nodes/{k}" for k in range(2)], TOKEN)
    assert not disp.policy.uses_clock
    assert disp.core.side(disp.started + 5.0).now == 0.0
    disp.policy = ClockedLeastRequest(exp, disp.policy.rng, 0)
    assert disp.core.side(disp.started + 5.0).now == pytest.approx(5.0 / exp.run.time_scale)


# ------------------------------------------------------------------- the cluster against its simulation

RUN_SPEC = """
name = "{name}"
seed = 5

[[classes]]
name = "slow"
count = 5
discipline = "fcfs"
speed = 1.0
speed_schedule = [{{ at = 40.0, factor = 0.6 }}, {{ at = 80.0, factor = 1.0 }}]

[[classes]]
name = "fast"
count = 5
discipline = "fcfs"
speed = 2.0
speed_schedule = [{{ start = 30.0, end = 60.0, to = 0.6, steps = 3 }}, {{ at = 90.0, factor = 1.0 }}]

[workload]
arrival_rate = 9.0
service = {{ dist = "exponential", mean = 1.0 }}

[policy]
{policy}
dispatchers = 2

[run]
warmup = 10.0
duration = 100.0
time_scale = 0.3
batches = 10
"""

#: two dispatchers each, each on its own counts and estimates (docs/spec.md, "least_request", "peak_ewma")
RUNS = {
    "weighted_least_request": 'name = "least_request"\nweights = "speed"',
    "peak_ewma": 'name = "peak_ewma"\ndecay_time = 10.0',
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, Any]]]:
    """Both runs at once (as tests/test_run.py does): each cluster is light and its verdict is against
    its own twin, which the machine's load does not move."""
    from test_run import lbt_finish, lbt_start

    started = {}
    for case, table in RUNS.items():
        d = tmp_path_factory.mktemp(case)
        spec = d / "spec.toml"
        spec.write_text(RUN_SPEC.format(name=f"run-{case}", policy=table))
        started[case] = lbt_start(spec, d / "report")
    return {case: lbt_finish(proc) for case, proc in started.items()}


@pytest.mark.parametrize("case", list(RUNS))
def test_the_cluster_agrees_with_its_twin_under_changing_speeds(
    case: str, runs: dict[str, tuple[int, dict[str, Any]]]
) -> None:
    """Ten FCFS nodes of speeds 1 and 2 whose speeds step and ramp down and back during the window, two
    dispatchers: the cluster's mean sojourn agrees with its twin's (the simulation of the same tasks on
    the same speed profile, paired batch by batch), and no message is sent."""
    from test_run import paired_by_hand, verdict

    code, doc = runs[case]
    cluster = doc["results"]["cluster"]["metrics"]
    assert cluster["mean_sojourn"]["value"] is not None
    v = verdict(doc, "mean_sojourn")
    assert v["paired"] and v["counts"] and v["verdict"] == "agrees", v
    mean, _, df = paired_by_hand(doc, "mean_sojourn", "cluster", "twin")
    assert df == 9 and v["relative"] == pytest.approx(math.expm1(mean), rel=1e-9, abs=1e-12)
    assert cluster["messages_per_task"]["value"] == 0.0
    load = doc["results"]["cluster"]["load"]
    assert load["completed"] == load["scheduled"], load
    assert doc["agrees"] is True and code == (0 if doc["representative"]["holds"] else 1)


# ------------------------------------------------------------------------------- the policies' rules


class Scripted(random.Random):
    """A random stream that gives the scripted numbers: ``random()`` in order, ``getrandbits`` one value."""

    def __init__(self, draws: list[float], bits: int = 0) -> None:
        super().__init__(0)
        self.draws, self.bits = list(draws), bits

    def random(self) -> float:
        return self.draws.pop(0)

    def getrandbits(self, k: int) -> int:
        return self.bits


def two_classes(policy: dict[str, Any], weights: tuple[float, ...] = (1.0, 4.0)) -> Any:
    """One node per class, node k of weight weights[k] (class weights when the policy asks for them)."""
    classes = [
        {"name": f"c{k}", "count": 1, "discipline": "fcfs"}
        | ({"weight": w} if policy.get("weights") == "class" else {})
        for k, w in enumerate(weights)
    ]
    return parse_spec(
        {
            "name": "rules",
            "seed": 1,
            "classes": classes,
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": policy,
            "run": {"warmup": 1.0, "duration": 10.0},
        }
    )


def test_envoy_schedule_after_picks_is_the_schedule_of_as_many_picks_one_by_one() -> None:
    """createWithPicks with weights 1 and 4 and 2 picks. By hand, with a_k = w_k + 1e-13 and W = 5 + 2e-13:
    floor(a_0 2 / W) = floor(0.4) = 0, floor(a_1 2 / W) = floor(1.6) = 1 (1 / a_1 = 0.25 < 2 / W = 0.4: no
    correction); node 0's deadline 1 / a_0, node 1's 2 / a_1 (0.5 - 1.25e-14), the clock at
    max(0, 1 / a_1): 1 pick emulated; the last pick one by one: node 1 at 2 / a_1, which becomes the
    clock, added again at 2 / a_1 + 1/4 (the plain weight, order 2). From an empty scheduler: node 0 at
    1, node 1 at 0.25; picks node 1 (again at 0.5), node 1 (again at 0.75): the same order of nodes."""
    w = {0: 1.0, 1: 4.0}
    a0, a1 = 1 + 1e-13, 4 + 1e-13
    s = EdfScheduler.create_with_picks([0, 1], w.__getitem__, 2)
    assert s.current_time == 2 / a1 and s.order_offset == 3
    assert sorted(s.queue) == [(2 / a1 + 0.25, 2, 1), (1 / a0, 0, 0)]
    fresh = EdfScheduler()
    for k in (0, 1):
        fresh.add(w[k], k)
    assert [fresh.pick_and_add(w.__getitem__) for _ in range(2)] == [1, 1]
    assert sorted(fresh.queue) == [(0.75, 3, 1), (1.0, 0, 0)]
    # the picks are taken modulo UINT32_MAX / 10, as Envoy does
    assert EdfScheduler.create_with_picks([0, 1], w.__getitem__, 2 + 429_496_729).queue == s.queue


def test_weighted_least_request_follows_envoy_effective_weights() -> None:
    """Weights 1 and 4 (class weights), active_request_bias 1, Envoy's seed 2 (two picks emulated: the
    queue holds node 0 at 1 / (1 + 1e-13) = 1 - 1e-13 and node 1 at 0.75 - 1.25e-14, test above). Each
    pick takes the earliest deadline and adds the node again at that deadline + (active + 1) / weight,
    active read before the new task counts (node 1's times below are all 1.25e-14 early):
      1. node 1 at 0.75;         again at 0.75 + 1/4 = 1.0          (active 1 then)
      2. node 0 at 1 - 1e-13;    again at ~1 + 1/1 = 2 - 1e-13      (active 1)
      3. node 1 at 1.0;          again at 1.0 + 2/4 = 1.5           (active 2)
      4. node 1 at 1.5;          again at 1.5 + 3/4 = 2.25          (active 3)
      5. node 0 at 2 - 1e-13;    again at ~2 + 2/1 = 4 - 1e-13      (active 2)
      a task of node 1 ends:     active 2 (its deadline stays until it is picked)
      6. node 1 at 2.25;         again at 2.25 + 3/4 = 3.0          (active 3)
      7. node 1 at 3.0;          again at 3.0 + 4/4 = 4.0           (active 4)
      8. node 0 at 4 - 1e-13, before node 1 at 4.0."""
    exp = two_classes({"name": "least_request", "weights": "class"})
    disp = LeastRequestDispatcher(exp, Scripted([], bits=2))
    picks = [disp.dispatch() for _ in range(5)]
    disp.on_task_done(1, 1.0)
    picks += [disp.dispatch() for _ in range(3)]
    assert [r.node for r in picks] == [1, 0, 1, 1, 0, 1, 1, 0]
    assert {r.outcome for r in picks} == {"weighted"}
    assert disp.in_flight == [3, 4]


def test_active_request_bias_is_the_exponent_of_the_active_requests() -> None:
    """Bias 0.5, weights 1 and 4, no emulated pick (seed 0): built from the weights + 1e-13, node 0 at
    1 / (1 + 1e-13) ~ 1, node 1 at 1 / (4 + 1e-13) ~ 0.25; then each node again at its deadline +
    (active + 1)^0.5 / weight:
      1. node 1 at 0.25;    again at 0.25 + 1^0.5 / 4 = 0.5
      2. node 1 at 0.5;     again at 0.5 + 2^0.5 / 4 = 0.85355
      3. node 1 at 0.85355; again at 0.85355 + 3^0.5 / 4 = 1.28657
      4. node 0 at ~1.0, before 1.28657; again at ~1 + 1^0.5 / 1 = 2
      5. node 1 at 1.28657, which is the clock then."""
    exp = two_classes({"name": "least_request", "weights": "class", "active_request_bias": 0.5})
    disp = LeastRequestDispatcher(exp, Scripted([], bits=0))
    assert [disp.dispatch().node for _ in range(5)] == [1, 1, 1, 0, 1]
    assert disp.edf is not None
    assert disp.edf.current_time == pytest.approx(0.25 + (1 + 2**0.5 + 3**0.5) / 4, rel=1e-12)


def test_weighted_least_request_rebuilds_on_health_changes_and_falls_back_to_p2c() -> None:
    """Three nodes of weights 1, 1, 4: with node 2 down the weights up are equal, so Envoy picks by
    choice_count = 2 on the active counts (the first sampled of the fewest); back up, the schedule is
    built afresh from the same seed (0 emulated picks: node 2 first, deadline 1/4)."""
    exp = parse_spec(
        {
            "name": "rules",
            "seed": 1,
            "classes": [
                {"name": "a", "count": 2, "discipline": "fcfs", "weight": 1.0},
                {"name": "b", "count": 1, "discipline": "fcfs", "weight": 4.0},
            ],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "least_request", "weights": "class"},
            "run": {"warmup": 1.0, "duration": 10.0},
        }
    )
    # draws: two samples of the two nodes up, (a, b) = (int(2 r1), int(1 r2) (+1 if >= a))
    disp = LeastRequestDispatcher(exp, Scripted([0.9, 0.0, 0.9, 0.0], bits=0))
    disp.on_node_down(2)
    first = disp.dispatch()  # sample (1, 0): counts 0, 0: the first, node 1
    second = disp.dispatch()  # sample (1, 0): counts 1, 0: node 0
    assert (first.node, first.outcome, second.node) == (1, "sampled", 0)
    disp.on_node_up(2, (0,), False)
    assert disp.dispatch() == Route(2, "weighted")


def test_equal_weights_draw_nothing_more_than_power_of_two() -> None:
    """Equal weights never schedule: the dispatcher draws exactly power-of-d's numbers (a run with
    weights = "speed" on equal speeds is the run of plain least_request)."""
    exp = two_classes({"name": "least_request", "weights": "class"}, weights=(2.0, 2.0))
    a, b = random.Random(3), random.Random(3)
    weighted, plain = (
        LeastRequestDispatcher(exp, a),
        LeastRequestDispatcher(two_classes({"name": "least_request"}), b),
    )
    assert [weighted.dispatch() for _ in range(20)] == [plain.dispatch() for _ in range(20)]
    assert a.random() == b.random()


PENALTY = (2**47 - 1) * 1e-9  # Finagle: Long.MaxValue >> 16 nanoseconds


def test_peak_ewma_decisions_by_hand() -> None:
    """tau = 10, Finagle's rules (no default_rtt). Each load read first observes 0 at the current time
    (estimate * e^{-dt/tau}); draws (0.1, 0.0) sample (node 0, node 1), (0.9, 0.0) sample (1, 0).
      t=0  dispatch: loads 0 and 0, a tie: the first drawn, node 0             (pending 1, 0)
      t=1  dispatch: node 0 has no estimate and a task: 2^47 - 1 ns + 1 ns; node 1: 0 -> node 1
      t=2  node 0's task ends, latency 2 > 0: the peak, estimate_0 = 2 (stamp 2)
      t=3  node 1's ends, latency 0.5: estimate_1 = 0.5 (stamp 3)
      t=4  dispatch (1, 0): node 1 0.5 e^-0.1 = 0.45242 x 1; node 0 2 e^-0.2 = 1.63746 x 1 -> node 1
      t=5  dispatch (0, 1): node 0 2 e^-0.3 = 1.48164 x 1; node 1 0.5 e^-0.2 x 2 = 0.81873 -> node 1
      t=6  dispatch (0, 1): node 0 2 e^-0.4 = 1.34064; node 1 0.5 e^-0.3 x 3 = 1.11123 -> node 1
      t=7  dispatch (0, 1): node 0 2 e^-0.5 = 1.21306; node 1 0.5 e^-0.4 x 4 = 1.34064 -> node 0
      t=8  a node-1 task ends, latency 1.0 > 0.5 e^-0.4 = 0.33516 (as read at t=7): estimate_1 = 1.0
      t=9  another, latency 0.2 < 1: estimate_1 = 1.0 e^-0.1 + 0.2 (1 - e^-0.1) = 0.92387
      t=9  dispatch (0, 1): node 0 2 e^-0.7 x 2 = 1.98634; node 1 0.92387 x 2 = 1.84774 -> node 1."""
    exp = two_classes({"name": "peak_ewma", "decay_time": 10.0})
    draws = [0.1, 0.0, 0.1, 0.0, 0.9, 0.0] + [0.1, 0.0] * 4
    disp = PeakEwmaDispatcher(exp, Scripted(draws))
    got = []

    def at(t: float) -> PeakEwmaDispatcher:
        disp.now = t
        return disp

    got.append(at(0).dispatch().node)
    assert disp.load(0) == pytest.approx(PENALTY + 1e-9, rel=1e-15)  # read at t = 0: no decay
    got.append(at(1).dispatch().node)
    at(2).on_task_done(0, 2.0)
    assert disp.estimate[0] == 2.0
    at(3).on_task_done(1, 0.5)
    for t in (4, 5, 6, 7):
        got.append(at(t).dispatch().node)
    assert disp.estimate[0] == pytest.approx(2 * math.exp(-0.5), rel=1e-12)  # read at t = 7
    assert disp.estimate[1] == pytest.approx(0.5 * math.exp(-0.4), rel=1e-12)
    at(8).on_task_done(1, 1.0)
    assert disp.estimate[1] == 1.0
    at(9).on_task_done(1, 0.2)
    assert disp.estimate[1] == pytest.approx(math.exp(-0.1) + 0.2 * (1 - math.exp(-0.1)), rel=1e-12)
    got.append(at(9).dispatch().node)
    assert got == [0, 1, 1, 1, 1, 0, 1]
    assert disp.pending == [1, 2]
    assert disp.load(0) == pytest.approx(2 * math.exp(-0.7) * 2, rel=1e-12)


def test_peak_ewma_with_tower_default_rtt_has_no_penalty() -> None:
    """default_rtt = 0.03 (Linkerd's 30 ms): every node starts at 0.03 and it decays like any estimate.
    t=0  loads 0.03 and 0.03: node 0 (the first drawn)
    t=1  node 0: 0.03 e^-0.1 x 2 = 0.05429; node 1: 0.03 e^-0.1 = 0.02715 -> node 1
    t=1  one node up (node 0 down): node 1 again, without a draw."""
    exp = two_classes({"name": "peak_ewma", "decay_time": 10.0, "default_rtt": 0.03})
    disp = PeakEwmaDispatcher(exp, Scripted([0.1, 0.0, 0.1, 0.0]))
    assert disp.dispatch().node == 0
    disp.now = 1.0
    assert disp.dispatch().node == 1
    assert disp.estimate == pytest.approx([0.03 * math.exp(-0.1)] * 2, rel=1e-12)
    disp.on_node_down(0)
    assert disp.dispatch().node == 1 and disp.pending == [1, 2]
