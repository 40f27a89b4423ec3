"""Fault injection on a real cluster (issue 8, docs/faults.md): spec, injection, health and the run's report.

The end-to-end test runs ``lbt run`` on a JIQ cluster of 12 FCFS nodes in 3 node processes with two faults:
the process serving nodes 0-3 is killed and restarted, the one serving nodes 8-11 is paused and continued.
It checks, from what the load generator and the dispatcher recorded:

- every task is accounted for: completed + refused + lost + failed + dropped = scheduled, tasks are lost
  only with the killed process, none with the paused one (its tasks wait and complete);
- the dispatcher marks each faulty process down within the detection bound (heartbeat + timeout wall
  seconds, plus one timeout of slack for a loaded machine's event loop) and routes nothing there until it
  is back, then routes there again;
- the batches outside the fault windows agree with the simulator on the same tasks.

Bounds are in model seconds: wall seconds / time_scale.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lbtestbed.model.reader import SpecError
from lbtestbed.spec import load_spec, parse_spec
from lbtestbed.transport.message_faults import MessageFaults

SPEC = """
name = "faults-e2e"
seed = 11

[[classes]]
name = "servers"
count = 12
discipline = "fcfs"

[workload]
load = 0.6
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "jiq"

[run]
warmup = 20.0
duration = 400.0
time_scale = 0.05
batches = 20

[health]
heartbeat = 0.2
timeout = 1.0

[[faults]]
kind = "kill"
node = 0
at = 85.0
until = 125.0
settle = 20.0

