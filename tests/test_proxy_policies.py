"""The policies production proxies run, and the clock and latencies their dispatcher sides read.

``DispatcherSide.now`` and ``on_task_done(node, latency)`` (policies/base.py): the dispatcher process sets
the clock before each call and measures a task's latency from its forwarding to its answer.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from lbtestbed.dispatcher.app import build_app as build_dispatcher_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.model.spec import parse_spec
from lbtestbed.policies.sampling import LeastRequestDispatcher
from lbtestbed.server_node.app import build_app as build_node_app
from lbtestbed.server_node.host import NodeHost

TOKEN = "test-token"
NOWHERE = "http://127.0.0.1:1"


class _Recording(LeastRequestDispatcher):
    """least_request reading the clock, recording what its driver tells it."""

    uses_clock = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.dispatched: list[float] = []
        self.done: list[tuple[float, float]] = []  # (now, latency)

    def dispatch(self) -> Any:
        self.dispatched.append(self.now)
        return super().dispatch()

    def on_task_done(self, node: int, latency: float) -> None:
        self.done.append((self.now, latency))
        super().on_task_done(node, latency)


async def test_the_dispatcher_process_tells_a_clocked_side_the_time_and_the_latency() -> None:
    """One task of work 2 on an idle FCFS node of speed 1 (20 ms of wall time per model second): it
    stays 2 model seconds at the node, so its latency at the dispatcher is at least 2 and at most the
    sojourn the dispatcher reports (which also holds the decision); the clock advanced by the latency."""
    exp = parse_spec(
        {
            "name": "clock",
            "seed": 1,
            "classes": [{"name": "s", "count": 1, "discipline": "fcfs"}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "least_request", "d": 1},
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.02},
        }
    )
    node_host = NodeHost(exp, [0], [NOWHERE], TOKEN)
    servers: list[TestServer] = []
    try:
        servers.append(TestServer(build_node_app(node_host), host="127.0.0.1"))
        await servers[-1].start_server()
        disp = DispatcherHost(exp, 0, 1, [f"http://127.0.0.1:{servers[0].port}/v1/nodes/0"], TOKEN)
        side = disp.policy = _Recording(exp, disp.policy.rng, 0)
        servers.append(TestServer(build_dispatcher_app(disp), host="127.0.0.1"))
        await servers[-1].start_server()
        before = (time.monotonic() - disp.started) / exp.run.time_scale
        await disp.health.ready.wait()
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{servers[-1].port}/v1/tasks"
            async with session.post(url, json={"work": 2.0}) as resp:
                assert resp.status == 200
                answer = await resp.json()
        after = (time.monotonic() - disp.started) / exp.run.time_scale
    finally:
        for server in servers:
            await server.close()
    assert len(side.dispatched) == 1 and len(side.done) == 1
    (t0,), ((t1, latency),) = side.dispatched, side.done
    assert before <= t0 <= t1 <= after  # model seconds since the dispatcher started
    assert 2.0 <= latency <= answer["sojourn"]
    assert t1 - t0 >= latency - 1e-9  # the task was forwarded after its dispatch call


def test_a_side_that_keeps_no_time_is_not_told_it() -> None:
    """A policy without ``uses_clock`` keeps now = 0: the drivers skip it (no cost on the hot path)."""
    exp = parse_spec(
        {
            "name": "clock",
            "seed": 1,
            "classes": [{"name": "s", "count": 2, "discipline": "fcfs"}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "least_request", "d": 2},
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.02},
        }
    )
    disp = DispatcherHost(exp, 0, 1, [f"{NOWHERE}/v1/nodes/{k}" for k in range(2)], TOKEN)
    assert not disp.policy.uses_clock
    assert disp.side(disp.started + 5.0).now == 0.0
    disp.policy = _Recording(exp, disp.policy.rng, 0)
    assert disp.side(disp.started + 5.0).now == pytest.approx(5.0 / exp.run.time_scale)
