"""Signed requests between the processes of a cluster (docs/protocol.md, "Authentication: signed requests").

No secret travels on the wire. Every request one cluster process sends another carries a MAC, under the
cluster's shared key, of what it asks for: the method, the receiver's address (host:port, as
in the cluster file), the path, the sender's id, a counter, the time and the body::

    Authorization: LBT-MAC 3f9c2a71d04e5b86:1042:1767268800.123456:9d0c...  (sender:counter:time:mac)

The MAC is keyed BLAKE2b with a 128-bit tag (RFC 7693, keyed mode: a MAC by design, like HMAC, and
about twice as fast as HMAC-SHA256 on the small bodies of the task path: signing a task's request,
checking it, and signing and checking its answer cost about 7 µs in all on this kind of machine, against a
few hundred µs per task through dispatcher and node; each MAC starts from a copy of the keyed state, which
saves hashing the key's block every time).

The receiver refuses (401) a request whose MAC is wrong (another body, path or receiver), whose
(sender, counter) it has seen (a replay), or that was signed before the receiver itself started (a
request captured before a restart). Its answer carries ``X-LBT-Signature``, a MAC of (sender, counter,
time, status, body), which the sender checks: a process that does not hold the key (a squatter on a dead
process's port) can neither forge a request, nor replay one, nor answer one.

Replays are caught without a clock window: every sender numbers its requests, and a receiver keeps per
sender the highest number seen and the numbers seen within ``WINDOW`` below it. A request that arrives
more than ``WINDOW`` numbers late is refused like a replay; on one machine requests overtake each other
by far less. So a stopped receiver (SIGSTOP) that reads its requests late still accepts them.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import time
from urllib.parse import urlsplit

SCHEME = "LBT-MAC"
AUTHORIZATION = "Authorization"
SIGNATURE = "X-LBT-Signature"
#: requests of one sender may overtake each other by this many before the late one is refused
WINDOW = 1 << 16
_REQUEST = b"LBT-MAC request\n"
_ANSWER = b"LBT-MAC answer\n"


class Unauthorized(Exception):
    """A request the receiver refuses with 401; the message says why (it goes to the client)."""


def authority(url: str) -> str:
    """``host:port`` of a process's URL: what a request to it is signed for."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 80}"


def _host_port(host: str) -> bytes:
    """A Host header as host:port (port 80 when it names none)."""
    return (host if ":" in host.rsplit("]", 1)[-1] else f"{host}:80").encode()


class _Keyed:
    """BLAKE2b keyed with the cluster's key: the key's block is hashed once, and each MAC starts from a copy
    of that state (half the work of keying every MAC anew, on bodies this small)."""

    __slots__ = ("state",)

    def __init__(self, key: bytes) -> None:
        self.state = hashlib.blake2b(key=key, digest_size=16)

    def mac(self, data: bytes) -> str:
        h = self.state.copy()
        h.update(data)
        return h.hexdigest()


class Signer:
    """The sender's side: signs each request and checks that its answer comes from a holder of the key."""

    def __init__(self, key: str) -> None:
        self.key = key.encode()
        self._keyed = _Keyed(self.key)
        self.sender = secrets.token_hex(8)  # this process's id among the senders a receiver knows
        self._sender = self.sender.encode()
        self._counter = itertools.count(1)

    def sign(self, method: bytes, to: bytes, path: bytes, body: bytes) -> tuple[bytes, bytes]:
        """The ``Authorization`` value for a request to ``to`` (host:port), and the tag its answer's
        signature is checked against (``answer_ok``)."""
        tag = b"%s:%d:%.6f" % (self._sender, next(self._counter), time.time())
        mac = self._keyed.mac(b"%s%s\n%s\n%s\n%s\n%s" % (_REQUEST, method, to, path, tag, body))
        return b"LBT-MAC %s:%s" % (tag, mac.encode()), tag

    def answer_ok(self, tag: bytes, status: int, body: bytes, signature: bytes | str | None) -> bool:
        """Whether an answer (status, body) to the request of ``tag`` was signed with the key."""
        if not signature:
            return False
        if isinstance(signature, str):
            signature = signature.encode("ascii", "replace")
        expected = self._keyed.mac(b"%s%s\n%d\n%s" % (_ANSWER, tag, status, body)).encode()
        return hmac.compare_digest(expected, signature.strip())

    def headers(self, method: str, url: str, body: bytes = b"") -> tuple[dict[str, str], bytes]:
        """Headers for a request to the full ``url`` (an aiohttp client's), and the answer's tag."""
        path = (urlsplit(url).path or "/").encode()
        value, tag = self.sign(method.encode(), authority(url).encode(), path, body)
        return {AUTHORIZATION: value.decode()}, tag


