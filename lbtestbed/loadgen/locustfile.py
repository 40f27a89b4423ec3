"""lbtestbed's locustfile: the spec's tasks from locust, open loop (Poisson) or closed loop (classic users).

    lbt load SPEC --locust [--schedule TEXT] [--locust-mode closed]        # the usual way: flags filled in
    locust -f lbtestbed/loadgen/locustfile.py --headless --host http://127.0.0.1:PORT --lbt-spec SPEC
    locust -f lbtestbed/loadgen/locustfile.py --host http://127.0.0.1:PORT --lbt-spec SPEC   # web UI
    locust -f ... --master --host URL --lbt-spec SPEC   and   locust -f ... --worker   (one or more)

Every task is ``POST {dispatcher}/v1/tasks`` with ``{"work": w}``, w from the spec's seeded size stream.
In open mode (the default) one user sends the tasks at their intended times, each in a greenlet of its own,
so arrivals never wait for completions; sojourn is measured from the intended send time and late sends are
counted, as ``lbt load`` does. In closed mode, classic users post, wait and think (see plan.py). The
load shape ``RateShape`` runs the plan: it ends an open run when every reply is in, and sets the number of
closed-loop users from the rate schedule. Tasks go round robin over the dispatchers.

Distributed (``--master``/``--worker``): the workers take the spec, the schedule and the host from the
master (locust sends its custom options with each start), and worker i of W sends the tasks i, i + W, ...
of the one seeded plan from a common time zero (shares.py); the master ends the run when every worker has
reported its share done. Each START (web UI or its HTTP API, ``POST /swarm``) runs the plan again, built
anew from the options of that moment (the form's custom parameters); ``lbt_run`` in the form says what it
sends. The form's users and ramp up are not used: the shape sets them.

Options (``locust --help`` lists them too):

    --lbt-spec PATH             the experiment spec (or the environment variable LBT_SPEC)
    --lbt-set KEY=VALUE         a spec override, as ``lbt --set`` (repeatable)
    --lbt-schedule TEXT         a rate schedule (docs/load.md; or LBT_SCHEDULE)
    --lbt-duration SECONDS      model seconds of arrivals at the spec's rate (default: warmup + duration)
    --lbt-replay FILE           send a recorded trace instead (open mode)
    --lbt-mode open|closed      default open
    --lbt-dispatchers URL,...   dispatchers to spread the tasks over (default: --host)
    --lbt-users N               closed mode: users at the spec's rate (default 20)
    --lbt-max-outstanding N     open mode: drop (and count) a task when N are open (default 10000)
    --lbt-drain SECONDS         wall seconds to wait for replies after the last send (default 120)
    --lbt-report FILE           write the summary (the keys of ``lbt load --json``) here at the end
    --lbt-metrics-port PORT     serve lbt load's generator metrics on 127.0.0.1:PORT (0: a free one; each
                                sending process its own: docs/load.md, "Monitoring the generator")
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
from gevent import GreenletExit
from gevent.pool import Group
from locust import FastHttpUser, LoadTestShape, User, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import STATE_INIT, MasterRunner, WorkerRunner

from lbtestbed.loadgen.metrics import LoadCollector, MetricsServer
from lbtestbed.loadgen.openloop import LATE, LoadReport
from lbtestbed.loadgen.plan import (
    CLOSED_SPAWN_RATE,
    LEAD_IN,
    MODES,
    Plan,
    build_plan,
    closed_users,
    describe,
)
from lbtestbed.loadgen.shares import failed_part, merged, part, share, worker_rows
from lbtestbed.model.workload import PoissonWorkload
from lbtestbed.spec import load_spec
from lbtestbed.transport.metrics import sojourn_buckets, standard_collectors
from lbtestbed.transport.registry import Registry
from lbtestbed.transport.wire import PREFIX

JSON_BODY = {"Content-Type": "application/json"}
STATS_NAME = f"{PREFIX}/tasks"  # one row in locust's statistics, whatever the dispatcher
#: wall seconds from a distributed start to model time 0, at least: the master's start message reaches the
#: workers, they build the plan (plus twice the time the master took to build it) and their users spawn
DIST_LEAD_IN = 1.0
PART = "lbt_part"  # the message a worker sends the master when its share is done: its part of the report
OPTION_NAMES = (  # the options a run is built from, beside the host and the overrides
    "spec", "schedule", "duration", "replay", "mode", "dispatchers", "users", "max_outstanding", "drain",
)  # fmt: skip
log = logging.getLogger("lbt")


class Run:
    """One run of the plan in one locust process: the tasks it sends (its share), its report, the count of
    open requests. The master of a distributed run sends nothing; it collects the workers' parts."""

    def __init__(
        self,
        plan: Plan,
        key: tuple[Any, ...],
        report_path: str | None,
        index: int = 0,
        of: int = 1,
        start_epoch: float | None = None,
    ) -> None:
        self.plan = plan
        self.key = key  # the options it was built from: a START with other options builds a new one
        self.report_path = report_path
        self.index, self.of = index, of
        self.share = share(len(plan.tasks), index, of)
        self.report = LoadReport()
        self.urls = [f"{d}{PREFIX}/tasks" for d in plan.dispatchers]
        self.outstanding = 0
        self.used = False  # a test started with it: the next START builds a new run
        self.claimed = False  # its open-loop user is sending (a second user of the process sends nothing)
        self.done = False
        self.start_epoch = start_epoch  # model time 0 as Unix time: given by the master when distributed
        self.start = time.monotonic() + LEAD_IN  # model time 0; set again when the test starts
        self.last_send = self.start
        self.seeds = itertools.count(plan.exp.seed * 1_000_003 + index)
        # closed mode: works in the spec's order, this worker's share of them, as many as the users ask for
        works = (w for _, w in iter(PoissonWorkload(plan.exp).next, None))
        self.works: Iterator[float] = itertools.islice(works, index, None, of)
        self.build_seconds = 0.0  # wall seconds building the plan took
        self.shares: dict[str, int] = {}  # master: worker id -> share index
        self.parts: dict[int, dict[str, Any]] = {}  # master: share index -> the worker's part

    @property
    def lead_in(self) -> float:
        """Distributed: wall seconds from the master's start to model time 0."""
        return DIST_LEAD_IN + 2.0 * self.build_seconds

    def begin(self) -> None:
        """The test starts: fix model time 0 (the master's, when distributed)."""
        self.used = True
        if self.start_epoch is None:
            self.start_epoch = time.time() + LEAD_IN
        self.start = time.monotonic() + (self.start_epoch - time.time())
        self.last_send = self.start

    def url_of(self, i: int) -> str:
        """Task i's dispatcher: the spec's split in open mode, in turn beyond the plan (closed mode)."""
        routes = self.plan.routes
        return self.urls[routes[i] if i < len(routes) else i % len(self.urls)]

    def post(self, client: Any, i: int, t: float, work: float, intended: float, timed: bool) -> None:
        """Send one task and record how it ended; ``timed``: measure how late it left."""
        report = self.report
        now = time.monotonic()
        self.last_send = now
        if timed:
            report.lateness.append(now - intended)
            if now - intended > LATE:
                report.late += 1
        try:
            resp = client.post(
                self.url_of(i), data=b'{"work": %r}' % work, headers=JSON_BODY, name=STATS_NAME
            )
            done = time.monotonic()
            if resp.status_code == 200:
                report.completed(t, work, json.loads(resp.content), intended, now, done, self.plan.time_scale)
            elif resp.status_code == 503:
                report.outcomes["refused"] += 1
            elif resp.status_code == 502:
                report.outcomes["lost"] += 1
            else:
                report.outcomes["failed"] += 1  # no answer (status 0) or one that is not the protocol's
        except (ValueError, AttributeError, TypeError):
            report.outcomes["failed"] += 1
        finally:
            self.outstanding -= 1

    def run_open(self, client: Any) -> None:
        """Every task of the share at its intended time, each in a greenlet of its own; then wait for the
        replies."""
        plan, report = self.plan, self.report
        report.scheduled = len(self.share)
        scale = plan.time_scale
        group = Group()
        start = self.start
        try:
            for i in self.share:
                t, work = plan.tasks[i]
                intended = start + t * scale
                report.due = intended  # for lbtestbed_loadgen_behind_seconds (--lbt-metrics-port)
                now = time.monotonic()
                while now < intended:  # re-check: a timer may fire a little early
                    gevent.sleep(intended - now)
                    now = time.monotonic()
                if self.outstanding >= plan.max_outstanding:
                    report.lateness.append(now - intended)
                    if now - intended > LATE:
                        report.late += 1
                    report.outcomes["dropped"] += 1
                    continue
                self.outstanding += 1
                group.spawn(self.post, client, i, t, work, intended, True)
            report.send_seconds = time.monotonic() - start
            report.due = None
            group.join(timeout=plan.drain)
        except GreenletExit:  # STOP: a task not on its way yet does not leave after it
            group.kill(block=False)
            raise
        report.wall_seconds = time.monotonic() - start
        self.done = True

    def post_closed(self, client: Any) -> None:
        """One task of a closed-loop user, now: the sojourn is its response time."""
        now = time.monotonic()
        if not 0 <= (now - self.start) / self.plan.time_scale < self.plan.schedule.duration:
            return  # before time 0 or after the schedule: the shape stops the users at its next tick
        i = self.report.scheduled * self.of + self.index  # this worker's share of the spec's tasks
        self.report.scheduled += 1
        self.outstanding += 1
        self.post(client, i, (now - self.start) / self.plan.time_scale, next(self.works), now, False)

    def finish(self) -> LoadReport:
        """The report of what this process did; a closed run or an open one cut short ends now."""
        report = self.report
        if self.plan.mode == "closed" or not self.done:
            report.send_seconds = report.send_seconds or self.last_send - self.start
            report.wall_seconds = time.monotonic() - self.start
        return report

    def summary(self, environment: Environment) -> dict[str, Any]:
        distributed = isinstance(environment.runner, MasterRunner)
        if distributed:
            report = merged(self.parts.values(), len(self.plan.tasks))
            if self.plan.mode == "closed":
                report.scheduled = sum(p["scheduled"] for p in self.parts.values())
        else:
            report = self.finish()
        report.model_seconds = report.wall_seconds / self.plan.time_scale
        unfinished = report.scheduled - sum(report.outcomes.values())
        report.outcomes["failed"] += unfinished  # still open when the run ended: no answer
        out: dict[str, Any] = {"generator": "locust", "mode": self.plan.mode, **report.summary()}
        if self.plan.mode == "closed":  # no intended send times: lateness does not apply
            for key in ("late_sends", "lateness_p50_ms", "lateness_p99_ms", "lateness_max_ms"):
                out[key] = None
        out["expected"] = self.plan.expected()
        out["unfinished"] = unfinished
        out["locust_requests"] = environment.stats.total.num_requests
        out["locust_failures"] = environment.stats.total.num_failures
        out["start_epoch"] = self.start_epoch
        if distributed:
            out["workers"] = worker_rows(self.parts.values())
            out["workers_expected"] = len(self.shares)
        return out


