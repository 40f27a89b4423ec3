"""Fuzz tests of what reads outside input: the HTTP endpoints and the spec files (issue 8, bad input).

1. Endpoints, fuzzed from docs/openapi.yaml with schemathesis (valid and invalid bodies, headers, path ids),
   with the token right, wrong or missing, against a real cluster on loopback: one dispatcher and two
   node-host processes (``Cluster``). Every answer is compared with what docs/protocol.md says the request
   gets (``documented_answer``: status, and the ``field`` a 400 names), and with the document's schemas; state
   messages are fuzzed again from ``fuzz_strategies.message_batches``, which hits the accepted kinds far more
   often than schemathesis does.
2. Hand-made malformed requests against the same cluster: truncated JSON, non-UTF-8, deep nesting, huge and
   non-finite numbers, bad work, bodies at and above the size limit, wrong methods, missing tokens, unknown
   kinds and nodes, chunked bodies, and clients that stall half-way through a body.
3. At the end, the processes are alive and healthy, their logs hold no traceback, and every task adds up:
   what the dispatcher counts is what the fuzzing client saw, and each node's arrivals are its completions
   plus the tasks it still holds.
4. Spec files: one fault put into a valid document (wrong type, out of range, missing, unknown key, broken
   TOML) makes ``load_spec`` raise ``SpecError`` naming the file and that key, and ``lbt simulate`` and
   ``lbt predict`` exit with 2 and that one line.
5. Hostile specs (issue 27): extreme and non-finite numbers, deep nesting, long and control-character
   names, long arrays anywhere, several byte-level damages in a row and random bytes, and hostile
   ``--set`` items: one line, or an experiment within the bounds of docs/spec.md ("Limits"); never
   another exception.

What the fuzzing found in lbtestbed/ (``BUG_*``: deep JSON, huge integers, unknown charsets, bodies that do
not inflate, long node ids, a client leaving mid-body, absurd node counts, newlines in keys) was fixed; each
has a regression test here, run against apps served in-process. Examples are bounded and derandomized
(``derandomize=True``): CI sees the same requests every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gzip
import io
import json
import logging
import math
import re
import socket
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import schemathesis
from aiohttp import web
from fuzz_strategies import (
    HOSTILE,
    Mutation,
    base_documents,
    broken_text,
    damaged_bytes,
    get_at,
    hostile_documents,
    json_bytes,
    message_batches,
    mutations,
    out_of_range,
    toml_dumps,
    toml_value,
    wrong_type,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_cluster import cluster_urls, get, post, scrape, signed_by, write_spec
from test_protocol_docs import FCFS_SPEC, NOWHERE, fcfs_experiment, serve, slta_experiment

from lbtestbed.cli import main as lbt_main
from lbtestbed.cluster.launcher import Cluster
from lbtestbed.dispatcher.app import build_app as build_dispatcher_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.server_node.app import build_app as build_node_app
from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import load_spec, parse_spec
from lbtestbed.transport import wire
from lbtestbed.transport.aiohttp_glue import signed
from lbtestbed.transport.cluster_file import ClusterFile
from lbtestbed.transport.process import start_serving
from lbtestbed.transport.signing import Signer, Verifier

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = schemathesis.openapi.from_path(ROOT / "docs" / "openapi.yaml")
TIMEOUT = 15.0  # wall seconds: no answer from a process within this is a hang (nothing here takes 0.2 s)
LONG_TASK = 1.0  # wall seconds: a task posted to a node that lasts longer is left in service (see exchange)

#: four pools (no queue: a long task never delays another), JIQ (the dispatcher takes idle tokens from nodes).
#: time_scale 1e-5: the largest task the dispatcher accepts (1e4 mean works) lasts 0.1 s of wall time.
LIVE_SPEC = """
name = "fuzz"
seed = 5
[[classes]]
name = "unit"
count = 2
discipline = "pool"
[[classes]]
name = "double"
count = 2
discipline = "pool"
speed = 2
[workload]
load = 1.0
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "jiq"
[run]
warmup = 0.0
duration = 10.0
time_scale = 1e-5
[[faults]]  # fault 0 may be switched by the fuzzer (POST /v1/faults); fault 1 is no message fault
kind = "drop"
fraction = 0.5
at = 0.0
until = 10.0
[[faults]]
kind = "kill"
node = 0
at = 0.0
until = 10.0
"""


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


# ======================================================================================== the live cluster


@dataclass
class Ledger:
    """What the client saw: accepted tasks at the dispatcher by status, and tasks posted straight to nodes."""

    dispatcher: Counter[int] = field(default_factory=Counter)  # 200, 502, 503
    admitted_at_nodes: int = 0  # posted to a node with the token and admitted (answered 200, or running)
    refused_at_nodes: int = 0  # a node's own 503

    def record_dispatcher(self, status: int) -> None:
        if status in (200, 502, 503):  # every other status is no task (docs/protocol.md)
            self.dispatcher[status] += 1


@dataclass
class Live:
    cluster: Cluster
    file: ClusterFile
    exp: Experiment
    dispatcher: str
    hosts: list[str]
    pids: list[int]
    ledger: Ledger
    signer: Signer = field(init=False)
    signed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.signer = Signer(self.file.token)

    @property
    def token(self) -> str:
        return self.file.token

    @property
    def here(self) -> list[int]:
        """The nodes of the node host that the fuzzers talk to."""
        return self.file.node_hosts[0].nodes

    @property
    def elsewhere(self) -> int:
        """A node of the cluster that the other node host serves."""
        return self.file.node_hosts[1].nodes[0]

    def node_url(self, k: int | str) -> str:
        return f"{self.hosts[0]}/v1/nodes/{k}"

    def sign(self, method: str, url: str, body: bytes | None) -> dict[str, str]:
        """A signed request's headers, as a peer of the cluster makes them (and remembered as such)."""
        headers, _ = self.signer.headers(method, url, body or b"")
        self.signed.add(headers["Authorization"])
        return headers

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """Whether a request carries a signature this test made (the documented answers assume its body
        and path were not changed since, which ``exchange`` ensures by signing the prepared request)."""
        return headers.get("Authorization") in self.signed


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    directory = tmp_path_factory.mktemp("fuzz")
    spec = write_spec(directory, LIVE_SPEC)
    with Cluster(directory / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        dispatcher, hosts = cluster_urls(f)
        pids = [e.pid for e in f.dispatchers + f.node_hosts]
        yield Live(cluster, f, f.experiment(), dispatcher, hosts, pids, Ledger())
        # the node hosts still serve the fuzzers' longest tasks, and a host waits for its open requests on
        # SIGTERM: the default grace of 5 s would be spent in full before the SIGKILL
        cluster.down(grace=1.0)


# ============================================================================ what docs/protocol.md says


@dataclass(frozen=True)
class Answer:
    """The answer docs/protocol.md gives a request: its status and, for a 400, the fields it may name."""

    status: int
    fields: frozenset[str] = frozenset()  # empty: the error names no field
    plain: bool = False  # aiohttp's plain-text 404 for a path that matches no route
    seconds: float = 0.0  # for a task: the wall time its work takes
    task: bool = False  # a task that is admitted


NO_ROUTE = Answer(404, plain=True)
NODE_ROUTE = re.compile(r"^/v1/nodes/([^/]*)/(tasks|probe|messages)$")


def bad(*fields: str) -> Answer:
    return Answer(400, frozenset(fields))


def is_integer(v: Any) -> bool:
    """A JSON integer (no fraction, no exponent) from 0 to 2^53 (docs/protocol.md)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**53


def is_number(v: Any) -> bool:
    """A finite JSON number, an integer within +-2^53 (exact as a float); booleans are not numbers."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return abs(v) <= 2**53 if isinstance(v, int) else math.isfinite(v)


def is_payload(v: Any) -> bool:
    """A message's ``data`` or a task's ``piggyback``: at most 16 finite numbers and booleans."""
    return isinstance(v, list) and len(v) <= 16 and all(isinstance(x, bool) or is_number(x) for x in v)


def charset(headers: Mapping[str, str]) -> str | None:
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    m = re.search(r";\s*charset=\"?([^\";]*)", ctype, re.I)
    return m.group(1) if m else None


def json_object(body: bytes, headers: Mapping[str, str]) -> tuple[dict[str, Any] | None, Answer | None]:
    """The body as a JSON object, or the answer to a body that is none (Conventions: Bodies, Size)."""
    if len(body) > wire.MAX_BODY:
        return None, Answer(413)
    try:
        value = json.loads(body.decode(charset(headers) or "utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, bad()
    return (value, None) if isinstance(value, dict) else (None, bad())


def work_answer(body: Mapping[str, Any], limit: float | None) -> Answer | None:
    work = body.get("work")
    if not is_number(work) or work <= 0 or (limit is not None and work > limit):
        return bad("work")
    return None


def is_idle_token_data(v: Any) -> bool:
    """JIQ's idle token data: [a], the node's arrivals so far, an integer >= 0 (docs/protocol.md)."""
    return isinstance(v, list) and len(v) == 1 and is_integer(v[0])


def message_answer(batch: Any, accepted: tuple[str, ...], node_ok: Any) -> Answer:
    """A messages body: the form of every message, then every kind, then every node (three passes); then
    the messages are applied in order, and the first the policy refuses is named."""
    msgs = batch.get("messages")
    if not isinstance(msgs, list) or not 1 <= len(msgs) <= 64:
        return bad("messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return bad(f"messages[{i}]")
        faults = set()
        kind = m.get("kind")
        if not (isinstance(kind, str) and 1 <= len(kind) <= 64):
            faults.add(f"messages[{i}].kind")
        if not is_payload(m.get("data", [])):
            faults.add(f"messages[{i}].data")
        if not is_integer(m.get("node")):
            faults.add(f"messages[{i}].node")
        if not is_integer(m.get("dispatcher", 0)):
            faults.add(f"messages[{i}].dispatcher")
        if faults:
            return bad(*faults)  # the message's checks have no documented order: any of its faults
    for i, m in enumerate(msgs):
        if m["kind"] not in accepted:
            return bad(f"messages[{i}].kind")
    for i, m in enumerate(msgs):
        if not node_ok(m["node"]):
            return bad(f"messages[{i}].node")
    for i, m in enumerate(msgs):
        if m["kind"] == "idle_token" and not is_idle_token_data(m.get("data", [])):
            return bad(f"messages[{i}]")  # JIQ applies every idle token whose data is [arrivals]
    return Answer(200)


def fault_switch_answer(body: bytes, headers: Mapping[str, str], authorized: bool) -> Answer:
    """``POST /v1/faults``: the token, a JSON object, ``fault`` an integer, ``active`` a boolean, and
    ``fault`` the index of a message fault of the spec (LIVE_SPEC: only 0)."""
    if not authorized:
        return Answer(401)
    value, answer = json_object(body, headers)
    if value is None:
        return answer or bad()
    if not is_integer(value.get("fault")):
        return bad("fault")
    if not isinstance(value.get("active"), bool):
        return bad("active")
    return Answer(200) if value["fault"] == 0 else bad("fault")


def documented_answer(
    live: Live, role: str, method: str, path: str, headers: Mapping[str, str], body: bytes
) -> Answer:
    """What the request gets, from docs/protocol.md (Conventions, Status codes, the endpoint sections)."""
    exp = live.exp
    authorized = live.authorized(headers)
    if path == "/v1/faults":
        return fault_switch_answer(body, headers, authorized)
    if (role, path) == ("nodes", "/v1/state"):
        return Answer(200) if authorized else Answer(401)
    if role == "dispatcher":
        if (method, path) in (("GET", "/v1/health"), ("GET", "/metrics")):
            return Answer(200)
        if path == "/v1/messages":
            if not authorized:
                return Answer(401)
            batch, answer = json_object(body, headers)
            if batch is None:
                return answer or bad()
            return message_answer(batch, ("idle_token",), lambda k: k < exp.n)
        task, answer = json_object(body, headers)
        if task is None:
            return answer or bad()
        limit = wire.MAX_WORK_MEANS * exp.workload.service.mean
        if (answer := work_answer(task, limit)) is not None:
            return answer
        return Answer(200, seconds=task["work"] * exp.run.time_scale / min(exp.node_speeds), task=True)
    if (method, path) in (("GET", "/v1/health"), ("GET", "/metrics")):
        return Answer(200)
    route = NODE_ROUTE.match(path)
    segment = urllib.parse.unquote(route.group(1)) if route else ""
    if route is None or not re.fullmatch(r"\d+", segment):
        return NO_ROUTE  # the route takes digits only; any other segment matches no route
    if not authorized:
        return Answer(401)
    k = int(segment)
    if k not in live.here:
        return Answer(404)
    endpoint = route.group(2)
    if endpoint == "probe":
        return Answer(200)
    value, answer = json_object(body, headers)
    if value is None:
        return answer or bad()
    if endpoint == "messages":
        return message_answer(value, (), lambda node: node == k)
    if (answer := work_answer(value, None)) is not None:
        return answer
    if not is_integer(value.get("origin", 0)):
        return bad("origin")
    if not is_payload(value.get("piggyback", [])):
        return bad("piggyback")
    if value.get("origin", 0) >= len(live.file.dispatchers):
        return bad("origin")
    return Answer(200, seconds=value["work"] / exp.node_speeds[k] * exp.run.time_scale, task=True)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


# ================================================================================ sending and checking


@dataclass
class Exchange:
    """A request as sent, what the documents say it gets, and what it got (None: no answer in time)."""

    request: requests.PreparedRequest
    expected: Answer
    response: requests.Response | None


def exchange(
    live: Live, session: requests.Session, role: str, prepared: requests.PreparedRequest
) -> Exchange:
    """Send one request with a timeout; a task posted to a node that outlasts LONG_TASK is left running."""
    body = prepared.body or b""
    body = body.encode() if isinstance(body, str) else body
    path = urllib.parse.urlsplit(prepared.url or "").path
    headers = dict(prepared.headers)
    expected = documented_answer(live, role, prepared.method or "", path, headers, body)
    long_task = expected.status == 200 and expected.seconds > LONG_TASK
    try:
        response = session.send(prepared, timeout=0.2 if long_task else TIMEOUT, allow_redirects=False)
    except requests.exceptions.ReadTimeout:
        response = None
    if expected.task and role == "nodes":
        live.ledger.admitted_at_nodes += 1
    if role == "dispatcher" and path == "/v1/tasks" and response is not None:
        live.ledger.record_dispatcher(response.status_code)
    if long_task:
        assert response is None, f"a reply before the task's {expected.seconds:.3g} s of work were done"
    else:
        assert response is not None, f"no answer in {TIMEOUT} s: {prepared.method} {prepared.url}"
    return Exchange(prepared, expected, response)


def check_answer(ex: Exchange) -> None:
    """The answer is the documented one: status, content type, and the JSON error body with its field."""
    r, expected = ex.response, ex.expected
    if r is None:
        return
    where = (
        f"{ex.request.method} {ex.request.url} {str(ex.request.body)[:300]} -> {r.status_code} {r.text[:300]}"
    )
    assert r.status_code == expected.status, where
    if expected.plain:
        assert (r.headers["Content-Type"].split(";")[0], r.text) == ("text/plain", "404: Not Found"), where
        return
    if r.status_code == 200:
        return
    assert r.headers["Content-Type"] == "application/json; charset=utf-8", where
    reply = r.json()
    assert isinstance(reply, dict) and isinstance(reply.get("error"), str) and reply["error"], where
    assert set(reply) <= {"error", "field"}, where
    if expected.fields:
        assert reply.get("field") in expected.fields, (
            f"expected a field in {sorted(expected.fields)}: {where}"
        )
    else:
        assert "field" not in reply, where


def prepare(
    method: str, url: str, headers: Mapping[str, str], body: bytes | None
) -> requests.PreparedRequest:
    return requests.Request(method, url, headers=dict(headers), data=body).prepare()


# =================================================================== 1. endpoints fuzzed from openapi.yaml

OPERATIONS = [
    ("dispatcher", "POST", "/v1/tasks"),
    ("dispatcher", "POST", "/v1/messages"),
    ("dispatcher", "GET", "/v1/health"),
    ("dispatcher", "GET", "/metrics"),
    ("dispatcher", "POST", "/v1/faults"),
    ("nodes", "POST", "/v1/faults"),
    ("nodes", "GET", "/v1/state"),
    ("nodes", "POST", "/v1/nodes/{node}/tasks"),
    ("nodes", "POST", "/v1/nodes/{node}/probe"),
    ("nodes", "POST", "/v1/nodes/{node}/messages"),
    ("nodes", "GET", "/v1/health"),
    ("nodes", "GET", "/metrics"),
]
CASES = [
    pytest.param(role, method, path, mode, id=f"{role}-{method}-{path}-{mode}")
    for role, method, path in OPERATIONS
    for mode in ("positive", "negative")
    if method == "POST" or mode == "positive"  # a GET without parameters has no invalid form to generate
]
SCHEMA_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.mark.parametrize(("role", "method", "path", "mode"), CASES)
def test_fuzzed_requests_get_their_documented_answers(
    live: Live, role: str, method: str, path: str, mode: str
) -> None:
    """schemathesis draws requests from docs/openapi.yaml (positive: bodies and ids the schemas allow;
    negative: ones they do not, headers and non-JSON bodies included); the token is then kept as drawn (a
    wrong one), removed, or set right, and the node id is kept as drawn (usually out of range), or set to a
    node of this host or of the other one. Each answer must be the documented one (status, error field) and
    satisfy the document's schemas; no 5xx, no hang."""
    operation = SCHEMA[path][method]
    base = live.dispatcher if role == "dispatcher" else live.hosts[0]
    secured = bool(operation.definition.raw.get("security"))
    nodes = [*map(str, live.here), "drawn", str(live.elsewhere)]
    session = requests.Session()
    seen: Counter[int] = Counter()

    @fuzz_settings(60)
    @given(
        case=operation.as_strategy(generation_mode=GenerationMode(mode)),
        token=st.sampled_from(["right", "drawn", "none"]),
        node=st.sampled_from(nodes),
    )
    def fuzz(case: Any, token: str, node: str) -> None:
        if "node" in case.path_parameters and node != "drawn":
            case.path_parameters["node"] = int(node)
        if secured and token != "drawn":
            case.headers.pop("Authorization", None)
        kwargs = case.as_transport_kwargs(base_url=base)
        try:
            prepared = requests.Request(
                kwargs["method"],
                kwargs["url"],
                headers=kwargs.get("headers"),
                data=kwargs.get("data"),
                json=kwargs.get("json"),
                params=kwargs.get("params"),
            ).prepare()
        except (requests.exceptions.InvalidJSONError, requests.exceptions.InvalidHeader):
            assume(False)  # the client cannot send it (NaN in a JSON body, a header with a line break)
            return
        if secured and token == "right":  # signed as sent: method, path and body (docs/protocol.md)
            body = prepared.body.encode() if isinstance(prepared.body, str) else prepared.body
            prepared.headers.update(live.sign(prepared.method or "", prepared.url or "", body))
        try:
            ex = exchange(live, session, role, prepared)
        except UnicodeEncodeError:
            assume(False)  # a header value http.client will not encode: nothing was sent
            return
        check_answer(ex)
        if ex.response is not None:
            seen[ex.response.status_code] += 1
            case.validate_response(ex.response, checks=SCHEMA_CHECKS)

    fuzz()
    assert seen, "no request was sent"
    if method == "POST" and (mode == "positive" or secured):
        assert len(seen) >= 2, seen  # both admitted and refused requests came up
    if mode == "positive" and path != "/v1/nodes/{node}/messages":  # a JIQ node takes no message kind
        assert seen[200] > 0, seen


@pytest.mark.parametrize("role", ["dispatcher", "nodes"])
def test_fuzzed_message_batches_get_their_documented_answers(live: Live, role: str) -> None:
    """State messages built to be nearly right (kinds of every policy, nodes in and just out of range, fields
    missing or mistyped, NaN in data, batches of 0 to 66), posted with the token: the documented status and
    field each time, and on a node's endpoint (JIQ: no kind accepted) never a 200."""
    url = (
        f"{live.dispatcher}/v1/messages"
        if role == "dispatcher"
        else f"{live.node_url(live.here[0])}/messages"
    )
    session = requests.Session()
    seen: Counter[int] = Counter()

    @fuzz_settings(120)
    @given(batch=message_batches(live.exp.n, ["idle_token"] if role == "dispatcher" else []))
    def fuzz(batch: Any) -> None:
        prepared = prepare("POST", url, live.sign("POST", url, json_bytes(batch)), json_bytes(batch))
        ex = exchange(live, session, role, prepared)
        check_answer(ex)
        assert ex.response is not None
        seen[ex.response.status_code] += 1

    fuzz()
    if role == "dispatcher":
        assert seen[200] >= 5 and seen[400] >= 20, seen  # both the applied and the refused batches were tried
    else:
        assert set(seen) == {400}, seen


# =============================================================================== 2. hand-made requests


def dispatcher_task(live: Live, body: bytes, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    status, reply = post(f"{live.dispatcher}/v1/tasks", body, dict(headers or {}))
    live.ledger.record_dispatcher(status)
    return status, reply


def node_task(live: Live, body: bytes, k: int | None = None) -> tuple[int, Any]:
    k = live.here[0] if k is None else k
    status, reply = post(f"{live.node_url(k)}/tasks", body, signed_by(live.token))
    live.ledger.admitted_at_nodes += status == 200
    live.ledger.refused_at_nodes += status == 503
    return status, reply


def assert_error(status: int, reply: Any, expected: int, field: str | None) -> None:
    assert status == expected, (status, reply)
    assert isinstance(reply, dict) and isinstance(reply.get("error"), str), reply
    assert reply.get("field") == field, reply


VALID_TASK = b'{"work": 1.5, "origin": 0, "piggyback": [1, true]}'


@pytest.mark.parametrize("cut", range(len(VALID_TASK)))
def test_a_body_cut_anywhere_is_not_json(live: Live, cut: int) -> None:
    """Every proper prefix of a JSON object is not JSON: 400 without a field, at both task endpoints."""
    assert_error(*dispatcher_task(live, VALID_TASK[:cut]), 400, None)
    assert_error(*node_task(live, VALID_TASK[:cut]), 400, None)


BAD_BODIES = [
    (b'{"work": "\xff"}', None),  # not UTF-8
    (b'\xef\xbb\xbf{"work": 1}', None),  # a byte-order mark is not JSON
    ('{"work": 1}'.encode("utf-16"), None),
    (b"null", None),
    (b'"work"', None),
    (b"[]", None),
    (b"", None),
    (b"{}", "work"),
    (b'{"work": ' + b"[" * 100 + b"]" * 100 + b"}", "work"),  # nested, but well within what JSON readers take
    (b'{"work": NaN}', "work"),
    (b'{"work": Infinity}', "work"),
    (b'{"work": -Infinity}', "work"),
    (b'{"work": 1e400}', "work"),  # overflows to infinity
    (b'{"work": -1e400}', "work"),
    (b'{"work": 1e-400}', "work"),  # underflows to zero
    (b'{"work": 0}', "work"),
    (b'{"work": -0.0}', "work"),
    (b'{"work": -5e-324}', "work"),
    (b'{"work": "1"}', "work"),
    (b'{"work": true}', "work"),
    (b'{"work": null}', "work"),
    (b'{"work": {}}', "work"),
    (b'{"Work": 1}', "work"),
]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
def test_malformed_task_bodies_get_400_naming_the_field(live: Live, body: bytes, field: str | None) -> None:
    assert_error(*dispatcher_task(live, body), 400, field)
    assert_error(*node_task(live, body), 400, field)


@pytest.mark.parametrize(
    "work", [b"10000.000001", b"1e5", b"1e308", b"1.7976931348623157e308", b"123456789012345678901234567890"]
)
def test_absurd_work_is_refused_by_the_dispatcher(live: Live, work: bytes) -> None:
    """Above 1e4 mean works (mean work 1 here) a task is refused before routing."""
    assert_error(*dispatcher_task(live, b'{"work": ' + work + b"}"), 400, "work")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"work": 1, "origin": 1.0}', "origin"),  # integers are written without a fraction
        (b'{"work": 1, "origin": 1e0}', "origin"),
        (b'{"work": 1, "origin": true}', "origin"),
        (b'{"work": 1, "origin": -1}', "origin"),
        (b'{"work": 1, "origin": "0"}', "origin"),
        (b'{"work": 1, "origin": null}', "origin"),
        (b'{"work": 1, "origin": 1}', "origin"),  # one dispatcher in this cluster
        (b'{"work": 1, "origin": 18446744073709551616}', "origin"),
        (b'{"work": 1, "piggyback": [NaN]}', "piggyback"),
        (b'{"work": 1, "piggyback": [1e400]}', "piggyback"),
        (b'{"work": 1, "piggyback": [null]}', "piggyback"),
        (b'{"work": 1, "piggyback": [[1]]}', "piggyback"),
        (b'{"work": 1, "piggyback": ' + json.dumps([0] * 17).encode() + b"}", "piggyback"),
        (b'{"work": 1, "piggyback": {}}', "piggyback"),
        (b'{"work": 1, "piggyback": null}', "piggyback"),
        (b'{"work": -1, "origin": 7, "piggyback": "x"}', "work"),  # work is checked first
        # the piggyback is checked before the origin's range
        (b'{"work": 1, "origin": 7, "piggyback": "x"}', "piggyback"),
    ],
)
def test_malformed_node_task_fields_get_400_naming_the_field(live: Live, body: bytes, field: str) -> None:
    assert_error(*node_task(live, body), 400, field)


def test_huge_numbers_in_a_node_task_are_read_as_documented(live: Live) -> None:
    """A 600-digit origin and a 600-digit integer in the piggyback are refused naming their field (message
    payloads hold integers up to 2^53, exact as floats), and a denormal work is positive: a task lasting a
    few nanoseconds."""
    assert_error(*node_task(live, b'{"work": 1, "origin": 1' + b"0" * 600 + b"}"), 400, "origin")
    assert_error(*node_task(live, b'{"work": 1, "piggyback": [1' + b"0" * 600 + b"]}"), 400, "piggyback")
    status, reply = node_task(live, b'{"work": 5e-324, "piggyback": [9007199254740992]}')
    assert status == 200 and reply["completed"] == reply["arrived"], reply


def padded(size: int, **fields: Any) -> bytes:
    """A JSON object of exactly ``size`` bytes: ``fields`` and a string of padding."""
    head = json.dumps({**fields, "pad": ""}).encode()
    return head[:-2] + b"x" * (size - len(head)) + head[-2:]


def test_bodies_of_the_limit_are_read_and_one_byte_more_is_413(live: Live) -> None:
    """MAX_BODY bytes are served; MAX_BODY + 1 get 413 with the JSON error body, at every endpoint that
    reads a body."""
    at_limit = padded(wire.MAX_BODY, work=1.0)
    assert len(at_limit) == wire.MAX_BODY
    assert dispatcher_task(live, at_limit)[0] == 200
    assert node_task(live, at_limit)[0] == 200
    over = padded(wire.MAX_BODY + 1, work=1.0)
    messages = padded(wire.MAX_BODY + 1, messages=[{"kind": "idle_token", "node": 0}])
    assert_error(*dispatcher_task(live, over), 413, None)
    assert_error(*node_task(live, over), 413, None)
    for url in (f"{live.dispatcher}/v1/messages", f"{live.node_url(live.here[0])}/messages"):
        assert_error(*post(url, messages, signed_by(live.token)), 413, None)
    # a compressed body that inflates beyond the limit is measured after inflating
    bomb = gzip.compress(padded(10 * wire.MAX_BODY, work=1.0))
    assert len(bomb) < wire.MAX_BODY
    assert_error(*dispatcher_task(live, bomb, {"Content-Encoding": "gzip"}), 413, None)


ROUTES = [
    ("dispatcher", "/v1/tasks", "POST"),
    ("dispatcher", "/v1/messages", "POST"),
    ("dispatcher", "/v1/health", "GET"),
    ("dispatcher", "/metrics", "GET"),
    ("nodes", "/v1/nodes/0/tasks", "POST"),
    ("nodes", "/v1/nodes/0/probe", "POST"),
    ("nodes", "/v1/nodes/0/messages", "POST"),
    ("nodes", "/v1/health", "GET"),
    ("nodes", "/metrics", "GET"),
]


@pytest.mark.parametrize(("role", "path", "allowed"), ROUTES)
def test_other_methods_get_405(live: Live, role: str, path: str, allowed: str) -> None:
    """Every other method on a known path: aiohttp's plain-text 405 with the allowed method in Allow."""
    base = live.dispatcher if role == "dispatcher" else live.hosts[0]
    methods = {"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"} - {allowed}
    if allowed == "GET":
        methods.discard("HEAD")  # GET routes answer HEAD too (docs/protocol.md)
    else:
        methods.add("HEAD")
    session = requests.Session()
    for method in sorted(methods):
        headers = live.sign(method, base + path, b'{"work": 1}')
        r = session.request(method, base + path, headers=headers, data=b'{"work": 1}', timeout=TIMEOUT)
        assert r.status_code == 405, (method, path, r.status_code, r.text)
        assert r.headers["Content-Type"].startswith("text/plain"), r.headers
        assert allowed in r.headers["Allow"].split(","), r.headers
        if method != "HEAD":
            assert r.text == "405: Method Not Allowed"


AUTH_HEADERS = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer TOKEN"},  # the key itself, as the first version of the protocol sent it
    {"Authorization": "TOKEN"},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "LBT-MAC"},
    {"Authorization": "LBT-MAC x:1:1:0"},
    {"Authorization": "LBT-MAC 0011223344556677:1:1767268800.0:00000000000000000000000000000000"},
    {"Authorization": "lbt-mac SIG"},  # the scheme's case matters (docs/protocol.md)
    {"Authorization": "LBT-MAC SIGx"},  # a valid signature, changed
    {"Authorization": "LBT-MAC  SIG"},  # two spaces
    {"X-Authorization": "LBT-MAC SIG"},
]


