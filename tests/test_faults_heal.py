"""Policy state heals after message faults and a dispatcher restart (issue 8): real clusters on loopback.

Each test starts a cluster of 2 node processes under ``tmp_path``, drives a short open-loop load of the
spec's own tasks and switches the spec's message faults on and off itself (``POST /v1/faults`` to every
process), or kills and restarts the dispatcher. Once the load has drained the truth is known exactly:
every node is idle. The dispatcher's picture must then equal it:

- JIQ holds an idle token of every node (``idle_tokens == n``), JSQ sees every node idle
  (``idle_nodes == n``), SLTA has every pool empty: a class-i pool holds a green token iff
  0 < l_i(r), and no epoch is left unanswered.

The policies never resend a lost token or departure notice, so a picture that heals after the faults were
on *until the load had drained* was healed by the dispatcher's health checks: ``reconcile`` with node
reports at least ``reconcile_age`` old (here the health timeout, 1 s wall: no spec emulates a delay long
enough to matter) and, for SLTA, epochs resent when their answer is overdue. The message counters show
that no message brought the missing state. After a dispatcher restart the same holds for the ends of the
old process's tasks. Healing is liveness: ``wait_until`` with a generous deadline, never a bound.

Why the picture is short when the load has drained (checked right away, with the fault still on): every
node's last departure falls in the last few tenths of a second of the load (a node gets a task about every
60 ms wall), its message was dropped (always for JIQ and SLTA, with probability 1/2 per node for JSQ, so
all 12 get through with probability 2^-12), and a report that shows it is not applied before it is
``reconcile_age`` = 1 s old.

Every task is accounted for: the generator's outcomes add up to the tasks scheduled, and the dispatcher's
``lbtestbed_dispatcher_tasks_total`` by outcome to the tasks it answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_cluster import (
    Metrics,
    cluster_urls,
    fcfs_spec,
    get,
    pool_spec,
    post,
    scrape,
    signed_by,
    wait_until,
    write_spec,
)

from lbtestbed.cluster.launcher import Cluster, healthy, spawn
from lbtestbed.loadgen.openloop import LoadReport, drive, poisson_tasks
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import ClusterFile
from lbtestbed.transport.wire import PREFIX

NODE_PROCESSES = 2
SCALE = 0.04  # wall seconds per model second (fcfs_spec and pool_spec use it)
#: the health settings written into every spec (the defaults, spelt out): wall seconds
HEALTH = "\n[health]\nheartbeat = 0.2\ntimeout = 1.0\n"
HEARTBEAT, TIMEOUT = 0.2, 1.0
RECONCILE_AGE = TIMEOUT  # max(timeout, 20 x mean emulated delay): at most 20 x 40 ms here
#: wall seconds allowed for healing after the drain, ten times the least it takes (a report is applied
#: RECONCILE_AGE after it was taken, by a check up to a heartbeat later, and shows in the next scrape): a
#: liveness deadline for a loaded machine, not a measurement
HEAL = 10 * (RECONCILE_AGE + 2 * HEARTBEAT)
OUTCOMES = ("completed", "refused", "lost", "failed", "dropped")


# ------------------------------------------------------------------------------------------ helpers


def fault(kind: str, messages: Sequence[str], at: float, until: float, extra: str = "") -> str:
    """A [[faults]] table; at/until document the schedule the test applies by hand."""
    kinds = ", ".join(f'"{k}"' for k in messages)
    return f'\n[[faults]]\nkind = "{kind}"\nmessages = [{kinds}]\nat = {at}\nuntil = {until}\n{extra}'


def switch(f: ClusterFile, index: int, active: bool) -> None:
    """Switch fault ``index`` on or off in every process of the cluster."""
    for e in f.dispatchers + f.node_hosts:
        body = json.dumps({"fault": index, "active": active}).encode()
        status, reply = post(f"{e.url}{PREFIX}/faults", body, signed_by(f.token))
        assert status == 200 and (index in reply["active"]) == active, (e.url, status, reply)


def gauges(url: str) -> dict[str, Any]:
    return scrape([url]).policy_state()


async def load(
    url: str, tasks: Sequence[tuple[float, float]], events: Sequence[tuple[float, Callable[[], Any]]] = ()
) -> tuple[LoadReport, float]:
    """Drive ``tasks`` through dispatcher ``url`` and run each event (blocking, in a thread) at its model
    time; the report and the monotonic instant of model time 0."""
    start = time.monotonic() + 0.1

    async def act() -> None:
        for t, event in events:
            delay = start + t * SCALE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await asyncio.to_thread(event)

    report, _ = await asyncio.gather(drive([url], tasks, SCALE, start=start), act())
    return report, start


def outcomes(report: LoadReport) -> dict[str, int]:
    out = {k: report.outcomes[k] for k in OUTCOMES}
    assert sum(out.values()) == report.scheduled, (out, report.scheduled)
    return out


def all_completed(report: LoadReport, disp: Metrics) -> None:
    """No fault here loses a task: the generator got every one back, the dispatcher routed and answered
    each once."""
    n = report.scheduled
    assert outcomes(report) == {"completed": n, "refused": 0, "lost": 0, "failed": 0, "dropped": 0}
    assert disp.by("lbtestbed_dispatcher_tasks_total", "outcome") == {"completed": n, "refused": 0, "lost": 0}
    assert disp.total("lbtestbed_dispatcher_decisions_total") == n


def faulted(nodes: Metrics, disp: Metrics, fault_kind: str, kind: str) -> float:
    """Messages of ``kind`` that a fault of ``fault_kind`` hit, wherever they were sent."""
    return nodes.total("lbtestbed_node_message_faults_total", fault=fault_kind, kind=kind) + disp.total(
        "lbtestbed_dispatcher_message_faults_total", fault=fault_kind, kind=kind
    )


# ======================================================================= 1. JIQ: idle tokens dropped


JIQ_N, JIQ_D = 10, 60.0  # 10 nodes, 60 model s = 2.4 s wall, about 410 tasks
FAULT_ON = 0.3 * JIQ_D


def test_jiq_idle_tokens_dropped_until_the_drain_come_back(tmp_path: Path) -> None:
    """Every idle token is dropped from 30 % of the load until it has drained: the dispatcher ends short
    of tokens with every node idle, and gets exactly n back from the nodes' reports, with no message."""
    text = fcfs_spec('name = "jiq"', count=JIQ_N, duration=JIQ_D, scale=SCALE) + HEALTH
    spec = write_spec(tmp_path, text + fault("drop", ["idle_token"], FAULT_ON, JIQ_D, "fraction = 1.0\n"))
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=NODE_PROCESSES)
        dispatcher, hosts = cluster_urls(f)
        tasks = list(poisson_tasks(f.experiment(), JIQ_D))
        report, _ = asyncio.run(load(dispatcher, tasks, [(FAULT_ON, lambda: switch(f, 0, True))]))

        # drained, the fault still on: the truth is n idle nodes, the picture falls short
        nodes, disp = scrape(hosts), scrape([dispatcher])
        assert nodes.total("lbtestbed_node_tasks") == 0
        short = disp.policy_state()["idle_tokens"]
        dropped = faulted(nodes, disp, "drop", "idle_token")
        assert dropped > 0, "the fault hit nothing"
        assert short < JIQ_N, f"no token was missing at the drain ({dropped:g} dropped)"
        received = disp.total("lbtestbed_dispatcher_messages_received_total", kind="idle_token")
        switch(f, 0, False)

        wait_until(lambda: gauges(dispatcher)["idle_tokens"] == JIQ_N, HEAL, "idle_tokens == n")
        nodes, disp = scrape(hosts), scrape([dispatcher])
        # no token message came after the drain: the reports brought them back
        assert disp.total("lbtestbed_dispatcher_messages_received_total", kind="idle_token") == received
        sent = nodes.total("lbtestbed_node_messages_sent_total", kind="idle_token")
        assert received == sent - dropped, (received, sent, dropped)
        assert nodes.total("lbtestbed_node_tasks") == 0
        all_completed(report, disp)


