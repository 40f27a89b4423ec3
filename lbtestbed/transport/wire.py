"""The wire protocol shared by dispatchers and server nodes: JSON over HTTP, version 1 (docs/protocol.md).

Bodies are small JSON objects. Every request between cluster processes (tasks forwarded to nodes, probes,
state messages) is signed with the cluster's shared key and so is its answer (``transport.signing``).
Errors are JSON too: ``{"error": "...", "field": "..."}`` with status 400 (malformed), 401 (not signed,
or a replay), 413 (too large) or 503 (a node at its task limit).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import MESSAGE_ID
from lbtestbed.policies.base import Message
from lbtestbed.transport.signing import AUTHORIZATION, SCHEME, SIGNATURE, Unauthorized, Verifier

VERSION = "v1"
PREFIX = f"/{VERSION}"
MAX_BODY = 64 * 1024  # bytes; a task or a state message is well under 1 KiB
BODY_TIMEOUT = 10.0  # wall seconds from a request's head to the end of its body
MAX_WORK_MEANS = 1e4  # a task's work may be at most this many times the spec's mean work
MAX_SAFE_INTEGER = 2**53  # integers beyond this are not exact as floats; JSON peers (JavaScript) agree


class BadRequest(Exception):
    """A request body that does not follow the protocol; ``field`` names the offending field."""

    def __init__(self, message: str, field: str = "", status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


def error(status: int, message: str, field: str = "", **extra: Any) -> web.Response:
    """A JSON error; ``extra`` adds fields (the node of a lost or refused task)."""
    return web.json_response(error_body(message, field, **extra), status=status)


def error_body(message: str, field: str = "", **extra: Any) -> dict[str, Any]:
    """The body of a JSON error (docs/protocol.md, "Conventions")."""
    body: dict[str, Any] = {"error": message, **extra}
    if field:
        body["field"] = field
    return body


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def signed(verifier: Verifier, handler: Handler) -> Handler:
    """``handler`` for peers only: the request must be signed with the cluster's key, for this process,
    and new (401 otherwise, before anything else is looked at but the body's size), and the answer is
    signed for the sender to check (docs/protocol.md, "Authentication: signed requests")."""

    async def handle(request: web.Request) -> web.StreamResponse:
        value = request.headers.get(AUTHORIZATION)
        if not value or not value.startswith(SCHEME + " "):
            verifier.refused += 1
            return error(401, "missing signature (Authorization: LBT-MAC sender:counter:time:mac)")
        try:
            body = await read_body(request)
        except BadRequest as e:
            return error(e.status, str(e))
        try:
            tag = verifier.verify(request.method, request.raw_path, value, body, request.host)
        except Unauthorized as e:
            return error(401, str(e))
        try:
            response = await handler(request)
        except web.HTTPException as e:  # the node routes' 404: an answer like any other
            response = web.Response(
                status=e.status, body=e.body, content_type=e.content_type, charset=e.charset
            )
        assert isinstance(response, web.Response), response
        body = response.body if isinstance(response.body, bytes) else b""
        response.headers[SIGNATURE] = verifier.sign(tag, response.status, body)
        return response

    return handle


async def read_body(request: web.Request) -> bytes:
    """The request's body, or BadRequest: too large (413), unreadable, or not complete within
    ``BODY_TIMEOUT`` (408: a client that trickles its body holds a connection for nothing)."""
    try:
        if request.content.is_eof():  # all there (the usual case): no timer needed
            return await request.read()
        return await asyncio.wait_for(request.read(), BODY_TIMEOUT)
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(f"body larger than {MAX_BODY} bytes", status=413) from None
    except TimeoutError:
        raise BadRequest(f"body not complete within {BODY_TIMEOUT:g} s", status=408) from None
    except (web.RequestPayloadError, HttpProcessingError, ClientPayloadError, ConnectionError) as e:
        # a body that does not inflate as its Content-Encoding says, or a client that left mid-body
        raise BadRequest(f"body could not be read: {type(e).__name__}") from None


async def read_json(request: web.Request) -> Mapping[str, Any]:
    """The request's JSON object, or BadRequest naming what is wrong."""
    return parse_json(await read_body(request), request.charset)


def parse_json(raw: bytes, charset: str | None = None) -> Mapping[str, Any]:
    """A body as a JSON object, read in ``charset`` (UTF-8 by default), or BadRequest naming what is wrong."""
    try:
        body = json.loads(raw.decode(charset or "utf-8"))
    except LookupError:
        raise BadRequest(f"unknown charset {charset!r}") from None
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: absurdly deep nesting
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def machine() -> str:
    """This machine's boot id (Linux): processes that read the same one read one monotonic clock (also in
    other network namespaces and containers); "" when unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def number(
    body: Mapping[str, Any], field: str, *, positive: bool = False, default: float | None = None
) -> float:
    v = body.get(field, default)
    if v is None:
        raise BadRequest(f"missing field {field!r}", field)
    if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v):
        raise BadRequest(f"{field} must be a finite number", field)
    if positive and v <= 0:
        raise BadRequest(f"{field} must be positive", field)
    if v < 0:
        raise BadRequest(f"{field} must not be negative", field)
    return float(v)


def _finite(v: int | float) -> bool:
    """Finite and representable as a float (JSON admits integers of any size)."""
    return abs(v) <= MAX_SAFE_INTEGER if isinstance(v, int) else math.isfinite(v)


def integer(body: Mapping[str, Any], field: str, default: int | None = None, where: str = "") -> int:
    """A non-negative integer field; ``where`` is the path of ``body`` in the request, for the error."""
    path = f"{where}.{field}" if where else field
    v = body.get(field, default)
    if v is None:
        raise BadRequest(f"missing field {path!r}", path)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SAFE_INTEGER:
        raise BadRequest(f"{path} must be an integer from 0 to 2^53", path)
    return v


def message_to_json(msg: Message, sent: float | None = None) -> dict[str, Any]:
    """A message on the wire; ``sent`` (optional) is the sender's monotonic clock when it sent it, so
    that the receiver can measure its age (docs/protocol.md, "Message ages")."""
    out: dict[str, Any] = {"kind": msg.kind, "node": msg.node, "dispatcher": msg.dispatcher}
    out["data"] = list(msg.data)
    if sent is not None:
        out["sent"] = sent
    return out


def sent_at(obj: Any) -> float | None:
    """A wire message's ``sent`` stamp, if it carries a finite one (older senders do not)."""
    v = obj.get("sent") if isinstance(obj, dict) else None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


#: the most recent message ages each process keeps per kind for ``GET /v1/timings``
AGES_KEPT = 200_000
#: the most recent ages it keeps message by message (``message_key``), for the twin to replay each one
KEYED_KEPT = 500_000
#: histogram buckets of wall-second legs and ages: 50 µs to 2.5 s
WALL_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def sojourn_buckets(exp: Experiment) -> list[float]:
    """Histogram buckets in model seconds, spread around the mean service time (the dispatcher's and the
    load generator's sojourn histograms)."""
    m = exp.workload.service.mean / min(exp.node_speeds)
    return [round(m * f, 6) for f in (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 50)]


def message_key(m: Message) -> str:
    """What names one state message of a run: its kind, node, dispatcher and the data that name the event
    which made it (``MESSAGE_ID``: every kind's data holds a number that grows with each message of a node,
    a token's arrivals count or round, a notice's counts, a pool's event number), so that the twin finds
    the age the cluster measured for the same message."""
    ids = MESSAGE_ID.get(m.kind)
    data = m.data if ids is None else tuple(m.data[i] for i in ids if i < len(m.data))
    return f"{m.kind}:{m.node}:{m.dispatcher}:{','.join(map(str, data))}"


class MessageAges:
    """The age of every state message a process applied (its apply instant minus the sender's ``sent``),
    by kind: the histogram ``lbtestbed_<role>_message_age_seconds{kind}`` in wall seconds, and the most
    recent ages in model seconds for ``GET /v1/timings``, by kind (the twin draws from them) and message
    by message (``message_key``: the twin replays each message's own age where it sends the same one)."""

    def __init__(self, role: str, registry: Any, scale: float) -> None:
        from prometheus_client import Histogram

        self.histogram = Histogram(
            f"lbtestbed_{role}_message_age_seconds",
            f"Wall time from a state message's send to its apply at this {role}, by kind",
            ["kind"],
            buckets=WALL_BUCKETS,
            registry=registry,
        )
        self.scale = scale
        # (sent, age in model seconds) of messages sent on a request of their own, and of those that rode
        # on the reply to a request
        self.recent: dict[str, deque[tuple[float, float]]] = {}
        self.riders: dict[str, deque[tuple[float, float]]] = {}
        self.keyed: dict[str, float] = {}  # by message_key, oldest first

    def observe(self, m: Message, sent: float | None, now: float, rider: bool = False) -> None:
        if sent is None:
            return
        age = max(0.0, now - sent)
        self.histogram.labels(m.kind).observe(age)
        into = self.riders if rider else self.recent
        kept = into.get(m.kind)
        if kept is None:
            kept = into[m.kind] = deque(maxlen=AGES_KEPT)
        kept.append((sent, age / self.scale))
        keyed = self.keyed
        keyed[message_key(m)] = age / self.scale
        if len(keyed) > KEYED_KEPT:
            del keyed[next(iter(keyed))]

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/timings``'s body (ages in model seconds, and the time scale that converts them)."""
        return {
            "message_ages": {kind: [a for _, a in kept] for kind, kept in sorted(self.recent.items())},
            "message_sent": {kind: [s for s, _ in kept] for kind, kept in sorted(self.recent.items())},
            "rider_ages": {kind: [a for _, a in kept] for kind, kept in sorted(self.riders.items())},
            "rider_sent": {kind: [s for s, _ in kept] for kind, kept in sorted(self.riders.items())},
            "keyed_ages": self.keyed,
            "time_scale": self.scale,
        }


def message_from_json(obj: Any, where: str = "message") -> Message:
    if not isinstance(obj, dict):
        raise BadRequest(f"{where} must be an object", where)
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind or len(kind) > 64:
        raise BadRequest(f"{where}.kind must be a short string", f"{where}.kind")
    data = small_tuple(obj.get("data", []), f"{where}.data")
    return Message(kind, integer(obj, "node", where=where), data, integer(obj, "dispatcher", 0, where))


def small_tuple(v: Any, field: str) -> tuple[Any, ...]:
    """A message payload: an array of at most 16 finite numbers or booleans."""
    if not isinstance(v, list) or len(v) > 16:
        raise BadRequest(f"{field} must be an array of at most 16 values", field)
    for x in v:
        if not isinstance(x, bool | int | float) or not _finite(x):
            raise BadRequest(f"{field} holds finite numbers (integers up to 2^53) and booleans only", field)
    return tuple(v)


def parse_messages(body: Mapping[str, Any], allowed: Sequence[str]) -> list[Message]:
    """The ``messages`` array of a body, every one of a kind in ``allowed`` (so labels stay bounded)."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw or len(raw) > 64:
        raise BadRequest("messages must be an array of 1 to 64 messages", "messages")
    msgs = [message_from_json(m, f"messages[{i}]") for i, m in enumerate(raw)]
    for i, m in enumerate(msgs):
        if m.kind not in allowed:
            expected = ", ".join(allowed) or "none"
            raise BadRequest(
                f"unexpected message kind {m.kind!r} (expected: {expected})", f"messages[{i}].kind"
            )
    return msgs


def metrics_handler(registry: Any) -> Any:
    """An aiohttp handler serving a prometheus_client registry in the text exposition format."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


def timings_handler(ages: MessageAges) -> Any:
    """An aiohttp handler serving ``GET /v1/timings``: the recent ages of the messages applied here."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(ages.to_json())

    return handle


def run_with(app: web.Application, host: Any) -> web.Application:
    """Start ``host`` (its async ``start``) with the app and stop it (``stop``) when the app shuts down."""

    async def on_startup(_: web.Application) -> None:
        await host.start()

    async def on_cleanup(_: web.Application) -> None:
        await host.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def standard_collectors(registry: Any) -> None:
    """The client library's own collectors on a registry of ours (every process's ``/metrics``): the
    process (``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``, ...,
    read from ``/proc`` at the scrape), the platform (``python_info``) and the garbage collector
    (``python_gc_collections_total{generation}``, ...). docs/protocol.md, "Every process"."""
    from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def counters_by_kind(name: str, doc: str, counts: Mapping[str, int]) -> Any:
    """A counter family with one series per message kind (kinds are checked per policy: bounded)."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=["kind"])
    for kind, value in sorted(counts.items()):
        family.add_metric([kind], value)
    return family


