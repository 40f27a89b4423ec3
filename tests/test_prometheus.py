"""Prometheus, its rules and the Grafana dashboards against live clusters and a real Prometheus server.

Four scenarios, each a real cluster scraped every second by its own Prometheus
(lbtestbed/cluster/prometheus.py):

- ``slta``: SLTA on two classes of pools with utilities (utility, tokens, r; theory predicts the
  occupancy tails and the utility bound), driven at the spec's rate;
- ``jiq``: JIQ on FCFS servers, driven at *half* the spec's arrival rate (what the spec's constants say
  and what arrives differ);
- ``faults``: SLTA on six pools in three node hosts (host 1 holds a pool of each class) started with
  ``lbt cluster up --with-prometheus --max-tasks 2``, every answer to an epoch dropped, the dispatcher
  restarted and node host 1 killed during the load: refusals, lost tasks, reports that cannot be
  delivered to the dead dispatcher, nodes marked down, SLTA's learning stalled (every change of r tells
  some live pool, whose answer is lost however often the epoch is resent), a target down;
- ``loadgen``: JIQ on FCFS servers from ``lbt cluster up --with-prometheus``, driven by ``lbt load
  --metrics-port 0`` (it registers with the cluster's Prometheus and keeps up) and by a generator whose
  send loop is held on purpose: the generator's series, the process collectors, and the alert on a
  generator behind its schedule (``generators``).

Every PromQL expression of the dashboards (template variables substituted), of the recording rules and of
the alerting rules runs against all four at one instant during the load. Each must parse everywhere and
return data everywhere, except where ``EXCUSED`` gives the reason a series is legitimately empty in a
scenario; and each must return data somewhere. The recorded series themselves are checked against the raw
samples, and the time averages against direct scrapes of ``/metrics``.

Tolerances. Exact comparisons of float ratios allow ``FLOAT_REL``: the two sides sum up to ~50 terms in
different orders, each rounding costs at most one ulp (2^-52 relative), so 64 ulps bound the difference.
The comparison with direct scrapes, which cannot be taken at Prometheus' scrape instants, uses the bound
derived in ``test_time_average_from_prometheus_matches_direct_scrapes``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_cluster import gone, lbt, processes_mentioning, wait_until, write_spec

from lbtestbed.cluster.launcher import Cluster, healthy, spawn
from lbtestbed.cluster.processes import Started, free_ports
from lbtestbed.cluster.prometheus import (
    PrometheusError,
    PrometheusServer,
    api_get,
    instant_query,
    range_samples,
    ready,
    serves,
    start_prometheus,
    wait_for_series,
)
from lbtestbed.experiment.fault_injector import FaultCollector, Injector
from lbtestbed.loadgen.openloop import LoadReport, drive, poisson_tasks
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import ClusterFile
from lbtestbed.transport.signing import Signer

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
FLOAT_REL = 64 * 2.0**-52
LOAD_WALL = 25.0  # wall seconds of load in the main scenarios
AT = 22.5  # evaluation instant, wall seconds after the load starts: 20 s windows hold load only
WINDOW = "20s"  # what $__range and $__rate_interval stand for at AT
DS_UID = "lbtestbed-prometheus"
BUILTINS = {"__range", "__rate_interval", "__interval"}

# ------------------------------------------------------------------------------------------- specs

SLTA_SPEC = """
name = "pools"
seed = 21
[[classes]]
name = "small"
count = 4
discipline = "pool"
utility = { kind = "xlog", r = 4 }
[[classes]]
name = "large"
count = 4
discipline = "pool"
utility = { kind = "xlog", r = 6 }
[workload]
load = 3.0
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "slta"
beta_scale = 1.0
[run]
warmup = 0.0
duration = 60.0
time_scale = 0.5
"""

JIQ_SPEC = """
name = "servers"
seed = 5
[[classes]]
name = "servers"
count = 6
discipline = "fcfs"
[workload]
load = 0.7
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "jiq"
[run]
warmup = 0.0
duration = 300.0
time_scale = 0.1
"""

FAULTS_SPEC = """
name = "faults"
seed = 9
[[classes]]
name = "small"
count = 3
discipline = "pool"
utility = { kind = "xlog", r = 3 }
[[classes]]
name = "large"
count = 3
discipline = "pool"
utility = { kind = "xlog", r = 5 }
[workload]
load = 2.0
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "slta"
beta_scale = 1.0
[run]
warmup = 0.0
duration = 200.0
time_scale = 0.1
[[faults]]  # switched on by the test in the node hosts: every answer to an epoch is lost
kind = "drop"
fraction = 1.0
messages = ["token_epoch"]
at = 0.0
until = 200.0
"""

# --------------------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    name: str
    url: str  # its Prometheus
    at: float  # Unix time at which every expression is evaluated
    variables: dict[str, str]  # the dashboards' template variables
    constants: set[str]  # records of its generated constants file
    levels: int = 0  # the largest occupancy any node reached by ``at``


@dataclass
class Live:
    slta: Scenario
    jiq: Scenario
    reports: dict[str, LoadReport]
    clusters: dict[str, ClusterFile]
    paths: dict[str, Path]  # the cluster files
    directs: list[tuple[float, str]]  # (Unix time, /metrics text) of the slta cluster's node host 0
    load_start: float  # Unix time of model time 0


def constants_of(cluster_path: Path) -> set[str]:
    doc = yaml.safe_load((cluster_path.with_suffix(".prometheus") / "constants.yml").read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"]}


def variables_of(exp_name: str, policy: str, classes: list[str]) -> dict[str, str]:
    return {"cluster": exp_name, "policy": policy, "class": "|".join(classes)}


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def last_sample_time(url: str, instance: str) -> float:
    found = instant_query(url, f'timestamp(lbtestbed_node_model_seconds_total{{instance="{instance}"}})')
    return found[0][1]


def scrape_after_prometheus(prom: str, instance: str, not_before: float, interval: float = 1.0) -> float:
    """Sleep until just after one of Prometheus' scrapes of ``instance`` (they keep a fixed phase)."""
    last = last_sample_time(prom, instance)
    k = max(1, math.ceil((not_before - last) / interval))
    target = last + k * interval + 0.005
    time.sleep(max(0.0, target - time.time()))
    return target


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    base = tmp_path_factory.mktemp("prometheus")
    specs = {name: write_spec(base / name, text) for name, text in (("slta", SLTA_SPEC), ("jiq", JIQ_SPEC))}
    with (
        Cluster(base / "slta" / "cluster.json") as c_slta,
        Cluster(base / "jiq" / "cluster.json") as c_jiq,
    ):
        files = {
            "slta": c_slta.up(load_spec(specs["slta"]), node_processes=2),
            "jiq": c_jiq.up(load_spec(specs["jiq"]), node_processes=2),
        }
        with (
            start_prometheus(load_spec(specs["slta"]), files["slta"], c_slta.path) as p_slta,
            start_prometheus(load_spec(specs["jiq"]), files["jiq"], c_jiq.path) as p_jiq,
        ):
            for server in (p_slta, p_jiq):
                wait_for_series(server.url, "sum(up) == 3", timeout=30)  # every target scraped once
            exps = {k: f.experiment() for k, f in files.items()}
            # the jiq cluster's generator runs at half its spec's rate: it is "behind" all along
            half = load_spec(specs["jiq"], ["workload.load=0.35"])
            tasks = {
                "slta": list(poisson_tasks(exps["slta"], LOAD_WALL / exps["slta"].run.time_scale)),
                "jiq": list(poisson_tasks(half, LOAD_WALL / half.run.time_scale)),
            }
            start_mono = time.monotonic() + 0.5
            load_start = time.time() + 0.5
            reports: dict[str, LoadReport] = {}

            async def both() -> None:
                runs = [
                    drive([files[k].dispatchers[0].url], tasks[k], exps[k].run.time_scale, start=start_mono)
                    for k in ("slta", "jiq")
                ]
                reports["slta"], reports["jiq"] = await asyncio.gather(*runs)

            errors: list[BaseException] = []

            def load() -> None:
                try:
                    asyncio.run(both())
                except BaseException as e:  # re-raised below, in the test's thread
                    errors.append(e)

            loader = threading.Thread(target=load)
            loader.start()
            # two direct scrapes of one node host, each just after one of Prometheus' scrapes of it
            host = files["slta"].node_hosts[0]
            instance = urllib.parse.urlsplit(host.url).netloc
            directs = []
            for offset in (8.0, 20.0):
                scrape_after_prometheus(p_slta.url, instance, load_start + offset)
                text = get_text(f"{host.url}/metrics")
                directs.append((time.time(), text))
            loader.join(timeout=LOAD_WALL + 60)
            assert not loader.is_alive(), "the load did not finish"
            if errors:
                raise errors[0]
            time.sleep(max(0.0, load_start + LOAD_WALL + 2.5 - time.time()))  # the last scrapes
            at = load_start + AT
            scen = {
                k: Scenario(
                    k,
                    server.url,
                    at,
                    variables_of(exps[k].name, exps[k].policy.name, [c.name for c in exps[k].classes]),
                    constants_of(cluster.path),
                    levels_reached(server.url, at),
                )
                for k, server, cluster in (("slta", p_slta, c_slta), ("jiq", p_jiq, c_jiq))
            }
            paths = {"slta": c_slta.path, "jiq": c_jiq.path}
            yield Live(scen["slta"], scen["jiq"], reports, files, paths, directs, load_start)


