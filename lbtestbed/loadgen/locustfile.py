"""lbtestbed's locustfile: the spec's tasks from locust, open loop (Poisson) or closed loop (classic users).

    lbt load SPEC --locust [--schedule TEXT] [--locust-mode closed]        # the usual way: flags filled in
    locust -f lbtestbed/loadgen/locustfile.py --headless --host http://127.0.0.1:PORT --lbt-spec SPEC

Every task is ``POST {dispatcher}/v1/tasks`` with ``{"work": w}``, w from the spec's seeded size stream.
In open mode (the default) one user sends the tasks at their intended times, each in a greenlet of its own,
so arrivals never wait for completions; sojourn is measured from the intended send time and late sends are
counted, as ``lbt load`` does. In closed mode, classic users post, wait and think (see plan.py). The
load shape ``RateShape`` runs the plan: it ends an open run when every reply is in, and sets the number of
closed-loop users from the rate schedule. Tasks go round robin over the dispatchers.

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
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import gevent
from gevent.pool import Group
from locust import FastHttpUser, LoadTestShape, User, events, task
from locust.env import Environment
from locust.exception import StopUser

from lbtestbed.loadgen.openloop import LATE, LoadReport
from lbtestbed.loadgen.plan import (
    CLOSED_SPAWN_RATE,
    LEAD_IN,
    MODES,
    Plan,
    build_plan,
    closed_users,
)
from lbtestbed.model.spec import load_spec
from lbtestbed.model.workload import PoissonWorkload
from lbtestbed.transport.wire import PREFIX

JSON_BODY = {"Content-Type": "application/json"}
STATS_NAME = f"{PREFIX}/tasks"  # one row in locust's statistics, whatever the dispatcher


class Run:
    """What the users of one locust process share: the plan, the report, the count of open requests."""

    def __init__(self, plan: Plan, report_path: str | None) -> None:
        self.plan = plan
        self.report_path = report_path
        self.report = LoadReport()
        self.urls = [f"{d}{PREFIX}/tasks" for d in plan.dispatchers]
        self.outstanding = 0
        self.done = False
        self.start = time.monotonic() + LEAD_IN  # model time 0; the open user resets it when it starts
        self.last_send = self.start
        self.seeds = itertools.count(plan.exp.seed * 1_000_003)
        # closed mode: works in the spec's order, as many as the users ask for
        self.works: Iterator[float] = (w for _, w in iter(PoissonWorkload(plan.exp).next, None))

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
        """Every task at its intended time, each in a greenlet of its own; then wait for the replies."""
        plan, report = self.plan, self.report
        report.scheduled = len(plan.tasks)
        scale = plan.time_scale
        group = Group()
        self.start = start = time.monotonic() + LEAD_IN
        for i, (t, work) in enumerate(plan.tasks):
            intended = start + t * scale
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
        group.join(timeout=plan.drain)
        report.wall_seconds = time.monotonic() - start
        self.done = True

    def post_closed(self, client: Any) -> None:
        """One task of a closed-loop user, now: the sojourn is its response time."""
        now = time.monotonic()
        if (now - self.start) / self.plan.time_scale >= self.plan.schedule.duration:
            return  # the schedule is over; the shape stops the users at its next tick
        i = self.report.scheduled
        self.report.scheduled += 1
        self.outstanding += 1
        self.post(client, i, (now - self.start) / self.plan.time_scale, next(self.works), now, False)

    def summary(self, environment: Environment) -> dict[str, Any]:
        report = self.report
        if self.plan.mode == "closed" or not self.done:
            report.send_seconds = report.send_seconds or self.last_send - self.start
            report.wall_seconds = time.monotonic() - self.start
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
        return out


RUN: Run | None = None


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--lbt-spec", env_var="LBT_SPEC", default="", help="lbtestbed: the experiment spec")
    parser.add_argument("--lbt-set", action="append", default=[], help="lbtestbed: a spec override KEY=VALUE")
    parser.add_argument(
        "--lbt-schedule", env_var="LBT_SCHEDULE", default=None, help="lbtestbed: rate schedule"
    )
    parser.add_argument(
        "--lbt-duration", type=float, default=None, help="lbtestbed: model seconds of arrivals"
    )
    parser.add_argument("--lbt-replay", default=None, help="lbtestbed: a trace file to send (open mode)")
    parser.add_argument("--lbt-mode", default="open", choices=MODES, help="lbtestbed: open or closed loop")
    parser.add_argument("--lbt-dispatchers", default="", help="lbtestbed: dispatcher URLs, comma-separated")
    parser.add_argument("--lbt-users", type=int, default=20, help="lbtestbed: closed-loop users at rate 1x")
    parser.add_argument("--lbt-max-outstanding", type=int, default=10_000, help="lbtestbed: open-mode bound")
    parser.add_argument(
        "--lbt-drain", type=float, default=120.0, help="lbtestbed: seconds to wait for replies"
    )
    parser.add_argument("--lbt-report", default="", help="lbtestbed: write the summary JSON here")


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    global RUN
    o = environment.parsed_options
    if o is None:
        return
    if not o.lbt_spec:
        sys.stderr.write("lbt locustfile: error: no spec: give --lbt-spec PATH or set LBT_SPEC\n")
        sys.exit(2)
    dispatchers = [d.strip().rstrip("/") for d in o.lbt_dispatchers.split(",") if d.strip()]
    if not dispatchers and environment.host:
        dispatchers = [environment.host.rstrip("/")]
    try:
        plan = build_plan(
            load_spec(o.lbt_spec, o.lbt_set),  # the worker process reads the spec itself
            mode=o.lbt_mode,
            schedule=o.lbt_schedule,
            duration=o.lbt_duration,
            replay=o.lbt_replay,
            dispatchers=dispatchers,
            users=o.lbt_users,
            max_outstanding=o.lbt_max_outstanding,
            drain=o.lbt_drain,
        )
    except (ValueError, OSError) as e:
        sys.stderr.write(f"lbt locustfile: error: {e}\n")
        sys.exit(2)
    OpenLoopUser.host = ClosedLoopUser.host = plan.dispatchers[0]
    RUN = Run(plan, o.lbt_report or None)


@events.test_start.add_listener
def _started(environment: Environment, **_: Any) -> None:
    if RUN is not None:
        RUN.start = time.monotonic() + LEAD_IN  # closed mode's model time 0; the open user sets its own


@events.quitting.add_listener
def _write_report(environment: Environment, **_: Any) -> None:
    if RUN is not None and RUN.report_path:
        with open(RUN.report_path, "w") as f:
            json.dump(RUN.summary(environment), f, indent=1)


class OpenLoopUser(FastHttpUser):
    """The open loop: one user sends every task of the plan on its schedule, never waiting for replies."""

    def __init__(self, environment: Environment) -> None:
        assert RUN is not None
        self.concurrency = RUN.plan.max_outstanding  # a send never waits for a free connection
        self.network_timeout = RUN.plan.hard_limit  # replies take as long as the system makes them
        self.connection_timeout = 5.0
        super().__init__(environment)

    @task
    def send_schedule(self) -> None:
        assert RUN is not None
        RUN.run_open(self.client)
        raise StopUser()


class ClosedLoopUser(FastHttpUser):
    """A classic locust user: post a task, wait for its reply, think for an exponential time, repeat."""

    def __init__(self, environment: Environment) -> None:
        assert RUN is not None
        self.network_timeout = RUN.plan.hard_limit
        self.connection_timeout = 5.0
        super().__init__(environment)
        self.rng = random.Random(next(RUN.seeds))

    def wait_time(self) -> float:
        assert RUN is not None
        return self.rng.expovariate(1.0 / RUN.plan.think)

    @task
    def post_task(self) -> None:
        assert RUN is not None
        RUN.post_closed(self.client)


class RateShape(LoadTestShape):
    """Runs the plan: one open-loop user until its replies are in, or closed-loop users that follow the
    schedule's multiplier (re-read about once a second, so a ramp becomes steps of one second)."""

    def tick(self) -> tuple[int, float, list[type[User]] | None] | None:
        if RUN is None:
            return None
        run_time = self.get_run_time()
        if RUN.plan.mode == "open":
            if RUN.done or run_time > RUN.plan.hard_limit:
                return None
            return 1, 1.0, [OpenLoopUser]
        users = closed_users(RUN.plan, run_time)
        if users is None:
            return None
        return users, CLOSED_SPAWN_RATE, [ClosedLoopUser]