class _Seen:
    """The request numbers of one sender seen by a receiver: the highest, and those within WINDOW of it."""

    __slots__ = ("highest", "numbers")

    def __init__(self) -> None:
        self.highest = 0
        self.numbers: set[int] = set()

    def first_time(self, n: int) -> bool:
        if n <= self.highest - WINDOW or n in self.numbers:
            return False
        self.numbers.add(n)
        if n > self.highest:
            self.highest = n
            if len(self.numbers) > 2 * WINDOW:  # forget what can no longer be accepted anyway
                floor = n - WINDOW
                self.numbers = {x for x in self.numbers if x > floor}
        return True


class Verifier:
    """The receiver's side: checks each request's signature and freshness and signs its answer."""

    def __init__(self, key: str, url: str | None = None) -> None:
        self.key = key.encode()
        self._keyed = _Keyed(self.key)
        # requests must be signed for this receiver's address; a receiver that does not know its own (an
        # app built in a test) takes the Host header's, which binds a request to the address it was sent to
        self.to = authority(url).encode() if url else None
        self.started = time.time()  # requests signed earlier were meant for an earlier process
        self.seen: dict[bytes, _Seen] = {}
        self.refused = 0

    def verify(self, method: str, path: str, value: str | None, body: bytes, host: str = "") -> bytes:
        """Check a request (``host``: its Host header); returns the tag to sign its answer with
        (``sign``). Unauthorized if refused."""
        try:
            return self._verify(method, path, value, body, self.to or _host_port(host))
        except Unauthorized:
            self.refused += 1
            raise

    def _verify(self, method: str, path: str, value: str | None, body: bytes, to: bytes) -> bytes:
        if not value:
            raise Unauthorized("missing signature (Authorization: LBT-MAC sender:counter:time:mac)")
        if not value.isascii():  # hmac.compare_digest refuses non-ASCII strings with TypeError
            raise Unauthorized("malformed signature (non-ASCII characters)")
        scheme, _, rest = value.partition(" ")
        tag, _, mac = rest.rpartition(":")
        parts = tag.split(":")
        if scheme != SCHEME or len(parts) != 3 or len(tag) > 128 or not parts[1].isdigit():
            raise Unauthorized("malformed signature (expected LBT-MAC sender:counter:time:mac)")
        raw = tag.encode()
        data = b"%s%s\n%s\n%s\n%s\n%s" % (_REQUEST, method.encode(), to, path.encode(), raw, body)
        if not hmac.compare_digest(self._keyed.mac(data), mac):
            raise Unauthorized("wrong signature")
        sender, n, stamp = parts
        try:
            signed_at = float(stamp)
        except ValueError:
            raise Unauthorized("malformed signature time") from None
        if signed_at < self.started:
            raise Unauthorized("signed before this process started")
        seen = self.seen.get(sender.encode())
        if seen is None:
            seen = self.seen[sender.encode()] = _Seen()
        if not seen.first_time(int(n)):
            raise Unauthorized("replayed request")
        return raw

    def sign(self, tag: bytes, status: int, body: bytes) -> str:
        """The ``X-LBT-Signature`` of an answer to the request of ``tag``."""
        return self._keyed.mac(b"%s%s\n%d\n%s" % (_ANSWER, tag, status, body))
