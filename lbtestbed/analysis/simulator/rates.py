"""The rates kernel: a Markovian spec simulated exactly from its rates, with no queue of completions and no
task objects (docs/simulator.md, "The rates kernel"; ``lbt simulate --kernel rates``).

Where the spec is Markovian (Poisson arrivals, exponential work, FCFS or PS nodes whose class gives one
speed; one dispatcher, no network delay, no faults, no speed changes: ``unsupported`` says what is not),
the number of tasks at each node is a continuous-time Markov chain together with the policy's state: a busy
node of class c completes a task at rate mu_c = speed_c / mean work, whatever its discipline and however
long its tasks have been served. So the kernel keeps per node a count and the arrival times of its tasks
(for their sojourns), per class the list of its busy nodes, and draws the next event from the competing
exponential clocks: the spec's next arrival (the event kernel's very arrival times), or a completion after
an exponential time of rate R = sum over classes of busy_c x mu_c, at a busy node of class c with
probability busy_c x mu_c / R, uniformly among them. The leaving task is the node's first under FCFS and
a uniformly chosen one under PS (each of x tasks is served at rate mu_c / x).

No policy rule lives here: the policy's own dispatcher side and node sides decide, through the calls the
event kernel makes with no delays (``dispatch``, ``resolve`` on ``probe_reply``, ``on_arrival``,
``on_departure``, ``on_message``, ``on_task_done``; the instant probe where the event kernel takes it). The
measurement is the event kernel's (``measure.Measurement``): the same batches, the same exact time
integrals (kept per class and level here: node-seconds at exactly j tasks), every task's sojourn. It draws
other random numbers than the event kernel for the service, so its runs agree with the event kernel's in
distribution, not to the bit (``tests/test_rates_kernel.py``).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.measure import Measurement
from lbtestbed.model.conditions import speed_changes
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seeded_random
from lbtestbed.model.workload import PoissonWorkload
from lbtestbed.policies import (
    DispatcherSide,
    Message,
    NodeSide,
    Probe,
    Route,
    make_dispatcher,
    make_node_sides,
)
from lbtestbed.policies.catalog import policy_of
from lbtestbed.policies.sampling import InstantProbe, instant_probe_of

INF = math.inf
#: the disciplines whose busy node completes at one rate, whatever it holds
DISCIPLINES = ("fcfs", "ps")
Progress = Callable[[float], None]


class Unsupported(ValueError):
    """The spec is not one the rates kernel simulates exactly: why, in one line."""


def unsupported(exp: Experiment) -> str | None:
    """Why the rates kernel cannot simulate ``exp`` exactly (None: it can)."""
    service = exp.workload.service
    if service.dist != "exponential":
        return f"workload.service is {service.describe()}: it needs exponential work"
    for i, c in enumerate(exp.classes):
        if c.discipline not in DISCIPLINES:
            return f"classes[{i}] ({c.name!r}) is a {c.discipline}: it serves fcfs and ps nodes"
        if c.speed.value is None:
            drawn = c.speed.describe()
            return f"classes[{i}] ({c.name!r}) draws each node's speed ({drawn}): it needs one per class"
    if exp.network.delay is not None:
        return "network.delay: its messages and probes arrive at once"
    if exp.faults:
        return f"the spec injects faults ({exp.faults[0].kind} first)"
    if speed_changes(exp):
        return "the spec changes node speeds over time (speed schedules or antagonists)"
    if exp.policy.dispatchers > 1:
        return f"policy.dispatchers = {exp.policy.dispatchers}: it drives one dispatcher"
    policy = policy_of(exp)
    if policy.learned is not None:
        return f"{policy.name} learns {policy.learned.name}, which it does not follow"
    if policy.node.timed:
        return f"{policy.name}'s nodes speak on a timer of their own"
    if policy.node.records_latency:
        return f"{policy.name}'s nodes learn each task's latency at the node"
    return None


class RatesSimulator:
    """One replication of a Markovian experiment on the rates kernel (module docstring)."""

    def __init__(self, exp: Experiment, replication: int = 0, progress: Progress | None = None) -> None:
        why = unsupported(exp)
        if why is not None:
            raise Unsupported(why)
        self.exp = exp
        self.progress = progress
        # the policy's halves on the event kernel's streams: dispatcher 0 shares its stream with the sides
        policy_rng = seeded_random(exp.seed, "policy", replication)
        self.dispatcher = make_dispatcher(exp, policy_rng, 0, 1)
        self.sides = make_node_sides(exp, policy_rng, dispatchers=1, replication=replication)
        self.workload = PoissonWorkload(exp, replication)  # its times; the works are not read
        # its own draws, on a stream of their own: uniforms, and exponentials from them (_exponential)
        self.uniform = seeded_random(exp.seed, "rates", replication).random
        n, classes = exp.n, exp.classes
        self.x = [0] * n  # tasks at each node
        mean = exp.workload.service.mean
        self.speed = [float(c.speed.value or 0) for c in classes]
        self.mu = [s / mean for s in self.speed]  # a busy node's completion rate
        self.ends = [sum(c.count for c in classes[: i + 1]) for i in range(len(classes))]  # nodes by class
        self.clocked = self.dispatcher.uses_clock
        self.hears_done = type(self.dispatcher).on_task_done is not DispatcherSide.on_task_done
        self.quiet_departure = all(type(s).on_departure is NodeSide.on_departure for s in self.sides)
        self.fifo = [c.discipline == "fcfs" for c in classes]
        # a class whose tasks' sojourns are known only when they leave keeps their arrival times: PS, and
        # FCFS when the dispatcher hears each task's latency; FCFS draws them on arrival (_fcfs_sojourn)
        self.stamped = [not fifo or self.hears_done for fifo in self.fifo]
        self.stamps: list[list[float]] = [[] for _ in range(n)] if any(self.stamped) else []
        # per class and level j: nodes holding exactly j tasks, and their node-seconds up to ``since``
        self.at_level: list[list[int]] = [[c.count] for c in classes]
        self.level_s: list[list[float]] = [[0.0] for _ in classes]
        self.since: list[list[float]] = [[0.0] for _ in classes]
        self.measure = Measurement(exp, [self.dispatcher])
        self.boundaries, self.drain_until = self.measure.window()
        self.arrivals = 0
        self.completions = 0
        self.in_system = 0
        self.report_at = 0.0

    # ------------------------------------------------------------------------------------- the loop

    def run(self) -> RawRun:
        wall = time.perf_counter()
        self.report_at = wall + 1.0
        instant = self._instant_probe()
        collecting = gc.isenabled()
        gc.disable()  # no cycles are made; a full collection would walk every node's list
        try:
            self._loop(None if instant is None else instant.pick)
        finally:
            if collecting:
                gc.enable()
        measure = self.measure
        if instant is not None:
            measure.count_instant_probes(instant.probes, instant.outcome)
        measure.in_system = self.in_system
        measure.finish()
        return measure.raw(self.arrivals + self.completions, time.perf_counter() - wall)

    def _loop(self, pick: Callable[[], int] | None) -> None:
        """The earlier of the next arrival and the next candidate completion, until the window's tasks
        are done or the drain ends. Candidates come at the constant rate of every node busy (sum over
        classes of count_c x mu_c), each at a node chosen with probability mu_c / that rate; at an idle
        node it is void (uniformization). A candidate's clock is drawn afresh after every event and
        boundary: it is memoryless."""
        measure, boundaries, drain_until = self.measure, self.boundaries, self.drain_until
        times, _ = self.workload.next_block()
        block, ai, t_arr = len(times), 0, times[0]
        nb, bi, next_boundary = len(boundaries), 0, boundaries[0]
        t, n_sys, tot_area, tot_area2 = 0.0, 0, 0.0, 0.0
        rate = sum(c.count * mu for c, mu in zip(self.exp.classes, self.mu, strict=True))
        while True:
            t_done = t + self._exponential() / rate
            t_next = t_arr if t_arr <= t_done else t_done
            if t_next >= next_boundary:  # after the window next_boundary is -inf: every event comes here
                if bi < nb:
                    dt, t = next_boundary - t, next_boundary
                    tot_area += n_sys * dt
                    tot_area2 += n_sys * n_sys * dt
                    self._boundary(t, tot_area, tot_area2)
                    bi += 1
                    next_boundary = boundaries[bi] if bi < nb else -INF
                    continue
                if measure.outstanding == 0 or t_next > drain_until:
                    break
            if t_arr <= t_done:
                step = 1
                ai += 1
                if ai == block:
                    times, _ = self.workload.next_block()
                    block, ai = len(times), 0
                    self._tick(t_next)
                self._arrival(t_arr, pick)
                t_arr = times[ai]
            else:  # none when the candidate fell on an idle node (void)
                step = -1 if self._completion(t_done, rate) else 0
            dt, t = t_next - t, t_next
            tot_area += n_sys * dt
            tot_area2 += n_sys * n_sys * dt
            n_sys += step
        self.in_system = n_sys

    def _tick(self, t: float) -> None:
        """``progress`` hears how far the run is (of warm-up and window: a drain, if any, is short), once a
        second at most."""
        if self.progress is not None and time.perf_counter() > self.report_at:
            self.report_at = time.perf_counter() + 1.0
            self.progress(min(1.0, t / self.measure.t_end))

    def _exponential(self) -> float:
        """A standard exponential draw, by inversion (1 - u is in (0, 1])."""
        return -math.log(1.0 - self.uniform())

    def _class_of(self, k: int) -> int:
        """Node ``k``'s class (nodes are numbered class by class)."""
        c, ends = 0, self.ends
        while k >= ends[c]:
            c += 1
        return c

    # ----------------------------------------------------------------------------- a task's way

    def _arrival(self, t: float, pick: Callable[[], int] | None) -> None:
        """A task arrives at ``t``: the policy routes it (the instant probe's ``pick``, else its sides)."""
        measure = self.measure
        self.arrivals += 1
        batch = measure.batch
        if batch >= 0:
            measure.arrivals[batch] += 1
        if pick is not None:
            self._join(pick(), t, batch)
            return
        route = self._route(t, batch)
        k = route.node
        self._join(k, t, batch)
        msgs = self.sides[k].on_arrival(self.x[k], 0, route.piggyback)
        if msgs:
            self.to_dispatcher(msgs)
        if route.messages:
            self.to_nodes(route.messages)

    def _route(self, t: float, batch: int) -> Route:
        """The dispatcher's decision, on probe replies read at once if it probes."""
        disp, measure = self.dispatcher, self.measure
        if self.clocked:
            disp.now = t
        decision = disp.dispatch()
        if isinstance(decision, Probe):
            d = len(decision.nodes)
            measure.count("probe", d)
            measure.count("probe_reply", d)
            sides, x = self.sides, self.x
            route = disp.resolve(decision, [sides[k].probe_reply(x[k]) for k in decision.nodes])
        else:
            route = decision
        if batch >= 0:
            measure.decisions[route.outcome] += 1
        return route

    def _join(self, k: int, t: float, batch: int) -> None:
        """The task joins node ``k`` at ``t``; a task of the window is followed to its end, or its sojourn
        drawn now."""
        c, xk = self._class_of(k), self.x[k]
        self.x[k] = xk + 1
        self._step(c, xk, xk + 1, t)
        if self.stamped[c]:
            self.stamps[k].append(t)
            if batch >= 0:
                self.measure.outstanding += 1
        elif batch >= 0:
            self._record(c, batch, self._fcfs_sojourn(xk, self.mu[c]))
        if batch >= 0 and self.fifo[c]:
            self.measure.fcfs_arrivals[batch] += 1
            if xk:
                self.measure.fcfs_waits[batch] += 1

    def _fcfs_sojourn(self, ahead: int, mu: float) -> float:
        """The sojourn of a task that joins an FCFS node of rate ``mu`` with ``ahead`` tasks there, drawn
        from its exact law: the sum of ahead + 1 exponential times of rate mu (the task in service needs
        one too, being memoryless; no later task goes before it)."""
        total = self._exponential()
        for _ in range(ahead):
            total += self._exponential()
        return total / mu

    def _completion(self, t: float, rate: float) -> bool:
        """A candidate completion at ``t`` at a node chosen with probability mu_c / ``rate`` (one uniform
        draw chooses the class and the node in it); False when that node is idle (void). The task that
        leaves is the node's first (FCFS) or any of its tasks, uniformly (PS)."""
        u, c, first = self.uniform() * rate, 0, 0
        ends, mu = self.ends, self.mu
        while c < len(ends) - 1 and u >= (ends[c] - first) * mu[c]:
            u -= (ends[c] - first) * mu[c]
            first = ends[c]
            c += 1
        k = min(first + int(u / mu[c]), ends[c] - 1)
        xk = self.x[k]
        if xk == 0:
            return False
        self.x[k] = xk - 1
        self._step(c, xk, xk - 1, t)
        self.completions += 1
        arrived = t
        if self.stamped[c]:
            stamps = self.stamps[k]
            if self.fifo[c] or xk == 1:
                arrived = stamps.pop(0)
            else:
                j = int(self.uniform() * xk)
                arrived = stamps[j]
                stamps[j] = stamps[-1]
                stamps.pop()
            self._left(c, arrived, t - arrived)
        if self.clocked:
            self.dispatcher.now = t
        # in the event kernel's order: the node side's messages, then the end of the task
        if not self.quiet_departure:
            msgs = self.sides[k].on_departure(xk - 1, 0)
            if msgs:
                self.to_dispatcher(msgs)
        if self.hears_done:  # its tasks are stamped: no delays, so forwarded when it arrived
            self.dispatcher.on_task_done(k, t - arrived)
        return True

    def _left(self, c: int, arrived: float, s: float) -> None:
        """A task that arrived at ``arrived`` left after ``s``: its sojourn, if it arrived in the window,
        goes to its arrival's batch (the last boundary at or before ``arrived``)."""
        boundaries, measure = self.boundaries, self.measure
        B = measure.B
        if not boundaries[0] <= arrived < boundaries[B]:
            return
        b = min(B - 1, int((arrived - measure.t_start) / measure.batch_len))
        while b > 0 and boundaries[b] > arrived:  # the quotient may round across a boundary
            b -= 1
        while b + 1 < B and boundaries[b + 1] <= arrived:
            b += 1
        self._record(c, b, s)
        measure.outstanding -= 1

    def _record(self, c: int, b: int, s: float) -> None:
        """Sojourn ``s`` of a task of class ``c``'s node that arrived in batch ``b``."""
        sojourn, sojourn_class = self.measure.sojourns()
        sojourn[b].append(s)
        if sojourn_class is not None:
            sojourn_class[c][b].append(s)

    # ------------------------------------------------------------------------------ the integrals

    def _step(self, c: int, was: int, now: int, t: float) -> None:
        """A node of class ``c`` goes from ``was`` tasks to ``now`` at ``t``: the two levels' node-seconds
        are brought up to ``t`` before their counts change."""
        at, level_s, since = self.at_level[c], self.level_s[c], self.since[c]
        if now == len(at):
            at.append(0)
            level_s.append(0.0)
            since.append(t)
        level_s[was] += at[was] * (t - since[was])
        since[was] = t
        at[was] -= 1
        level_s[now] += at[now] * (t - since[now])
        since[now] = t
        at[now] += 1

    def _boundary(self, t: float, tot: float, tot2: float) -> None:
        """A batch boundary at ``t``: every level's node-seconds up to ``t``, summed as the measurement
        takes them."""
        time_at: list[list[float]] = []
        task_s = util_s = idle_speed = idle = 0.0
        for c, cls in enumerate(self.exp.classes):
            at, level_s, since = self.at_level[c], self.level_s[c], self.since[c]
            for j in range(len(at)):
                level_s[j] += at[j] * (t - since[j])
                since[j] = t
                task_s += j * level_s[j]
                if cls.utility is not None:
                    util_s += cls.utility.value(j) * level_s[j]
            time_at.append(list(level_s))
            idle_speed += self.speed[c] * level_s[0]
            idle += level_s[0]
        self.measure.snapshot(t, time_at, task_s, util_s, idle_speed, idle, tot, tot2)

    # ------------------------------------------------------------------------------------- messages

    def to_dispatcher(self, msgs: tuple[Message, ...]) -> None:
        """Node sides' messages, at the dispatcher at once; its answers go back at once."""
        for m in msgs:
            self.measure.count(m.kind)
            out = self.dispatcher.on_message(m)
            if out:
                self.to_nodes(out)

    def to_nodes(self, msgs: tuple[Message, ...]) -> None:
        """The dispatcher side's messages, at their nodes at once; their answers go back at once."""
        for m in msgs:
            self.measure.count(m.kind)
            out = self.sides[m.node].on_message(m, self.x[m.node])
            if out:
                self.to_dispatcher(out)

    def _instant_probe(self) -> InstantProbe | None:
        """The policy's instant probe over the counts, where the event kernel takes it too
        (``policies.sampling.instant_probe_of``)."""
        return instant_probe_of(self.dispatcher, self.sides, self.x)
