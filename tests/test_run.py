"""``lbt run`` end to end: a real cluster, the open-loop generator, the twin, the simulator and the theory.

Each policy runs on a small cluster for under a minute of wall time. The run's verdict is the cluster
against its twin (the simulation of the same tasks with the delays the cluster measured), paired batch by
batch. The checks recompute that comparison from the batch values in results.json (a paired t interval
on the per-batch log ratios or differences), so they do not only trust the verdict words, and check the
per-task legs against the sojourns they make up.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from result_schemas import problems

POOLS = """
name = "{name}"
seed = 5

[[classes]]
name = "small"
count = 5
discipline = "pool"
utility = {{ kind = "xlog", r = 6 }}

[[classes]]
name = "large"
count = 5
discipline = "pool"
utility = {{ kind = "xlog", r = 9 }}

[workload]
load = 3.0
service = {{ dist = "exponential", mean = 1.0 }}

[policy]
{policy}

[run]
warmup = 10.0
duration = {duration}
time_scale = {scale}
batches = 10
"""

QUEUES = """
name = "{name}"
seed = 5

[[classes]]
name = "servers"
count = 10
discipline = "fcfs"
speed = 1.0

[workload]
load = 0.7
service = {{ dist = "exponential", mean = 1.0 }}

[policy]
{policy}

[run]
warmup = 10.0
duration = {duration}
time_scale = {scale}
batches = 10
"""

# policy: (spec template, policy table, headline metric, model seconds measured, time_scale). SLTA's tokens
# and epochs follow every few events, so it gets the slowest clock: 30 arrivals per model second are 17 ms
# apart in wall time at 0.5, several loopback round trips.
CASES = {
    "jlmu": (POOLS, 'name = "jlmu"', "utility", 120.0, 0.25),
    "slta": (POOLS, 'name = "slta"\nbeta_scale = 1.0', "utility", 80.0, 0.5),
    "jiq": (QUEUES, 'name = "jiq"', "mean_sojourn", 100.0, 0.3),
    "power_of_d": (QUEUES, 'name = "power_of_d"\nd = 2', "mean_sojourn", 100.0, 0.3),
    # two dispatchers, each on the departures of its own tasks (docs/spec.md, dispatchers and split)
    "jsq_two_dispatchers": (QUEUES, 'name = "jsq"\ndispatchers = 2', "mean_sojourn", 100.0, 0.3),
    # the nodes' own updates, at k T of the run's clock, to both dispatchers (docs/spec.md, "sparse_jsq")
    "sparse_jsq_two_dispatchers": (
        QUEUES,
        'name = "sparse_jsq"\ndispatchers = 2\nupdates = "synchronous"\nrate = 0.5',
        "mean_sojourn",
        100.0,
        0.3,
    ),
    "jiq_sparse_two_dispatchers": (
        QUEUES,
        'name = "jiq_sparse"\ndispatchers = 2\np = 0.5',
        "mean_sojourn",
        100.0,
        0.3,
    ),
}


def lbt_start(spec: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--out", str(out), "--json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lbt_finish(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, dict[str, Any]]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # lbt run stops its cluster on SIGTERM
        proc.communicate(timeout=30)
        raise
    assert proc.returncode in (0, 1), stderr
    return proc.returncode, json.loads(stdout)


def lbt_run(spec: Path, out: Path, *extra: str, timeout: float = 180) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--out", str(out), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def verdict(
    doc: dict[str, Any], metric: str, reference: str = "twin", subject: str = "cluster"
) -> dict[str, Any]:
    found = [
        v
        for v in doc["comparison"]
        if v["metric"] == metric and v["reference"] == reference and v["subject"] == subject
    ]
    assert len(found) == 1, (metric, reference, subject)
    return found[0]


LOG_SCALE = {"mean_sojourn", "sojourn_p50", "sojourn_p99", "mean_tasks_per_node", "tasks_in_system"}
LOG_SCALE |= {"messages_per_task"}


def batch_values(doc: dict[str, Any], source: str, metric: str) -> dict[int, float]:
    """A result's value of ``metric`` by batch (window position), from results.json's ``batch_values``
    (the batches' positions, and per metric a value for each: null in a batch without one)."""
    table = doc["results"][source]["batch_values"]
    values = zip(table["batches"], table["values"][metric], strict=True)
    return {b: v for b, v in values if v is not None}


def paired_by_hand(doc: dict[str, Any], metric: str, a: str, b: str) -> tuple[float, float, int]:
    """(mean, t half-width, df) of the per-batch log ratios (or differences) of ``metric`` between the
    results ``a`` and ``b``, from their batch values."""
    from scipy import stats

    va, vb = (batch_values(doc, source, metric) for source in (a, b))
    common = sorted(va.keys() & vb.keys())
    log = metric in LOG_SCALE and all(va[k] > 0 and vb[k] > 0 for k in common)
    d = [math.log(va[k] / vb[k]) if log else va[k] - vb[k] for k in common]
    # docs/run.md: a per-batch gap within 1e-9 of the values' size is rounding and counts as 0
    size = [1.0 if log else max(abs(va[k]), abs(vb[k])) for k in common]
    d = [0.0 if abs(x) <= 1e-9 * s else x for x, s in zip(d, size, strict=True)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n), n - 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, Any], Path]]:
    """Every case's `lbt run`, all at once: each cluster is light (tens of tasks per wall second) and
    mostly waits on its clock, and its verdict is against its own twin, which the machine's load does not
    move; one after the other they took three and a half minutes."""
    started = {}
    for policy, (template, table, _, duration, scale) in CASES.items():
        d = tmp_path_factory.mktemp(policy)
        spec = d / "spec.toml"
        spec.write_text(template.format(name=f"run-{policy}", policy=table, duration=duration, scale=scale))
        started[policy] = (lbt_start(spec, d / "report"), d / "report")
    return {policy: (*lbt_finish(proc), out) for policy, (proc, out) in started.items()}