RUN: Run | None = None


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    # numbers are read as text (and checked by the plan): locust's web form hands back text, "" when cleared
    parser.add_argument("--lbt-spec", env_var="LBT_SPEC", default="", help="lbtestbed: the experiment spec")
    parser.add_argument(
        "--lbt-set",
        action="append",
        default=[],
        include_in_web_ui=False,  # the form cannot edit a list of text
        help="lbtestbed: a spec override KEY=VALUE",
    )
    parser.add_argument(
        "--lbt-schedule", env_var="LBT_SCHEDULE", default=None, help="lbtestbed: rate schedule"
    )
    parser.add_argument("--lbt-duration", default=None, help="lbtestbed: model seconds of arrivals")
    parser.add_argument("--lbt-replay", default=None, help="lbtestbed: a trace file to send (open mode)")
    parser.add_argument("--lbt-mode", default="open", choices=MODES, help="lbtestbed: open or closed loop")
    parser.add_argument("--lbt-dispatchers", default="", help="lbtestbed: dispatcher URLs, comma-separated")
    parser.add_argument("--lbt-users", default="20", help="lbtestbed: closed-loop users at rate 1x")
    parser.add_argument("--lbt-max-outstanding", default="10000", help="lbtestbed: open-mode bound")
    parser.add_argument("--lbt-drain", default="120", help="lbtestbed: seconds to wait for replies")
    parser.add_argument(
        "--lbt-metrics-port",
        default=None,
        include_in_web_ui=False,
        help="lbtestbed: serve the generator's Prometheus metrics on 127.0.0.1:PORT (0: a free port, "
        "logged); each worker serves its own share",
    )
    parser.add_argument(
        "--lbt-report", default="", include_in_web_ui=False, help="lbtestbed: write the summary JSON here"
    )
    parser.add_argument(
        "--lbt-run",
        default=describe(RUN.plan) if RUN is not None else "",
        help="what START sends, read only; users and ramp up are not used (the load shape sets them)",
    )