# =========================================================== 2. JIQ: idle tokens duplicated and delayed


#: an emulated network delay (40 ms wall on average) draws each copy's own delay, so that the two copies of
#: a duplicated token arrive apart (the duplicate and delay faults delay both copies alike), often after
#: the first was used; 20 x 40 ms stays below the health timeout, so reconcile_age is still 1 s
NETWORK = '\n[network]\ndelay = { dist = "exponential", mean = 1.0 }\n'


def test_jiq_duplicated_and_delayed_tokens_count_once(tmp_path: Path) -> None:
    """Every idle token is sent twice and delayed (exponential, mean 2 model s = 80 ms wall, which
    reorders a node's tokens) from 30 % of the load on: after the drain the dispatcher holds exactly n
    tokens, and it counted as stale at least one copy of every duplicated token: of two copies with the
    same number at most one is ever taken, also when the second comes after the first was used."""
    faults = fault("duplicate", ["idle_token"], FAULT_ON, JIQ_D, "fraction = 1.0\n") + fault(
        "delay", ["idle_token"], FAULT_ON, JIQ_D, 'delay = { dist = "exponential", mean = 2.0 }\n'
    )
    text = fcfs_spec('name = "jiq"', count=JIQ_N, duration=JIQ_D, scale=SCALE) + HEALTH + NETWORK + faults

    def on() -> None:
        switch(f, 1, True)  # the delay first: every duplicated token is delayed too
        switch(f, 0, True)

    spec = write_spec(tmp_path, text)
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=NODE_PROCESSES)
        dispatcher, hosts = cluster_urls(f)
        tasks = list(poisson_tasks(f.experiment(), JIQ_D))
        report, _ = asyncio.run(load(dispatcher, tasks, [(FAULT_ON, on)]))

        def settled() -> bool:
            nodes, disp = scrape(hosts), scrape([dispatcher])
            sent = nodes.total("lbtestbed_node_messages_sent_total", kind="idle_token")  # every copy
            got = disp.total("lbtestbed_dispatcher_messages_received_total", kind="idle_token")
            return got == sent and gauges(dispatcher)["idle_tokens"] == JIQ_N

        wait_until(settled, HEAL, "every copy delivered and idle_tokens == n")
        nodes, disp = scrape(hosts), scrape([dispatcher])
        duplicated = faulted(nodes, disp, "duplicate", "idle_token")
        assert duplicated > 0 and faulted(nodes, disp, "delay", "idle_token") > 0
        stale = disp.policy_state()["jiq_stale_tokens_total"]
        assert stale >= duplicated, (stale, duplicated)
        assert nodes.total("lbtestbed_node_tasks") == 0
        all_completed(report, disp)