# ------------------------------------------------------------------------------------ expressions


@dataclass(frozen=True)
class Expression:
    source: str  # file
    name: str  # panel and refId, rule name, or variable
    expr: str


def dashboard_expressions() -> list[Expression]:
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append(Expression(path.name, f"{panel['title']} [{target['refId']}]", target["expr"]))
        for note in board["annotations"]["list"]:
            out.append(Expression(path.name, f"annotation {note['name']}", note["expr"]))
    return out


def rule_expressions(kind: str) -> list[Expression]:
    """``record`` or ``alert`` rules of deploy/prometheus, each with its own name."""
    out = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    name = rule[kind] + "".join(
                        f" {k}={v}" for k, v in sorted(rule.get("labels", {}).items())
                    )
                    out.append(Expression(path.name, name, rule["expr"]))
    return out


ALL = dashboard_expressions() + rule_expressions("record") + rule_expressions("alert")

#: (scenarios, pattern, reason): an expression matching the pattern may be empty in those scenarios
EXCUSED: list[tuple[set[str], re.Pattern[str], str]] = [
    ({"jiq", "loadgen"}, re.compile(r"slta"), "JIQ has no SLTA state"),
    ({"slta", "faults"}, re.compile(r"idle_tokens"), "SLTA exports only slta_* state"),
    ({"jiq", "loadgen"}, re.compile(r"utility_to_bound"), "FCFS servers have no utility bound (lbt predict)"),
    ({"jiq", "loadgen"}, re.compile(r"messages_resent"), "only SLTA's epochs are ever sent again"),
    # nothing fails in the main scenarios; the faults scenario has it all
    (
        {"slta", "jiq", "loadgen"},
        re.compile(
            r'message_failures|outcome="(refused|lost)"\}\[1m\]|up\{job="lbtestbed"\} == 0|node_transitions'
        ),
        "no process failed, no node at a task limit",
    ),
    (
        {"slta", "jiq", "loadgen"},
        re.compile(r"slta_unanswered_epochs"),
        "no epoch was lost: SLTA keeps learning",
    ),
    # only the generators scenario has generators that serve metrics (lbt load, and one held on purpose)
    ({"slta", "jiq", "faults"}, re.compile(r"lbtestbed_loadgen_"), "its generator serves no metrics"),
    ({"slta", "jiq", "faults"}, re.compile(r"lbtestbed_fault_active"), "no lbt run injects its faults"),
]


def excused(scenario: Scenario, item: Expression) -> str | None:
    """Why ``item`` may be empty in ``scenario``, or None."""
    for where, pattern, reason in EXCUSED:
        if scenario.name in where and pattern.search(item.expr):
            return reason
    # a constant that theory leaves null for this spec has no series (lbt predict says why)
    for record in re.findall(r"lbtestbed:(?:predicted|spec):\w+", item.expr):
        if record not in scenario.constants:
            return f"{record}: theory gives no value for this spec"
    # the tail rule for k holds data only where some node reached k tasks
    k = tail_level(item)
    if k is not None and k > scenario.levels:
        return f"no node reached {k} tasks"
    return None


def tail_level(item: Expression) -> int | None:
    """k of a tail rule, None for any other expression."""
    m = re.fullmatch(r"lbtestbed:class_occupancy_tail:1m tasks=(\d+)", item.name)
    return int(m.group(1)) if m else None


def levels_reached(url: str, at: float) -> int:
    """The largest occupancy any node reached (a level's series exists from then on)."""
    found = instant_query(url, "lbtestbed_node_occupancy_model_seconds_total", at)
    return max(int(labels["tasks"]) for labels, _ in found)


def substitute(expr: str, variables: dict[str, str]) -> str:
    out = expr.replace("$__rate_interval", WINDOW).replace("$__range", WINDOW)
    for name, value in variables.items():
        out = out.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out


def evaluate(scenario: Scenario, item: Expression) -> list[tuple[dict[str, str], float]]:
    return instant_query(scenario.url, substitute(item.expr, scenario.variables), scenario.at)


# -------------------------------------------------------------------------------- faults scenario


@dataclass
class Faults:
    scenario: Scenario
    results: dict[Expression, list[tuple[dict[str, str], float]] | str] = field(default_factory=dict)
    up: subprocess.CompletedProcess[str] | None = None
    status_healthy: subprocess.CompletedProcess[str] | None = None
    status_dead: subprocess.CompletedProcess[str] | None = None
    down: subprocess.CompletedProcess[str] | None = None
    file: ClusterFile | None = None
    report: LoadReport | None = None
    cluster_path: Path = Path()


