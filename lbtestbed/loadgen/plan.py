"""What a load run sends and when: the spec's tasks at its rate, on a schedule or from a trace.

``lbt load`` and the locustfile build the same plan from the same options, so both generators send the same
tasks. This module does not import locust (importing locust monkey-patches the process for gevent), so
``lbt`` and the tests can use it. The locustfile has two modes:

- ``open``: one locust user sends every task of the spec's workload (or of a rate schedule, or of a trace)
  at its intended time, each in a greenlet of its own, so arrivals never wait for completions.
- ``closed``: classic locust users, each posting a task, waiting for its reply, then thinking for an
  exponential time. With ``users`` users at multiplier 1 and a mean think time of users / rate, the offered
  rate matches the spec's only while replies are instant; a slower system silently gets fewer tasks.
  The number of users follows the schedule's multiplier, re-read about once a second by the load shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lbtestbed.loadgen.openloop import poisson_tasks, read_trace
from lbtestbed.loadgen.schedule import RateSchedule, ScheduleError, parse_schedule, scheduled_tasks
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reading import sent_tasks_problem
from lbtestbed.model.workload import DispatcherSplit

MODES = ("open", "closed")
LEAD_IN = 0.05  # wall seconds between the user's start and model time 0
CLOSED_SPAWN_RATE = 1000.0  # users per second: closed-loop steps take effect at once


@dataclass
class Plan:
    exp: Experiment
    mode: str
    schedule: RateSchedule  # the rate multiplier over model time (open mode: already in ``tasks``)
    tasks: list[tuple[float, float]]  # (model arrival time, work)
    dispatchers: list[str]
    routes: list[int]  # the dispatcher of each task: the spec's split (policy.split)
    users: int = 20  # closed mode: users at multiplier 1
    max_outstanding: int = 10_000
    drain: float = 120.0  # wall seconds to wait for replies after the last send

    @property
    def time_scale(self) -> float:
        return self.exp.run.time_scale

    @property
    def span(self) -> float:
        """Wall seconds from model time 0 to the end of the schedule."""
        return self.schedule.duration * self.time_scale

    @property
    def think(self) -> float:
        """Closed mode: mean think time in wall seconds, so that ``users`` users offer the spec's rate."""
        return self.users * self.time_scale / self.exp.workload.arrival_rate

    @property
    def hard_limit(self) -> float:
        """Wall seconds after which the shape ends the run whatever is still open."""
        return LEAD_IN + self.span + self.drain + 5.0

    def expected(self) -> float:
        """The number of tasks the schedule asks for on average (the arrival rate's integral)."""
        return self.exp.workload.arrival_rate * self.schedule.total


def build_plan(
    exp: Experiment,
    *,
    mode: str = "open",
    schedule: str | None = None,
    duration: float | None = None,
    replay: str | None = None,
    dispatchers: Sequence[str] = (),
    users: int = 20,
    max_outstanding: int = 10_000,
    drain: float = 120.0,
) -> Plan:
    """The tasks ``exp`` sends under the schedule or trace; bad input raises ValueError (ScheduleError)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not dispatchers:
        raise ValueError("no dispatcher URL to send the tasks to")
    if len(dispatchers) != exp.policy.dispatchers:
        raise ValueError(
            f"{exp.source}: the spec runs {exp.policy.dispatchers} dispatcher(s) (policy.dispatchers) but "
            f"{len(dispatchers)} dispatcher URL(s) were given: start the cluster from this spec, or "
            f"--set policy.dispatchers={len(dispatchers)}"
        )
    if sum(x is not None for x in (schedule, duration, replay)) > 1:
        raise ValueError("give at most one of a schedule, a duration and a trace to replay")
    if replay is not None and mode == "closed":
        raise ValueError("a trace has its own arrival times: replay it in open mode")
    if users < 1 or max_outstanding < 1 or not drain > 0:
        raise ValueError("users and max outstanding must be at least 1, and the drain time positive")
    if replay is not None:
        tasks = read_trace(Path(replay))
        horizon = tasks[-1][0] if tasks else 0.0
        rate = RateSchedule.constant(max(horizon, 1e-9))
    elif schedule is not None:
        try:
            rate = parse_schedule(schedule)
        except ScheduleError as e:
            raise ScheduleError(f"schedule: {e}") from None
        _check_size(exp, rate.total, "the schedule")  # total: model seconds at the spec's rate
        tasks = list(scheduled_tasks(exp, rate))
    else:
        horizon = duration if duration is not None else exp.run.warmup + exp.run.duration
        if not (math.isfinite(horizon) and horizon > 0):
            raise ValueError(f"the duration must be a positive number of model seconds, got {horizon:g}")
        _check_size(exp, horizon, "the load")
        rate = RateSchedule.constant(horizon)
        tasks = list(poisson_tasks(exp, horizon))
    routes = DispatcherSplit(exp).take(len(tasks))
    return Plan(exp, mode, rate, tasks, list(dispatchers), routes, users, max_outstanding, drain)


def describe(plan: Plan) -> str:
    """One line that says what a run of the plan sends (locust's web UI shows it beside START)."""
    if plan.mode == "open":
        what = f"{len(plan.tasks)} tasks, open loop"
    else:
        what = f"closed loop, {plan.users} users (about {plan.expected():.0f} tasks were replies instant)"
    rate = plan.exp.workload.arrival_rate / plan.time_scale
    return (
        f"{plan.exp.name}: {what}, over {plan.schedule.duration:g} model s = {plan.span:.1f} wall s "
        f"({rate:.4g} tasks per wall s at rate 1x), to {', '.join(plan.dispatchers)}"
    )


def _check_size(exp: Experiment, model_seconds: float, what: str) -> None:
    problem = sent_tasks_problem(exp, model_seconds, what)
    if problem:
        raise ValueError(problem)


def closed_users(plan: Plan, run_time: float) -> int | None:
    """Closed mode: users wanted ``run_time`` wall seconds into the run; None once the schedule is over."""
    t = (run_time - LEAD_IN) / plan.time_scale
    if t >= plan.schedule.duration:
        return None
    return round(plan.schedule.multiplier(max(t, 0.0)) * plan.users)