@pytest.mark.parametrize("policy", list(CASES))
def test_cluster_agrees_with_its_twin(policy: str, runs: dict[str, tuple[int, dict[str, Any], Path]]) -> None:
    _, doc, _ = runs[policy]
    cluster = doc["results"]["cluster"]["metrics"]
    headline = CASES[policy][2]
    for metric in (headline, "messages_per_task"):
        assert cluster[metric]["value"] is not None and cluster[metric]["ci95"] is not None, metric
        v = verdict(doc, metric)
        assert v["paired"] and v["counts"] and v["verdict"] == "agrees", v
        mean, half, df = paired_by_hand(doc, metric, "cluster", "twin")
        assert v["df"] == df == 9  # ten batches
        if v["relative"] is not None:  # the log scale: the row gives exp(mean) - 1
            assert v["relative"] == pytest.approx(math.expm1(mean), rel=1e-9, abs=1e-12)
        else:
            assert v["difference"] == pytest.approx(mean, rel=1e-9, abs=1e-12)
            assert v["difference_ci95"] == pytest.approx(half, rel=1e-9)
    for name in cluster["occupancy_tail"]:
        v = verdict(doc, f"occupancy_tail[{name}]")
        assert v["verdict"] == "agrees", v
    # the twin's cost to the policy is reported against the zero-delay simulation, not counted
    cost = verdict(doc, headline, "simulation", "twin")
    assert cost["paired"] and not cost["counts"]
    # every task came back, and the load generator kept its schedule well enough to count
    load = doc["results"]["cluster"]["load"]
    assert load["completed"] == load["scheduled"], load


@pytest.mark.parametrize("policy", ["jiq", "power_of_d"])
def test_the_exact_theory_decides_against_the_simulation(
    policy: str, runs: dict[str, tuple[int, dict[str, Any], Path]]
) -> None:
    """Ten fcfs nodes at load 0.7: JIQ and JSQ(2) are exact at that n (the Markov chain, docs/theory.md,
    "Values at the spec's n"), so the theory counts, against the zero-delay simulation and within its stated
    error; the cluster, whose delays cost the policy, sees it for information only."""
    _, doc, _ = runs[policy]
    theory = doc["results"]["theory"]["metrics"]
    for metric in ("mean_sojourn", "wait_probability"):
        assert theory[metric]["regime"] == "exact" and theory[metric]["limit"] is not None
        v = verdict(doc, metric, "theory", "simulation")
        assert v["counts"] and v["verdict"] == "agrees", v
        assert not verdict(doc, metric, "theory", "cluster")["counts"]