def switch_fault(url: str, token: str, index: int, active: bool) -> None:
    body = json.dumps({"fault": index, "active": active}).encode()
    headers, _ = Signer(token).headers("POST", f"{url}/v1/faults", body)  # as a peer signs it
    req = urllib.request.Request(f"{url}/v1/faults", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def restart_dispatcher(f: ClusterFile, cfile: Path) -> None:
    """SIGKILL the dispatcher and start it again on its port (recorded in the cluster file for `down`)."""
    d = f.dispatchers[0]
    os.killpg(d.pid, signal.SIGKILL)
    wait_until(lambda: gone(d.pid), 10.0, "the killed dispatcher to exit")
    time.sleep(0.3)  # some departures go to the dead dispatcher and fail
    spawn(cfile, f, d)
    f.save(cfile)
    wait_until(lambda: healthy(d.url), 20.0, "the restarted dispatcher to answer")


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, live: Live) -> Iterator[Faults]:
    """`lbt cluster up --with-prometheus --max-tasks 2`, every answer to an epoch dropped (the spec's
    message fault, switched on in both node hosts), load, the dispatcher killed and started again after
    2 s (the node hosts' reports to it fail meanwhile), node host 1 killed after 4 s; every expression is
    evaluated 12 s after Prometheus saw the host down (the stall alert looks at 10 s), then
    `lbt cluster down` runs; the record keeps every answer. Runs after the main load."""
    base = tmp_path_factory.mktemp("faults")
    spec = write_spec(base, FAULTS_SPEC)
    cfile = base / "run" / "cluster.json"
    out = Faults(Scenario("faults", "", 0.0, {}, set()), cluster_path=cfile)
    try:
        out.up = lbt(
            "cluster", "up", str(spec), "--file", str(cfile), "--node-processes", "3", "--max-tasks", "2",
            "--with-prometheus",
        )  # fmt: skip
        assert out.up.returncode == 0, out.up.stderr
        f = out.file = ClusterFile.load(cfile)
        exp = f.experiment()
        wait_for_series(f.prometheus_url, "sum(up) == 4", timeout=30)
        out.status_healthy = lbt("cluster", "status", "--file", str(cfile))
        for host in f.node_hosts:
            switch_fault(host.url, f.token, 0, True)
        tasks = list(poisson_tasks(exp, 18.0 / exp.run.time_scale))
        start_mono, start = time.monotonic() + 0.2, time.time() + 0.2
        reports: list[LoadReport] = []
        loader = threading.Thread(
            target=lambda: reports.append(
                asyncio.run(drive([f.dispatchers[0].url], tasks, exp.run.time_scale, start=start_mono))
            )
        )
        loader.start()
        time.sleep(max(0.0, start + 2.0 - time.time()))
        restart_dispatcher(f, cfile)
        time.sleep(max(0.0, start + 4.0 - time.time()))
        os.kill(f.node_hosts[1].pid, signal.SIGKILL)
        instance = urllib.parse.urlsplit(f.node_hosts[1].url).netloc
        wait_for_series(f.prometheus_url, f'up{{instance="{instance}"}} == 0', timeout=15)
        at = time.time() + 12.0
        loader.join(timeout=60)
        out.report = reports[0] if reports else None
        time.sleep(max(0.0, at + 1.5 - time.time()))  # the scrapes after the evaluation instant
        out.scenario = Scenario(
            "faults",
            f.prometheus_url,
            at,
            variables_of(exp.name, exp.policy.name, [c.name for c in exp.classes]),
            constants_of(cfile),
            levels_reached(f.prometheus_url, at),
        )
        for item in ALL:
            try:
                out.results[item] = evaluate(out.scenario, item)
            except PrometheusError as e:
                out.results[item] = str(e)
        out.status_dead = lbt("cluster", "status", "--file", str(cfile))
        out.down = lbt("cluster", "down", "--file", str(cfile))
        yield out
    finally:
        if cfile.exists():
            Cluster(cfile).down()


# ------------------------------------------------------------------------------ generators scenario

GENERATORS_SPEC = """
name = "generators"
seed = 3
[[classes]]
name = "servers"
count = 4
discipline = "fcfs"
[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "jiq"
[run]
warmup = 0.0
duration = 300.0
time_scale = 0.05
[[faults]]  # applied by the held generator's injector, as lbt run does: 1 s to 14 s wall
kind = "drop"
fraction = 0.01
messages = ["idle_token"]
at = 20.0
until = 280.0
"""
GENERATORS_WALL = 16.0  # wall seconds of schedule for each generator: 40 tasks a wall second
HOLD = 2.5  # wall seconds the held generator's send loop is held at each of its progress calls