# ============================================================ 3. JSQ: half the departure notices dropped


JSQ_N = 12  # every last notice gets through with probability 2^-12 (module docstring)


def test_jsq_dropped_departures_heal(tmp_path: Path) -> None:
    """Half the departure notices are dropped from 30 % of the load until it has drained: the dispatcher
    ends seeing some idle node busy, and sees all n idle again from the nodes' reports."""
    text = fcfs_spec('name = "jsq"', count=JSQ_N, duration=JIQ_D, scale=SCALE) + HEALTH
    spec = write_spec(tmp_path, text + fault("drop", ["departure"], FAULT_ON, JIQ_D, "fraction = 0.5\n"))
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=NODE_PROCESSES)
        dispatcher, hosts = cluster_urls(f)
        tasks = list(poisson_tasks(f.experiment(), JIQ_D))
        report, _ = asyncio.run(load(dispatcher, tasks, [(FAULT_ON, lambda: switch(f, 0, True))]))

        nodes, disp = scrape(hosts), scrape([dispatcher])
        assert nodes.total("lbtestbed_node_tasks") == 0
        dropped = faulted(nodes, disp, "drop", "departure")
        assert dropped > 0, "the fault hit nothing"
        short = disp.policy_state()["idle_nodes"]
        assert short < JSQ_N, f"every node looked idle at the drain ({dropped:g} dropped)"
        switch(f, 0, False)

        def healed() -> bool:
            nodes, disp = scrape(hosts), scrape([dispatcher])
            sent = nodes.total("lbtestbed_node_messages_sent_total", kind="departure")
            got = disp.total("lbtestbed_dispatcher_messages_received_total", kind="departure")
            return got == sent - dropped and gauges(dispatcher)["idle_nodes"] == JSQ_N

        wait_until(healed, HEAL, "every notice not dropped delivered and idle_nodes == n")
        assert scrape(hosts).total("lbtestbed_node_tasks") == 0
        all_completed(report, scrape([dispatcher]))