SOJOURNS = ("mean_sojourn", "sojourn_p50", "sojourn_p99")


@pytest.mark.parametrize("policy", list(CASES))
def test_rows_that_cannot_disagree_are_shown_but_not_counted(
    policy: str, runs: dict[str, tuple[int, dict[str, Any], Path]]
) -> None:
    """On pool nodes the twin's sojourns are the cluster's task by task (the task's own service plus its
    measured legs): the sojourn rows of cluster against twin are shown, marked "by construction", and not
    counted, so the headline counts only rows that could have failed. On fcfs nodes they decide. The
    claim itself is checked from tasks.csv: on pools each batch's mean sojourn of the twin is the
    cluster's up to the legs the twin takes as 0 where a clock reading made them negative (a reply read
    a hair before the model's completion instant), the only place the twin departs from the legs."""
    import csv

    _, doc, report = runs[policy]
    pools = CASES[policy][0] is POOLS
    for metric in SOJOURNS:
        v = verdict(doc, metric)
        assert v["by_construction"] is pools and v["counts"] is not pools, v
    if pools:
        settings = doc["results"]["cluster"]["settings"]
        width = settings["duration"] / settings["batches"]
        slack: dict[int, list[float]] = {}
        with open(report / "tasks.csv", newline="") as f:
            for r in csv.DictReader(f):
                b = math.floor((float(r["t"]) - settings["warmup"]) / width)
                legs = [float(r[k]) for k in ("arrive", "decide", "forward", "reply")]
                slack.setdefault(b, []).append(sum(-x for x in legs if x < 0))
        a, b = (batch_values(doc, source, "mean_sojourn") for source in ("cluster", "twin"))
        assert a.keys() == b.keys()
        for k in a:
            allowed = sum(slack[k]) / len(slack[k])
            assert abs(a[k] - b[k]) <= allowed + 1e-9 * a[k], (k, a[k], b[k], allowed)
    counted = [v for v in doc["comparison"] if v["counts"] and v["agrees"] is not None]
    assert not any(v["by_construction"] for v in counted)
    text = (report / "report.md").read_text()
    assert f"{len(counted)} comparisons that decide" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    for metric in SOJOURNS:
        assert ("by construction" in rows[metric]) is pools, rows[metric]


@pytest.mark.parametrize("policy", list(CASES))
def test_results_json_follows_its_schema(
    policy: str, runs: dict[str, tuple[int, dict[str, Any], Path]]
) -> None:
    """docs/results.schema.json holds for results.json (and lbt run --json prints the same object)."""
    _, doc, report = runs[policy]
    assert problems("results.schema.json", doc) == []
    assert json.loads((report / "results.json").read_text()) == doc


def test_two_dispatchers_ran_on_both_sides_of_the_comparison(
    runs: dict[str, tuple[int, dict[str, Any], Path]],
) -> None:
    """The K = 2 run started two dispatchers, and every result it compares says it ran two."""
    _, doc, _ = runs["jsq_two_dispatchers"]
    assert len(doc["results"]["cluster"]["endpoints"]["dispatchers"]) == 2
    for source in ("cluster", "twin", "simulation"):
        assert doc["results"][source]["settings"]["dispatchers"] == 2, source