@dataclass
class Generators:
    """`lbt cluster up --with-prometheus` (scrapes every 0.25 s), and against it at once: `lbt load
    --metrics-port 0` (a generator that keeps up: 40 tasks a second), and a generator whose send loop is
    held for HOLD s after every second of sending (drive's progress callback runs in the loop), served
    and registered as lbt run's is (cluster.prometheus.serve_generator). Every expression is evaluated
    at ``at`` (the held generator's alert fires by then), after both ended."""

    scenario: Scenario
    url: str
    keeps_up: str  # instance of the lbt load generator
    held: str  # instance of the held one
    summary: dict[str, Any]  # lbt load's JSON summary
    held_report: LoadReport
    held_gap: float  # the longest wall time between two intended sends of the held generator
    results: dict[Expression, list[tuple[dict[str, str], float]] | str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def generators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generators]:
    from lbtestbed.cluster.prometheus import serve_generator

    base = tmp_path_factory.mktemp("generators")
    spec = write_spec(base, GENERATORS_SPEC)
    cfile = base / "run" / "cluster.json"
    try:
        up = lbt(
            "cluster", "up", str(spec), "--file", str(cfile), "--node-processes", "1",
            "--with-prometheus", "--scrape-interval", "0.25",
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        f = ClusterFile.load(cfile)
        exp = f.experiment()
        url = f.prometheus_url
        wait_for_series(url, "sum(up) == 2", timeout=30)
        duration = str(GENERATORS_WALL / exp.run.time_scale)
        exe = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "lbt"
        keeps_up = subprocess.Popen(
            [str(exe), "load", str(spec), "--cluster", str(cfile), "--duration", duration,
             "--metrics-port", "0", "--json", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        tasks = list(poisson_tasks(exp, GENERATORS_WALL / exp.run.time_scale))
        held_report = LoadReport()
        served: list[str] = []

        released = [0.0]

        def hold(done: int, total: int) -> None:
            # drive calls it when a second has passed since its last call began, so with every send
            # after a hold: hold again only after a second of sending
            if time.monotonic() - released[0] >= 1.0:
                time.sleep(HOLD)  # in the send loop: nothing is sent meanwhile
                released[0] = time.monotonic()

        async def held_run(registry: Any) -> None:
            origin = time.monotonic() + 0.2
            injector = Injector(exp, f, cfile, origin, lambda line: None)
            registry.register(FaultCollector(injector))  # lbtestbed_fault_active, as lbt run serves it
            async with aiohttp.ClientSession() as session:
                load = drive(
                    [f.dispatchers[0].url], tasks, exp.run.time_scale, progress=hold, report=held_report,
                    start=origin,
                )  # fmt: skip
                await asyncio.gather(load, injector.run(session))

        def held() -> None:
            with serve_generator(
                held_report, exp, None, cfile.with_suffix(".prometheus"), served.append
            ) as server:
                assert server is not None
                served.append(server.address)
                asyncio.run(held_run(server.registry))

        loader = threading.Thread(target=held)
        started = time.time()
        loader.start()
        out, err = keeps_up.communicate(timeout=GENERATORS_WALL + 90)
        assert keeps_up.returncode == 0, err
        loader.join(timeout=GENERATORS_WALL + 90)
        assert not loader.is_alive(), "the held generator did not finish"
        address = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", err)
        assert address, err
        at = started + 12.0  # the held generator has been behind for seconds, the fault is on
        scenario = Scenario(
            "loadgen", url, at, variables_of(exp.name, exp.policy.name, ["servers"]), constants_of(cfile),
            levels_reached(url, at),
        )  # fmt: skip
        gap = max(b - a for (a, _), (b, _) in itertools.pairwise(tasks)) * exp.run.time_scale
        out_gen = Generators(scenario, url, address.group(1), served[-1], json.loads(out), held_report, gap)
        for item in ALL:
            try:
                out_gen.results[item] = evaluate(scenario, item)
            except PrometheusError as e:
                out_gen.results[item] = str(e)
        yield out_gen
    finally:
        if cfile.exists():
            Cluster(cfile).down()


# ============================================================================ 1. static structure


def test_promtool_accepts_the_rule_files() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", *(str(p) for p in sorted(RULES.glob("*.yml")))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_tail_rules_select_exactly_the_levels_from_k() -> None:
    """The k-th tail rule's numerator selects the levels not in 0..k-1, in each of its selectors, and the
    rules cover k = 1..K without a gap."""
    levels = []
    for item in rule_expressions("record"):
        if not item.name.startswith("lbtestbed:class_occupancy_tail:1m"):
            continue
        k = tail_level(item)
        assert k is not None, item.name
        regexes = re.findall(r'tasks!~"([^"]*)"', item.expr)
        assert len(regexes) == 1, item
        assert all(r.split("|") == [str(j) for j in range(k)] for r in regexes), item
        levels.append(k)
    assert sorted(levels) == list(range(1, len(levels) + 1)) and len(levels) >= 20


def test_rules_are_named_and_documented() -> None:
    records = [e.name for e in rule_expressions("record")]
    assert len(records) == len(set(records)), "two recording rules record the same series"
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
                    assert rule["annotations"]["summary"], rule["alert"]
                    assert "cluster" in rule["annotations"]["summary"], rule["alert"]


def variable_refs(text: str) -> set[str]:
    return set(re.findall(r"\$\{?(\w+)\}?", text))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    board = json.loads(path.read_text())
    for key in ("uid", "title", "panels", "templating", "schemaVersion", "time", "tags"):
        assert key in board, f"{path.name}: no {key}"
    assert 0 < len(board["uid"]) <= 40 and "lbtestbed" in board["tags"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "cluster", "policy"} <= set(variables)
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert ds["current"]["value"] == DS_UID, "the default is the provisioned datasource"
    ref = {"type": "prometheus", "uid": "${datasource}"}

    used: set[str] = set()
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == ref, v["name"]
            assert re.fullmatch(r"label_values\(.+, *\w+\)", v["query"]), v["name"]
            assert v["definition"] == v["query"]
            used |= variable_refs(v["query"])
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        where = f"{path.name}: panel {panel['id']} {panel.get('title')!r}"
        assert panel["type"] in ("timeseries", "stat", "table", "barchart"), where
        assert panel["title"] and panel["description"], where
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, where
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{where} overlaps another panel"
        cells |= mine
        assert panel["datasource"] == ref, where
        used.add("datasource")
        refids = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refids) == len(set(refids)), where
        for t in panel["targets"]:
            assert t["datasource"] == ref and t["expr"].strip(), where
            used |= variable_refs(t["expr"])
            used |= variable_refs(t.get("legendFormat", ""))
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if "(model seconds)" in panel["title"] or ":sojourn_model_seconds:" in exprs:
            # Grafana would show model seconds as durations of wall time
            assert unit == "suffix: model s" and "model s" in panel["description"], where
        if "model_seconds" in exprs or "model_second" in exprs:
            assert unit not in ("s", "ms", "µs", "ns", "m", "h", "d", "dtdurations", "dtdurationms"), where
        counts = re.search(r"Tasks|Messages per|Nodes routed|tokens|epochs", panel["title"])
        if counts and panel["type"] != "table":
            assert unit, f"{where}: a count without a unit"
        assert not re.search(r"increase\([^\]]*\[\$__rate_interval\]", exprs), (
            f"{where}: increase over $__rate_interval"
        )
    for note in board["annotations"]["list"]:
        assert note["datasource"] == ref and note["enable"] and note["expr"].strip(), note["name"]
        used |= variable_refs(note["expr"])
    assert any("lbtestbed_fault_active" in n["expr"] for n in board["annotations"]["list"]), path.name
    undefined = used - set(variables) - BUILTINS
    assert not undefined, f"{path.name}: undefined variables {undefined}"
    unused = set(variables) - used
    assert not unused, f"{path.name}: template variables used nowhere: {unused}"


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(DASHBOARDS) >= 4 and len(uids) == len(set(uids))


def test_grafana_provisioning() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "lbtestbed.yml").read_text())
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == DS_UID and source["access"] == "proxy"
    assert urllib.parse.urlsplit(source["url"]).scheme == "http"
    # the port `lbt cluster up --with-prometheus` takes by default when it is free
    from lbtestbed.cluster.prometheus import GRAFANA_PORT

    assert urllib.parse.urlsplit(source["url"]).port == GRAFANA_PORT
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "lbtestbed.yml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    for key in ("name", "orgId", "folder"):
        assert key in provider


# ======================================================================= 2. the generated config


