"""Unit tests of what ``lbt run`` and ``lbt sweep`` compute, without a cluster.

- ``analysis.compare``: verdict arithmetic on hand-made estimates, the Bonferroni rule of the occupancy
  tails, limit predictions.
- ``analysis.measure``: metric snapshots whose ``/metrics`` pages come from the real collectors of the node
  host and the dispatcher (so a renamed metric breaks these tests), fed by real node models driven through
  hand-written occupancy paths. Every ratio ``cluster_raw`` produces is checked against the value worked
  out by hand from those paths.
- ``analysis.scrape``: the text format, sums over labels and processes, Prometheus query rows.
- ``sweep``: value splitting, the grid, bad overrides through ``lbt sweep``, a ``--simulate-only`` sweep end
  to end, and the policy switch of ``--set policy.name``.
- ``analysis.report`` and ``analysis.plots``: the comparison table, report.md, and every plot's PNG.

Float tolerances: the hand values are sums of a handful of binary fractions, so the code's sums are exact
or off by a few ulps; ``REL`` = 1e-12 is far above that and far below any real mistake.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
import tomllib
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest

import lbtestbed.dispatcher.host as dispatcher_module
import lbtestbed.dispatcher.metrics as dispatcher_metrics
from lbtestbed.analysis.comparison.compare import (
    Side,
    Verdict,
    compare,
    compare_scalar,
    compare_tail,
    run_agrees,
)
from lbtestbed.analysis.measurement.measure import cluster_raw
from lbtestbed.analysis.measurement.scrape import Snapshot, from_query, parse
from lbtestbed.analysis.report import plots
from lbtestbed.analysis.report import run_report as report
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import METRICS, Result, summarize
from lbtestbed.cli import main
from lbtestbed.cluster.processes import free_ports
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.experiment import runner
from lbtestbed.experiment.sweep import grid, split_values, varying
from lbtestbed.loadgen.openloop import TaskRecord
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import NodeModel, make_node
from lbtestbed.model.reader import SpecError
from lbtestbed.model.workload import Task
from lbtestbed.policies import CATALOG
from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import load_spec, parse_spec
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile, Endpoint

#: what SLTA learns (its index r): the learned quantity the plots and the report know generically
SLTA_R = CATALOG["slta"].learned
assert SLTA_R is not None


REL = 1e-12
Z95 = NormalDist().inv_cdf(0.975)  # the standard normal quantile, not the module's constant


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=REL)


# ============================================================================================ compare


def est(value: float | None, ci95: float | None = None) -> dict[str, float | None]:
    return {"value": value, "ci95": ci95}


def test_scalar_agrees_at_the_edge_of_the_combined_interval() -> None:
    # half-widths 3 and 4 combine to exactly 5; a difference of exactly 5 is inside
    v = compare_scalar("mean_sojourn", est(10.0, 3.0), est(5.0, 4.0), "simulation", True)
    assert v.agrees is True and v.counts
    assert close(v.distance or 0.0, 5.0 / (5.0 / Z95))  # = z: the edge is z standard errors away
    assert v.word == "agrees"


def test_scalar_disagrees_just_beyond_with_its_distance_in_standard_errors() -> None:
    v = compare_scalar("mean_sojourn", est(10.0, 3.0), est(5.0 - 1e-9, 4.0), "simulation", True)
    assert v.agrees is False and v.counts
    se = 5.0 / Z95
    assert close(v.distance or 0.0, (5.0 + 1e-9) / se)
    assert v.word == f"disagrees ({(5.0 + 1e-9) / se:.1f} se)"


def test_scalar_distance_inside_the_interval() -> None:
    v = compare_scalar("utility", est(1.0, 0.6), est(1.5, 0.8), "simulation", True)
    assert v.agrees is True
    assert close(v.distance or 0.0, 0.5 / (1.0 / Z95))
    assert (v.measured, v.measured_ci95, v.expected, v.expected_ci95) == (1.0, 0.6, 1.5, 0.8)


@pytest.mark.parametrize(
    ("measured", "expected", "why"),
    [
        (est(None), est(1.0, 0.1), "not measured"),
        (est(1.0, 0.1), est(None), "no theory value"),
        (est(None), est(None), "not measured"),
    ],
)
def test_missing_values_are_not_counted(measured: dict[str, Any], expected: dict[str, Any], why: str) -> None:
    v = compare_scalar("idle_nodes", measured, expected, "theory", True)
    assert v.agrees is None and v.distance is None
    assert v.counts is False
    assert v.why == why
    assert v.word == "-"
    assert not run_agrees([v])  # nothing that counts: no agreement to claim (report: NOTHING TO COMPARE)


def test_theory_without_interval_uses_the_measurement_interval_alone() -> None:
    inside = compare_scalar("mean_sojourn", est(2.0, 0.25), est(2.25), "theory", True)
    assert inside.agrees is True
    assert close(inside.distance or 0.0, 0.25 / (0.25 / Z95))
    outside = compare_scalar("mean_sojourn", est(2.0, 0.25), est(2.2500001), "theory", True)
    assert outside.agrees is False


def test_both_without_interval_are_compared_exactly() -> None:
    same = compare_scalar("messages_per_task", est(4.0), est(4.0), "theory", True)
    assert same.agrees is True and same.distance == 0.0
    assert "exactly" in same.why
    differ = compare_scalar("messages_per_task", est(4.0), est(4.01), "theory", True)
    assert differ.agrees is False and differ.distance == math.inf


def tail(*points: tuple[float | None, float | None]) -> list[dict[str, float | None]]:
    return [est(1.0, 0.0), *(est(v, c) for v, c in points)]


def bonferroni(m: int) -> float:
    return NormalDist().inv_cdf(1.0 - 0.025 / m)


def test_tail_uses_the_bonferroni_level_of_the_points_compared() -> None:
    # one point 2.2 combined standard errors off: beyond z = 1.96 alone, within the level for 4 points
    se = 0.01 / Z95  # ci95 0.01 on the measurement, none on the reference
    off = 2.2 * se
    bad = (0.5 + off, 0.01)
    ok = [(0.3, 0.01), (0.2, 0.01), (0.1, 0.01)]
    one = compare_tail("fast", tail(bad), tail((0.5, None)), "theory", True)
    assert one.agrees is False
    assert close(one.distance or 0.0, 2.2)
    four = compare_tail(
        "fast", tail(bad, *ok), tail((0.5, None), (0.3, None), (0.2, None), (0.1, None)), "x", True
    )
    assert bonferroni(1) < 2.2 < bonferroni(4)
    assert four.agrees is True
    assert four.metric == "occupancy_tail[fast]"
    assert "4 points" in four.why and f"|t| <= {bonferroni(4):.2f}" in four.why
    # the worst point is reported, with its own values
    assert (four.measured, four.expected, four.measured_ci95, four.expected_ci95) == (
        0.5 + off,
        0.5,
        0.01,
        None,
    )
    assert "worst at >= 1 tasks" in four.why


def test_tail_skips_points_below_the_floor_and_missing_values() -> None:
    # j = 2 and 3 are far apart but both sides are below 1e-3; j = 4 has no reference value
    measured = tail((0.5, 0.02), (9e-4, 1e-6), (5e-4, 1e-6), (0.4, 0.01))
    expected = tail((0.5, 0.02), (1e-5, None), (9.9e-4, None), (None, None))
    v = compare_tail("slow", measured, expected, "simulation", True)
    assert v.agrees is True
    assert "1 points" in v.why and "worst at >= 1 tasks" in v.why
    # with nothing left the verdict neither agrees nor counts
    empty = compare_tail("slow", tail((9e-4, 1e-6)), tail((1e-5, None)), "simulation", True)
    assert empty.agrees is None and empty.counts is False


def test_tail_worst_point_decides_and_is_reported() -> None:
    # j = 1 is 1 se off, j = 3 is 10 se off, j = 2 is 3 se off
    se = 0.01 / Z95
    measured = tail((0.8 + se, 0.01), (0.5 + 3 * se, 0.01), (0.2 + 10 * se, 0.01))
    expected = tail((0.8, None), (0.5, None), (0.2, None))
    v = compare_tail("fast", measured, expected, "theory", True)
    assert v.agrees is False
    assert close(v.distance or 0.0, 10.0)
    assert close(v.measured or 0.0, 0.2 + 10 * se) and v.expected == 0.2
    assert "worst at >= 3 tasks" in v.why and "3 points" in v.why


def result(
    source: str,
    tails: dict[str, list[dict[str, float | None]]] | None = None,
    notes: list[dict[str, Any]] | None = None,
    **values: dict[str, Any],
) -> Result:
    """A result object built by hand: every metric null unless given."""
    metrics: dict[str, Any] = {m: est(None) for m in METRICS if m != "occupancy_tail"}
    metrics.update(values)
    metrics["occupancy_tail"] = tails or {}
    extras: dict[str, Any] = {"notes": notes} if notes is not None else {}
    return Result("hand", "power_of_d", source, metrics, {}, extras)


def test_limit_predictions_are_marked_and_do_not_count() -> None:
    notes = [
        {"metric": "mean_sojourn", "formula": "W", "source": "s", "assumes": ["n -> infinity (mean field)"]},
        {"metric": "occupancy_tail[fast]", "formula": "P", "source": "s", "assumes": ["large n"]},
        {"metric": "idle_nodes", "formula": "I", "source": "s", "assumes": ["any stable policy"]},
    ]
    cluster = result(
        "cluster",
        {"fast": tail((0.5, 0.01))},
        mean_sojourn=est(2.0, 0.1),
        idle_nodes=est(3.0, 0.1),
    )
    theory = result(
        "theory",
        {"fast": tail((0.9, None))},
        notes,
        mean_sojourn=est(3.0),
        idle_nodes=est(3.05),
    )
    verdicts = compare(Side(cluster), Side(theory))
    by = {v.metric: v for v in verdicts}
    assert all(v.reference == "theory" for v in verdicts)
    assert by["mean_sojourn"].agrees is False and by["mean_sojourn"].counts is False
    assert "limit" in by["mean_sojourn"].why
    assert by["occupancy_tail[fast]"].agrees is False and by["occupancy_tail[fast]"].counts is False
    assert "limit" in by["occupancy_tail[fast]"].why
    assert by["idle_nodes"].agrees is True and by["idle_nodes"].counts is True
    assert run_agrees(verdicts)
    # the same numbers with the limit notes gone decide the run
    plain = compare(
        Side(cluster), Side(result("theory", {"fast": tail((0.9, None))}, [], mean_sojourn=est(3.0)))
    )
    assert not run_agrees(plain)


def test_compare_covers_both_references_in_table_order() -> None:
    cluster = result("cluster", {"fast": tail((0.5, 0.01))}, mean_sojourn=est(2.0, 0.1))
    sim = result("simulation", {"fast": tail((0.5, 0.01))}, mean_sojourn=est(2.0, 0.1))
    theory = result("theory", {"fast": []}, [], mean_sojourn=est(2.0))
    verdicts = compare(Side(cluster), Side(sim)) + compare(Side(cluster), Side(theory))
    refs = [v.reference for v in verdicts]
    assert refs == sorted(refs, key=["simulation", "theory"].index)  # simulation first, then theory
    metrics = [v.metric for v in verdicts if v.reference == "simulation"]
    assert metrics[0] == "mean_sojourn" and metrics[-1] == "occupancy_tail[fast]"
    assert len(metrics) == 12  # the 11 scalars of docs/spec.md and the one class's tail
    tails = [v for v in verdicts if v.metric == "occupancy_tail[fast]"]
    assert [v.agrees for v in tails] == [True, None]  # theory has no tail for this class


def verdict(agrees: bool | None, counts: bool) -> Verdict:
    return Verdict("m", "simulation", 1.0, 0.1, 1.0, 0.1, agrees, 0.0, counts)


def test_run_agrees_only_on_the_verdicts_that_count() -> None:
    assert run_agrees([verdict(True, True), verdict(False, False), verdict(None, False)])
    assert not run_agrees([verdict(True, True), verdict(False, True)])
    assert run_agrees([verdict(True, True), verdict(None, True)])


def test_tail_points_missing_on_one_side_count_as_zero() -> None:
    # the cluster's nodes never held 2 tasks (its list stops at j = 1, docs/spec.md: entries below 1e-6 are
    # cut); the simulator has 20% of the nodes there, about 39 standard errors away
    measured = tail((0.5, 0.01))
    expected = tail((0.5, 0.01), (0.2, 0.01))
    v = compare_tail("fast", measured, expected, "simulation", True)
    assert v.agrees is False


def test_tail_points_equal_without_interval_agree() -> None:
    # heavily loaded pools: every batch has every node busy, so j = 1 is exactly 1 with a zero interval
    measured = tail((1.0, 0.0), (0.4, 0.01))
    expected = tail((1.0, 0.0), (0.4, 0.01))
    v = compare_tail("small", measured, expected, "simulation", True)
    assert v.agrees is True


# ============================================================================================ scrape

PAGE = """\
# HELP lbtestbed_node_occupancy_model_seconds_total Model seconds with exactly `tasks` tasks
# TYPE lbtestbed_node_occupancy_model_seconds_total counter
lbtestbed_node_occupancy_model_seconds_total{class="a",node="0",tasks="0"} 1.5
lbtestbed_node_occupancy_model_seconds_total{class="a",node="0",tasks="1"} 2.5
lbtestbed_node_occupancy_model_seconds_total{class="b",node="1",tasks="0"} 4.0
# HELP lbtestbed_node_model_seconds_total Model time since the process started
# TYPE lbtestbed_node_model_seconds_total counter
lbtestbed_node_model_seconds_total 4.0
# HELP lbtestbed_node_speed Work units served per model second
# TYPE lbtestbed_node_speed gauge
lbtestbed_node_speed{class="a",node="0"} 2.0
lbtestbed_node_speed{class="b",node="1"} 0.5
"""


def test_parse_reads_every_sample_of_the_text_format() -> None:
    p = parse(PAGE)
    assert len(p.samples) == 6
    assert ("lbtestbed_node_model_seconds_total", {}, 4.0) in p.samples
    name = "lbtestbed_node_occupancy_model_seconds_total"
    assert p.value(name) == 8.0
    assert p.value(name, node="0") == 4.0
    assert p.value(name, node="0", tasks="1") == 2.5
    assert p.value(name, node="7") == 0.0
    assert p.value("no_such_metric") == 0.0
    assert p.by(name, "class") == {("a",): 4.0, ("b",): 4.0}
    assert p.by(name, "tasks", "node") == {("0", "0"): 1.5, ("1", "0"): 2.5, ("0", "1"): 4.0}
    assert p.by("lbtestbed_node_model_seconds_total", "node") == {("",): 4.0}  # no such label: ""


def test_snapshot_sums_over_processes() -> None:
    other = parse(PAGE.replace('node="0"', 'node="2"').replace('node="1"', 'node="3"'))
    snap = Snapshot(1.25, {"http://a": parse(PAGE), "http://b": other})
    name = "lbtestbed_node_occupancy_model_seconds_total"
    assert snap.value(name) == 16.0
    assert snap.value(name, tasks="0") == 11.0
    assert snap.by(name, "class") == {("a",): 8.0, ("b",): 8.0}
    assert snap.by("lbtestbed_node_model_seconds_total") == {(): 8.0}


def prometheus_rows(snap: Snapshot, policy: str) -> list[tuple[dict[str, str], float]]:
    """The rows an instant query returns for these pages under lbtestbed/cluster/prometheus.py's scrape
    configuration: target labels role, index, cluster, policy (honor_labels: the sample's own label wins),
    job and instance."""
    rows = []
    for i, (url, proc) in enumerate(snap.processes.items()):
        target = {
            "instance": url.removeprefix("http://"),
            "job": "lbtestbed",
            "role": "dispatcher" if "disp" in url else "nodes",
            "index": str(i),
            "cluster": "hand",
            "policy": policy,
        }
        for name, labels, value in proc.samples:
            rows.append(({**target, **labels, "__name__": name}, value))
    return rows


def test_from_query_groups_rows_per_instance_without_target_labels() -> None:
    rows = [
        (
            {
                "__name__": "m_total",
                "instance": "h:1",
                "job": "j",
                "role": "nodes",
                "cluster": "c",
                "node": "0",
            },
            1.0,
        ),
        (
            {
                "__name__": "m_total",
                "instance": "h:1",
                "job": "j",
                "role": "nodes",
                "cluster": "c",
                "node": "1",
            },
            2.0,
        ),
        (
            {
                "__name__": "m_total",
                "instance": "h:2",
                "job": "j",
                "role": "nodes",
                "cluster": "c",
                "node": "2",
            },
            4.0,
        ),
        ({"__name__": "g", "instance": "h:2", "job": "j"}, 8.0),
    ]
    snap = from_query(rows, 3.5)
    assert snap.at == 3.5
    assert set(snap.processes) == {"h:1", "h:2"}
    assert snap.processes["h:1"].samples == [("m_total", {"node": "0"}, 1.0), ("m_total", {"node": "1"}, 2.0)]
    assert snap.processes["h:2"].samples == [("m_total", {"node": "2"}, 4.0), ("g", {}, 8.0)]
    assert snap.value("m_total") == 7.0
    assert snap.by("m_total", "node") == {("0",): 1.0, ("1",): 2.0, ("2",): 4.0}
    # the rows are not modified
    assert rows[0][0]["job"] == "j"


# =========================================================================================== measure

QUEUES = """
name = "measure-queues"
seed = 3

[[classes]]
name = "fast"
count = 2
discipline = "fcfs"
speed = 2.0

[[classes]]
name = "slow"
count = 1
discipline = "ps"
speed = 1.0

[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "power_of_d"
d = 2

[run]
warmup = 2.0
duration = 6.0
batches = 2
"""

POOLS = """
name = "measure-pools"
seed = 3

[[classes]]
name = "small"
count = 1
discipline = "pool"
utility = { kind = "xlog", r = 3 }

[[classes]]
name = "large"
count = 1
discipline = "pool"
utility = { kind = "xlog", r = 5 }

[workload]
load = 1.0
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "slta"
beta = 1.0

[run]
warmup = 1.5
duration = 4.0
batches = 2
time_scale = 0.5
"""


def experiment(text: str) -> Experiment:
    return parse_spec(tomllib.loads(text), "hand.toml")


class Driven:
    """A real node model fed with (model time, work) arrivals; it completes tasks when it says they end."""

    def __init__(self, model: NodeModel, arrivals: list[tuple[float, float]]) -> None:
        self.model = model
        self.arrivals = list(arrivals)
        self.ids = itertools.count(1)

    def to(self, t: float) -> None:
        while True:
            ta = self.arrivals[0][0] if self.arrivals else math.inf
            tc = self.model.next_completion()
            if min(ta, tc) > t:
                return
            if tc <= ta:
                self.model.complete(tc)
            else:
                _, work = self.arrivals.pop(0)
                self.model.arrive(Task(next(self.ids), work, ta), ta)


@pytest.fixture
def idle_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop that never runs: the node host arms its completion timers on it at a scrape."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def node_host(exp: Experiment, ids: list[int], loop: asyncio.AbstractEventLoop) -> NodeHost:
    """A node host whose models are fresh at its model time 0, as ``NodeHost.start`` makes them."""
    host = NodeHost(exp, ids, ["http://127.0.0.1:9"], "token")
    host.loop = loop
    for k in ids:
        c = exp.classes[exp.node_class[k]]
        host.models[k] = make_node(c.discipline, exp.node_speeds[k], c.utility, 0.0)
    return host


def node_page(host: NodeHost, t: float) -> str:
    """The host's /metrics page when its model clock reads t."""
    host.now = lambda: t  # type: ignore[method-assign]
    return generate_latest(host.registry).decode()


def dispatcher_page(host: DispatcherHost) -> str:
    return generate_latest(host.registry).decode()


@pytest.fixture
def queue_snapshots(idle_loop: asyncio.AbstractEventLoop) -> tuple[Experiment, list[Snapshot]]:
    """power_of_d on two fcfs nodes of speed 2 (class fast, host A) and one ps node (class slow, host B).

    Occupancy paths (model time of the node's own host; host B's clock reads 10 more than host A's):
      node 0: [1,2) 1, [2,3) 2, [3,4) 1, [4,6) 0, [6,12) 1        arrivals 1 (work 4), 2 (2), 6 (12)
      node 1: [.5,1) 1, [1,5) 0, [5,5.5) 1, [5.5,5.75) 2, [5.75,6) 3, [6,7) 2, [7,8) 1, then 0
                                                                 arrivals .5 (1), 5 (2), 5.5 (2), 5.75 (2)
      node 2: [12,13) 1, [13,13.5) 0, [13.5,14) 1, [14,15) 0, [15,19) 1   arrivals 12 (1), 13.5 (.5), 15 (4)
    Snapshots at host A's 2, 5, 8 and host B's 12, 15, 18. Node 1 never holds 2 or 3 tasks before the
    last one, so its occupancy label set grows.
    """
    exp = experiment(QUEUES)
    a, b = node_host(exp, [0, 1], idle_loop), node_host(exp, [2], idle_loop)
    disp = DispatcherHost(exp, 0, 1, ["http://127.0.0.1:9"] * exp.n, "token")
    driven = {
        0: Driven(a.models[0], [(1.0, 4.0), (2.0, 2.0), (6.0, 12.0)]),
        1: Driven(a.models[1], [(0.5, 1.0), (5.0, 2.0), (5.5, 2.0), (5.75, 2.0)]),
        2: Driven(b.models[2], [(12.0, 1.0), (13.5, 0.5), (15.0, 4.0)]),
    }
    snaps = []
    for i, (ta, tb) in enumerate([(2.0, 12.0), (5.0, 15.0), (8.0, 18.0)]):
        for k in (0, 1):
            driven[k].to(ta)
        driven[2].to(tb)
        # senders' counts decide; what receivers counted must not be added (each message counted once)
        a.core.sent = Counter(probe_reply=[7, 11, 20][i])
        a.core.received = Counter(probe=[500, 600, 700][i])
        b.core.sent = Counter(probe_reply=[3, 4, 8][i])
        disp.core.sent = Counter(probe=[10, 16, 30][i])
        disp.core.received = Counter(probe_reply=[100, 200, 400][i])
        disp.core.decisions = Counter(probed=[5, 8, 15][i])
        pages = {
            "http://dispatcher": dispatcher_page(disp),
            "http://nodes-a": node_page(a, ta),
            "http://nodes-b": node_page(b, tb),
        }
        snaps.append(Snapshot(float(i), {url: parse(text) for url, text in pages.items()}))
    return exp, snaps


# (t, work, node, sojourn, stay, waited); batches of intended arrival time: [2, 5) and [5, 8)
QUEUE_RECORDS = [
    TaskRecord(1.0, 1.0, 0, 9.0, 8.0, True),  # before the window
    TaskRecord(2.0, 1.0, 0, 2.0, 1.5, False),  # batch 0 (its start is in)
    TaskRecord(3.0, 1.0, 1, 1.0, 0.75, True),  # batch 0, waited at an fcfs node
    TaskRecord(4.5, 1.0, 2, 3.0, 2.5, True),  # batch 0, ps node: no wait is counted there
    TaskRecord(4.9, 1.0, -1, 50.0, 0.0, False),  # the node is unknown
    TaskRecord(5.0, 1.0, 1, 4.0, 3.0, True),  # batch 1
    TaskRecord(6.0, 1.0, 3, 77.0, 1.0, True),  # node 3 does not exist (n = 3)
    TaskRecord(7.5, 1.0, 2, 0.5, 0.25, False),  # batch 1
    TaskRecord(8.0, 1.0, 0, 100.0, 1.0, False),  # the window's end is out
]


def ratios(raw: RawRun, key: str) -> tuple[list[float], float]:
    """Per-batch ratios and the pooled ratio of one of raw's ratio pairs."""
    num, den = raw.ratios[key]
    assert len(num) == len(den) == raw.batches
    return [float(x) for x in num / den], float(num.sum() / den.sum())


def assert_ratio(raw: RawRun, key: str, nums: list[float], dens: list[float]) -> None:
    per_batch, pooled = ratios(raw, key)
    want = [n / d for n, d in zip(nums, dens, strict=True)]
    assert all(close(x, y) for x, y in zip(per_batch, want, strict=True)), (key, per_batch, want)
    assert close(pooled, sum(nums) / sum(dens)), (key, pooled)


def test_cluster_raw_time_averages_from_real_collector_pages(
    queue_snapshots: tuple[Experiment, list[Snapshot]],
) -> None:
    exp, snaps = queue_snapshots
    raw = cluster_raw(exp, snaps, QUEUE_RECORDS)
    assert raw.batches == 2
    # batch 0: node 0 on [2,5]: 2 tasks 1 s, 1 task 1 s, idle 1 s; node 1 idle 3 s; node 2 on [12,15]:
    # 1 task 1.5 s, idle 1.5 s. Batch 1: node 0 on [5,8]: idle 1 s, 1 task 2 s; node 1: 1 task 1.5 s,
    # 2 tasks 1.25 s, 3 tasks .25 s; node 2 on [15,18]: 1 task 3 s.
    task_s = [2 + 1 + 0 + 1.5, 0 + 2 + (1.5 + 2.5 + 0.75) + 3]  # 4.5, 9.75
    node_s = [9.0, 9.0]  # 3 nodes x 3 model s each, each on its own host's clock
    assert_ratio(raw, "mean_tasks_per_node", task_s, node_s)
    # tasks in the system come from the dispatcher's own integral, which held none here
    assert ratios(raw, "tasks_in_system")[1] == 0.0
    assert_ratio(raw, "idle_nodes", [1 + 3 + 1.5, 1 + 0 + 0], [3.0, 3.0])
    assert_ratio(raw, "idle_capacity", [2 * 1 + 2 * 3 + 1 * 1.5, 2 * 1], [3.0, 3.0])  # speeds 2, 2, 1
    assert "utility" not in raw.ratios  # no class has a utility
    assert "slta_r" not in raw.ratios


def test_cluster_raw_occupancy_tails_per_class(queue_snapshots: tuple[Experiment, list[Snapshot]]) -> None:
    exp, snaps = queue_snapshots
    raw = cluster_raw(exp, snaps, QUEUE_RECORDS)
    # class fast (nodes 0, 1; 6 node-seconds a batch). Time at exactly x: batch 0: x=0 4, x=1 1, x=2 1;
    # batch 1: x=0 1, x=1 3.5, x=2 1.25, x=3 .25. Class slow (node 2; 3 node-seconds): batch 0: x=0 1.5,
    # x=1 1.5; batch 1: x=1 3.
    fast = {0: [6.0, 6.0], 1: [2.0, 5.0], 2: [1.0, 1.5], 3: [0.0, 0.25]}
    slow = {0: [3.0, 3.0], 1: [1.5, 3.0]}
    for c, want in ((0, fast), (1, slow)):
        den = 6.0 if c == 0 else 3.0
        for j, nums in want.items():
            assert_ratio(raw, f"tail:{c}:{j}", nums, [den, den])
        for j in itertools.count(len(want)):  # anything further is an empty tail point
            if f"tail:{c}:{j}" not in raw.ratios:
                break
            assert all(x == 0.0 for x in raw.ratios[f"tail:{c}:{j}"][0])


def test_cluster_raw_messages_per_task_by_kind_over_decisions(
    queue_snapshots: tuple[Experiment, list[Snapshot]],
) -> None:
    exp, snaps = queue_snapshots
    raw = cluster_raw(exp, snaps, QUEUE_RECORDS)
    decisions = [8.0 - 5, 15.0 - 8]
    probes = [16.0 - 10, 30.0 - 16]  # sent by the dispatcher
    replies = [(11.0 - 7) + (4 - 3), (20.0 - 11) + (8 - 4)]  # sent by both node hosts
    assert_ratio(raw, "messages:probe", probes, decisions)
    assert_ratio(raw, "messages:probe_reply", replies, decisions)
    assert_ratio(raw, "messages_per_task", [p + r for p, r in zip(probes, replies, strict=True)], decisions)
    assert raw.message_kinds == ("probe", "probe_reply")
    assert raw.decisions == {"probed": 10}


def test_cluster_raw_batches_tasks_by_intended_arrival(
    queue_snapshots: tuple[Experiment, list[Snapshot]],
) -> None:
    exp, snaps = queue_snapshots
    raw = cluster_raw(exp, snaps, QUEUE_RECORDS)
    # in the window with a known node: batch 0: t = 2 (node 0), 3 (node 1), 4.5 (node 2);
    # batch 1: t = 5 (node 1), 7.5 (node 2)
    assert [sorted(b) for b in raw.sojourns] == [[1.0, 2.0, 3.0], [0.5, 4.0]]
    assert_ratio(raw, "mean_sojourn", [2.0 + 1.0 + 3.0, 4.0 + 0.5], [3.0, 2.0])
    assert_ratio(raw, "sojourn:0", [2.0 + 1.0, 4.0], [2.0, 1.0])  # class fast
    assert_ratio(raw, "sojourn:1", [3.0, 0.5], [1.0, 1.0])  # class slow
    assert_ratio(raw, "network_overhead", [0.5 + 0.25 + 0.5, 1.0 + 0.25], [3.0, 2.0])
    # fcfs nodes only: batch 0 has two arrivals there (one waited), batch 1 one (waited)
    assert_ratio(raw, "wait_probability", [1.0, 1.0], [2.0, 1.0])


def test_cluster_raw_reads_prometheus_rows_like_direct_scrapes(
    queue_snapshots: tuple[Experiment, list[Snapshot]],
) -> None:
    exp, snaps = queue_snapshots
    direct = cluster_raw(exp, snaps, QUEUE_RECORDS)
    queried = cluster_raw(
        exp, [from_query(prometheus_rows(s, "power_of_d"), s.at) for s in snaps], QUEUE_RECORDS
    )
    assert set(queried.ratios) == set(direct.ratios)
    for key, (num, den) in direct.ratios.items():
        assert np.array_equal(queried.ratios[key][0], num) and np.array_equal(queried.ratios[key][1], den), (
            key
        )
    assert queried.decisions == direct.decisions


def test_cluster_raw_needs_two_snapshots(queue_snapshots: tuple[Experiment, list[Snapshot]]) -> None:
    exp, snaps = queue_snapshots
    with pytest.raises(ValueError, match="two snapshots"):
        cluster_raw(exp, snaps[:1], [])


@pytest.fixture
def pool_snapshots(
    monkeypatch: pytest.MonkeyPatch, idle_loop: asyncio.AbstractEventLoop
) -> tuple[Experiment, list[Snapshot]]:
    """slta on two pools with utilities u(x) = x ln(r/x), r = 3 (node 0) and 5 (node 1), one node host.

    Occupancy paths (model time):
      node 0: [1,2) 1, [2,3) 2, [3,4) 1, [4,4.5) 2, [4.5,5) 1, then 0   arrivals 1 (work 2), 2 (3), 4 (.5)
      node 1: [0,2.5) 1, [2.5,3.5) 2, [3.5,10) 1                        arrivals 0 (10), 2.5 (1)
    Snapshots at model times 1.5, 3.5, 5.5. The dispatcher's clock (time_scale .5) reads 1, 3, 7 model s
    at them; its r is 1 until 2, 2 until 5, then 3; it holds 1 task from .5, 2 from 2 and 1 from 4.
    """
    exp = experiment(POOLS)
    wall = [100.0]
    clock = types.SimpleNamespace(monotonic=lambda: wall[0], time=time.time)
    monkeypatch.setattr(dispatcher_module, "time", clock)
    monkeypatch.setattr(dispatcher_metrics, "time", clock)
    disp = DispatcherHost(exp, 0, 1, ["http://127.0.0.1:9"] * exp.n, "token")
    assert disp.core.learned is not None and disp.policy.r == 1  # type: ignore[attr-defined]
    host = node_host(exp, [0, 1], idle_loop)
    driven = [
        Driven(host.models[0], [(1.0, 2.0), (2.0, 3.0), (4.0, 0.5)]),
        Driven(host.models[1], [(0.0, 10.0), (2.5, 1.0)]),
    ]

    def at_dispatcher(tau: float) -> None:
        wall[0] = 100.0 + tau * exp.run.time_scale

    snaps = []
    plan = [
        (1.5, 1.0, [(0.5, None, 1)]),
        (3.5, 3.0, [(2.0, 2, 1)]),
        (5.5, 7.0, [(4.0, None, -1), (5.0, 3, 0)]),
    ]
    for i, (t, tau, changes) in enumerate(plan):
        for d in driven:
            d.to(t)
        for when, r, accepted in changes:
            at_dispatcher(when)
            if r is not None:
                disp.policy.r = r  # type: ignore[attr-defined]
                disp.core.track_r(wall[0])
            if accepted:
                disp.core.present.add(accepted, wall[0])
        at_dispatcher(tau)
        host.core.sent = Counter(
            token_departure=[2, 5, 9][i], token_arrival=[0, 1, 1][i], token_epoch=[1, 2, 4][i]
        )
        disp.core.sent = Counter(epoch=[1, 2, 4][i])
        disp.core.decisions = Counter(green_prev=[3, 6, 10][i], yellow=[1, 2, 5][i])
        pages = {"http://dispatcher": dispatcher_page(disp), "http://nodes": node_page(host, t)}
        snaps.append(Snapshot(float(i), {u: parse(p) for u, p in pages.items()}))
    return exp, snaps


def u(r: float, x: int) -> float:
    return x * math.log(r / x) if x else 0.0


def test_cluster_raw_pools_utility_tails_and_slta_r(
    pool_snapshots: tuple[Experiment, list[Snapshot]],
) -> None:
    exp, snaps = pool_snapshots
    records = [TaskRecord(2.0, 1.0, 0, 1.25, 1.0, True), TaskRecord(4.0, 1.0, 1, 0.75, 0.5, False)]
    raw = cluster_raw(exp, snaps, records)
    # batch 0 [1.5, 3.5]: node 0: 1 task 1 s, 2 tasks 1 s; node 1: 1 task 1 s, 2 tasks 1 s
    # batch 1 [3.5, 5.5]: node 0: 1 task 1 s, 2 tasks .5 s, idle .5 s; node 1: 1 task 2 s
    assert_ratio(raw, "mean_tasks_per_node", [3.0 + 3.0, 2.0 + 2.0], [4.0, 4.0])
    util = [
        u(3, 1) + u(3, 2) + u(5, 1) + u(5, 2),
        u(3, 1) + 0.5 * u(3, 2) + 2 * u(5, 1),
    ]
    assert_ratio(raw, "utility", util, [4.0, 4.0])
    assert_ratio(raw, "tail:0:1", [2.0, 1.5], [2.0, 2.0])
    assert_ratio(raw, "tail:0:2", [1.0, 0.5], [2.0, 2.0])
    assert_ratio(raw, "tail:1:1", [2.0, 2.0], [2.0, 2.0])
    assert_ratio(raw, "tail:1:2", [1.0, 0.0], [2.0, 2.0])
    # r over the dispatcher's own clock: [1,3]: 1 until 2, then 2; [3,7]: 2 until 5, then 3
    assert_ratio(raw, "slta_r", [1 * 1 + 2 * 1, 2 * 2 + 3 * 2], [2.0, 4.0])
    # tasks accepted and not answered, over the dispatcher's clock: [1, 3] 1 then 2, [3, 7] 2 then 1
    assert_ratio(raw, "tasks_in_system", [1 * 1 + 2 * 1, 2 * 1 + 1 * 3], [2.0, 4.0])
    # tokens and epochs over decisions: decisions 4 and 7
    assert_ratio(raw, "messages:token_departure", [3.0, 4.0], [4.0, 7.0])
    assert_ratio(raw, "messages:token_arrival", [1.0, 0.0], [4.0, 7.0])
    assert_ratio(raw, "messages:token_epoch", [1.0, 2.0], [4.0, 7.0])
    assert_ratio(raw, "messages:epoch", [1.0, 2.0], [4.0, 7.0])
    assert_ratio(raw, "messages_per_task", [6.0, 8.0], [4.0, 7.0])
    assert raw.decisions == {"green_prev": 7, "yellow": 4}
    # pools: no idle capacity and no waiting
    for key in ("idle_capacity", "idle_nodes", "wait_probability"):
        assert key not in raw.ratios
    # batches [1.5, 3.5) and [3.5, 5.5)
    assert raw.sojourns == [[1.25], [0.75]]
    # and the shared result object takes it
    res = summarize(exp, [raw], source="cluster")
    assert res.source == "cluster"
    assert close(res.metrics["slta_r"]["value"], 13.0 / 6.0)
    assert close(res.metrics["utility"]["value"], sum(util) / 8.0)
    assert [e["value"] for e in res.metrics["occupancy_tail"]["small"]] == pytest.approx(
        [1.0, 3.5 / 4, 1.5 / 4], rel=REL
    )


# ============================================================================================= sweep


def test_split_values_keeps_brackets_braces_and_quotes_whole() -> None:
    assert split_values("jiq,power_of_d, least_request") == ["jiq", "power_of_d", "least_request"]
    assert split_values("[1,2],{x=1,y=[3,4]},5") == ["[1,2]", "{x=1,y=[3,4]}", "5"]
    assert split_values("[[1,2],[3]],[4]") == ["[[1,2],[3]]", "[4]"]
    assert split_values("\"a,b\",'c,d',e") == ['"a,b"', "'c,d'", "e"]
    assert split_values('"[",x') == ['"["', "x"]  # a bracket inside quotes is text
    assert split_values('{dist="lognormal", mean=1, scv=0.5}') == ['{dist="lognormal", mean=1, scv=0.5}']
    assert split_values("0.5") == ["0.5"]


def test_split_values_respects_escaped_quotes() -> None:
    assert split_values(r'"a\"b,c",d') == [r'"a\"b,c"', "d"]


def test_grid_is_every_combination_in_the_order_given() -> None:
    points = grid(["policy.name=jiq,power_of_d", "workload.load=0.5,0.7,0.9", "run.batches=10"])
    assert len(points) == 6
    assert points[0] == ["policy.name=jiq", "workload.load=0.5", "run.batches=10"]
    assert points[1] == ["policy.name=jiq", "workload.load=0.7", "run.batches=10"]
    assert points[3] == ["policy.name=power_of_d", "workload.load=0.5", "run.batches=10"]
    assert points[-1] == ["policy.name=power_of_d", "workload.load=0.9", "run.batches=10"]
    assert varying(points) == ["policy.name", "workload.load"]
    assert grid([]) == [[]]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["workload.load"], ["--set", "workload.load", "key.path=value"]),
        (["workload.load=0.5,,0.7"], ["--set", "workload.load", "empty value"]),
        (["workload.load=0.5,"], ["--set", "workload.load", "empty value"]),
    ],
)
def test_grid_rejects_bad_overrides(overrides: list[str], words: list[str]) -> None:
    with pytest.raises(SpecError) as e:
        grid(overrides)
    assert all(w in str(e.value) for w in words), str(e.value)


