"""The protocol documents (docs/openapi.yaml, docs/protocol.md) checked against the code.

(a) docs/openapi.yaml is a valid OpenAPI 3.1 document, and its examples satisfy its own schemas;
(b) its (method, path) pairs, per tag, are exactly the routes that the dispatcher and node apps register;
(c) the message kinds it and protocol.md list are exactly MESSAGE_KINDS, policy by policy, and the kinds
    they say each role accepts are exactly NODE_BOUND and DISPATCHER_BOUND;
(d) both apps, served on 127.0.0.1, answer every documented (method, path, status) with a body that the
    document's schema allows, ask for the token exactly where the document says so, and export exactly the
    metric families that protocol.md lists.

The OpenAPI checks need PyYAML, openapi-spec-validator and jsonschema; they skip cleanly without them.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from lbtestbed.dispatcher.app import build_app as build_dispatcher_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import CATALOG, DISPATCHER_BOUND, DISPATCHERS, MESSAGE_KINDS, NODE_BOUND
from lbtestbed.policies.jlmu import ranking_of
from lbtestbed.policies.slta import Thresholds
from lbtestbed.server_node.app import build_app as build_node_app
from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import parse_spec
from lbtestbed.transport import wire
from lbtestbed.transport.process import Serving, start_serving
from lbtestbed.transport.signing import Signer

ROOT = Path(__file__).resolve().parents[1]
OPENAPI = ROOT / "docs" / "openapi.yaml"
PROTOCOL = ROOT / "docs" / "protocol.md"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
TOKEN = "test-token"
NOWHERE = "http://127.0.0.1:1"  # a closed loopback port: connections are refused at once

FCFS_SPEC: dict[str, Any] = {
    "name": "protocol-docs",
    "seed": 1,
    "classes": [{"name": "servers", "count": 2, "discipline": "fcfs"}],
    "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
    "policy": {"name": "jiq"},
    "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.01},
}


def fcfs_experiment() -> Experiment:
    return parse_spec(copy.deepcopy(FCFS_SPEC))


def slta_experiment() -> Experiment:
    data = copy.deepcopy(FCFS_SPEC)
    data["classes"] = [
        {"name": "pools", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 4}}
    ]
    data["policy"] = {"name": "slta", "beta": 1.0}
    return parse_spec(data)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    loaded = yaml.safe_load(OPENAPI.read_text())
    assert isinstance(loaded, dict)
    return loaded


def operations(doc: Mapping[str, Any], tag: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(METHOD, path) -> operation object, for the operations with ``tag`` (all when None)."""
    return {
        (method.upper(), path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS and (tag is None or tag in op.get("tags", []))
    }


def deref(doc: Mapping[str, Any], obj: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in obj:
        parts = obj["$ref"].removeprefix("#/").split("/")
        obj = functools.reduce(lambda o, key: o[key], parts, doc)
    return obj


def validator(doc: Mapping[str, Any], schema: Mapping[str, Any]) -> Any:
    """A JSON Schema 2020-12 validator for ``schema``, whose $refs resolve in the document's components."""
    jsonschema = pytest.importorskip("jsonschema")
    root = {"allOf": [schema], "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


def app_routes(app: web.Application) -> set[tuple[str, str]]:
    """(METHOD, canonical path) of every route, without the HEAD that add_get adds to every GET."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def build_apps() -> tuple[web.Application, web.Application]:
    exp = fcfs_experiment()
    node = build_node_app(NodeHost(exp, [0, 1], [NOWHERE], "t"))
    urls = [f"{NOWHERE}{wire.PREFIX}/nodes/{k}" for k in range(exp.n)]
    dispatcher = build_dispatcher_app(DispatcherHost(exp, 0, 1, urls, "t"))
    return node, dispatcher


# ------------------------------------------------------------------------------------------- (a) validity


def test_openapi_document_is_valid(doc: dict[str, Any]) -> None:
    osv = pytest.importorskip("openapi_spec_validator")
    osv.validate(doc, cls=osv.OpenAPIV31SpecValidator)
    assert doc["openapi"].startswith("3.1")
    assert {t["name"] for t in doc["tags"]} == {"dispatcher", "node"}


def test_openapi_examples_satisfy_their_schemas(doc: dict[str, Any]) -> None:
    checked = 0

    def check(media: Mapping[str, Any], where: str) -> None:
        nonlocal checked
        if "schema" not in media:
            return
        v = validator(doc, media["schema"])
        values = [media["example"]] if "example" in media else []
        values += [deref(doc, e)["value"] for e in media.get("examples", {}).values()]
        for value in values:
            errors = [e.message for e in v.iter_errors(value)]
            assert not errors, f"{where}: example {value!r}: {errors}"
            checked += 1

    for (method, path), op in operations(doc).items():
        body = op.get("requestBody")
        if body is not None:
            for ctype, media in deref(doc, body)["content"].items():
                check(media, f"{method} {path} request {ctype}")
        for status, response in op["responses"].items():
            for ctype, media in deref(doc, response).get("content", {}).items():
                if ctype == "application/json":
                    check(media, f"{method} {path} {status}")
    for name, schema in doc["components"]["schemas"].items():
        for value in schema.get("examples", []):
            assert validator(doc, schema).is_valid(value), f"schema {name}: example {value!r}"
            checked += 1
    assert checked >= 20


def test_documented_policies_are_the_dispatchers(doc: dict[str, Any]) -> None:
    policy = doc["components"]["schemas"]["DispatcherHealth"]["properties"]["policy"]
    assert set(policy["enum"]) == set(DISPATCHERS)


# -------------------------------------------------------------------------------------------- (b) routes


def test_documented_routes_are_the_registered_routes(doc: dict[str, Any]) -> None:
    node_app, dispatcher_app = build_apps()
    node_routes, dispatcher_routes = app_routes(node_app), app_routes(dispatcher_app)
    assert set(operations(doc, "node")) == node_routes
    assert set(operations(doc, "dispatcher")) == dispatcher_routes
    assert set(operations(doc)) == node_routes | dispatcher_routes
    for (method, path), op in operations(doc).items():
        assert op.get("tags"), f"{method} {path} has no tag"


def test_protocol_md_names_every_route() -> None:
    text = PROTOCOL.read_text()
    node_app, dispatcher_app = build_apps()
    for method, path in app_routes(node_app) | app_routes(dispatcher_app):
        assert f"`{method} {path}`" in text, f"protocol.md never names `{method} {path}`"


# ------------------------------------------------------------------------------------- (c) message kinds


def kinds_by_policy(table: Mapping[str, tuple[str, ...]]) -> dict[str, set[str]]:
    return {policy: set(kinds) for policy, kinds in table.items()}


def test_openapi_message_kinds_are_the_policies_kinds(doc: dict[str, Any]) -> None:
    documented = doc["components"]["schemas"]["Message"]["x-message-kinds"]
    assert kinds_by_policy(documented) == kinds_by_policy(MESSAGE_KINDS)
    union = set().union(*MESSAGE_KINDS.values())
    assert set().union(*map(set, documented.values())) == union


def test_openapi_accepted_kinds_are_the_bound_kinds(doc: dict[str, Any]) -> None:
    message = doc["components"]["schemas"]["Message"]
    assert kinds_by_policy(message["x-accepted-by-node"]) == kinds_by_policy(NODE_BOUND)
    assert kinds_by_policy(message["x-accepted-by-dispatcher"]) == kinds_by_policy(DISPATCHER_BOUND)


def protocol_md_section(title: str) -> str:
    text = PROTOCOL.read_text()
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start : end if end >= 0 else len(text)]


def test_protocol_md_message_kinds_are_the_policies_kinds() -> None:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", protocol_md_section("### The kinds, per policy"), re.M)
    documented = {kind: set(re.findall(r"`(\w+)`", policies)) for kind, policies in rows}
    expected: dict[str, set[str]] = {}
    for policy, kinds in MESSAGE_KINDS.items():
        for kind in kinds:
            expected.setdefault(kind, set()).add(policy)
    assert documented == expected


def test_protocol_md_accepted_kinds_are_the_bound_kinds() -> None:
    section = protocol_md_section("### Accepted kinds, per endpoint")
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    node = {policy: set(re.findall(r"`(\w+)`", kinds)) for policy, kinds, _ in rows}
    dispatcher = {policy: set(re.findall(r"`(\w+)`", kinds)) for policy, _, kinds in rows}
    assert node == kinds_by_policy(NODE_BOUND)
    assert dispatcher == kinds_by_policy(DISPATCHER_BOUND)


def test_protocol_md_policy_state_is_what_the_policies_declare() -> None:
    """The table of "Policy state": a row per quantity some policy exports (``unit.Quantity``), with its
    type, its label and the policies that export it."""
    rows = re.findall(
        r"^\| `(\w+)` \| (gauge|counter) \| ([^|]+) \| ([^|]+) \|",
        protocol_md_section("### Policy state"),
        re.M,
    )
    documented = {
        metric: (kind, label.strip().strip("`"), set(re.findall(r"`(\w+)`", policies)))
        for metric, kind, label, policies in rows
    }
    declared = {
        q.metric: (q.kind, q.label or "—", {p.name for p in CATALOG if q in p.exported})
        for q in CATALOG.quantities().values()
    }
    assert documented == declared


# --------------------------------------------------------------------------------------------- (d) live


def documented_metrics(title: str) -> set[str]:
    """The metrics of a section, with those every process exports (the client library's collectors)."""
    rows = protocol_md_section(title) + protocol_md_section("### Every process")
    return set(re.findall(r"^\| `((?:lbtestbed|process|python)_\w+)` \|", rows, re.M))


def exported_metrics(text: str) -> set[str]:
    """Metric family names in a text exposition (no page has ``_created`` series: docs/protocol.md)."""
    return set(re.findall(r"^# TYPE (\S+) \S+$", text, re.M))


class Caller:
    """Sends requests and checks each answer against the operation the document gives for it."""

    def __init__(self, doc: Mapping[str, Any], session: aiohttp.ClientSession) -> None:
        self.doc = doc
        self.session = session
        self.ops = operations(doc)
        self.seen: set[tuple[str, str, str]] = set()

    async def __call__(
        self,
        base: str,
        method: str,
        template: str,
        path: str | None = None,
        *,
        token: str | None = None,
        body: Any = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        if raw is None and body is not None:
            raw = json.dumps(body).encode()
        url = base + (path or template)
        headers = {"Content-Type": "application/json"}
        if token is not None:  # signed as a peer of the cluster signs (docs/protocol.md, Authentication)
            headers |= Signer(token).headers(method, url, raw or b"")[0]
        async with self.session.request(method, url, headers=headers, data=raw) as resp:
            status, ctype, data = resp.status, resp.content_type, await resp.read()
        op = self.ops[(method, template)]
        where = f"{method} {path or template} -> {status}: {data[:200]!r}"
        assert str(status) in op["responses"], f"undocumented status: {where}"
        content = deref(self.doc, op["responses"][str(status)])["content"]
        assert ctype in content, f"undocumented content type {ctype}: {where}"
        self.seen.add((method, template, str(status)))
        if ctype != "application/json":
            return status, data.decode()
        value = json.loads(data)
        errors = [e.message for e in validator(self.doc, content[ctype]["schema"]).iter_errors(value)]
        assert not errors, f"{where}: {errors}"
        return status, value


async def serve(app: web.Application) -> tuple[Serving, str]:
    """``app`` served on 127.0.0.1 as a cluster process serves it: its task routes on the lean server, the
    rest handed to aiohttp (transport/process.py)."""
    server = await start_serving(app, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.port}"


async def wait_until(condition: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_live_answers_follow_the_documents(doc: dict[str, Any]) -> None:
    pytest.importorskip("jsonschema")
    exp = fcfs_experiment()  # jiq, two FCFS nodes, 10 ms wall per unit of work
    node_host = NodeHost(exp, [0, 1], [NOWHERE], TOKEN, max_tasks=1)
    servers: list[Serving] = []
    try:
        server, nodes = await serve(build_node_app(node_host))
        servers.append(server)
        urls = [f"{nodes}/v1/nodes/{k}" for k in range(exp.n)]
        dispatcher_host = DispatcherHost(exp, 0, 1, urls, TOKEN)
        server, disp = await serve(build_dispatcher_app(dispatcher_host))
        servers.append(server)
        node_host.dispatchers[:] = [disp]
        await asyncio.wait_for(dispatcher_host.ready.wait(), 10)  # its first health checks
        dead = [f"{NOWHERE}/v1/nodes/{k}" for k in range(exp.n)]
        server, lost = await serve(build_dispatcher_app(DispatcherHost(exp, 0, 1, dead, TOKEN)))
        servers.append(server)
        slta = slta_experiment()
        slta_host = NodeHost(slta, [0, 1], [NOWHERE], TOKEN)
        server, slta_nodes = await serve(build_node_app(slta_host))
        servers.append(server)
        slta_dispatcher = DispatcherHost(slta, 0, 1, dead, TOKEN)
        server, slta_disp = await serve(build_dispatcher_app(slta_dispatcher))
        servers.append(server)
        big = json.dumps({"work": 1, "pad": "x" * wire.MAX_BODY}).encode()

        async with aiohttp.ClientSession() as session:
            call = Caller(doc, session)
            tasks, messages = "/v1/tasks", "/v1/messages"
            node_tasks = "/v1/nodes/{node}/tasks"
            probe, node_messages = "/v1/nodes/{node}/probe", "/v1/nodes/{node}/messages"

            # the dispatcher: tasks
            status, reply = await call(disp, "POST", tasks, body={"work": 1.0})
            assert status == 200 and reply["node"] in (0, 1) and "messages" not in reply
            assert (await call(disp, "POST", tasks, body={"work": 0}))[1]["field"] == "work"
            assert (await call(disp, "POST", tasks, raw=b"not json"))[0] == 400
            assert (await call(disp, "POST", tasks, raw=big))[0] == 413
            # a dispatcher whose nodes never answered takes no tasks (docs/faults.md)
            status, reply = await call(lost, "POST", tasks, body={"work": 1.0})
            assert status == 503 and "first answers" in reply["error"], reply
            limit = wire.MAX_WORK_MEANS * exp.workload.service.mean  # above it, refused before routing
            status, reply = await call(disp, "POST", tasks, body={"work": limit * 1.5})
            assert status == 400 and reply["field"] == "work"

            # a node: a task posted directly (with the token) brings the idle token back on its reply
            zero = "/v1/nodes/0/tasks"
            status, reply = await call(
                nodes, "POST", node_tasks, zero, token=TOKEN, body={"work": 1, "origin": 0}
            )
            assert status == 200 and reply["messages"][0]["kind"] == "idle_token"
            assert (await call(nodes, "POST", node_tasks, zero, body={"work": 1}))[0] == 401
            assert (await call(nodes, "POST", node_tasks, zero, token="wrong", body={"work": 1}))[0] == 401
            assert (await call(nodes, "POST", node_tasks, zero, token=TOKEN, body={"work": -1}))[0] == 400
            for piggyback in ({}, ["a"], [0] * 17, [None]):
                piggy = {"work": 1, "piggyback": piggyback}
                status, reply = await call(nodes, "POST", node_tasks, zero, token=TOKEN, body=piggy)
                assert (status, reply["field"]) == (400, "piggyback"), piggyback
            status, reply = await call(
                nodes, "POST", node_tasks, zero, token=TOKEN, body={"work": 1, "origin": 1}
            )
            assert (status, reply["field"]) == (400, "origin")  # one dispatcher in this cluster
            nine = "/v1/nodes/9/tasks"
            assert (await call(nodes, "POST", node_tasks, nine, token=TOKEN, body={"work": 1}))[0] == 404
            assert (await call(nodes, "POST", node_tasks, nine, body={"work": 1}))[0] == 401  # token first
            for segment in ("x", "-1", "+1", "1.0"):  # digits only: no route, aiohttp's plain-text 404
                path = f"/v1/nodes/{segment}/tasks"
                status, text = await call(nodes, "POST", node_tasks, path, token=TOKEN, body={"work": 1})
                assert (status, text) == (404, "404: Not Found"), segment
            assert (await call(nodes, "POST", node_tasks, zero, token=TOKEN, raw=big))[0] == 413

            # every node at its limit of one task: 503 from the node and from the dispatcher
            long = [asyncio.ensure_future(call(disp, "POST", tasks, body={"work": 30.0})) for _ in range(2)]
            await wait_until(lambda: all(m.x == 1 for m in node_host.models.values()))
            one_task = "/v1/nodes/1/tasks"
            assert (await call(nodes, "POST", node_tasks, one_task, token=TOKEN, body={"work": 1}))[0] == 503
            assert (await call(disp, "POST", tasks, body={"work": 1.0}))[0] == 503
            assert [status for status, _ in await asyncio.gather(*long)] == [200, 200]

            # probes
            status, reply = await call(nodes, "POST", probe, "/v1/nodes/1/probe", token=TOKEN)
            assert status == 200 and reply == {"node": 1, "x": 0}
            assert (await call(nodes, "POST", probe, "/v1/nodes/1/probe", token="wrong"))[0] == 401
            assert (await call(nodes, "POST", probe, "/v1/nodes/7/probe", token=TOKEN))[0] == 404

            # state messages to the dispatcher
            idle = {"messages": [{"kind": "idle_token", "node": 0, "dispatcher": 0, "data": [1000]}]}
            applied = {"ok": True, "applied": 1}
            assert (await call(disp, "POST", messages, token=TOKEN, body=idle))[1] == applied
            assert (await call(disp, "POST", messages, body=idle))[0] == 401
            assert (await call(disp, "POST", messages, token=TOKEN, body={"messages": []}))[0] == 400
            # a kind the policy does not receive, or a node outside the cluster: refused before counting
            received = dict(dispatcher_host.core.received)
            departure = {"messages": [idle["messages"][0], {"kind": "departure", "node": 0}]}
            reply = (await call(disp, "POST", messages, token=TOKEN, body=departure))[1]
            assert reply["field"] == "messages[1].kind"
            far_node = {"messages": [idle["messages"][0], {"kind": "idle_token", "node": exp.n}]}
            reply = (await call(disp, "POST", messages, token=TOKEN, body=far_node))[1]
            assert reply["field"] == "messages[1].node"
            assert dict(dispatcher_host.core.received) == received
            assert (await call(disp, "POST", messages, token=TOKEN, raw=big))[0] == 413

            # a message the policy refuses stops the batch and says how many were applied
            token_ok = {
                "kind": "token_arrival",
                "node": 0,
                "dispatcher": 0,
                "data": [0, 1, 1, False, True, 0, 1],
            }
            batch = {"messages": [token_ok, {**token_ok, "data": [0, 1, 2]}]}
            status, reply = await call(slta_disp, "POST", messages, token=TOKEN, body=batch)
            assert (status, reply["field"]) == (400, "messages[1]")
            assert "(1 of 2 messages applied)" in reply["error"]
            assert slta_dispatcher.core.received["token_arrival"] == 1
            assert slta_dispatcher.core.rejected["token_arrival"] == 1

            # state messages to a node: an SLTA epoch that agrees with the idle pool's true bits is
            # answered all the same, on the reply, with the unchanged bits, the pool's last seq (none: 0),
            # its task count (0) and the dispatcher's tasks it received (0)
            bits = Thresholds(ranking_of(slta)).true_bits(0, 0, 1)
            epoch = {"messages": [{"kind": "epoch", "node": 1, "dispatcher": 0, "data": [1, 1, 0, *bits]}]}
            one = "/v1/nodes/1/messages"
            status, reply = await call(slta_nodes, "POST", node_messages, one, token=TOKEN, body=epoch)
            answer = {"kind": "token_epoch", "node": 1, "dispatcher": 0, "data": [1, 1, 0, *bits, 0, 0]}
            sent = reply["messages"][0].pop("sent")  # the node's monotonic clock when it answered
            assert isinstance(sent, float) and 0 <= time.monotonic() - sent < 5
            assert (status, reply) == (200, {"ok": True, "applied": 1, "messages": [answer]})
            assert (await call(slta_nodes, "POST", node_messages, one, body=epoch))[0] == 401
            other = "/v1/nodes/0/messages"
            reply = (await call(slta_nodes, "POST", node_messages, other, token=TOKEN, body=epoch))[1]
            assert reply["field"] == "messages[0].node"
            token_back = {"messages": [answer]}  # a node takes epoch only
            reply = (await call(slta_nodes, "POST", node_messages, one, token=TOKEN, body=token_back))[1]
            assert reply["field"] == "messages[0].kind"
            short = {"messages": [{**epoch["messages"][0], "data": [2, 1]}]}
            reply = (await call(slta_nodes, "POST", node_messages, one, token=TOKEN, body=short))[1]
            assert reply["field"] == "messages[0]" and "(0 of 1 messages applied)" in reply["error"]
            # a jiq node takes no message at all: probes have their own endpoint
            probe_msg = {"messages": [{"kind": "probe", "node": 0, "dispatcher": 0}]}
            reply = (await call(nodes, "POST", node_messages, other, token=TOKEN, body=probe_msg))[1]
            assert reply["field"] == "messages[0].kind"
            far = "/v1/nodes/5/messages"
            assert (await call(slta_nodes, "POST", node_messages, far, token=TOKEN, body=epoch))[0] == 404
            assert (await call(slta_nodes, "POST", node_messages, one, token=TOKEN, raw=big))[0] == 413

            # health, timings and metrics on both roles
            assert (await call(disp, "GET", "/v1/health"))[1]["policy"] == "jiq"
            assert (await call(nodes, "GET", "/v1/health"))[1]["nodes"] == [0, 1]
            # the idle tokens that rode on the task replies above were stamped by the node: they have ages
            status, timings = await call(disp, "GET", "/v1/timings")
            assert status == 200 and timings["message_ages"] == {}
            assert timings["rider_ages"]["idle_token"] and min(timings["rider_ages"]["idle_token"]) >= 0
            # when each was sent (the node's monotonic clock), in the same order
            sent = timings["rider_sent"]["idle_token"]
            assert len(sent) == len(timings["rider_ages"]["idle_token"]) and sent == sorted(sent)
            assert 0 <= time.monotonic() - sent[-1] < 5
            # and each one's own age under its key (kind:node:dispatcher:id): one per token that rode
            keyed = timings["keyed_ages"]
            assert len(keyed) == len(timings["rider_ages"]["idle_token"])
            assert all(k.startswith("idle_token:") and v >= 0 for k, v in keyed.items())
            # the epoch posted to the SLTA node above carried no stamp: applied, but with no age
            status, timings = await call(slta_nodes, "GET", "/v1/timings")
            empty = {"message_ages": {}, "message_sent": {}, "rider_ages": {}, "rider_sent": {}}
            empty |= {"keyed_ages": {}, "time_scale": 0.01}
            assert status == 200 and timings == empty
            status, text = await call(disp, "GET", "/metrics")
            # a JIQ dispatcher: every documented family but SLTA's own integral of r, and JIQ's state
            slta_only = {"lbtestbed_dispatcher_slta_r_model_seconds_total"}
            jiq_state = {q.metric for q in CATALOG["jiq"].exported}
            assert exported_metrics(text) == documented_metrics("### Dispatcher") - slta_only | jiq_state
            status, text = await call(nodes, "GET", "/metrics")
            assert exported_metrics(text) == documented_metrics("### Node host")

            # fault switches (docs/faults.md): fault 0 of this spec is a drop fault, fault 1 a kill
            data = copy.deepcopy(FCFS_SPEC)
            data["faults"] = [
                {"kind": "drop", "at": 1.0, "until": 2.0, "fraction": 0.5},
                {"kind": "kill", "at": 1.0, "until": 2.0, "node": 1},
            ]
            faulty_host = NodeHost(parse_spec(data), [0, 1], [NOWHERE], TOKEN)
            server, faulty = await serve(build_node_app(faulty_host))
            servers.append(server)
            switch = "/v1/faults"
            on = {"fault": 0, "active": True}
            reply = (await call(faulty, "POST", switch, token=TOKEN, body=on))[1]
            assert reply == {"ok": True, "active": [0]}
            assert faulty_host.faults.active == {0}
            status, reply = await call(faulty, "POST", switch, token=TOKEN, body={"fault": 1, "active": True})
            assert (status, reply["field"]) == (400, "fault")  # a kill is not switched in the process
            assert (await call(faulty, "POST", switch, body=on))[0] == 401
            assert (await call(faulty, "POST", switch, token=TOKEN, raw=big))[0] == 413
            # the run's clock and a failing node (docs/faults.md, Gray failures): node 1 fails every task
            # over the run's model times [0, 1e6)
            data["faults"] = [{"kind": "fail", "at": 0.0, "until": 1e6, "node": 1, "fraction": 1.0}]
            data["run"] = {**data["run"], "duration": 2e6}
            gray_host = NodeHost(parse_spec(data), [0, 1], [NOWHERE], TOKEN)
            server, gray = await serve(build_node_app(gray_host))
            servers.append(server)
            status, reply = await call(gray, "POST", "/v1/origin", token=TOKEN, body={"origin": time.time()})
            assert (status, reply) == (200, {"ok": True, "speed_changes": 0})
            status, reply = await call(gray, "POST", "/v1/origin", token=TOKEN, body={"origin": -1})
            assert (status, reply["field"]) == (400, "origin")
            assert (await call(gray, "POST", "/v1/origin", body={"origin": 1.0}))[0] == 401
            assert (await call(gray, "POST", "/v1/origin", token=TOKEN, raw=big))[0] == 413
            status, reply = await call(
                gray, "POST", node_tasks, "/v1/nodes/1/tasks", token=TOKEN, body={"work": 0.5}
            )
            assert status == 500 and "failed the task" in reply["error"], reply
            assert gray_host.core.failed[1] == 1 and gray_host.models[1].arrivals == 0
            # the dispatchers' health check of a node host: incarnation and every node's report
            status, reply = await call(nodes, "GET", "/v1/state", token=TOKEN)
            assert status == 200 and set(reply["reports"]) == {"0", "1"}
            assert reply["incarnation"] == node_host.incarnation
            assert (await call(nodes, "GET", "/v1/state"))[0] == 401
            # a dispatcher whose nodes never answered is not ready
            status, reply = await call(lost, "GET", "/v1/health")
            assert (status, reply["status"], reply["ready"]) == (503, "starting", False)
            # a task lost with its node: the node host goes away after the dispatcher's first contact
            gone_host = NodeHost(exp, [0, 1], [NOWHERE], TOKEN)
            gone_server, gone_nodes = await serve(build_node_app(gone_host))
            urls = [f"{gone_nodes}/v1/nodes/{k}" for k in range(exp.n)]
            orphan = DispatcherHost(exp, 0, 1, urls, TOKEN)
            server, orphan_url = await serve(build_dispatcher_app(orphan))
            servers.append(server)
            await asyncio.wait_for(orphan.ready.wait(), 10)
            await gone_server.close()
            status, reply = await call(orphan_url, "POST", tasks, body={"work": 1.0})
            assert status == 502 and reply["node"] in (0, 1), reply
            assert orphan.core.outcomes["lost"] == 1 and orphan.health.up_count == 0  # marked down at once

            # the token is asked for exactly where the document says so
            for (method, path), op in call.ops.items():
                assert ("401" in op["responses"]) == bool(op.get("security")), f"{method} {path}"

        documented = {
            (method, path, status)
            for (method, path), op in operations(doc).items()
            for status in op["responses"]
        }
        assert call.seen == documented, f"documented but never seen: {sorted(documented - call.seen)}"
    finally:
        for server in servers:
            await server.close()