def test_promtool_accepts_the_generated_config(live: Live) -> None:
    for path in live.paths.values():
        directory = path.with_suffix(".prometheus")
        config = directory / "prometheus.yml"
        result = subprocess.run(
            ["promtool", "check", "config", str(config)], capture_output=True, text=True, cwd=directory
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout and "constants.yml" in result.stdout


def test_targets_carry_role_cluster_and_policy(live: Live) -> None:
    for scenario, cluster in ((live.slta, live.clusters["slta"]), (live.jiq, live.clusters["jiq"])):
        found = instant_query(scenario.url, "up", scenario.at)
        got = sorted(
            (lab["role"], lab["index"], lab["instance"], lab["cluster"], lab["policy"]) for lab, _ in found
        )
        want = sorted(
            (e.role, str(e.index), urllib.parse.urlsplit(e.url).netloc, scenario.variables["cluster"],
             scenario.variables["policy"])
            for e in cluster.dispatchers + cluster.node_hosts
        )  # fmt: skip
        assert got == want


def test_constants_hold_the_spec(live: Live) -> None:
    """Arrival rate n * load / mean work and the class sizes, worked out by hand from SLTA_SPEC."""
    s = live.slta
    (rate,) = instant_query(s.url, 'lbtestbed:spec:arrival_rate{cluster="pools"}', s.at)
    assert rate[1] == 8 * 3.0 / 1.0 and rate[0]["policy"] == "slta"
    nodes = {lab["class"]: v for lab, v in instant_query(s.url, "lbtestbed:spec:nodes", s.at)}
    assert nodes == {"small": 4.0, "large": 4.0}
    tail = instant_query(s.url, 'lbtestbed:predicted:occupancy_tail{tasks="0"}', s.at)
    assert sorted(lab["class"] for lab, _ in tail) == ["large", "small"] and all(v == 1.0 for _, v in tail)


def test_template_variables_resolve(live: Live) -> None:
    """Each query variable, with the variables before it substituted, lists the scenario's values."""
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            parsed = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["query"])
            assert parsed, var["query"]
            match, label = parsed.groups()
            for s in (live.slta, live.jiq):
                selector = substitute(match, s.variables)
                values = api_get(
                    s.url,
                    f"/api/v1/label/{label}/values",
                    {"match[]": selector, "start": s.at - 60, "end": s.at},
                    f"{path.name}: variable {var['name']}",
                )
                assert set(s.variables[var["name"]].split("|")) == set(values), (path.name, var["name"])


# ================================================================ 3. every expression returns data


@pytest.mark.parametrize("item", ALL, ids=lambda e: f"{e.source}: {e.name}")
def test_expression_parses_and_returns_data(
    item: Expression, live: Live, faults: Faults, generators: Generators
) -> None:
    results = {
        live.slta.name: evaluate(live.slta, item),
        live.jiq.name: evaluate(live.jiq, item),
        "faults": faults.results[item],
        "loadgen": generators.results[item],
    }
    assert not isinstance(results["faults"], str), results["faults"]
    assert not isinstance(results["loadgen"], str), results["loadgen"]
    scenarios = {
        "slta": live.slta,
        "jiq": live.jiq,
        "faults": faults.scenario,
        "loadgen": generators.scenario,
    }
    missing = [n for n, r in results.items() if not r and excused(scenarios[n], item) is None]
    assert not missing, f"no data in {missing}: {item.expr}"
    k = tail_level(item)
    if k is not None and all(k > s.levels for s in scenarios.values()):
        assert not any(results.values()), f"data for a level no node reached: {item.expr}"
        return
    assert any(results.values()), f"no data in any scenario: {item.expr}"
    for found in results.values():
        assert isinstance(found, list)
        for labels, value in found:
            assert not math.isnan(value), (labels, item.expr)


def test_recorded_series_exist(live: Live) -> None:
    """Prometheus evaluated every recording rule: the recorded series are there (tail rules: for every k
    that some node of the class reached, and for no other k)."""
    for s in (live.slta, live.jiq):
        for item in rule_expressions("record"):
            record = item.name.split()[0]
            labels = dict(kv.split("=") for kv in item.name.split()[1:])
            selector = record + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
            found = instant_query(s.url, selector, s.at)
            if excused(s, item) is None:
                assert found, f"{s.name}: no series {selector}"
        reached: dict[str, int] = {}
        for lab, _ in instant_query(s.url, "lbtestbed_node_occupancy_model_seconds_total", s.at):
            reached[lab["class"]] = max(reached.get(lab["class"], 0), int(lab["tasks"]))
        tail = instant_query(s.url, "lbtestbed:class_occupancy_tail:1m", s.at)
        got: dict[str, set[int]] = {}
        for lab, _ in tail:
            got.setdefault(lab["class"], set()).add(int(lab["tasks"]))
        assert got == {c: set(range(1, min(k, 40) + 1)) for c, k in reached.items() if k >= 1}, s.name


# ============================================================================ 4. the alerts fire


def test_generator_series_and_process_collectors_reach_prometheus(generators: Generators) -> None:
    """`lbt load --metrics-port 0` against a cluster started with --with-prometheus: Prometheus scraped it
    (it registered itself) up to its end, so its last samples are its summary's numbers; every process,
    the generators included, exports the standard process and GC collectors."""
    g = generators

    def last(expr: str) -> dict[str, float]:
        return {lab["instance"]: v for lab, v in instant_query(g.url, f"last_over_time({expr}[3m])")}

    s = g.summary
    assert s["completed"] == s["scheduled"] > 300
    assert last('lbtestbed_loadgen_tasks_sent_total{role="loadgen"}')[g.keeps_up] == s["sent"]
    assert last('lbtestbed_loadgen_tasks_total{outcome="completed"}')[g.keeps_up] == s["completed"]
    assert last("lbtestbed_loadgen_late_sends_total")[g.keeps_up] == s["late_sends"]
    assert last("lbtestbed_loadgen_tasks_scheduled")[g.keeps_up] == s["scheduled"]
    assert (
        last('lbtestbed_loadgen_sojourn_model_seconds_count{outcome="completed"}')[g.keeps_up]
        == s["completed"]
    )
    count = last("lbtestbed_loadgen_lateness_seconds_count")[g.keeps_up]
    within = last('lbtestbed_loadgen_lateness_seconds_bucket{le="0.002"}')[g.keeps_up]
    assert count - within == s["late_sends"] and count == s["sent"]
    held = g.held_report.summary()
    assert last("lbtestbed_loadgen_tasks_sent_total")[g.held] == held["sent"]
    for metric in (
        "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
        "python_gc_collections_total", "python_info",
    ):  # fmt: skip
        roles = {lab["role"] for lab, _ in instant_query(g.url, f"last_over_time({metric}[3m])")}
        assert roles == {"dispatcher", "nodes", "loadgen"}, metric
    loadgens = instant_query(g.url, 'last_over_time(up{role="loadgen"}[3m])')
    assert sorted(lab["instance"] for lab, _ in loadgens) == sorted([g.keeps_up, g.held])
    assert all(v == 1.0 for _, v in loadgens), "a generator's last scrape failed: it left before Prometheus"


def test_generator_behind_alert_fires_on_a_held_generator_only(generators: Generators) -> None:
    """The held generator's loop stood still HOLD s at a time, right after a send: the next send, due at
    most ``held_gap`` later, left at least HOLD - held_gap late (its lateness shows it, by construction);
    the alert fired for it. The one that kept up was scraped all along and never fired: its sends leave
    milliseconds late at worst, far below 0.1 s for a tenth of them."""
    g = generators
    assert max(g.held_report.lateness) >= HOLD - g.held_gap
    span = f"{math.ceil(time.time() - g.scenario.at + GENERATORS_WALL + 10)}s"
    firing = instant_query(
        g.url,
        f'max_over_time(ALERTS{{alertname="LbtestbedLoadGeneratorBehind", alertstate="firing"}}[{span}])',
    )
    assert {lab["instance"] for lab, _ in firing} == {g.held}, firing
    scraped = instant_query(
        g.url, f'count_over_time(lbtestbed_loadgen_behind_seconds{{instance="{g.keeps_up}"}}[{span}])'
    )
    assert scraped and scraped[0][1] >= 20, "the generator that keeps up was not scraped for 5 s"