SWEEP_SPEC = """
name = "sweep-pools"
seed = 11

[[classes]]
name = "small"
count = 2
discipline = "pool"
utility = { kind = "xlog", r = 3 }

[[classes]]
name = "large"
count = 2
discipline = "pool"
utility = { kind = "xlog", r = 4 }

[workload]
load = 1.5
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "slta"
beta_scale = 1.0
rank_order = "ji"

[run]
warmup = 5.0
duration = 40.0
batches = 5
"""


@pytest.fixture
def sweep_spec(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP_SPEC)
    return path


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["workload.load"], ["--set", "workload.load"]),
        (["workload.load=1.5,,2"], ["workload.load", "empty value"]),
        (["workload.load=1.5,abc"], ["sweep.toml", "workload.load"]),
        (["policy.name=jlmu,best"], ["sweep.toml", "policy.name"]),
    ],
)
def test_bad_sweep_overrides_exit_2_with_one_line(
    sweep_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], words: list[str]
) -> None:
    argv = ["sweep", str(sweep_spec), "--simulate-only", "--quiet", "--out", str(tmp_path / "out")]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lbt: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_bad_run_override_exits_2_before_anything_starts(
    sweep_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["run", str(sweep_spec), "--set", "workload.load=-1", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lbt: error: ") and err.count("\n") == 1 and "workload.load" in err, err
    assert not out.exists()


def test_policy_switch_drops_foreign_keys_and_keeps_shared_ones(sweep_spec: Path, tmp_path: Path) -> None:
    # the SLTA file's beta_scale would be an unknown key for jlmu; rank_order is jlmu's too
    exp = load_spec(sweep_spec, ["policy.name=jlmu"])
    assert exp.policy.name == "jlmu" and exp.policy.rank_order == "ji"  # type: ignore[attr-defined]
    assert getattr(exp.policy, "beta", None) is None  # jlmu takes no beta: it was dropped
    pod = tmp_path / "pod.toml"
    pod.write_text(
        QUEUES.replace('name = "power_of_d"\nd = 2', 'name = "power_of_d"\nd = 3\ntie_break = "fastest"')
    )
    lr = load_spec(pod, ["policy.name=least_request"])  # takes d, not tie_break
    assert lr.policy.name == "least_request" and lr.policy.d == 3  # type: ignore[attr-defined]
    assert getattr(lr.policy, "tie_break", "random") == "random"  # least_request takes none: dropped
    jsq = load_spec(pod, ["policy.name=jsq"])  # takes tie_break, not d
    assert jsq.policy.tie_break == "fastest" and getattr(jsq.policy, "d", None) is None  # type: ignore[attr-defined]
    # a key set after the switch is checked against the new policy
    with pytest.raises(SpecError, match="beta_scale"):
        load_spec(sweep_spec, ["policy.name=jlmu", "policy.beta_scale=2"])


def test_override_without_a_key_is_rejected(sweep_spec: Path) -> None:
    with pytest.raises(SpecError):
        load_spec(sweep_spec, ["=5"])


class PlotSpy:
    """Wraps ``plots._save``: records what each figure shows before the PNG is written."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.figures: dict[str, list[dict[str, Any]]] = {}
        original = plots._save

        def spy(fig: Any, path: Path) -> Path:
            self.figures[path.name] = [
                {
                    "xlabel": ax.get_xlabel(),
                    "ylabel": ax.get_ylabel(),
                    "legend": [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [],
                }
                for ax in fig.axes
            ]
            return original(fig, path)

        monkeypatch.setattr(plots, "_save", spy)


def assert_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(pixels[..., :3].std()) > 0.0  # something is drawn


def test_simulate_only_sweep_end_to_end(
    sweep_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = PlotSpy(monkeypatch)
    out = tmp_path / "sweep"
    argv = ["sweep", str(sweep_spec), "--simulate-only", "--quiet", "--jobs", "1", "--out", str(out)]
    argv += ["--set", "policy.name=jlmu,slta", "--set", "workload.load=1.5,2.5", "--set", "run.batches=5"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["spec"] == str(sweep_spec)
    settings = [p["settings"] for p in doc["points"]]
    assert settings == [
        {"policy.name": "jlmu", "workload.load": "1.5"},
        {"policy.name": "jlmu", "workload.load": "2.5"},
        {"policy.name": "slta", "workload.load": "1.5"},
        {"policy.name": "slta", "workload.load": "2.5"},
    ]
    for p in doc["points"]:
        assert p["source"] == "simulation" and p["agrees"] is None
        # the policy really switched: only slta learns r
        assert (p["metrics"]["slta_r"]["value"] is not None) == (p["settings"]["policy.name"] == "slta")
        assert p["metrics"]["utility"]["value"] is not None and p["theory"]["utility"]["value"] is not None
    md = (out / "sweep.md").read_text().splitlines()
    table_rows = [line for line in md if line.startswith("| jlmu |") or line.startswith("| slta |")]
    assert len(table_rows) == 4
    assert_png(out / "tradeoff.png")
    (ax,) = spy.figures["tradeoff.png"]
    assert ax["xlabel"] and ax["ylabel"] == "utility per node"
    assert ax["legend"] == ["jlmu", "slta", "load=1.5", "load=2.5"]  # colour per policy, marker per load
    # the numeric setting swept gets its own plot, a line per policy; the policy name does not
    assert_png(out / "against_workload_load.png")
    (ax,) = spy.figures["against_workload_load.png"]
    assert ax["xlabel"].startswith("workload.load") and sorted(ax["legend"]) == ["jlmu", "slta"]
    assert "against_policy_name.png" not in spy.figures
    assert "![against_workload_load](against_workload_load.png)" in md
    assert str(out / "sweep.md") in stdout and "against_workload_load.png" in stdout


# ===================================================================================== report, plots

TWO_CLASSES = QUEUES.replace('name = "power_of_d"\nd = 2', 'name = "power_of_d"')

SCALARS_BY_HAND = (
    "mean_sojourn",
    "sojourn_p50",
    "sojourn_p99",
    "mean_tasks_per_node",
    "tasks_in_system",
    "utility",
    "wait_probability",
    "idle_capacity",
    "idle_nodes",
    "messages_per_task",
    "slta_r",
)


def run_report(limit: bool = True) -> report.RunReport:
    """Every scalar valued everywhere. Against the simulation only sojourn_p99 disagrees (0.5 apart,
    combined half-width .1); against the theory mean_sojourn disagrees, a limit prediction when ``limit``."""
    exp = experiment(TWO_CLASSES)
    base = {m: est(1.0, 0.05) for m in SCALARS_BY_HAND}
    base["messages_per_task"] = {"value": 4.0, "ci95": 0.05, "by_kind": {"probe": 2.0, "probe_reply": 2.0}}
    tails = {"fast": tail((0.5, 0.01), (0.2, 0.01)), "slow": tail((0.3, 0.01))}
    cluster = result(
        "cluster", tails, **{**base, "mean_sojourn": est(2.0, 0.06), "sojourn_p99": est(5.0, 0.06)}
    )
    sim = result(
        "simulation", tails, **{**base, "mean_sojourn": est(2.05, 0.08), "sojourn_p99": est(5.5, 0.08)}
    )
    assumes = ["n -> infinity (mean field)"] if limit else ["exact"]
    notes = [{"metric": "mean_sojourn", "formula": "W", "source": "s", "assumes": assumes}]
    theory = result(
        "theory",
        {"fast": tail((0.5, None), (0.2, None)), "slow": []},
        notes,
        **{**base, "mean_sojourn": est(2.5), "slta_r": est(None)},
    )
    return report.build(exp, Side(cluster), Side(sim), theory, {"metrics_source": "scrape"}, ["a warning"])


def test_comparison_rows_have_every_metric_and_mark_limits() -> None:
    rep = run_report()
    rows = report.comparison_rows(rep)
    assert rows[0] == [
        "metric",
        "unit",
        "cluster",
        "simulation",
        "cluster-sim",
        "verdict",
        "theory",
        "verdict",
    ]
    names = [r[0] for r in rows[1:]]
    # a tail's row names the level j at which every source's value is shown: its worst point's
    assert sorted(names) == sorted(
        [*SCALARS_BY_HAND, "occupancy_tail[fast] at j=1", "occupancy_tail[slow] at j=1"]
    )
    by = {r[0]: r for r in rows[1:]}
    assert all(len(r) == 8 for r in rows)
    se = 0.5 / (0.1 / Z95)  # sojourn_p99 against the simulation: 0.5 apart, combined half-width .1
    assert by["sojourn_p99"][5] == f"disagrees ({se:.1f} se)"
    assert by["sojourn_p99"][4] == "-0.5 ± 0.1"  # the gap and its interval (no batches here: unpaired)
    assert by["mean_sojourn"][5] == "agrees"
    assert by["mean_sojourn"][7] == f"(disagrees ({0.5 / (0.06 / Z95):.1f} se), limit)"
    assert by["mean_sojourn"][2].startswith("2 ± 0.06")
    assert by["slta_r"][6:] == ["-", "-"]  # theory has no value: no verdict
    assert by["occupancy_tail[fast] at j=1"][5] == "agrees"
    assert rep.agrees is False
    # without the limit note the theory's verdict is plain
    plain = {r[0]: r for r in report.comparison_rows(run_report(limit=False))[1:]}
    assert plain["mean_sojourn"][7] == f"disagrees ({0.5 / (0.06 / Z95):.1f} se)"


def test_rows_without_any_value_are_left_out() -> None:
    rep = run_report()
    for r in (rep.cluster, rep.simulation, rep.theory):
        assert r is not None
        r.metrics["wait_probability"] = est(None)
    rep.verdicts = compare(Side(rep.cluster), Side(rep.simulation)) + compare(
        Side(rep.cluster), Side(rep.theory)
    )
    names = [r[0] for r in report.comparison_rows(rep)[1:]]
    assert "wait_probability" not in names and "idle_nodes" in names


def test_markdown_opens_with_the_headline_and_the_table() -> None:
    rep = run_report()
    text = report.markdown(rep, [Path("somewhere/occupancy_tail.png"), Path("somewhere/sojourn.png")])
    lines = text.splitlines()
    assert lines[0] == "# measure-queues: power_of_d on a 3-node cluster, dispatchers=1"
    assert lines[1] == ""
    assert lines[2].startswith("**DISAGREES: ") and "sojourn_p99 vs simulation" in lines[2]
    assert "mean_sojourn vs theory" not in lines[2]  # a limit prediction does not decide
    assert lines[4] == "| metric | unit | cluster | simulation | cluster-sim | verdict | theory | verdict |"
    assert "## Warnings" in lines and "- a warning" in lines
    assert "![occupancy_tail](occupancy_tail.png)" in lines and "![sojourn](sojourn.png)" in lines
    table_lines = [
        line for line in lines if line.startswith("| occupancy_tail[") or line.startswith("| mean_")
    ]
    assert len(table_lines) == 4  # mean_sojourn, mean_tasks_per_node, two tails


def test_headline_agrees_when_nothing_that_counts_disagrees() -> None:
    rep = run_report()
    rep.verdicts = [v for v in rep.verdicts if v.metric != "sojourn_p99"]
    counted = sum(1 for v in rep.verdicts if v.counts and v.agrees)
    # by hand: against the simulation the 10 scalars left and the 2 tails; against the theory those scalars
    # but mean_sojourn (a limit) and slta_r (no value), and the tail "fast" ("slow" has no theory points)
    assert counted == 12 + 9
    assert report.headline(rep) == (
        "AGREES: all 21 comparisons that decide agree: 12 metrics cluster vs simulation (within their 95% "
        "intervals), 9 metrics cluster vs theory (the theory's exact and finite-n values, within their "
        "stated error)"
    )
    # the terminal ends with the headline, wrapped to its width
    text = report.terminal(rep)
    assert " ".join(text.split()).endswith(" ".join(report.headline(rep).split()))
    assert max(map(len, text.splitlines())) <= 100


def test_results_json_is_strict_json(tmp_path: Path) -> None:
    rep = run_report()
    assert rep.theory is not None
    rep.cluster.metrics["idle_nodes"] = est(3.0)  # no interval on either side, and different values
    rep.theory.metrics["idle_nodes"] = est(3.5)
    rep.verdicts = compare(Side(rep.cluster), Side(rep.simulation)) + compare(
        Side(rep.cluster), Side(rep.theory)
    )
    raw = RawRun(batches=2, ratios={"tasks_in_system": (np.array([1.0, 2.0]), np.ones(2))})
    report.write(tmp_path, rep, {"cluster": raw}, [])

    def reject(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    json.loads((tmp_path / "results.json").read_text(), parse_constant=reject)


def test_slta_r_plot_without_a_simulation(tmp_path: Path) -> None:
    exp = experiment(POOLS)
    tails = {"small": tail((0.9, 0.01)), "large": tail((0.8, 0.01))}
    cluster = result("cluster", tails, slta_r=est(2.5, 0.1), utility=est(0.9, 0.01))
    theory = result("theory", tails, [], slta_r=est(2.4), utility=est(0.91))
    rep = report.build(exp, Side(cluster), None, theory, {}, [])
    raw = RawRun(batches=2, ratios={"utility": (np.array([0.9, 0.92]), np.ones(2))})
    files = report.write(tmp_path, rep, {"cluster": raw}, [(1.5, 2.0), (2.5, 3.0), (4.0, 2.0)])
    assert "slta_r.png" in [f.name for f in files]


def test_warmup_warning_names_the_warmup_that_suffices(tmp_path: Path) -> None:
    spec = tmp_path / "pools.toml"
    spec.write_text(SWEEP_SPEC.replace("warmup = 5.0", "warmup = 0.0"))
    warning = runner.warmup_warning(load_spec(spec))
    assert warning is not None and "--set run.warmup=" in warning
    enough = warning.rpartition("--set ")[2].strip()
    assert runner.warmup_warning(load_spec(spec, [enough])) is None
    assert runner.warmup_warning(experiment(QUEUES)) is None  # no fluid model for queues


def raw_run(series: list[float], key: str) -> RawRun:
    raw = RawRun(batches=len(series))
    raw.ratios[key] = (np.array(series), np.ones(len(series)))
    raw.sojourns = [[0.5, 1.0, 2.0], [0.25, 3.0]]
    return raw


def test_every_plot_writes_a_labelled_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = PlotSpy(monkeypatch)
    rep = run_report()
    assert rep.simulation is not None and rep.theory is not None
    results = [rep.cluster, rep.simulation, rep.theory]
    pools = tmp_path / "pools"
    pools.mkdir()
    bounded = result("theory")
    bounded.extras["bounds"] = {"utility_upper": 1.0, "utility_poisson_jensen": 0.95}
    written = [
        plots.occupancy_tail(tmp_path, results, run="r"),
        plots.over_time(
            tmp_path,
            2.0,
            6.0,
            {
                "cluster": raw_run([1.0, 1.5], "tasks_in_system"),
                "simulation": raw_run([1.2, 1.4], "tasks_in_system"),
            },
            rep.theory,
            run="r",
        ),
        plots.over_time(pools, 2.0, 6.0, {"cluster": raw_run([0.8, 0.9], "utility")}, bounded, run="r"),
        plots.learned(
            tmp_path,
            SLTA_R,
            [(2.0, 3.0), (4.0, 4.0)],
            RawRun(batches=2, r_series=[(2.5, 3), (5.0, 4)]),
            rep.theory,
            run="r",
        ),
        plots.messages(tmp_path, results, run="r"),
        plots.sojourn(tmp_path, {"cluster": [0.5, 1.0, 2.0], "simulation": [0.4, 1.1]}, rep.theory, run="r"),
    ]
    names = [
        "occupancy_tail.png",
        "over_time.png",
        "over_time.png",
        "slta_r.png",
        "messages.png",
        "sojourn.png",
    ]
    for path, name in zip(written, names, strict=True):
        assert path is not None and path.name == name
        assert_png(path)
    for name in set(names):
        for ax in spy.figures[name]:
            assert ax["xlabel"] and ax["ylabel"] and ax["legend"], (name, ax)
    assert len(spy.figures["occupancy_tail.png"]) == 2  # one panel per class
    assert "model s" in spy.figures["sojourn.png"][0]["xlabel"]  # the unit is named


def test_plots_that_do_not_apply_return_none(tmp_path: Path) -> None:
    quiet = result(
        "cluster",
        {"servers": tail((0.5, 0.01))},
        messages_per_task={"value": 0.0, "ci95": 0.0, "by_kind": {}},
    )
    assert plots.messages(tmp_path, [quiet], run="r") is None
    assert plots.sojourn(tmp_path, {"cluster": [], "simulation": []}, None, run="r") is None
    assert plots.learned(tmp_path, SLTA_R, [], RawRun(batches=2), None, run="r") is None
    assert list(tmp_path.iterdir()) == []


def test_report_write_lists_the_files_it_wrote(tmp_path: Path) -> None:
    rep = run_report()
    raws = {
        "cluster": raw_run([1.0, 1.5], "tasks_in_system"),
        "simulation": raw_run([1.2, 1.4], "tasks_in_system"),
    }
    files = report.write(tmp_path, rep, raws, [])
    assert [f.name for f in files[:2]] == ["results.json", "report.md"]
    assert {f.name for f in files[2:]} == {
        "occupancy_tail.png",
        "over_time.png",
        "messages.png",
        "sojourn.png",
    }
    for f in files:
        assert f.exists()
    doc = json.loads((tmp_path / "results.json").read_text())
    assert set(doc["results"]) == {"cluster", "simulation", "theory"}
    assert doc["agrees"] is False and doc["warnings"] == ["a warning"]
    assert len(doc["comparison"]) == len(rep.verdicts)
    md = (tmp_path / "report.md").read_text()
    for f in files[2:]:
        assert f"({f.name})" in md


# ============================================================================================ runner


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    """A cluster file for the tiny fcfs spec whose processes are not running (ports found free)."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(QUEUES.replace("[run]\n", "[run]\ntime_scale = 0.05\n"))
    d, h = free_ports(2)
    f = ClusterFile.of(
        load_spec(spec),
        token="token",
        dispatchers=[Endpoint("dispatcher", 0, f"http://127.0.0.1:{d}")],
        node_hosts=[Endpoint("nodes", 0, f"http://127.0.0.1:{h}", [0, 1, 2])],
    )
    path = tmp_path / "cluster.json"
    f.save(path)
    return path


@pytest.mark.parametrize(
    ("override", "what"),
    [
        ("classes[0].count=3", "classes"),
        ("policy.name=jsq", "policy"),
        ("run.time_scale=0.5", "run.time_scale"),
        ("seed=4", "seed"),
    ],
)
def test_existing_cluster_must_run_the_spec(
    cluster_file: Path, tmp_path: Path, override: str, what: str
) -> None:
    spec = ClusterFile.load(cluster_file).spec
    exp = load_spec(spec, [override])
    with (
        pytest.raises(ClusterError, match=f"run {what} = "),
        runner.cluster_for(exp, tmp_path, cluster_file, 1, None, lambda _: None),
    ):
        pass
    # the same spec is accepted, and nothing is started or stopped
    same = load_spec(spec)
    with runner.cluster_for(same, tmp_path, cluster_file, 1, None, lambda _: None) as f:
        assert f.node_urls() == [f"{f.node_hosts[0].url}/v1/nodes/{k}" for k in range(3)]
    assert cluster_file.exists()


def test_an_unreachable_cluster_is_refused_before_anything_starts(
    cluster_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its processes named in one line, exit 2, and no run directory: no load was sent."""
    spec = ClusterFile.load(cluster_file).spec
    argv = ["run", spec, "--endpoints", str(cluster_file), "--out", str(tmp_path / "r"), "--quiet"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "did not answer" in err and "internal error" not in err, err
    for e in ClusterFile.load(cluster_file).dispatchers + ClusterFile.load(cluster_file).node_hosts:
        assert e.url in err
    assert not (tmp_path / "r" / "journal.jsonl").exists()