# ==================================================== 4. SLTA: departures and epoch answers dropped


SLTA_D = 40.0  # 24 tasks per model s (8 pools at rho = 3): about 960 tasks in 1.6 s wall
SLTA_ON = 0.4 * SLTA_D
SLTA_CLASSES = {"small": 4, "large": 4}  # pool_spec


def test_slta_dropped_tokens_and_epoch_answers_heal(tmp_path: Path) -> None:
    """Every token_departure and token_epoch is dropped from 40 % of the load until it has drained. The
    picture then only fills: r rises and the pools told of each new epoch never answer. Afterwards every
    pool is empty, so the picture must show, at the final r (no task, no learning step), a green token in
    every pool of a class with l_i(r) > 0 and none elsewhere, and no unanswered epoch."""
    text = pool_spec('name = "slta"\nbeta_scale = 1.0', duration=SLTA_D, scale=SCALE) + HEALTH
    spec = write_spec(
        tmp_path,
        text + fault("drop", ["token_departure", "token_epoch"], SLTA_ON, SLTA_D, "fraction = 1.0\n"),
    )
    before: dict[str, Any] = {}

    def on() -> None:
        before.update(gauges(dispatcher))
        switch(f, 0, True)

    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=NODE_PROCESSES)
        exp = f.experiment()
        assert {c.name: c.count for c in exp.classes} == SLTA_CLASSES
        dispatcher, hosts = cluster_urls(f)
        tasks = list(poisson_tasks(exp, SLTA_D))
        report, _ = asyncio.run(load(dispatcher, tasks, [(SLTA_ON, on)]))

        nodes, disp = scrape(hosts), scrape([dispatcher])
        assert nodes.total("lbtestbed_node_tasks") == 0
        assert faulted(nodes, disp, "drop", "token_departure") > 0
        state = disp.policy_state()
        assert state["slta_r"] > before["slta_r"], (before, state)  # r moved during the fault
        assert state["slta_unanswered_epochs"] > 0, state
        assert faulted(nodes, disp, "drop", "token_epoch") > 0
        assert green(state) != expected_green(state), f"the picture was right at the drain: {state}"
        switch(f, 0, False)

        def healed() -> bool:
            s = gauges(dispatcher)
            return s["slta_unanswered_epochs"] == 0 and green(s) == expected_green(s)

        wait_until(healed, HEAL, "no unanswered epoch and the green tokens of empty pools")
        disp = scrape([dispatcher])
        state = disp.policy_state()
        assert disp.total("lbtestbed_dispatcher_messages_resent_total", kind="epoch") > 0
        assert scrape(hosts).total("lbtestbed_node_tasks") == 0
        # nothing routed after the drain: r is what it was then, and some class has pools with tokens
        assert sum(expected_green(state).values()) > 0, state
        all_completed(report, disp)


def green(state: dict[str, Any]) -> dict[str, float]:
    return {c: state["slta_green_tokens"][c] for c in SLTA_CLASSES}


def expected_green(state: dict[str, Any]) -> dict[str, float]:
    """Every pool empty: a class-i pool holds a green token iff 0 < l_i(r) (the threshold gauges)."""
    return {c: float(count if state["slta_threshold"][c] > 0 else 0) for c, count in SLTA_CLASSES.items()}


# ============================================================================ 5. the dispatcher restarts


RESTART_N, RESTART_D = 10, 75.0  # 3 s wall, about 450 tasks


def restart_spec(policy: str) -> str:
    """Processor sharing, not FCFS: a short task the new dispatcher sends to a node that serves a long
    task of the old one leaves before it, so the long task's end (its notice lost with the old process)
    is that node's last event, and only the node's report can tell the new dispatcher of it."""
    return f"""
name = "restart"
seed = 21
[[classes]]
name = "servers"
count = {RESTART_N}
discipline = "ps"
[workload]
load = 0.6
service = {{ dist = "exponential", mean = 1.0 }}
[policy]
name = "{policy}"
[run]
warmup = 0.0
duration = {RESTART_D}
time_scale = {SCALE}
{HEALTH}"""