DESCRIPTION = (
    "the fraction of its sends in the last 20 s more than 0.1 s late, or the seconds its send loop is "
    "behind; the run does not send the spec's arrivals on time."
)


def test_generator_behind_alert_with_promtool(tmp_path: Path) -> None:
    """The rule on hand-made series (promtool test rules): 10 sends a second with half of them more than
    0.1 s late fires; none late stays silent; a loop that sends nothing while its lag grows fires."""
    test = {
        "rule_files": [str(RULES / "alerting_rules.yml")],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [
                    *[
                        {
                            "series": f'{name}{{cluster="c",policy="p",instance="{inst}"{extra}}}',
                            "values": values,
                        }
                        for inst, sent, within, behind in (
                            ("held", "0+10x40", "0+5x40", "0x40"),
                            ("ok", "0+10x40", "0+10x40", "0x40"),
                            ("stalled", "5x40", "5x40", "0+1x40"),
                        )
                        for name, extra, values in (
                            ("lbtestbed_loadgen_lateness_seconds_count", "", sent),
                            ("lbtestbed_loadgen_lateness_seconds_bucket", ',le="0.1"', within),
                            ("lbtestbed_loadgen_behind_seconds", "", behind),
                        )
                    ]
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "30s",
                        "alertname": "LbtestbedLoadGeneratorBehind",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "cluster": "c",
                                    "policy": "p",
                                    "instance": inst,
                                },
                                "exp_annotations": {
                                    "summary": f"cluster c: the load generator {inst} is behind its schedule",
                                    "description": f"{value}: {DESCRIPTION}\n",
                                },
                            }
                            for inst, value in (("held", "0.5"), ("stalled", "30"))
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(json.dumps(test))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_fault_alerts_fire(faults: Faults) -> None:
    """The faults scenario shows a target down, refusals, lost tasks, departure reports that could not be
    delivered to the dead dispatcher, and SLTA's learning stalled by the lost epoch answers (the dispatcher
    keeps resending: docs/faults.md). Epochs to the dead host's pools no longer fail: the dispatcher marks
    them down and sends them nothing."""
    by_alert = {e.name.split()[0]: faults.results[e] for e in rule_expressions("alert")}
    down = by_alert["LbtestbedTargetDown"]
    assert isinstance(down, list) and [(lab["role"], lab["index"]) for lab, _ in down] == [("nodes", "1")]
    assert by_alert["LbtestbedTasksRefused"] and by_alert["LbtestbedTasksLost"]
    marked = by_alert["LbtestbedNodesMarkedDown"]  # the killed host, by the dispatcher's health checks
    assert isinstance(marked, list) and [v for _, v in marked] and all(v >= 1 for _, v in marked), marked
    failures = by_alert["LbtestbedMessageFailures"]
    assert isinstance(failures, list)
    assert ("nodes", "token_departure") in {(lab["role"], lab["kind"]) for lab, _ in failures}, failures
    assert by_alert["LbtestbedSLTALearningStalled"], "r kept moving although no epoch was answered"
    assert faults.report is not None and faults.report.outcomes["refused"] > 0
    assert faults.report.outcomes["lost"] > 0


# ======================================================== 5. exact time averages from Prometheus


def node_occupancy(text: str) -> dict[tuple[str, str], dict[int, float]]:
    """(node, class) -> k -> model seconds with k tasks, from one /metrics page."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "lbtestbed_node_occupancy_model_seconds_total":
                key = (s.labels["node"], s.labels["class"])
                out.setdefault(key, {})[int(s.labels["tasks"])] = float(s.value)
    return out


def prometheus_occupancy(
    url: str, instance: str, end: float, seconds: float
) -> dict[float, dict[tuple[str, str], dict[int, float]]]:
    """Scrape timestamp -> (node, class) -> k -> value: the raw samples Prometheus stored."""
    out: dict[float, dict[tuple[str, str], dict[int, float]]] = {}
    selector = f'lbtestbed_node_occupancy_model_seconds_total{{instance="{instance}"}}'
    for labels, samples in range_samples(url, selector, end, seconds):
        key = (labels["node"], labels["class"])
        for t, v in samples:
            out.setdefault(t, {}).setdefault(key, {})[int(labels["tasks"])] = v
    return out


def fractions(
    later: dict[int, float], earlier: dict[int, float]
) -> tuple[dict[int, float], float]:  # fmt: skip
    """Fraction of the window with exactly k tasks, and the window's model length."""
    delta = {k: v - earlier.get(k, 0.0) for k, v in later.items()}
    length = sum(delta.values())
    return {k: d / length for k, d in delta.items()}, length


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=FLOAT_REL, abs_tol=FLOAT_REL)


@pytest.fixture(scope="module")
def windows(live: Live) -> dict[str, Any]:
    """The slta cluster's node host 0: Prometheus' samples nearest to the two direct scrapes."""
    host = live.clusters["slta"].node_hosts[0]
    instance = urllib.parse.urlsplit(host.url).netloc
    # every sample since Prometheus started (test_recorded_occupancy_equals_the_raw_samples needs them)
    raw = prometheus_occupancy(live.slta.url, instance, live.load_start + LOAD_WALL + 2, LOAD_WALL + 120)
    (a, text_a), (b, text_b) = live.directs
    p1 = min(raw, key=lambda t: abs(t - a))
    p2 = min(raw, key=lambda t: abs(t - b))
    return {"instance": instance, "raw": raw, "p1": p1, "p2": p2, "a": text_a, "b": text_b}


def test_time_average_from_prometheus_matches_direct_scrapes(windows: dict[str, Any]) -> None:
    """The fraction of model time each node held k tasks, between two of Prometheus' samples, against the
    same fraction between two direct scrapes of /metrics taken just after them.

    The two windows differ at each end by the model time between a sample and its direct scrape, d in
    all; for a fraction f of an indicator over windows of lengths T and T', |f - f'| <= 2 d / T (the
    integrals differ by at most d, the lengths too). d and T come from the samples' own integrals.
    """
    raw, p1, p2 = windows["raw"], windows["p1"], windows["p2"]
    direct_a, direct_b = node_occupancy(windows["a"]), node_occupancy(windows["b"])
    checked = 0
    for key in raw[p2]:
        f_prom, length = fractions(raw[p2][key], raw[p1].get(key, {}))
        f_direct, _ = fractions(direct_b[key], direct_a.get(key, {}))
        d = abs(sum(direct_a[key].values()) - sum(raw[p1][key].values())) + abs(
            sum(direct_b[key].values()) - sum(raw[p2][key].values())
        )
        bound = 2 * d / length
        for k in set(f_prom) | set(f_direct):
            diff = abs(f_prom.get(k, 0.0) - f_direct.get(k, 0.0))
            assert diff <= bound + FLOAT_REL, (key, k, f_prom.get(k), f_direct.get(k), d, length)
            checked += 1
    assert checked >= 8, "too few (node, k) pairs to show anything"