def test_power_of_d_sends_exactly_2d_messages(runs: dict[str, tuple[int, dict[str, Any], Path]]) -> None:
    """The simulation counts every task's 2d messages in its own batch: exactly 2d per task. The cluster
    counts a probe when it is sent and the task when it is decided, so a task probed before a window end
    and decided after it moves its d probes (or replies) to the other side: the window's count is d per
    task up to the tasks in their probes at its two ends (a handful in 2,000)."""
    _, doc, _ = runs["power_of_d"]
    sim = doc["results"]["simulation"]["metrics"]["messages_per_task"]
    assert sim["by_kind"] == {"probe": 2.0, "probe_reply": 2.0}
    cluster = doc["results"]["cluster"]["metrics"]["messages_per_task"]["by_kind"]
    decided = sum(doc["results"]["cluster"]["decisions"].values())
    for kind in ("probe", "probe_reply"):  # d = 2 per task, at most 10 tasks in their probes at each end
        assert abs(cluster[kind] - 2.0) * decided <= 2 * (10 + 10), (cluster, decided)


def test_cluster_tail_is_recomputed_point_by_point(runs: dict[str, tuple[int, dict[str, Any], Path]]) -> None:
    """The tail verdict holds at every point: each within its Bonferroni-widened combined interval."""
    from scipy import stats

    _, doc, _ = runs["jlmu"]
    cluster, sim = doc["results"]["cluster"]["metrics"], doc["results"]["simulation"]["metrics"]
    for name, tail in cluster["occupancy_tail"].items():
        pairs = [
            (a, b)
            for a, b in zip(tail[1:], sim["occupancy_tail"][name][1:], strict=False)
            if max(a["value"], b["value"]) >= 1e-3
        ]
        z = float(stats.norm.ppf(1 - 0.025 / len(pairs)))
        for a, b in pairs:
            half = math.hypot(a["ci95"] or 0.0, b["ci95"] or 0.0)
            assert abs(a["value"] - b["value"]) <= half / 1.959964 * z, (name, a, b)


def test_report_opens_with_the_comparison_and_has_the_plots(
    runs: dict[str, tuple[int, dict[str, Any], Path]],
) -> None:
    _, doc, report = runs["slta"]
    text = (report / "report.md").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# run-slta: slta")
    assert lines[2].startswith("**AGREES") or lines[2].startswith("**DISAGREES")
    header = "| metric | unit | cluster | twin | cluster-twin | verdict | simulation | net cost | theory |"
    assert lines[4].startswith(header)
    assert "cost this slta run" in text  # the network's cost to the policy, in a sentence
    for png in ("occupancy_tail", "over_time", "slta_r", "messages", "sojourn"):
        path = report / f"{png}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({png}.png)" in text
    assert json.loads((report / "results.json").read_text())["name"] == "run-slta"
    # the SLTA r integral made it into the result, near the simulator's
    assert doc["results"]["cluster"]["metrics"]["slta_r"]["value"] is not None


