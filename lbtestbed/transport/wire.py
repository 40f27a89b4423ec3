"""The wire protocol's codec: JSON over HTTP, version 1 (docs/protocol.md), without the HTTP.

Bodies are small JSON objects. This module turns them into values and back and checks their fields: state
messages to and from JSON, numbers and integers within the protocol's bounds, and the answers a process
gives (``Reply``: a status and a JSON object). It reads no socket and no clock and knows no web framework;
``transport.aiohttp_glue`` serves it with aiohttp, and any other server can call the same functions.
Errors are JSON too: ``{"error": "...", "field": "..."}`` with status 400 (malformed), 401 (not signed, or
a replay), 413 (too large) or 503 (a node at its task limit).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from lbtestbed.policies import MESSAGE_ID
from lbtestbed.policies.base import Message

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


class Reply(NamedTuple):
    """An answer to a request: its status and its JSON object. ``compact``: encoded without spaces by the
    fast encoder (the task path's answers), otherwise as the standard library's ``json.dumps`` does."""

    status: int
    body: Mapping[str, Any]
    compact: bool = False


def error_reply(status: int, message: str, field: str = "", **extra: Any) -> Reply:
    """A JSON error; ``extra`` adds fields (the node of a lost or refused task)."""
    return Reply(status, error_body(message, field, **extra))


def error_body(message: str, field: str = "", **extra: Any) -> dict[str, Any]:
    """The body of a JSON error (docs/protocol.md, "Conventions")."""
    body: dict[str, Any] = {"error": message, **extra}
    if field:
        body["field"] = field
    return body


def bad_request(e: BadRequest) -> Reply:
    """The answer to a request that ``e`` found malformed."""
    return error_reply(e.status, str(e), e.field)


#: 19 digits in a row: maybe an integer beyond 64 bits, which orjson would read as a float
_LONG_DIGITS = re.compile(rb"\d{19}")


def decode_json(raw: bytes, charset: str | None = None) -> Mapping[str, Any]:
    """A request body's JSON object (``charset``: the request's, UTF-8 if none), or BadRequest.

    The standard library's reader decides; orjson reads the usual body first, several times faster, and
    where it reads a body at all it reads the same values (tests/test_wire.py holds it to that): a body
    in UTF-8 without an integer of 19 digits or more (orjson reads one beyond 64 bits as a float). What it
    refuses (NaN, 1e400, a lone surrogate, deep nesting, anything malformed) the standard reader reads
    or refuses as before."""
    if (charset is None or charset.lower() == "utf-8") and not _LONG_DIGITS.search(raw):
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            return body
    try:
        body = json.loads(raw.decode(charset or "utf-8"))
    except LookupError:
        raise BadRequest(f"unknown charset {charset!r}") from None
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: absurdly deep nesting
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


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


def task_work(body: Mapping[str, Any], max_work: float) -> float:
    """A task's ``work``: positive, finite and at most ``max_work`` (``MAX_WORK_MEANS`` mean works)."""
    work = number(body, "work", positive=True)
    if work > max_work:
        raise BadRequest(f"work above {max_work:g} ({MAX_WORK_MEANS:g} mean works)", "work")
    return work


def fault_switch(body: Mapping[str, Any]) -> tuple[int, bool]:
    """``POST /v1/faults``'s ``{"fault": i, "active": true}``: the fault's index and its new state."""
    index = integer(body, "fault")
    active = body.get("active")
    if not isinstance(active, bool):
        raise BadRequest("active must be true or false", "active")
    return index, active


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


def message_key(m: Message) -> str:
    """What names one state message of a run: its kind, node, dispatcher and the data that name the event
    which made it (``MESSAGE_ID``: every kind's data holds a number that grows with each message of a node,
    a token's arrivals count or round, a notice's counts, a pool's event number), so that the twin finds
    the age the cluster measured for the same message."""
    ids = MESSAGE_ID.get(m.kind)
    data = m.data if ids is None else tuple(m.data[i] for i in ids if i < len(m.data))
    return f"{m.kind}:{m.node}:{m.dispatcher}:{','.join(map(str, data))}"


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