def test_rule_form_is_exact_between_two_scrapes(live: Live, windows: dict[str, Any]) -> None:
    """The recording rule's expression, with its 1 min window set to the time between two samples and
    evaluated at the later one, equals the ratio of the raw samples' differences exactly."""
    raw, p1, p2 = windows["raw"], windows["p1"], windows["p2"]
    (rule,) = [e for e in rule_expressions("record") if e.name == "lbtestbed:node_occupancy_fraction:1m"]
    span_ms = round((p2 - p1) * 1000)
    expr = rule.expr.replace("offset 1m", f"offset {span_ms}ms")
    assert expr != rule.expr
    found = instant_query(live.slta.url, expr, p2)
    mine = {
        ((lab["node"], lab["class"]), int(lab["tasks"])): v
        for lab, v in found
        if lab["instance"] == windows["instance"]
    }
    want = {}
    for key in raw[p2]:
        f, _ = fractions(raw[p2][key], raw[p1].get(key, {}))
        want.update({(key, k): v for k, v in f.items()})
    assert mine.keys() == want.keys()
    bad = {k: (mine[k], want[k]) for k in want if not close(mine[k], want[k])}
    assert not bad, bad


def test_increase_ratio_is_exact_when_every_series_spans_the_window(
    live: Live, windows: dict[str, Any]
) -> None:
    """docs/protocol.md's increase() ratio over a window from 1 ms before one sample to another equals the
    raw ratio for every node whose series all existed at the first sample with a value of at least 1 %
    of their increase. Prometheus extrapolates every series of the node by the same factor (T + 1 ms)/T
    then; it would limit the extrapolation of a counter at zero (the 'durationToZero' rule) only for a
    value below increase * 1 ms / T, and a series born inside the window is not extrapolated alike."""
    raw, p1, p2 = windows["raw"], windows["p1"], windows["p2"]
    window_ms = round((p2 - p1) * 1000) + 1
    occ = f'lbtestbed_node_occupancy_model_seconds_total{{instance="{windows["instance"]}"}}'
    expr = (
        f"increase({occ}[{window_ms}ms]) / ignoring(tasks) group_left "
        f"sum without (tasks) (increase({occ}[{window_ms}ms]))"
    )
    found = {
        ((lab["node"], lab["class"]), int(lab["tasks"])): v
        for lab, v in instant_query(live.slta.url, expr, p2)
    }
    checked = 0
    for key in raw[p2]:
        later, earlier = raw[p2][key], raw[p1].get(key, {})
        if set(later) != set(earlier) or any(earlier[k] < 0.01 * (later[k] - earlier[k]) for k in later):
            continue
        f, _ = fractions(later, earlier)
        for k, v in f.items():
            assert close(found[(key, k)], v), (key, k, found[(key, k)], v)
        checked += 1
    assert checked >= 1, "no node kept its occupancy levels across the window"


def test_recorded_occupancy_equals_the_raw_samples(live: Live, windows: dict[str, Any]) -> None:
    """The series Prometheus recorded for lbtestbed:node_occupancy_fraction:1m at its evaluation instants
    equal the ratio computed from the raw samples: the latest sample at or before the instant, minus the
    latest at or before one minute earlier (0 when there is none: the average since the process
    started). A sample scraped just before an evaluation may be stored after it, so the sample before
    the latest is a candidate too."""
    instance = windows["instance"]
    raw: dict[float, dict[tuple[str, str], dict[int, float]]] = windows["raw"]
    times = sorted(raw)
    recorded = range_samples(
        live.slta.url, f'lbtestbed:node_occupancy_fraction:1m{{instance="{instance}"}}', live.slta.at, 15
    )
    assert recorded
    by_instant: dict[float, dict[tuple[tuple[str, str], int], float]] = {}
    for lab, samples in recorded:
        for t, v in samples:
            by_instant.setdefault(t, {})[((lab["node"], lab["class"]), int(lab["tasks"]))] = v

    def candidates(before: float) -> list[float | None]:
        older: list[float | None] = [t for t in times if t <= before]
        return [*older[-2:], None] if len(older) < 2 else older[-2:]

    checked = 0
    for e, values in by_instant.items():
        matched = False
        for now in candidates(e):
            for then in candidates(e - 60.0):
                if now is None or (then is not None and then >= now):
                    continue
                want = {}
                for key in raw[now]:
                    f, _ = fractions(raw[now][key], raw[then].get(key, {}) if then is not None else {})
                    want.update({(key, k): v for k, v in f.items()})
                if want.keys() == values.keys() and all(close(values[k], want[k]) for k in want):
                    matched = True
        assert matched, f"recorded values at {e} match no pair of raw samples"
        checked += 1
    assert checked >= 10


def test_recorded_tail_equals_the_raw_samples(live: Live) -> None:
    """lbtestbed:class_occupancy_tail:1m as recorded, against the raw samples of both node hosts: the
    model seconds the class's nodes held at least k tasks over all their model seconds. Each host
    contributes its latest sample at or before the instant, or the one before it (see above). Prometheus
    is younger than a minute here, so the averages run from the processes' start."""
    hosts = [urllib.parse.urlsplit(h.url).netloc for h in live.clusters["slta"].node_hosts]
    end = live.load_start + LOAD_WALL + 2
    raws = [prometheus_occupancy(live.slta.url, host, end, LOAD_WALL + 120) for host in hosts]
    recorded = range_samples(live.slta.url, "lbtestbed:class_occupancy_tail:1m", live.slta.at, 10)
    by_instant: dict[float, dict[tuple[str, int], float]] = {}
    for lab, samples in recorded:
        for t, v in samples:
            by_instant.setdefault(t, {})[(lab["class"], int(lab["tasks"]))] = v
    assert len(by_instant) >= 5

    def tail(samples: list[dict[tuple[str, str], dict[int, float]]]) -> dict[tuple[str, int], float]:
        above: dict[tuple[str, int], float] = {}
        total: dict[str, float] = {}
        for sample in samples:
            for (_, cls), levels in sample.items():
                total[cls] = total.get(cls, 0.0) + sum(levels.values())
                for k in range(1, max(levels) + 1):
                    above[(cls, k)] = above.get((cls, k), 0.0) + sum(v for j, v in levels.items() if j >= k)
        return {(cls, k): v / total[cls] for (cls, k), v in above.items()}

    for e, values in by_instant.items():
        assert all(min(raw) > e - 60.0 for raw in raws), "Prometheus is older than a minute here"
        choices = [sorted(t for t in raw if t <= e)[-2:] for raw in raws]
        combos = [(t0, t1) for t0 in choices[0] for t1 in choices[1]]
        assert any(
            (want := tail([raws[0][t0], raws[1][t1]])).keys() == values.keys()
            and all(close(values[k], want[k]) for k in want)
            for t0, t1 in combos
        ), f"recorded tail at {e} matches no pair of the hosts' samples: {values}"


