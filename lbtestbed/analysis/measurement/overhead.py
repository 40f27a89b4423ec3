"""Where the time goes: the legs of every task and the ages of state messages, summarised.

A task's sojourn as the client measures it (from its intended send to the reply) is the model's time at
the node (``stay``) plus the emulation's own costs, leg by leg (docs/run.md, "Where the time goes"):

* ``late``: the generator's lateness, from the intended send to the request leaving;
* ``to_dispatcher``: from the request leaving to the dispatcher accepting it;
* ``decide``: from the accept to the routing decision (probes included);
* ``forward``: from the decision to the node's arrival instant;
* ``reply``: from the node's completion instant to the client reading the reply (the node's timer error,
  its reply, the dispatcher's reply); ``notify`` is the part of it up to the dispatcher reading the reply;
* ``total``: the sojourn minus the stay, the whole transport-and-dispatch overhead.

Each is given as p50 and p99, in wall milliseconds and in model seconds.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lbtestbed.loadgen.openloop import TaskRecord

LEGS = ("late", "to_dispatcher", "decide", "forward", "notify", "reply", "total")


def _leg(r: TaskRecord, name: str) -> float:
    if name == "to_dispatcher":
        return r.arrive - r.late
    if name == "total":
        return r.sojourn - r.stay
    return float(getattr(r, name))


def _quantiles(values: Sequence[float] | np.ndarray, scale: float) -> dict[str, float | int | None]:
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    if not x.size:
        return {"p50_ms": None, "p99_ms": None, "p50_model": None, "p99_model": None, "count": 0}
    p50, p99 = (float(np.quantile(x, q)) for q in (0.5, 0.99))
    return {
        "p50_ms": 1e3 * p50 * scale,
        "p99_ms": 1e3 * p99 * scale,
        "p50_model": p50,
        "p99_model": p99,
        "count": int(x.size),
    }


def overhead_of(
    records: Sequence[TaskRecord],
    scale: float,
    message_ages: Mapping[str, Sequence[float]],
    rider_ages: Mapping[str, Sequence[float]],
    kinds: Sequence[str] = (),
) -> dict[str, Any]:
    """``results.json``'s ``overhead`` object. The ages are given for every message kind of ``kinds``
    (the policy's) and every other kind measured, a kind without messages with count 0, so that every run
    of a spec has the same keys."""
    legs = {name: _quantiles([_leg(r, name) for r in records], scale) for name in LEGS}

    def by_kind(ages: Mapping[str, Sequence[float]]) -> dict[str, Any]:
        return {k: _quantiles(ages.get(k, ()), scale) for k in sorted({*kinds, *ages})}

    return {
        "legs": legs,
        "message_age": by_kind(message_ages),
        "rider_age": by_kind(rider_ages),
        "clock": "CLOCK_MONOTONIC of one machine, shared by every process of the cluster",
    }


FIELDS = TaskRecord._fields


def write_records(path: Path, records: Sequence[TaskRecord]) -> None:
    """The per-task records, one CSV row each (model seconds; NaN where a leg was not stamped)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for r in records:
            w.writerow([repr(v) if isinstance(v, float) else int(v) if isinstance(v, bool) else v for v in r])
