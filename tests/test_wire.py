"""The wire codec's JSON reader (lbtestbed/transport/wire.py, ``decode_json``): orjson reads the usual body
first, and wherever it reads one it must read what the standard library reads, values and types alike;
what it refuses goes to the standard reader, which decides as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbtestbed.transport import wire

# JSON values with the edges that tell the two readers apart: integers of any size (orjson reads those
# beyond 64 bits as floats), floats near the ends of their range, strings with escapes and non-ASCII
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def typed(v: Any) -> Any:
    """``v`` with the type of every number kept, so that 1 and 1.0 compare different."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    return (type(v).__name__, v)


def standard(raw: bytes) -> Any:
    """What the standard library reads (the reader before the fast path), or the error's status."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return 400
    return typed(body) if isinstance(body, dict) else 400


def decoded(raw: bytes) -> Any:
    try:
        return typed(wire.decode_json(raw))
    except wire.BadRequest as e:
        return e.status


@settings(max_examples=400, derandomize=True)
@given(body=st.dictionaries(st.text(max_size=8), values, max_size=5), spaced=st.booleans())
def test_a_body_reads_as_the_standard_reader_reads_it(body: dict[str, Any], spaced: bool) -> None:
    raw = json.dumps(body, separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=spaced).encode()
    assert decoded(raw) == standard(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"work": 18446744073709551616}',  # beyond 64 bits: an integer, not a float
        b'{"work": -9223372036854775809}',
        b'{"work": 1e400}',  # infinity, which the checks refuse later
        b'{"work": NaN}',
        b'{"work": Infinity}',
        b'{"a": "\\ud800"}',  # a lone surrogate
        b'{"a": 1, "a": 2}',
        b"\xef\xbb\xbf{}",  # a byte-order mark
        b'{"a": "\xff"}',  # not UTF-8
        b"[1, 2]",
        b"",
        b"[" * 5000,
        b'{"a": 1} x',
    ],
)
def test_the_edges_read_as_the_standard_reader_reads_them(raw: bytes) -> None:
    assert decoded(raw) == standard(raw)


def test_a_charset_other_than_utf8_is_read_by_the_standard_reader() -> None:
    raw = '{"a": "é"}'.encode("latin-1")
    assert wire.decode_json(raw, "latin-1") == {"a": "é"}
    with pytest.raises(wire.BadRequest):
        wire.decode_json(raw)  # not UTF-8