def _text(o: Any, name: str) -> str | None:
    value = getattr(o, name, None)
    return None if value is None or str(value).strip() == "" else str(value).strip()


def _number(o: Any, name: str, kind: type[int] | type[float]) -> Any:
    value = _text(o, name)
    flag = "--" + name.replace("_", "-")
    if value is None:
        raise ValueError(f"{flag}: a number is needed")
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{flag}: expected {what}, got {value!r}") from None


def _key(environment: Environment) -> tuple[Any, ...]:
    """The options a run is built from, as they are now (the web form may have changed them)."""
    o: Any = environment.parsed_options
    return (environment.host, tuple(o.lbt_set or ()), *(_text(o, f"lbt_{n}") for n in OPTION_NAMES))


def new_run(environment: Environment, index: int = 0, of: int = 1, start_epoch: float | None = None) -> Run:
    """A run built from the current options; bad ones raise ValueError or OSError (SpecError is one)."""
    began = time.monotonic()
    o: Any = environment.parsed_options
    spec = _text(o, "lbt_spec")
    if spec is None:
        raise ValueError("no spec: give --lbt-spec PATH or set LBT_SPEC")
    dispatchers = [d.strip().rstrip("/") for d in (_text(o, "lbt_dispatchers") or "").split(",") if d.strip()]
    if not dispatchers and environment.host:
        dispatchers = [environment.host.rstrip("/")]
    plan = build_plan(
        load_spec(spec, o.lbt_set or ()),  # every process reads the spec itself
        mode=_text(o, "lbt_mode") or "open",
        schedule=_text(o, "lbt_schedule"),
        duration=None if _text(o, "lbt_duration") is None else _number(o, "lbt_duration", float),
        replay=_text(o, "lbt_replay"),
        dispatchers=dispatchers,
        users=_number(o, "lbt_users", int),
        max_outstanding=_number(o, "lbt_max_outstanding", int),
        drain=_number(o, "lbt_drain", float),
    )
    OpenLoopUser.host = ClosedLoopUser.host = plan.dispatchers[0]
    run = Run(plan, _key(environment), _text(o, "lbt_report"), index, of, start_epoch)
    run.build_seconds = time.monotonic() - began
    return run


