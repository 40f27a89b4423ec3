"""The run's side of fault injection: the spec's ``[[faults]]`` applied at their model times.

Process faults act on the processes ``lbt run`` started: ``kill`` sends SIGKILL to the node process serving
the fault's node and starts it again at ``until`` (same port, a new incarnation with no tasks); ``pause``
sends SIGSTOP and SIGCONT; ``restart_dispatcher`` kills a dispatcher and starts it again. Message faults
are switched on and off in every process (``POST /v1/faults``), which applies them to what it sends
(``lbtestbed.transport.message_faults``). Every action is logged with the model time it took effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from lbtestbed.cluster.launcher import spawn, started
from lbtestbed.model.experiment import GRAY_FAULTS, MESSAGE_FAULTS, Experiment, Fault
from lbtestbed.transport import wire
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile, Endpoint
from lbtestbed.transport.process import machine
from lbtestbed.transport.signing import SIGNATURE, Signer


@dataclass
class FaultAction:
    """One thing the injector did: ``action`` start or end of fault ``fault``, at ``model_time``."""

    fault: int
    kind: str
    action: str
    target: str
    model_time: float
    error: str = ""
    nodes: list[int] = field(default_factory=list)  # the nodes of a node process it acted on


def target_of(f: ClusterFile, fault: Fault) -> Endpoint | None:
    """The process a process fault acts on (None for message faults and gray failures: those act from
    the node host's own schedule, ``NodeHost.set_origin``)."""
    if fault.kind in ("kill", "pause"):
        for e in f.node_hosts:
            if fault.node in e.nodes:
                return e
        raise ClusterError(f"no node process serves node {fault.node}")
    if fault.kind == "restart_dispatcher":
        if fault.dispatcher >= len(f.dispatchers):
            raise ClusterError(
                f"fault restart_dispatcher names dispatcher {fault.dispatcher}, the cluster has "
                f"{len(f.dispatchers)}"
            )
        return f.dispatchers[fault.dispatcher]
    return None


def describe(f: ClusterFile, fault: Fault) -> str:
    e = target_of(f, fault)
    if fault.kind == "slow":
        return f"slow node {fault.node} to {fault.speed:g} of its speed"
    if fault.kind == "fail":
        return f"node {fault.node} fails {fault.fraction:g} of its tasks"
    if e is None:
        return f"{fault.kind} {fault.fraction:g} of {', '.join(fault.messages)}"
    if e.role == "nodes":
        return f"{fault.kind} node process {e.index} (nodes {e.nodes[0]}-{e.nodes[-1]})"
    return f"restart dispatcher {e.index}"


def check(exp: Experiment, f: ClusterFile, local: bool) -> None:
    """Refuse faults the cluster cannot take, before the run starts."""
    windows: dict[str, list[tuple[float, float]]] = {}
    for i, fault in enumerate(exp.faults):
        e = target_of(f, fault)
        if e is None:
            continue
        if not local:
            raise ClusterError(
                f"faults[{i}] ({fault.kind}) signals a process: it needs a cluster that lbt run starts "
                f"itself, not one given with --endpoints"
            )
        key = f"{e.role}-{e.index}"
        for a, b in windows.get(key, []):
            if fault.at < b and a < fault.until:
                raise ClusterError(
                    f"faults[{i}] overlaps an earlier fault on the same process ({key}, [{a:g}, {b:g}))"
                )
        windows.setdefault(key, []).append((fault.at, fault.until))


class Injector:
    """Applies ``exp.faults`` to the cluster ``f`` (file ``path``) on the load's clock."""

    def __init__(
        self,
        exp: Experiment,
        f: ClusterFile,
        path: Path,
        origin: float,
        say: Callable[[str], None],
        note: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``note``: where each action is also written as it is taken (the run's journal)."""
        self.exp, self.f, self.path, self.origin, self.say = exp, f, path, origin, say
        self.note = note
        self.scale = exp.run.time_scale
        self.log: list[FaultAction] = []
        self.signer = Signer(f.token)

    def now(self) -> float:
        return (time.monotonic() - self.origin) / self.scale

    async def set_origin(self, session: aiohttp.ClientSession, origin_unix: float) -> None:
        """Tell every node host the run's model time 0 (a Unix time), on which it applies the spec's gray
        failures (``model.conditions``): timed speed changes and fail faults. With kill faults the cluster
        file keeps it too, for the node hosts started again during the run. ClusterError if one could not
        be told."""
        self.f.origin = origin_unix
        # the same instant on this machine's monotonic clock, which the task legs are stamped on: a node host
        # on this machine applies the timed changes exactly where the twin puts them
        self.f.origin_monotonic, self.f.origin_machine = self.origin, machine()
        if any(fault.kind == "kill" for fault in self.exp.faults):
            self.f.save(self.path)
        body = json.dumps(
            {"origin": origin_unix, "monotonic": self.origin, "machine": self.f.origin_machine}
        ).encode()
        hosts = self.f.node_hosts
        problems = [
            p for p in await asyncio.gather(*(self.post(session, e.url, body, "/origin") for e in hosts)) if p
        ]
        if problems:
            raise ClusterError(f"the run's clock could not be set: {'; '.join(problems)}")

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Every fault on its own timeline, so that one whose action waits (a message fault switched in a
        stopped process answers only when it continues) never holds up another (the SIGCONT of that
        very process)."""
        await asyncio.gather(*(self._fault(session, i) for i in range(len(self.exp.faults))))

    async def _fault(self, session: aiohttp.ClientSession, i: int) -> None:
        fault = self.exp.faults[i]
        for t, action in ((fault.at, "start"), (fault.until, "end")):
            delay = self.origin + t * self.scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._apply(session, i, action)

    async def _apply(self, session: aiohttp.ClientSession, i: int, action: str) -> None:
        fault = self.exp.faults[i]
        e = target_of(self.f, fault)
        target = describe(self.f, fault)
        at = self.now()  # when the signal or the switch goes out: a dispatcher may notice at once
        error = ""
        if fault.kind in MESSAGE_FAULTS:
            error = await self._switch(session, i, action == "start")
        elif fault.kind in GRAY_FAULTS:
            pass  # the node host applies it on the run's clock (set_origin): here it is only logged
        elif e is not None:
            error = self.signal_group(fault.kind, e, action)
        nodes = list(e.nodes) if e is not None else [fault.node] if fault.kind in GRAY_FAULTS else []
        entry = FaultAction(i, fault.kind, action, target, at, error, nodes)
        self.log.append(entry)
        if self.note is not None:
            self.note({"e": "fault", **asdict(entry)})
        note = f" ({error})" if error else ""
        self.say(f"fault {i}: {action} {target} at model time {entry.model_time:.4g}{note}")

    def signal_group(self, kind: str, e: Endpoint, action: str) -> str:
        if kind == "pause":
            return _kill(e, signal.SIGSTOP if action == "start" else signal.SIGCONT)
        if action == "start":
            problem = _kill(e, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(e.pid, 0)  # our child: reap it now
            return problem
        spawn(self.path, self.f, e)  # same port: the dispatchers find it again, with a new incarnation
        self.f.save(self.path)
        return ""

    async def _switch(self, session: aiohttp.ClientSession, i: int, active: bool) -> str:
        urls = [e.url for e in self.f.dispatchers + self.f.node_hosts]
        body = json.dumps({"fault": i, "active": active}).encode()
        problems = [p for p in await asyncio.gather(*(self.post(session, u, body) for u in urls)) if p]
        return "; ".join(problems)

    async def post(self, session: aiohttp.ClientSession, url: str, body: bytes, path: str = "/faults") -> str:
        """A signed POST of ``body`` to ``url``'s ``path``; what went wrong, or "" if it was done.

        A switch and an origin are idempotent, so a POST whose connection breaks before an answer is sent
        once more, signed afresh, on a new connection: ``session`` shares its kept-alive connections with
        the scrapes, and one to a process that was killed and started again on its port (a fault, or a
        restart by the watch) is closed by then, which the first write finds ("Can not write request
        body": seen with the machine busy). An answer that does not come in 5 s is not asked again."""
        error = ""
        for _ in range(2):
            try:
                return await self._post_once(session, url, body, path)
            except (TimeoutError, aiohttp.ServerTimeoutError) as e:
                return f"{url}: {str(e) or type(e).__name__}"
            except aiohttp.ClientConnectionError as e:
                error = f"{url}: {str(e) or type(e).__name__}"
            except aiohttp.ClientError as e:
                return f"{url}: {str(e) or type(e).__name__}"
        return error

    async def _post_once(self, session: aiohttp.ClientSession, url: str, body: bytes, path: str) -> str:
        target = f"{url}{wire.PREFIX}{path}"
        headers, tag = self.signer.headers("POST", target, body)
        async with session.post(
            target,
            data=body,
            headers={**headers, "Content-Type": "application/json", "Connection": "close"},
            timeout=aiohttp.ClientTimeout(total=5),
        ) as resp:
            raw = await resp.read()
            if not self.signer.answer_ok(tag, resp.status, raw, resp.headers.get(SIGNATURE)):
                return f"{url}: an answer without the cluster's signature ({resp.status})"
            return "" if resp.status == 200 else f"{url}: {resp.status} {raw.decode(errors='replace')}"

    def restore(self) -> None:
        """After the run: continue any process still paused (a run cut short), so that it can be stopped."""
        for fault in self.exp.faults:
            e = target_of(self.f, fault)
            if fault.kind == "pause" and e is not None:
                _kill(e, signal.SIGCONT)

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(a) for a in self.log]


class FaultCollector:
    """``lbtestbed_fault_active{fault, kind, target}``: 1 while a fault of the spec is in effect (from the
    injector's start action to its end action), 0 otherwise; a series for every fault of the spec from the
    run's start. ``lbt run`` serves it beside its generator's metrics, so that dashboards can mark the
    fault windows (deploy/grafana's annotations)."""

    def __init__(self, injector: Injector) -> None:
        self.injector = injector

    def collect(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        active: dict[int, bool] = {}
        for a in list(self.injector.log):  # a copy: the run's loop appends meanwhile
            active[a.fault] = a.action == "start"
        family = GaugeMetricFamily(
            "lbtestbed_fault_active",
            "1 while fault `fault` of the spec (docs/faults.md) is in effect, 0 otherwise",
            labels=["fault", "kind", "target"],
        )
        for i, fault in enumerate(self.injector.exp.faults):
            family.add_metric(
                [str(i), fault.kind, describe(self.injector.f, fault)], float(active.get(i, False))
            )
        return [family]


def _kill(e: Endpoint, sig: int) -> str:
    """Signal the process of ``e`` (and its group) if it is still the one the cluster file records."""
    if not started(e).signal(sig):
        return f"process {e.pid} is gone"
    return ""