def time_scale_gauge(scale: float) -> Any:
    """``lbtestbed_time_scale``: every process exports it so that dashboards can convert model seconds."""
    from prometheus_client.core import GaugeMetricFamily

    gauge = GaugeMetricFamily("lbtestbed_time_scale", "Wall seconds per model second")
    gauge.add_metric([], scale)
    return gauge


class Guard(Protocol):
    """What a listener's guard counts (``transport.process.ConnectionGuard``)."""

    @property
    def open(self) -> int: ...

    @property
    def refused(self) -> int: ...

    @property
    def shed(self) -> int: ...


def listener_metrics(role: str, guard: Guard | None, unauthorized: int) -> Any:
    """The listener's own families (``transport.process``, ``transport.signing``): connections open now,
    new connections closed at once because the process held its limit, silent ones closed to make room
    (all 0 for a host served without a guard, in a test), and requests refused with 401."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    open_now, refused, shed = (guard.open, guard.refused, guard.shed) if guard is not None else (0, 0, 0)

    gauge = GaugeMetricFamily(f"lbtestbed_{role}_connections_open", "Connections open to this process now")
    gauge.add_metric([], open_now)
    yield gauge
    closed = CounterMetricFamily(
        f"lbtestbed_{role}_connections_refused",
        "Connections closed at once: the process held its limit of open connections",
    )
    closed.add_metric([], refused)
    yield closed
    made_room = CounterMetricFamily(
        f"lbtestbed_{role}_connections_shed",
        "Connections that had sent nothing since they opened, closed at the limit to make room for a new one",
    )
    made_room.add_metric([], shed)
    yield made_room
    bad = CounterMetricFamily(
        f"lbtestbed_{role}_unauthorized",
        "Peer requests refused with 401: not signed with the cluster's key, replayed, or signed before "
        "this process started",
    )
    bad.add_metric([], unauthorized)
    yield bad