class _CurrentRun:
    """The generator's metrics (``loadgen.metrics``) of the run this process sends now; a restart from the
    web UI starts a new run, whose counters start again from 0 (Prometheus sees a counter reset)."""

    def __init__(self) -> None:
        self.collector: LoadCollector | None = None

    def collect(self) -> list[Any]:
        run = RUN
        if run is None:
            return []
        if self.collector is None or self.collector.report is not run.report:
            self.collector = LoadCollector(run.report, run.plan.time_scale, sojourn_buckets(run.plan.exp))
        return self.collector.collect()


def _serve_metrics(port: int) -> None:
    """``--lbt-metrics-port``: the series of ``lbt load --metrics-port`` on 127.0.0.1:PORT (0: a free one),
    from a thread (a greenlet under gevent's patching)."""
    registry = Registry()
    registry.register(_CurrentRun())
    standard_collectors(registry)
    server = MetricsServer(registry, port)
    log.info("lbt: generator metrics: %s", server.url)


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    global RUN
    o: Any = environment.parsed_options
    if o is None:
        return
    port = getattr(o, "lbt_metrics_port", None)
    if port not in (None, "") and not isinstance(environment.runner, MasterRunner):
        _serve_metrics(int(port))  # every process that sends: standalone, or each worker
    if isinstance(environment.runner, WorkerRunner):
        return  # a worker takes its options from the master with each start (see _started)
    for name in ("lbt_spec", "lbt_replay"):  # workers may start elsewhere: give them absolute paths
        if _text(o, name):
            setattr(o, name, str(Path(_text(o, name) or "").resolve()))
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(PART, _part_came)
    web_form = not o.headless
    try:
        RUN = new_run(environment)
    except (ValueError, OSError) as e:
        if web_form and not o.lbt_dispatchers and not environment.host and "no dispatcher URL" in str(e):
            return  # the web form asks for the host
        sys.stderr.write(f"lbt locustfile: error: {e}\n")
        sys.exit(2)
    log.info("lbt: %s", describe(RUN.plan))