@pytest.mark.parametrize("headers", AUTH_HEADERS)
def test_internal_endpoints_refuse_requests_without_a_signature(live: Live, headers: dict[str, str]) -> None:
    """No signature, the key as a token, a malformed or a wrong one: 401 before anything but the body's
    size is looked at, at each endpoint that peers use; nothing reaches the policy or the node model."""
    before = scrape([live.dispatcher, *live.hosts])
    message = json.dumps({"messages": [{"kind": "idle_token", "node": 0}]}).encode()
    for url, body in (
        (f"{live.dispatcher}/v1/messages", message),
        (f"{live.node_url(live.here[0])}/tasks", b'{"work": 1}'),
        (f"{live.node_url(live.here[0])}/probe", b""),
        (f"{live.node_url(live.here[0])}/messages", message),
        (f"{live.node_url(99)}/tasks", b"{"),  # 401 before the node id and the body's JSON
    ):
        signature = Signer(live.token).headers("POST", url, body)[0]["Authorization"].split(" ", 1)[1]
        sent = {k: v.replace("TOKEN", live.token).replace("SIG", signature) for k, v in headers.items()}
        assert_error(*post(url, body, sent), 401, None)
    after = scrape([live.dispatcher, *live.hosts])
    for name in (
        "lbtestbed_dispatcher_messages_received_total",
        "lbtestbed_node_messages_received_total",
        "lbtestbed_node_arrivals_total",
    ):
        assert after.total(name) == before.total(name), name