# ================================================================================= 6. the CLI


def test_cli_up_with_prometheus_status_and_down(faults: Faults) -> None:
    assert faults.up is not None and faults.file is not None
    line = next(x for x in faults.up.stdout.splitlines() if x.split()[:1] == ["prometheus"])
    assert faults.file.prometheus_url in line and f"pid {faults.file.prometheus_pid}" in line
    assert faults.status_healthy is not None and faults.status_healthy.returncode == 0
    rows = faults.status_healthy.stdout.strip().splitlines()
    assert len(rows) == 5 and all("healthy" in r for r in rows), faults.status_healthy.stdout
    assert faults.status_dead is not None and faults.status_dead.returncode == 1
    states = {r.split()[0] + r.split()[1]: r for r in faults.status_dead.stdout.strip().splitlines()}
    assert "DEAD" in states["nodes1"] and "healthy" in states["prometheus0"], faults.status_dead.stdout
    assert faults.down is not None
    assert faults.down.returncode == 0, faults.down.stderr
    assert "stopped 4 process(es)" in faults.down.stdout  # dispatcher, node hosts 0 and 2, Prometheus
    pids = [e.pid for e in faults.file.dispatchers + faults.file.node_hosts] + [faults.file.prometheus_pid]
    wait_until(lambda: all(gone(p) for p in pids), 10, "every process, Prometheus included, to exit")
    assert not faults.cluster_path.exists()
    assert (faults.cluster_path.with_suffix(".prometheus") / "data").is_dir(), "the run's data is kept"


def test_cli_refuses_a_bad_scrape_interval_before_starting_anything(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FAULTS_SPEC)
    cfile = tmp_path / "run" / "cluster.json"
    result = lbt(
        "cluster", "up", str(spec), "--file", str(cfile), "--with-prometheus", "--scrape-interval", "0"
    )
    assert result.returncode == 2
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "--scrape-interval" in err[0] and "between" in err[0], result.stderr
    assert not cfile.exists()


def test_cli_without_the_prometheus_binary_says_how_to_install_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FAULTS_SPEC)
    cfile = tmp_path / "run" / "cluster.json"
    exe = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "lbt"
    exe = exe if exe.exists() else ROOT / ".venv" / "bin" / "lbt"
    result = subprocess.run(
        [str(exe), "cluster", "up", str(spec), "--file", str(cfile), "--with-prometheus"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(tmp_path / "empty")},
    )
    assert result.returncode == 1
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "prometheus" in err[0] and "make prometheus" in err[0], result.stderr
    assert not cfile.exists()


def another_prometheus(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A Prometheus that is not the cluster's (another cluster's, say) ready on a free loopback port."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(json.dumps({"global": {"scrape_interval": "10s"}}))
    port = free_ports(1)[0]
    command = [
        "prometheus",
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    log = open(directory / "log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    wait_until(lambda: ready(f"http://127.0.0.1:{port}"), 30, "the other Prometheus to be ready")
    return proc, port


def test_cli_up_refuses_a_port_held_by_another_prometheus(tmp_path: Path) -> None:
    """The port the cluster is told to use answers /-/ready, but from another server: the cluster's own
    Prometheus cannot bind it, so the cluster is stopped, with one line and exit 1 (before, readiness was
    polled on the other server and `up` said the cluster's Prometheus ran there)."""
    other, port = another_prometheus(tmp_path / "other")
    cfile = tmp_path / "run" / "cluster.json"
    try:
        spec = write_spec(tmp_path, JIQ_SPEC)
        args = ["--file", str(cfile), "--with-prometheus", "--prometheus-port", str(port)]
        result = lbt("cluster", "up", str(spec), *args, timeout=120)
        assert result.returncode == 1, result.stdout + result.stderr
        err = result.stderr.strip().splitlines()
        assert len(err) == 1 and f"127.0.0.1:{port}" in err[0] and "another process" in err[0], err
        assert not cfile.exists(), "the cluster is stopped: no file left behind"
        assert processes_mentioning(str(cfile)) == [], "no process of the cluster is left"
        assert other.poll() is None, "the other server is left alone"
    finally:
        if cfile.exists():  # a cluster that came up anyway: leave nothing running
            lbt("cluster", "down", "--file", str(cfile))
        other.terminate()
        other.wait(10)


def test_serves_tells_our_server_from_another_on_its_port(tmp_path: Path) -> None:
    """``serves`` accepts a server only when the process we started answers: another server on the URL
    is refused for our live process, and our server for a record of another process."""
    other, port = another_prometheus(tmp_path / "other")
    try:
        url = f"http://127.0.0.1:{port}"
        assert serves(url, Started.of(other.pid, other.args)), "the other server is its own"
        mine, _ = another_prometheus(tmp_path / "mine")  # a live Prometheus of ours, on another port
        try:
            assert not serves(url, Started.of(mine.pid, mine.args)), "ours is alive, but another answers"
        finally:
            mine.terminate()
            mine.wait(10)
    finally:
        other.terminate()
        other.wait(10)


# ============================================================================== 7. query errors


def test_query_errors_name_the_expression(live: Live) -> None:
    with pytest.raises(PrometheusError, match=r"query 'sum\(up': .*parse error") as bad:
        instant_query(live.slta.url, "sum(up")
    assert len(str(bad.value).splitlines()) == 1
    nowhere = "http://127.0.0.1:9"  # discard port: nothing listens there
    with pytest.raises(PrometheusError, match=r"query 'up': Prometheus at http://127.0.0.1:9 unreachable"):
        instant_query(nowhere, "up")
    with pytest.raises(PrometheusError, match=r"no series after 0.5 s"):
        wait_for_series(live.slta.url, 'up{role="nobody"}', timeout=0.5)


def test_server_stops_and_leaves_no_process(live: Live, tmp_path: Path) -> None:
    """A PrometheusServer of its own for the slta cluster file, stopped as a context manager."""
    cfile = tmp_path / "other.json"
    live.clusters["slta"].save(cfile)
    server: PrometheusServer
    exp = live.clusters["slta"].experiment()
    with start_prometheus(exp, live.clusters["slta"], cfile, scrape_interval=0.5) as server:
        assert wait_for_series(server.url, "up", timeout=30)
        pid = server.pid
    assert gone(pid)
    assert (tmp_path / "other.prometheus" / "prometheus.yml").exists()


def test_a_preferred_port_is_taken_when_free_and_passed_over_when_not(live: Live, tmp_path: Path) -> None:
    """`lbt cluster up --with-prometheus` prefers GRAFANA_PORT (the provisioned datasource's): here a port
    of our own stands for it, once free and once held by a socket of ours."""
    import socket

    exp = live.clusters["slta"].experiment()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        held.listen()
        with start_prometheus(exp, live.clusters["slta"], tmp_path / "a.json", 1.0, prefer=port) as server:
            assert urllib.parse.urlsplit(server.url).port != port
    with start_prometheus(exp, live.clusters["slta"], tmp_path / "b.json", 1.0, prefer=port) as server:
        assert urllib.parse.urlsplit(server.url).port == port