def _prepare(environment: Environment) -> bool:
    """A START: the run to send (a new one when the last was used or the options changed); the master
    also deals the shares out to the workers connected now."""
    global RUN
    try:
        if RUN is None or RUN.used or RUN.key != _key(environment):
            RUN = new_run(environment)
    except (ValueError, OSError) as e:
        log.error("lbt locustfile: error: %s", e)
        return False
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        clients = runner.clients
        workers = sorted(c.id for c in clients.ready + clients.running + clients.spawning)
        if not workers:
            log.error("lbt locustfile: no worker is connected")
            return False
        RUN.shares = {w: i for i, w in enumerate(workers)}
        log.info("lbt: %s; in %d share(s), one per worker", describe(RUN.plan), len(workers))
    else:
        log.info("lbt: %s", describe(RUN.plan))
    return True


@events.test_start.add_listener
def _started(environment: Environment, **_: Any) -> None:
    global RUN
    o: Any = environment.parsed_options
    runner = environment.runner
    if isinstance(runner, WorkerRunner):  # the master's options have just arrived with its start message
        shares = getattr(o, "lbt_shares", None) or {}
        if runner.client_id not in shares:
            RUN = None
            log.warning("lbt: this worker joined after the start: it sends nothing in this run")
            return
        index = shares[runner.client_id]
        try:
            RUN = new_run(environment, index, len(shares), o.lbt_start_epoch)
        except (ValueError, OSError) as e:  # its files are not the master's: say so to the master
            RUN = None
            log.error("lbt locustfile: error: %s", e)
            runner.send_message(PART, failed_part(index, o.lbt_start_epoch, str(e)))
            return
        RUN.begin()
        if RUN.plan.mode == "closed":
            gevent.spawn(_report_closed, environment, RUN)
        return
    if RUN is None:
        return
    if isinstance(runner, MasterRunner):  # locust sends the master's options to the workers with its start
        RUN.start_epoch = time.time() + RUN.lead_in
        o.lbt_shares, o.lbt_start_epoch = RUN.shares, RUN.start_epoch
    RUN.begin()


def _send_part(environment: Environment, run: Run) -> None:
    assert environment.runner is not None
    environment.runner.send_message(PART, part(run.finish(), run.index, run.start_epoch or 0.0))