@pytest.mark.parametrize(
    ("role", "message", "field"),
    [
        ("dispatcher", {"kind": "departure", "node": 0}, "messages[0].kind"),  # a JSQ kind: not JIQ's
        ("dispatcher", {"kind": "epoch", "node": 0}, "messages[0].kind"),  # dispatcher-to-node
        ("dispatcher", {"kind": "idle-token", "node": 0}, "messages[0].kind"),
        ("dispatcher", {"kind": "", "node": 0}, "messages[0].kind"),
        ("dispatcher", {"kind": "x" * 65, "node": 0}, "messages[0].kind"),
        ("dispatcher", {"kind": "idle_token", "node": 4}, "messages[0].node"),  # 4 nodes: 0 to 3
        ("dispatcher", {"kind": "idle_token", "node": 10**30}, "messages[0].node"),
        ("dispatcher", {"kind": "idle_token", "node": -1}, "messages[0].node"),
        ("dispatcher", {"kind": "idle_token", "node": 0.0}, "messages[0].node"),
        ("dispatcher", {"kind": "idle_token", "node": 0, "dispatcher": -1}, "messages[0].dispatcher"),
        ("dispatcher", {"kind": "idle_token", "node": 0, "data": [1e400]}, "messages[0].data"),
        ("nodes", {"kind": "epoch", "node": 0, "data": [1, 1, 0, False, False]}, "messages[0].kind"),
        ("nodes", {"kind": "idle_token", "node": 0}, "messages[0].kind"),
        ("nodes", {"kind": "", "node": 0}, "messages[0].kind"),
    ],
)
def test_unknown_kinds_and_nodes_are_refused(
    live: Live, role: str, message: dict[str, Any], field: str
) -> None:
    """Kinds the receiver does not take, nodes it does not know, fields out of form: 400 naming the field,
    and nothing applied."""
    url = f"{live.dispatcher}/v1/messages" if role == "dispatcher" else f"{live.node_url(0)}/messages"
    received = ("lbtestbed_dispatcher_messages_received_total", "lbtestbed_node_messages_received_total")
    before = scrape([live.dispatcher, *live.hosts])
    assert_error(*post(url, json_bytes({"messages": [message]}), signed_by(live.token)), 400, field)
    after = scrape([live.dispatcher, *live.hosts])
    assert [after.total(name) for name in received] == [before.total(name) for name in received]