[[faults]]
kind = "pause"
node = 11
at = 205.0
until = 285.0
settle = 60.0
"""

SCALE = 0.05
HEARTBEAT, TIMEOUT = 0.2, 1.0
#: model seconds within which a dead or paused process must be marked down (module docstring)
DETECT = (HEARTBEAT + 2 * TIMEOUT) / SCALE
#: model seconds between a task's intended send and its routing (the generator's lateness and the
#: dispatch: 0.1 s wall). A task is routed at its intended time t or up to this much later, so one sent
#: just before a process came back up may be routed to it after.
ROUTE_SLACK = 0.1 / SCALE
PROCESSES = ("--node-processes", "3")  # nodes 0-3, 4-7, 8-11


def base_doc() -> dict[str, Any]:
    import tomllib

    return tomllib.loads(SPEC)


# ------------------------------------------------------------------------------------------ spec


@pytest.mark.parametrize(
    ("fault", "key", "says"),
    [
        ({"kind": "kill", "at": 10.0, "until": 5.0, "node": 1}, "faults[0].until", "must come after at"),
        ({"kind": "kill", "at": 10.0, "until": 20.0, "node": 12}, "faults[0].node", "at most 11"),
        ({"kind": "kill", "at": 10.0, "until": 999.0, "node": 1}, "faults[0].until", "within the run"),
        ({"kind": "drop", "at": 1.0, "until": 5.0, "fraction": 1.5}, "faults[0].fraction", "(0, 1]"),
        ({"kind": "drop", "at": 1.0, "until": 5.0, "fraction": 0.5, "node": 2}, "faults[0].node", "unknown"),
        ({"kind": "drop", "at": 1.0, "until": 5.0, "messages": ["probe"]}, "faults[0].messages[0]", "probe"),
        ({"kind": "delay", "at": 1.0, "until": 5.0}, "faults[0].delay", "missing"),
        ({"kind": "explode", "at": 1.0, "until": 5.0}, "faults[0].kind", "must be one of"),
        ({"kind": "pause", "at": 1.0, "until": 5.0, "node": 1, "settle": -1}, "faults[0].settle", "negative"),
    ],
)
def test_a_bad_fault_is_one_line_naming_its_key(fault: dict[str, Any], key: str, says: str) -> None:
    doc = base_doc()
    doc["faults"] = [fault]
    with pytest.raises(SpecError) as err:
        parse_spec(doc, "f.toml")
    assert err.value.key == key, str(err.value)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_policy_without_state_messages_has_no_message_faults() -> None:
    doc = base_doc()
    doc["policy"] = {"name": "random"}
    doc["faults"] = [{"kind": "drop", "at": 1.0, "until": 5.0, "fraction": 0.5}]
    with pytest.raises(SpecError, match="random sends no state messages"):
        parse_spec(doc, "f.toml")


def test_faults_parse_with_their_defaults() -> None:
    doc = base_doc()
    doc["faults"].append({"kind": "drop", "at": 30.0, "until": 40.0, "fraction": 0.25})
    exp = parse_spec(doc, "f.toml")
    kill, _, drop = exp.faults
    assert (kill.kind, kill.node, kill.at, kill.until, kill.settle) == ("kill", 0, 85.0, 125.0, 20.0)
    assert drop.messages == ("idle_token",) and drop.fraction == 0.25
    assert drop.settle == exp.run.warmup  # the default settle
    assert exp.health.heartbeat == HEARTBEAT and exp.health.timeout == TIMEOUT


# ----------------------------------------------------------------------------- message faults


def message_faults(faults: list[dict[str, Any]]) -> MessageFaults:
    doc = base_doc()
    doc["faults"] = faults
    return MessageFaults(parse_spec(doc, "f.toml"), stream=0)


def test_a_drop_fault_drops_its_fraction_and_only_while_active() -> None:
    mf = message_faults([{"kind": "drop", "at": 1.0, "until": 5.0, "fraction": 0.3}])
    assert mf.copies("idle_token") == (0.0,)  # not active yet
    mf.set(0, True)
    n = 20_000
    dropped = sum(1 for _ in range(n) if mf.copies("idle_token") == ())
    # binomial(n, 0.3): 4.5 standard deviations either way (fixed seed: the test is deterministic)
    sd = (n * 0.3 * 0.7) ** 0.5
    assert abs(dropped - 0.3 * n) < 4.5 * sd, dropped
    assert mf.hits["drop", "idle_token"] == dropped
    mf.set(0, False)
    assert mf.copies("idle_token") == (0.0,)


def test_duplicate_and_delay_faults_compose() -> None:
    mf = message_faults(
        [
            {"kind": "duplicate", "at": 1.0, "until": 5.0, "fraction": 1.0},
            {"kind": "delay", "at": 1.0, "until": 5.0, "delay": 0.5},
        ]
    )
    mf.set(0, True)
    mf.set(1, True)
    assert mf.copies("idle_token") == (0.5, 0.5)  # two copies, each delayed by the deterministic 0.5
    with pytest.raises(Exception, match="no message fault 7"):
        mf.set(7, True)


def test_a_kill_fault_cannot_target_a_message_switch() -> None:
    mf = message_faults([{"kind": "kill", "at": 1.0, "until": 5.0, "node": 2}])
    with pytest.raises(Exception, match="no message fault 0"):
        mf.set(0, True)


# --------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    d = tmp_path_factory.mktemp("faults")
    spec = d / "spec.toml"
    spec.write_text(SPEC)
    out = d / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--out", str(out), "--json", *PROCESSES],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout), out


def _faults(doc: dict[str, Any]) -> dict[str, Any]:
    faults: dict[str, Any] = doc["results"]["cluster"]["faults"]
    return faults


def _window(faults: dict[str, Any], index: int) -> tuple[float, float, list[int]]:
    acts = [a for a in faults["actions"] if a["fault"] == index]
    start = next(a for a in acts if a["action"] == "start")
    end = next(a for a in acts if a["action"] == "end")
    assert not start["error"] and not end["error"], acts
    return start["model_time"], end["model_time"], start["nodes"]


def observed_batches(faults: dict[str, Any], settle: dict[int, float]) -> set[int]:
    """The batches (20 of 20 model s from 20) the processes' observed outages overlap, each from the last
    check that saw its process serving to its end plus the settle time of its fault (``settle``, by fault;
    the warm-up, 20, for one nobody planned): a process that was out longer than scheduled (a dispatcher
    waiting for its nodes' first answers) disturbs the batches it was out in."""
    out = set()
    for o in faults["outages"]:
        lo, hi = o["last_seen"], (o["end"] if o["end"] is not None else 1e9) + settle.get(o["fault"], 20.0)
        out |= {b for b in range(20) if lo < 20 + 20 * (b + 1) and 20 + 20 * b < hi}
    return out


def _transitions(faults: dict[str, Any], nodes: list[int], after: float) -> tuple[float, float]:
    """The first down at or after ``after`` of the process holding ``nodes``, and the first up after it."""
    mine = [e for e in faults["health_events"] if e["nodes"] == [nodes[0], nodes[-1]]]
    down = next(e["model_time"] for e in mine if e["to"] == "down" and e["model_time"] >= after)
    up = next(e["model_time"] for e in mine if e["to"] == "up" and e["model_time"] > down)
    return down, up


def test_every_task_is_accounted_for(fault_run: tuple[int, dict[str, Any], Path]) -> None:
    _, doc, _ = fault_run
    load = doc["results"]["cluster"]["load"]
    ends = sum(load[k] for k in ("completed", "refused", "lost", "failed", "dropped"))
    assert ends == load["scheduled"], load
    timeline = doc["results"]["cluster"]["fault_timeline"]
    lost_nodes = {node for _, outcome, node in timeline["failures"] if outcome == "lost"}
    _, _, killed = _window(_faults(doc), 0)
    assert lost_nodes <= set(killed), (lost_nodes, killed)  # lost only with the killed process
    assert load["lost"] == sum(1 for _, o, _ in timeline["failures"] if o == "lost")
    assert load["refused"] == 0 and load["failed"] == 0, load


def test_a_killed_process_is_routed_around_and_taken_back(
    fault_run: tuple[int, dict[str, Any], Path],
) -> None:
    _, doc, _ = fault_run
    faults = _faults(doc)
    start, end, nodes = _window(faults, 0)
    down, up = _transitions(faults, nodes, start)
    assert down - start <= DETECT, (start, down)
    assert up >= end, "taken back before it was restarted"
    completed = doc["results"]["cluster"]["fault_timeline"]["completed"]
    routed_while_down = [t for t, k in completed if k in nodes and down + ROUTE_SLACK < t < up - ROUTE_SLACK]
    assert routed_while_down == []
    assert any(k in nodes for t, k in completed if t > up), "no task went to the restarted process"


def test_a_paused_process_is_routed_around_and_its_tasks_complete(
    fault_run: tuple[int, dict[str, Any], Path],
) -> None:
    _, doc, _ = fault_run
    faults = _faults(doc)
    start, end, nodes = _window(faults, 1)
    down, up = _transitions(faults, nodes, start)
    assert down - start <= DETECT, (start, down)
    assert up >= end - ROUTE_SLACK, "taken back while still stopped"
    completed = doc["results"]["cluster"]["fault_timeline"]["completed"]
    assert [t for t, k in completed if k in nodes and down + ROUTE_SLACK < t < up - ROUTE_SLACK] == []
    # tasks it held when it stopped are served after it continues: none is lost
    assert any(k in nodes and start <= t < down for t, k in completed), "nothing was waiting there"
    assert any(k in nodes for t, k in completed if t > up)
    event = next(e for e in faults["health_events"] if e["to"] == "up" and e["model_time"] == up)
    assert event["fresh"] is False  # same process, state kept


def test_batches_outside_the_faults_agree_with_the_twin(
    fault_run: tuple[int, dict[str, Any], Path],
) -> None:
    """The run's verdict (cluster against its twin, paired) on the batches no fault disturbed."""
    _, doc, _ = fault_run
    excluded = _faults(doc)["batches_excluded"]
    # kill [85, 125] + 20 and pause [205, 285] + 60 over batches of 20 model s from 20 (faults start
    # between batch boundaries: a boundary's scrape racing a fault would also drop the batch before)
    # a batch beyond these only where a process did not answer the scrape at one of its ends (on a busy
    # machine a scrape can miss its deadline): that is recorded, and the batch is not compared either
    unanswered = set(_faults(doc)["batches_unanswered"])
    observed = observed_batches(_faults(doc), {0: 20.0, 1: 60.0})
    assert {o["fault"] for o in _faults(doc)["outages"]} == {0, 1}  # both seen out; nothing unplanned
    assert set(excluded) == {3, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15, 16} | unanswered | observed, (
        excluded,
        unanswered,
    )
    deciding = [v for v in doc["comparison"] if v["counts"]]
    assert any(v["reference"] == "twin" for v in deciding), "nothing was compared"
    # the cluster decides against its twin; the theory's values at n, against the zero-delay simulation
    assert all(
        (v["reference"], v["subject"], v["paired"])
        in (("twin", "cluster", True), ("theory", "simulation", False))
        for v in deciding
    )
    assert all(v["verdict"] == "agrees" for v in deciding), [
        (v["metric"], v["verdict"]) for v in deciding if v["verdict"] != "agrees"
    ]


def test_the_report_shows_the_faults(fault_run: tuple[int, dict[str, Any], Path]) -> None:
    _, _, out = fault_run
    text = (out / "report.md").read_text()
    assert "## Faults" in text and "kill node process 0 (nodes 0-3)" in text
    assert "pause node process 2 (nodes 8-11)" in text and "not noticed" not in text
    assert (out / "faults.png").stat().st_size > 10_000
    assert "![faults](faults.png)" in text


def test_a_fault_on_a_missing_dispatcher_is_refused(tmp_path: Path) -> None:
    doc = SPEC + '\n[[faults]]\nkind = "restart_dispatcher"\ndispatcher = 3\nat = 10.0\nuntil = 20.0\n'
    spec = tmp_path / "spec.toml"
    spec.write_text(doc)
    load_spec(spec)  # the spec itself is fine: the cluster decides how many dispatchers there are
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "dispatcher 3" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr


def test_message_faults_draw_the_same_for_the_same_seed() -> None:
    a = message_faults([{"kind": "drop", "at": 1.0, "until": 5.0, "fraction": 0.5}])
    b = message_faults([{"kind": "drop", "at": 1.0, "until": 5.0, "fraction": 0.5}])
    a.set(0, True)
    b.set(0, True)
    assert [a.copies("idle_token") for _ in range(200)] == [b.copies("idle_token") for _ in range(200)]


# ------------------------------------------------------- message faults and a dispatcher restart, end to end

MESSAGES_SPEC = (
    SPEC.split("[health]")[0]
    .replace('name = "faults-e2e"', 'name = "faults-messages"')
    .replace('"jiq"', '"jsq"')
    + """
[[faults]]
kind = "drop"
fraction = 0.5
messages = ["departure"]
at = 85.0
until = 125.0
settle = 20.0

[[faults]]
kind = "duplicate"
fraction = 1.0
at = 165.0
until = 185.0
settle = 20.0

[[faults]]
kind = "restart_dispatcher"
at = 265.0
until = 275.0
settle = 20.0
"""
)


@pytest.fixture(scope="module")
def messages_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("faults-messages")
    spec = d / "spec.toml"
    spec.write_text(MESSAGES_SPEC)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtestbed.cli",
            "run",
            str(spec),
            "--out",
            str(d / "r"),
            "--json",
            *PROCESSES,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode in (0, 1), proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_message_faults_and_a_dispatcher_restart_are_applied_and_accounted_for(
    messages_run: dict[str, Any],
) -> None:
    cluster = messages_run["results"]["cluster"]
    actions = cluster["faults"]["actions"]
    assert [(a["fault"], a["action"]) for a in actions] == [
        (0, "start"), (0, "end"), (1, "start"), (1, "end"), (2, "start"), (2, "end")
    ]  # fmt: skip
    assert all(a["error"] == "" for a in actions), actions
    load = cluster["load"]
    assert sum(load[k] for k in ("completed", "refused", "lost", "failed", "dropped")) == load["scheduled"]
    assert load["failed"] > 0, "no task met the dead dispatcher"
    assert load["lost"] == 0, load  # no node died
    # only tasks around the dispatcher's outage fail: sent to it while it was down, on their way when it
    # died (sojourns stay under 30 model s here), or refused by its successor before it heard every node
    restart_at, restarted = actions[4]["model_time"], actions[5]["model_time"]
    for t, outcome, _ in cluster["fault_timeline"]["failures"]:
        assert outcome in ("failed", "refused") and restart_at - 30 <= t <= restarted + 2 * DETECT, (
            t,
            outcome,
        )


def test_outside_message_faults_the_run_agrees_with_the_twin(messages_run: dict[str, Any]) -> None:
    """Half the departure reports lost, then every one duplicated, then the dispatcher restarted with the
    nodes holding its predecessor's tasks: once each has settled, JSQ routes as its twin (the simulation
    with the run's measured delays, and no faults) does, which it could not with a picture that kept lost
    departures (those nodes would look busy for good) or counted duplicated ones twice."""
    excluded = messages_run["results"]["cluster"]["faults"]["batches_excluded"]
    # [85, 145], [165, 205], [265, 295]
    # a batch beyond these only where a process did not answer the scrape at one of its ends (on a busy
    # machine a scrape can miss its deadline): that is recorded, and the batch is not compared either
    unanswered = set(messages_run["results"]["cluster"]["faults"]["batches_unanswered"])
    # the restarted dispatcher is out from its kill until it has heard from every node process: longer
    # than scheduled, and the batches it was out in are left out too
    faults = messages_run["results"]["cluster"]["faults"]
    [outage] = faults["outages"]
    assert (outage["process"], outage["fault"]) == ("dispatcher-0", 2) and outage["end"] > 275.0
    observed = observed_batches(faults, {2: 20.0})
    assert set(excluded) == {3, 4, 5, 6, 7, 8, 9, 12, 13} | unanswered | observed, (excluded, unanswered)
    deciding = [v for v in messages_run["comparison"] if v["counts"]]
    assert any(v["reference"] == "twin" for v in deciding)
    assert all(
        (v["reference"], v["paired"]) in (("twin", True), ("theory", False))
        and (v["reference"] == "twin") == (v["subject"] == "cluster")
        for v in deciding
    )
    assert all(v["verdict"] == "agrees" for v in deciding), [
        (v["metric"], v["verdict"]) for v in deciding if v["verdict"] != "agrees"
    ]