def _report_closed(environment: Environment, run: Run) -> None:
    """A closed-loop worker: report its part once the schedule is over and its users' tasks are back."""
    gevent.sleep(max(0.0, run.start + run.plan.span - time.monotonic()))
    deadline = time.monotonic() + run.plan.drain
    while run.outstanding and time.monotonic() < deadline:
        gevent.sleep(0.05)
    if run is RUN:
        _send_part(environment, run)


def _part_came(environment: Environment, msg: Any) -> None:
    """The master: a worker's share is done."""
    data = msg.data
    if RUN is not None and data.get("start_epoch") == RUN.start_epoch:  # not a part of an earlier run
        RUN.parts[int(data["index"])] = data
        if "error" in data:
            log.error("lbt: worker %s sends nothing: %s", msg.node_id, data["error"])


@events.quitting.add_listener
def _write_report(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return  # the master writes the run's report
    if RUN is not None and any("error" in p for p in RUN.parts.values()):
        environment.process_exit_code = 1  # a worker could not build the plan: its share was not sent
    if RUN is not None and RUN.report_path:
        with open(RUN.report_path, "w") as f:
            json.dump(RUN.summary(environment), f, indent=1)


class OpenLoopUser(FastHttpUser):
    """The open loop: one user sends every task of the process's share on its schedule, never waiting for
    replies."""

    def __init__(self, environment: Environment) -> None:
        if RUN is not None:  # (a worker that joined late has none: its user sends nothing)
            self.concurrency = RUN.plan.max_outstanding  # a send never waits for a free connection
            self.network_timeout = RUN.plan.hard_limit  # replies take as long as the system makes them
        self.connection_timeout = 5.0
        super().__init__(environment)

    @task
    def send_schedule(self) -> None:
        run = RUN
        if run is None or run.claimed:
            raise StopUser()
        run.claimed = True
        run.run_open(self.client)
        if isinstance(self.environment.runner, WorkerRunner) and run is RUN:
            _send_part(self.environment, run)
        raise StopUser()


class ClosedLoopUser(FastHttpUser):
    """A classic locust user: post a task, wait for its reply, think for an exponential time, repeat."""

    def __init__(self, environment: Environment) -> None:
        if RUN is not None:
            self.network_timeout = RUN.plan.hard_limit
        self.connection_timeout = 5.0
        super().__init__(environment)
        self.rng = random.Random(next(RUN.seeds) if RUN is not None else 0)

    def wait_time(self) -> float:
        return self.rng.expovariate(1.0 / RUN.plan.think) if RUN is not None else 1.0

    @task
    def post_task(self) -> None:
        if RUN is not None:
            RUN.post_closed(self.client)


class RateShape(LoadTestShape):
    """Runs the plan: one open-loop user (one per worker when distributed) until its replies are in, or
    closed-loop users that follow the schedule's multiplier (re-read about once a second, so a ramp becomes
    steps of one second). Each START runs the plan from its beginning."""

    last: tuple[int, float, list[type[User]]] | None = None

    def tick(self) -> tuple[int, float, list[type[User]] | None] | None:
        runner = self.runner
        assert runner is not None
        if runner.state == STATE_INIT and not _prepare(runner.environment):  # a START: nothing runs yet
            return None
        run = RUN
        if run is None:
            return None
        run_time = self.get_run_time()
        distributed = isinstance(runner, MasterRunner)
        if distributed:
            if len(run.parts) == len(run.shares) or run_time > run.lead_in + run.plan.hard_limit:
                return None
        elif run.done or run_time > run.plan.hard_limit:
            return None
        if run.plan.mode == "open":
            users = len(run.shares) if distributed else 1
            return users, max(1.0, float(users)), [OpenLoopUser]
        closed = closed_users(run.plan, run_time - (run.lead_in - LEAD_IN if distributed else 0.0))
        if closed is None:  # the schedule is over; distributed, the workers' parts are still to come
            return self.last if distributed else None
        self.last = (closed, CLOSED_SPAWN_RATE, [ClosedLoopUser])
        return self.last