def test_node_ids_out_of_range_get_404(live: Live) -> None:
    """A node of the other host, or of no host: the JSON 404; a segment that is not digits: no route."""
    for k in (live.elsewhere, live.exp.n, 10**40):
        status, reply = post(f"{live.node_url(k)}/probe", b"", signed_by(live.token))
        assert (status, reply) == (404, {"error": f"no node {k} here"})
    for segment in ("-1", "1e0", "0x1", "%20", "", "1%2F0", "0.5"):
        url = f"{live.hosts[0]}/v1/nodes/{segment}/probe"
        status, text = get_plain(url, "POST", live.sign("POST", url, b""))
        assert (status, text) == (404, "404: Not Found"), segment


def get_plain(url: str, method: str, headers: Mapping[str, str]) -> tuple[int, str]:
    r = requests.request(method, url, headers=dict(headers), timeout=TIMEOUT)
    return r.status_code, r.text


# ------------------------------------------------------------------------------------------- raw sockets


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or 80


def raw_request(url: str, data: bytes, timeout: float = TIMEOUT) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it or a reply is complete."""
    with socket.create_connection(host_port(url), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return reply
            reply += chunk
            head, _, rest = reply.partition(b"\r\n\r\n")
            m = re.search(rb"(?i)content-length: *(\d+)", head)
            if m and len(rest) >= int(m.group(1)):
                return reply


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def chunked(body: bytes, size: int = 4096) -> bytes:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def test_chunked_bodies_without_a_length_are_read_and_limited(live: Live) -> None:
    """Transfer-Encoding: chunked, no Content-Length: a task is served; one over the limit gets 413."""
    head = b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    reply = raw_request(live.dispatcher, head + chunked(b'{"work": 2.5}', size=3))
    live.ledger.record_dispatcher(status_of(reply))
    assert status_of(reply) == 200 and b'"sojourn"' in reply, reply
    reply = raw_request(live.dispatcher, head + chunked(padded(wire.MAX_BODY + 1, work=1.0)))
    assert status_of(reply) == 413 and reply.endswith(b'{"error": "body larger than 65536 bytes"}'), reply
    node = f"POST /v1/nodes/{live.here[0]}/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    signature = live.sign("POST", f"{live.node_url(live.here[0])}/tasks", b'{"work": 2.5}')["Authorization"]
    node_head = (node + f"Authorization: {signature}\r\nConnection: close\r\n\r\n").encode()
    reply = raw_request(live.hosts[0], node_head + chunked(b'{"work": 2.5}', size=1))
    live.ledger.admitted_at_nodes += status_of(reply) == 200
    assert status_of(reply) == 200, reply


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\nContent-Length: 2\r\n\r\n{}",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP\r\n\r\n",  # a TLS client hello, of sorts
    ],
    ids=["bad-chunk", "length-and-chunked", "negative-length", "huge-header", "not-http"],
)
def test_broken_http_framing_gets_400_and_the_connection_closes(live: Live, request_bytes: bytes) -> None:
    """Requests the HTTP parser cannot frame are answered 400 by the server itself (before any route) and
    the connection is closed; nothing becomes a task."""
    # a head over 16 KiB gets 431 from the lean server of the task path (docs/protocol.md, "The lean server
    # of the task path"; aiohttp answered 400 for a header line over 8 190 bytes)
    expected = 431 if len(request_bytes) > 16 * 1024 else 400
    before = scrape([live.dispatcher]).total("lbtestbed_dispatcher_decisions_total")
    reply = raw_request(live.dispatcher, request_bytes)
    assert status_of(reply) == expected, reply[:200]
    assert scrape([live.dispatcher]).total("lbtestbed_dispatcher_decisions_total") == before


def test_stalled_bodies_hold_only_their_own_connection(live: Live) -> None:
    """Slowloris: 20 connections that send headers and part of a body, then wait. Meanwhile both processes
    answer health checks and serve a task as usual; when the stalled clients give up, nothing of theirs
    was counted. A body that arrives one byte at a time is read as usual."""
    before = scrape([live.dispatcher, *live.hosts])
    stalled = []
    try:
        for i in range(20):
            url, path = (
                (live.dispatcher, "/v1/tasks")
                if i % 2
                else (live.hosts[0], f"/v1/nodes/{live.here[0]}/tasks")
            )
            s = socket.create_connection(host_port(url), timeout=TIMEOUT)
            signature = live.sign("POST", url + path, b'{"work": 1}')["Authorization"]
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {signature}\r\n"
                f'Content-Length: 100\r\n\r\n{{"work": 1'.encode()
            )
            stalled.append(s)
        time.sleep(0.2)
        for url in (live.dispatcher, *live.hosts):
            assert get(f"{url}/v1/health", timeout=TIMEOUT)[0] == 200
        status, reply = dispatcher_task(live, b'{"work": 1}')
        assert status == 200, reply
    finally:
        for s in stalled:
            s.close()
    with socket.create_connection(host_port(live.dispatcher), timeout=TIMEOUT) as s:
        body = b'{"work": 3}'
        s.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 11\r\n\r\n")
        for byte in body:
            s.sendall(bytes([byte]))
            time.sleep(0.02)
        reply = s.makefile("rb").read()
    live.ledger.record_dispatcher(status_of(reply))
    assert status_of(reply) == 200, reply
    after = scrape([live.dispatcher, *live.hosts])
    # two tasks of ours (the one above and the slow one), nothing from the stalled connections
    assert (
        after.total("lbtestbed_dispatcher_decisions_total")
        - before.total("lbtestbed_dispatcher_decisions_total")
        == 2
    )
    assert after.total("lbtestbed_node_arrivals_total") - before.total("lbtestbed_node_arrivals_total") == 2


# ============================================================== 3. after all that: alive, healthy, balanced


def test_after_the_fuzzing_every_process_is_healthy_and_every_task_adds_up(live: Live) -> None:
    """Runs after every other test of the live cluster (pytest keeps the file's order; it also holds when
    run alone: it sends tasks of its own first). No process
    died or restarted, each answers its health check, no log holds a traceback, and the task accounting is
    exact: the dispatcher's outcomes are the statuses its clients saw, each accepted task was decided once,
    and each node's arrivals are its completions plus the tasks it holds."""
    for _ in range(5):
        assert dispatcher_task(live, b'{"work": 0.5}')[0] == 200
    assert [row["alive"] and row["healthy"] for row in live.cluster.status()] == [True] * len(live.pids)
    assert [e.pid for e in live.file.dispatchers + live.file.node_hosts] == live.pids
    disp, nodes = scrape([live.dispatcher]), scrape(live.hosts)
    ledger = live.ledger
    outcomes = disp.by("lbtestbed_dispatcher_tasks_total", "outcome")
    assert outcomes == {
        "completed": ledger.dispatcher[200],
        "refused": ledger.dispatcher[503],
        "lost": ledger.dispatcher[502],
    }
    assert disp.total("lbtestbed_dispatcher_decisions_total") == sum(ledger.dispatcher.values())
    assert disp.total("lbtestbed_dispatcher_tasks_in_flight") == 0
    arrivals = nodes.by("lbtestbed_node_arrivals_total", "node")
    completions = nodes.by("lbtestbed_node_completions_total", "node")
    present = nodes.by("lbtestbed_node_tasks", "node")
    for k in map(str, range(live.exp.n)):
        assert arrivals[k] == completions[k] + present[k], (k, arrivals, completions, present)
    assert sum(arrivals.values()) == ledger.dispatcher[200] + ledger.admitted_at_nodes
    assert nodes.total("lbtestbed_node_refused_total") == ledger.dispatcher[503] + ledger.refused_at_nodes
    for endpoint in live.file.dispatchers + live.file.node_hosts:
        for record in unexpected_errors(Path(endpoint.log).read_text(errors="replace")):
            pytest.fail(f"{endpoint.log}:\n{record}")