@pytest.mark.parametrize("policy", list(CASES))
def test_the_legs_make_up_each_sojourn(
    policy: str, runs: dict[str, tuple[int, dict[str, Any], Path]]
) -> None:
    """tasks.csv: every completed task's legs add up to its sojourn (one clock, docs/run.md), and the
    overhead object summarises the same legs."""
    import csv

    _, doc, report = runs[policy]
    with open(report / "tasks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    load = doc["results"]["cluster"]["load"]
    assert len(rows) == load["completed"] > 100
    for r in rows:
        parts = sum(float(r[k]) for k in ("arrive", "decide", "forward", "stay", "reply"))
        assert parts == pytest.approx(float(r["sojourn"]), abs=1e-9), r
        assert 0 <= float(r["late"]) <= float(r["arrive"])
    legs = doc["results"]["cluster"]["overhead"]["legs"]
    assert set(legs) == {"late", "to_dispatcher", "decide", "forward", "notify", "reply", "total"}
    scale = CASES[policy][4]
    total = sorted(float(r["sojourn"]) - float(r["stay"]) for r in rows)
    assert legs["total"]["count"] == len(rows)
    assert legs["total"]["p50_ms"] == pytest.approx(1e3 * scale * _median(total), rel=1e-6)


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def test_exit_code_follows_the_verdicts(runs: dict[str, tuple[int, dict[str, Any], Path]]) -> None:
    """Exit 0 only with both answers: faithful (no comparison that counts disagrees, no leg beyond what the
    machine explains) and representative (every net cost's interval within the tolerance: recomputed here
    from the costs)."""
    for policy, (code, doc, _) in runs.items():
        counted = [v for v in doc["comparison"] if v["counts"]]
        disagree = any(v["agrees"] is False for v in counted)
        assert doc["agrees"] is (not disagree), policy
        rep = doc["representative"]
        tolerance = rep["tolerance"]
        representative = all(abs(c["cost"]) + (c["ci95"] or 0.0) <= tolerance for c in rep["costs"])
        assert rep["holds"] is representative, policy
        explained = all(not leg["beyond"] for leg in doc["legs"]["legs"])  # each leg within the machine's
        assert doc["faithful"] is (not disagree and explained), policy
        assert code == (0 if not disagree and explained and representative else 1), policy


def test_a_bad_spec_is_exit_code_2_before_anything_starts(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    text = QUEUES.format(name="bad", policy='name = "jiq"', duration=10, scale=0.1)
    spec.write_text(text.replace("load = 0.7", "load = -1"))
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "bad.toml" in proc.stderr and "load" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_prometheus_and_direct_scraping_give_the_same_time_averages(tmp_path: Path) -> None:
    """``lbt run --with-prometheus`` reads the window from a real Prometheus server and, beside it, scrapes
    every process directly at the batch boundaries. Prometheus answers a boundary with its last scrape
    before it, so the two windows differ at each end by a shift the run records (model clocks of the same
    process in both). A time average of X in [0, M] over windows of length L whose ends differ by d1 and d2
    differs by at most 2 M (d1 + d2) / (L - d1 - d2); that is the tolerance, and it is small because the
    scrape interval is a fifth of a batch."""
    spec = tmp_path / "spec.toml"
    spec.write_text(QUEUES.format(name="prom", policy='name = "jiq"', duration=60.0, scale=0.3))
    _, doc, _ = lbt_run(spec, tmp_path / "report", "--with-prometheus")
    cluster = doc["results"]["cluster"]
    assert cluster["metrics_source"].startswith("http://127.0.0.1:")
    direct = cluster["direct_scrape"]
    d = sum(direct["window_shift"])
    L = 60.0
    assert d < 0.2 * L, direct["window_shift"]  # each end within a fraction of a batch
    tails = cluster["metrics"]["occupancy_tail"]["servers"]
    M = len(tails)  # no node held more tasks than the tail's length
    bound = 2 * (d / (L - d))
    pairs = {
        "mean_tasks_per_node": M,
        "tasks_in_system": M * 10,
        "idle_nodes": 10,
    }
    for metric, top in pairs.items():
        p, s = cluster["metrics"][metric]["value"], direct[metric]
        assert abs(p - s) <= top * bound, (metric, p, s, top * bound)
    for j, (p, s) in enumerate(zip(tails, direct["occupancy_tail"]["servers"], strict=False)):
        assert abs(p["value"] - s) <= bound, (j, p["value"], s, bound)
    # and the two are not trivially identical: Prometheus's window really is its own
    assert direct["window_shift"] != [0.0, 0.0]
    # every process's CPU over the window, per task (docs/run.md, "What a task costs in CPU"): 18 wall s
    # of a cluster at work cost every process some CPU; 7 tasks per model s: 420 in the window, sd 20
    cpu = cluster["cpu"]
    assert cpu["tasks"] > 300 and {p["role"] for p in cpu["processes"]} == {
        "dispatcher",
        "nodes",
        "generator",
    }
    assert all(
        p["cpu_seconds"] > 0 and p["per_task"] == p["cpu_seconds"] / cpu["tasks"] for p in cpu["processes"]
    )


def test_a_warmup_shorter_than_the_fluid_model_needs_is_warned_about(tmp_path: Path) -> None:
    """Pools need ln(10 sqrt(n rho)) / mu model seconds to come within a tenth of a standard deviation of
    equilibrium from empty (docs/theory.md): 10 pools at rho = 3 need ln(10 sqrt(30)) = 4.00 s."""
    from lbtestbed.experiment.runner import warmup_warning
    from lbtestbed.spec import load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text(POOLS.format(name="warm", policy='name = "jlmu"', duration=10, scale=0.1))
    need = math.log(10 * math.sqrt(30))
    short = warmup_warning(load_spec(spec, [f"run.warmup={need - 0.01}"]))
    assert short is not None and f"{need:.3g}" in short and "--set run.warmup=5" in short
    assert warmup_warning(load_spec(spec, [f"run.warmup={need + 0.01}"])) is None
    # queues have no fluid rule here: no warning rather than a wrong one
    queues = tmp_path / "q.toml"
    queues.write_text(QUEUES.format(name="q", policy='name = "jiq"', duration=10, scale=0.1))
    assert warmup_warning(load_spec(queues, ["run.warmup=0.001"])) is None


def test_sweep_runs_each_point_on_a_cluster(tmp_path: Path) -> None:
    """Two short cluster runs under one sweep: one row each, a report each, the trade-off plot."""
    spec = tmp_path / "spec.toml"
    spec.write_text(QUEUES.format(name="sweep", policy='name = "power_of_d"\nd = 2', duration=20, scale=0.2))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtestbed.cli",
            "sweep",
            str(spec),
            "--set",
            "policy.name=power_of_d,random",
            "--out",
            str(tmp_path / "sweep"),
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert [p["settings"]["policy.name"] for p in doc["points"]] == ["power_of_d", "random"]
    for p in doc["points"]:
        assert p["source"] == "cluster"
        assert (Path(p["directory"]) / "report.md").exists()
    by_policy = {p["settings"]["policy.name"]: p for p in doc["points"]}
    assert by_policy["power_of_d"]["metrics"]["messages_per_task"]["value"] == 4.0
    assert by_policy["random"]["metrics"]["messages_per_task"]["value"] == 0.0
    assert (tmp_path / "sweep" / "tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    assert proc.returncode == (0 if all(p["agrees"] for p in doc["points"]) else 1)


needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2",
)


def lbt_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("lbt-")}


@needs_root
def test_a_run_in_network_namespaces_agrees_as_on_loopback(tmp_path: Path) -> None:
    """``--netns``: every node process in its own namespace behind a veth pair and a bridge, rate-limited;
    tasks, probes and replies cross real interfaces. The comparison agrees as it does on loopback, the
    endpoints are the bridge's addresses, and nothing is left behind."""
    before = lbt_namespaces()
    spec = tmp_path / "spec.toml"
    spec.write_text(
        QUEUES.format(name="netns", policy='name = "power_of_d"\nd = 2', duration=60.0, scale=0.3)
    )
    _, doc, _ = lbt_run(spec, tmp_path / "report", "--netns", "--bandwidth", "100mbit")
    cluster = doc["results"]["cluster"]
    hosts = cluster["endpoints"]["node_hosts"]
    assert hosts and all(h.startswith("http://10.213.") for h in hosts), hosts
    assert len({h.rsplit(":", 1)[0] for h in hosts}) == len(hosts)  # one address (namespace) each
    for metric in ("mean_sojourn", "messages_per_task", "occupancy_tail[servers]"):
        assert verdict(doc, metric)["verdict"] == "agrees", verdict(doc, metric)
    assert cluster["load"]["completed"] == cluster["load"]["scheduled"]
    assert lbt_namespaces() == before


@needs_root
def test_namespaces_left_by_a_crash_are_removed(tmp_path: Path) -> None:
    """A run that died without ``down`` leaves namespaces with no process in them and a bridge with no
    port; the next ``--netns`` start (``cleanup_stale``) removes them, and only them."""
    from lbtestbed.cluster import netns

    layout = netns.create(2)
    try:
        assert set(layout.namespaces) <= lbt_namespaces()
        # the namespaces' veth ends keep the bridge busy until the namespaces go
        removed = netns.cleanup_stale()
        assert set(layout.namespaces) <= set(removed)
        assert layout.bridge in removed
        assert not set(layout.namespaces) & lbt_namespaces()
    finally:
        netns.destroy(layout)