KILL_AT = 15.0  # model s: 0.6 s wall into the load, which leaves the restart 2 s wall to get ready
OUTAGE = 0.3  # wall seconds between the kill and the restart
#: sent just before the kill: in service at the old dispatcher's death and until after the load
#: (at least 14.5 + 70 model s > 75), their ends ride on replies to the dead process and are lost
LONG_WORK, LONG_TASKS = 70.0, 2
#: wall seconds for the restarted dispatcher to answer /v1/health with 200 (liveness)
READY = 20.0


@pytest.mark.parametrize(("policy", "quantity"), [("jsq", "idle_nodes"), ("jiq", "idle_tokens")])
def test_restarted_dispatcher_rebuilds_its_picture(tmp_path: Path, policy: str, quantity: str) -> None:
    """SIGKILL the dispatcher a fifth into the load while long tasks of its own are in service, restart
    it at the same port after 0.3 s and keep loading. Tasks in flight at the kill or sent before the new
    process listened fail; none is lost in the dark: the generator's outcomes add up to the tasks scheduled
    and the new dispatcher's outcomes to the tasks it answered. Once everything has drained, the new
    dispatcher sees every node idle, although it first met nodes busy with tasks of the old one whose ends
    no message reports (``restart_spec``)."""
    spec = write_spec(tmp_path, restart_spec(policy))
    marks: dict[str, float] = {}
    busy_at_ready: list[float] = []
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=NODE_PROCESSES)
        dispatcher, hosts = cluster_urls(f)
        old = f.dispatchers[0]
        tasks = [(t, w) for t, w in poisson_tasks(f.experiment(), RESTART_D)]
        tasks += [(KILL_AT - 0.5, LONG_WORK)] * LONG_TASKS
        tasks.sort()
        new_procs = []

        def kill() -> None:
            proc = next(p for p in cluster.procs if p.pid == old.pid)
            os.killpg(old.pid, signal.SIGKILL)
            proc.wait()

        def restart() -> None:
            marks["spawn"] = time.monotonic()
            new_procs.append(spawn(cluster.path, f, old))  # same endpoint, same port; sets old.pid
            f.save(cluster.path)
            wait_until(lambda: healthy(dispatcher), READY, "the new dispatcher ready")
            marks["ready"] = time.monotonic()
            busy_at_ready.append(scrape(hosts).total("lbtestbed_node_tasks"))

        report, start = asyncio.run(
            load(dispatcher, tasks, [(KILL_AT, kill), (KILL_AT + OUTAGE / SCALE, restart)])
        )
        assert marks["ready"] < start + RESTART_D * SCALE, "the restart took the whole load"
        # the long tasks were still in service when the new dispatcher first met the nodes
        assert busy_at_ready[0] >= LONG_TASKS

        # the truth: every node idle (the long tasks end about 0.4 s wall after the load)
        wait_until(lambda: scrape(hosts).total("lbtestbed_node_tasks") == 0, HEAL, "the nodes to drain")
        wait_until(lambda: gauges(dispatcher)[quantity] == RESTART_N, HEAL, f"{quantity} == n")

        # the generator: every task ended somehow, and failures only around the outage
        out = outcomes(report)
        assert out["failed"] >= LONG_TASKS and out["lost"] == 0 and out["dropped"] == 0, out
        ready_model = (marks["ready"] - start) / SCALE
        failed_at = [t for t, outcome, _ in report.failures if outcome == "failed"]
        # in flight at the kill, or sent before the new process listened (which is before it was ready)
        assert all(t < ready_model for t in failed_at), (failed_at, ready_model)
        # the new dispatcher answered what the generator saw answered after the restart: completions
        # observed after the spawn (the old process answered nothing after it died, the new one nothing
        # before it was started), refusals while it waited for the nodes' first answers
        new_completed = sum(1 for r in report.records if start + (r.t + r.sojourn) * SCALE > marks["spawn"])
        disp = scrape([dispatcher])
        answered = disp.by("lbtestbed_dispatcher_tasks_total", "outcome")
        assert answered == {"completed": new_completed, "refused": out["refused"], "lost": 0}, answered
        assert disp.total("lbtestbed_dispatcher_decisions_total") == new_completed
        assert 0 < new_completed < out["completed"]  # both processes completed tasks
        status, body = get(f"{dispatcher}{PREFIX}/health")
        assert status == 200 and json.loads(body)["nodes_up"] == RESTART_N, body
    for p in new_procs:
        p.wait(timeout=10)