def unexpected_errors(log: str) -> list[str]:
    """The log records with a traceback, less two kinds: aiohttp's own report of a request it could not
    parse (test_broken_http_framing_..., a 400 that aiohttp logs at ERROR)."""
    out = []
    for record in re.split(r"\n(?=\d{4}-\d\d-\d\d )", log):
        if "Traceback" not in record:
            continue
        framing = "/lbtestbed/" not in record and "aiohttp.http_exceptions." in record
        if not framing:
            out.append(record)
    return out


# ============================================ known bugs: reproducers, against apps served in-process


@contextlib.asynccontextmanager
async def in_process(exp: Experiment | None = None) -> Any:
    """A node host (nodes 0, 1) and its dispatcher, served on 127.0.0.1 in this process."""
    exp = exp or fcfs_experiment()
    node_host = NodeHost(exp, [0, 1], [NOWHERE], "T")
    node_server, nodes = await serve(build_node_app(node_host))
    dispatcher_host = DispatcherHost(exp, 0, 1, [f"{nodes}/v1/nodes/{k}" for k in range(exp.n)], "T")
    dispatcher_server, disp = await serve(build_dispatcher_app(dispatcher_host))
    node_host.dispatchers[:] = [disp]
    await asyncio.wait_for(dispatcher_host.ready.wait(), 10)  # it takes tasks after first contact
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            yield session, disp, nodes, dispatcher_host
    finally:
        await dispatcher_server.close()
        await node_server.close()


async def post_status(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """POST ``data``; without ``headers``, signed with the key ``T`` of the in-process apps, as a peer."""
    if headers is None:
        headers = Signer("T").headers("POST", url, data)[0]
    async with session.post(url, data=data, headers=dict(headers)) as r:
        return r.status, await r.text()


BUG_DEEP_JSON = (
    "was: transport/wire.py read_json catches ValueError and UnicodeDecodeError but not RecursionError: a "
    "body of deeply nested arrays (64 KiB of '[') makes json.loads raise RecursionError: aiohttp answers 500"
)


async def test_deeply_nested_json_gets_400() -> None:
    async with in_process() as (session, disp, nodes, _):
        status, text = await post_status(session, f"{disp}/v1/tasks", b"[" * 60000, {})
        assert status == 400, text
        status, text = await post_status(session, f"{nodes}/v1/nodes/0/messages", b"[" * 60000)
        assert status == 400, text


BUG_HUGE_INTEGER = (
    "was: transport/wire.py number() calls math.isfinite on a JSON integer, which raises OverflowError for "
    "one beyond float range (1 followed by 400 zeros): {'work': 10**400} gets 500 instead of 400 work at the "
    "dispatcher (above the work limit) and 500 instead of a task (or 400) at a node"
)


async def test_an_integer_beyond_float_range_is_read() -> None:
    async with in_process() as (session, disp, nodes, _):
        status, text = await post_status(session, f"{disp}/v1/tasks", b'{"work": 1' + b"0" * 400 + b"}", {})
        assert status == 400, text
        assert json.loads(text).get("field") == "work", text
        status, text = await post_status(
            session,
            f"{nodes}/v1/nodes/0/tasks",
            b'{"work": -1' + b"0" * 400 + b"}",
        )
        assert status == 400, text
        assert json.loads(text).get("field") == "work", text


BUG_UNKNOWN_CHARSET = (
    "was: transport/wire.py read_json: aiohttp decodes the body with the Content-Type's charset, and an "
    "unknown one (charset=nonexistent) raises LookupError, which is not caught: 500 instead of 400"
)


async def test_an_unknown_charset_gets_400() -> None:
    async with in_process() as (session, disp, _, _):
        headers = {"Content-Type": "application/json; charset=nonexistent"}
        status, text = await post_status(session, f"{disp}/v1/tasks", b'{"work": 1}', headers)
        assert status == 400, text


BUG_CONTENT_ENCODING = (
    "was: transport/wire.py read_json: a body sent with Content-Encoding: gzip (or deflate) that does not "
    "inflate makes aiohttp raise RequestPayloadError (ContentEncodingError), which was not caught: 500 "
    "instead of 400"
)


async def test_a_body_that_does_not_inflate_gets_400() -> None:
    """aiohttp closes a connection whose body failed to inflate (after the 400), so one request each."""
    async with in_process() as (session, disp, _, _):
        for encoding in ("gzip", "deflate"):
            status, text = await post_status(
                session,
                f"{disp}/v1/tasks",
                b"not compressed",
                {"Content-Encoding": encoding, "Connection": "close"},
            )
            assert status == 400 and "could not be read" in text, (encoding, text)


BUG_LONG_NODE_ID = (
    "was (docs/protocol.md, Known gaps): a node id of more than 4300 digits exceeds int()'s limit in "
    "server_node/host.py NodeHost._node: aiohttp's plain-text 500 instead of a 404"
)


async def test_a_node_id_of_5000_digits_gets_404() -> None:
    async with in_process() as (session, _, nodes, _):
        status, text = await post_status(session, f"{nodes}/v1/nodes/{'1' * 5000}/probe", b"")
        assert status == 404, text


# docs/protocol.md still lists these two as known gaps; the code has closed them. These tests keep them so.


async def test_a_rider_for_a_node_outside_the_cluster_is_dropped_and_the_task_counted() -> None:
    """A node's reply carrying a departure notice for node 99 of a 2-node JSQ cluster: the task completes
    and is counted, the rider is rejected."""
    exp = parse_spec({**copy.deepcopy(FCFS_SPEC), "policy": {"name": "jsq"}})

    async def liar(request: web.Request) -> web.Response:  # a node whose reply names a node that is not there
        reply = {"node": 0, "arrived": 0.0, "completed": 1.0, "waited": False}
        return web.json_response({**reply, "messages": [{"kind": "departure", "node": 99}]})

    async def state(request: web.Request) -> web.Response:  # the health check: every node idle
        reports = {str(k): [0, 0, 0, 0] for k in range(exp.n)}  # JSQ: x, dispatcher 0's counts, events
        return web.json_response({"incarnation": 1, "model_time": 0.0, "reports": reports})

    app = web.Application()
    key = Verifier("T")  # the liar holds the key: what it says is a peer's word
    app.router.add_post(r"/v1/nodes/{node:\d+}/tasks", signed(key, liar))
    app.router.add_get("/v1/state", signed(key, state))
    fake, base = await serve(app)
    host = DispatcherHost(exp, 0, 1, [f"{base}/v1/nodes/{k}" for k in range(exp.n)], "T")
    server, disp = await serve(build_dispatcher_app(host))
    await asyncio.wait_for(host.ready.wait(), 10)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            status, text = await post_status(session, f"{disp}/v1/tasks", b'{"work": 1}', {})
        assert status == 200, text
        core = host.core
        assert (core.outcomes["completed"], core.rejected["departure"], core.in_flight) == (1, 1, 0)
    finally:
        await server.close()
        await fake.close()


BUG_UNREADABLE_REPORT = (
    "was: dispatcher/health.py Health._answered: a state report the policy refused (ValueError, e.g. a JSQ "
    "report without its event count) escaped the health watch's task, which ended: no node was checked again"
)


async def test_an_unreadable_state_report_fails_the_check_and_the_watch_goes_on() -> None:
    """A node host whose reports the policy cannot read (three values where JSQ reads four): its nodes are
    not taken up, the checks are counted as unreadable and keep coming, and the dispatcher refuses tasks
    ("no node is up") instead of hanging."""
    exp = parse_spec({**copy.deepcopy(FCFS_SPEC), "policy": {"name": "jsq"}})
    asked = 0

    async def state(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        reports = {str(k): [0, 0, 0] for k in range(exp.n)}
        return web.json_response({"incarnation": 1, "model_time": 0.0, "reports": reports})

    app = web.Application()
    app.router.add_get("/v1/state", signed(Verifier("T"), state))
    fake, base = await serve(app)
    host = DispatcherHost(exp, 0, 1, [f"{base}/v1/nodes/{k}" for k in range(exp.n)], "T")
    server, disp = await serve(build_dispatcher_app(host))
    try:
        await asyncio.wait_for(host.ready.wait(), 10)  # it answered: no first-contact wait
        before = asked
        await asyncio.sleep(5 * exp.health.heartbeat)
        assert asked > before + 1 and host.health.heartbeats["unreadable"] >= 2
        assert host.health.up_count == 0 and not any(host.health.node_up)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            status, text = await post_status(session, f"{disp}/v1/tasks", b'{"work": 1}', {})
        assert status == 503 and "no node is up" in text, text
    finally:
        await server.close()
        await fake.close()


@pytest.mark.parametrize("r", [0, -1, 10**9])
async def test_an_slta_epoch_with_an_unusable_r_is_refused_and_the_pool_serves_on(r: int) -> None:
    """An epoch whose r is below 1 or absurdly large: 400 naming the message, and the pool still serves a
    task (work 1 at time_scale 0.01: 10 ms) within 2 s."""
    async with in_process(slta_experiment()) as (session, _, nodes, _):
        epoch = {"messages": [{"kind": "epoch", "node": 0, "dispatcher": 0, "data": [1, r, 0, False, False]}]}
        status, text = await post_status(session, f"{nodes}/v1/nodes/0/messages", json_bytes(epoch))
        assert (status, json.loads(text)["field"]) == (400, "messages[0]"), text
        task = post_status(session, f"{nodes}/v1/nodes/0/tasks", b'{"work": 1}')
        status, text = await asyncio.wait_for(task, 2.0)
        assert status == 200, text


BUG_CLIENT_GONE = (
    "was: transport/wire.py read_json does not catch the ConnectionResetError that aiohttp raises when a "
    "client closes its connection half-way through a body: every such client makes the process log "
    "'Error handling request' at ERROR with a traceback (nothing else happens: the reply has nowhere to go)"
)


async def test_a_client_that_leaves_mid_body_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    # served as lbtestbed/transport/process.py serves it (aiohttp's TestServer does not show this)
    exp = fcfs_experiment()
    app = build_dispatcher_app(
        DispatcherHost(exp, 0, 1, [f"{NOWHERE}/v1/nodes/{k}" for k in range(exp.n)], "T")
    )
    server = await start_serving(app, "127.0.0.1", 0)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b'POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"work"')
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        await asyncio.sleep(0.3)
    finally:
        await server.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


# =============================================================================================== 4. specs

SPEC_DOCS = base_documents()


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("specs") / "spec.toml"


def run_lbt(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = lbt_main(list(args))
    return code, out.getvalue(), err.getvalue()


def assert_one_line(text: str) -> None:
    assert "\n" not in text and "\r" not in text, repr(text)


def test_the_base_documents_are_valid_specs(spec_file: Path) -> None:
    """The fuzzers below put one fault into each of these; without it they load."""
    for doc in SPEC_DOCS:
        spec_file.write_text(toml_dumps(doc))
        assert load_spec(spec_file).name == doc["name"]


@fuzz_settings(150)
@given(mutation=mutations(SPEC_DOCS))
def test_a_spec_with_one_fault_is_refused_naming_the_file_and_key(
    spec_file: Path, mutation: Mutation
) -> None:
    """A wrong type, a value out of range, a missing required key or an unknown key: SpecError naming the
    file and exactly that key, in one line; `lbt simulate` and `lbt predict` print that line and exit 2."""
    spec_file.write_text(toml_dumps(mutation.doc))
    with pytest.raises(SpecError) as raised:
        load_spec(spec_file)
    err = raised.value
    assert err.key == mutation.key, (mutation.what, str(err))
    assert str(err).startswith(f"{spec_file}: {mutation.key}: "), str(err)
    assert_one_line(str(err))
    if mutation.what == "missing":
        assert "missing" in str(err) or "exactly one" in str(err), str(err)
    for args in (("simulate", str(spec_file), "--quiet"), ("predict", str(spec_file))):
        code, out, errtext = run_lbt(*args)
        command = args[0]
        assert (code, out) == (2, ""), (command, code, errtext)
        assert errtext.startswith(f"lbt: error: {spec_file}: {mutation.key}: ") and errtext.endswith("\n"), (
            errtext
        )
        assert_one_line(errtext[:-1])


@fuzz_settings(250)
@given(data=broken_text(SPEC_DOCS))
def test_broken_spec_text_is_refused_in_one_line(spec_file: Path, data: bytes) -> None:
    """Bytes cut, inserted, replaced or repeated: the file loads (the damage left valid TOML and a valid
    spec) or SpecError names the file in one line; never another exception."""
    spec_file.write_bytes(data)
    try:
        load_spec(spec_file)
    except SpecError as err:
        assert str(err).startswith(f"{spec_file}: "), str(err)
        assert_one_line(str(err))
        if err.key:
            assert f": {err.key}: " in str(err)


@st.composite
def override(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """A valid document and one ``--set KEY=VALUE`` that puts a wrong type or an out-of-range value at KEY."""
    doc = draw(st.sampled_from(SPEC_DOCS))
    mutation = draw(wrong_type(doc) | out_of_range(doc))
    path = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", mutation.key))
    return doc, mutation.key, f"{mutation.key}={toml_value(get_at(mutation.doc, path))}"


@fuzz_settings(100)
@given(case=override())
def test_a_bad_override_is_refused_naming_its_key(
    spec_file: Path, case: tuple[dict[str, Any], str, str]
) -> None:
    """`--set` goes through the same checks as the file: a bad value is refused naming its key."""
    doc, key, item = case
    spec_file.write_text(toml_dumps(doc))
    with pytest.raises(SpecError) as raised:
        load_spec(spec_file, [item])
    assert raised.value.key == key, (item, str(raised.value))
    code, _, errtext = run_lbt("predict", str(spec_file), "--set", item)
    assert code == 2 and errtext.startswith(f"lbt: error: {spec_file}: {key}: "), errtext
    assert_one_line(errtext.rstrip("\n"))


BUG_ABSURD_COUNT = (
    "was: model/spec.py accepts any classes[].count >= 1 and draws every node's speed while validating "
    "(_check_stability -> Experiment.node_speeds): count = 10**15 raises MemoryError from load_spec, and "
    "`lbt predict` says 'internal error: MemoryError' with exit 1 instead of a spec error with exit 2"
)


def test_an_absurd_node_count_is_a_spec_error(spec_file: Path) -> None:
    doc = json.loads(json.dumps(SPEC_DOCS[0]))
    doc["classes"][0]["count"] = 10**15
    spec_file.write_text(toml_dumps(doc))
    try:
        load_spec(spec_file)
    except SpecError as err:
        assert_one_line(str(err))
    code, _, errtext = run_lbt("predict", str(spec_file))
    assert code in (0, 2) and "internal error" not in errtext, errtext


BUG_KEY_WITH_NEWLINE = (
    "was: model/spec.py writes an unknown key's name into the error as it is: a quoted TOML key with a "
    'line break ("a\\nb" = 1) gives a SpecError, and an `lbt` error, of two lines'
)


def test_spec_error_for_a_key_with_a_newline_is_one_line(spec_file: Path) -> None:
    spec_file.write_text(toml_dumps({**SPEC_DOCS[0], "a\nb": 1}))
    with pytest.raises(SpecError) as raised:
        load_spec(spec_file)
    assert_one_line(str(raised.value))


# ===================================================================================== 5. hostile specs

MAX_SEED, MAX_NAME, MAX_BATCHES, MAX_MODEL_SECONDS = 2**64 - 1, 100, 10_000, 1e12


def assert_within_bounds(exp: Experiment) -> None:
    """What a spec that loads may ask, whatever it held (docs/spec.md, "Limits")."""
    assert 0 <= exp.seed <= MAX_SEED
    assert len(exp.name) <= MAX_NAME and all(len(c.name) <= MAX_NAME for c in exp.classes)
    assert not any(ch < " " for ch in exp.name + "".join(c.name for c in exp.classes))
    assert 2 <= exp.run.batches <= MAX_BATCHES
    assert exp.run.warmup + exp.run.duration <= MAX_MODEL_SECONDS
    rate = exp.workload.arrival_rate
    assert math.isfinite(rate) and math.isfinite(exp.work_rate) and rate * exp.run.duration >= 1


def loads_or_one_line(spec_file: Path) -> None:
    """``load_spec`` gives an experiment within the bounds, or SpecError in one line naming the file;
    never another exception (no RecursionError, no MemoryError, no OverflowError)."""
    try:
        exp = load_spec(spec_file)
    except SpecError as err:
        assert str(err).startswith(f"{spec_file}: "), str(err)
        assert_one_line(str(err))
        return
    assert_within_bounds(exp)


@fuzz_settings(150)
@given(doc=hostile_documents(SPEC_DOCS))
def test_hostile_values_are_refused_in_one_line_or_stay_within_the_bounds(
    spec_file: Path, doc: dict[str, Any]
) -> None:
    """Huge, tiny and non-finite numbers, 64-bit edges, values nested up to 60 deep, long and control-
    character names, long arrays, anywhere in a valid spec (and under keys of the fuzzer's naming)."""
    spec_file.write_text(toml_dumps(doc))
    loads_or_one_line(spec_file)


@fuzz_settings(300)
@given(data=damaged_bytes(SPEC_DOCS))
def test_damaged_or_random_bytes_never_raise_anything_but_one_line(spec_file: Path, data: bytes) -> None:
    """Several damages in a row, or bytes that never were a spec (random, NULs, 64 open brackets)."""
    spec_file.write_bytes(data)
    loads_or_one_line(spec_file)


@fuzz_settings(60)
@given(data=damaged_bytes(SPEC_DOCS) | hostile_documents(SPEC_DOCS).map(lambda d: toml_dumps(d).encode()))
def test_lbt_answers_a_hostile_spec_with_exit_2_and_one_line_or_runs_it(spec_file: Path, data: bytes) -> None:
    """Through the command line: exit 2 and one line (`lbt: error: ...`), or 0; never 1 and an internal
    error."""
    spec_file.write_bytes(data)
    code, _, err = run_lbt("predict", str(spec_file))
    assert code in (0, 2), err
    if code == 2:
        assert err.startswith("lbt: error: ") and err.count("\n") == 1, err


@fuzz_settings(80)
@given(
    item=st.text(max_size=200)
    | st.builds(
        lambda k, v: f"{k}={toml_value(v)}",
        st.sampled_from(
            [
                "seed",
                "name",
                "run.batches",
                "run.duration",
                "workload.load",
                "classes[0].name",
                "policy.name",
                "x.y.z",
            ]
        ),
        HOSTILE,
    )
)
def test_hostile_overrides_are_refused_in_one_line_or_stay_within_the_bounds(
    spec_file: Path, item: str
) -> None:
    spec_file.write_text(toml_dumps(SPEC_DOCS[0]))
    try:
        exp = load_spec(spec_file, [item])
    except SpecError as err:
        assert_one_line(str(err))
        return
    assert_within_bounds(exp)
