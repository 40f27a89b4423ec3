"""An experiment written back as a spec document: the form in which it travels whole.

``document(exp)`` is a complete TOML document (every table, defaults written out, the time scale as the
number it was resolved to) that ``lbtestbed.spec.parse_spec`` reads back as ``exp`` itself: a cluster file
holds it, so that every process of a cluster runs the experiment its parent resolved, without reading the
spec file or applying overrides again (docs/design.md, principle 1).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

from lbtestbed.model.distributions import SizeDistribution, SpeedSpec
from lbtestbed.model.experiment import (
    GRAY_FAULTS,
    MESSAGE_FAULTS,
    PROCESS_FAULTS,
    Experiment,
    Fault,
    NodeClass,
)
from lbtestbed.model.schedules import Antagonist, Entry, Step


def document(exp: Experiment) -> dict[str, Any]:
    """The complete spec document of ``exp`` (module docstring)."""
    w, run = exp.workload, exp.run
    workload: dict[str, Any] = {"service": size(w.service)}
    workload[w.given] = {"load": w.load, "arrival_rate": w.arrival_rate, "beta": w.beta}[w.given]
    out: dict[str, Any] = {
        "name": exp.name,
        "seed": exp.seed,
        "classes": [_node_class(c) for c in exp.classes],
        "workload": workload,
        "policy": exp.policy.table(),
        "run": {
            "warmup": run.warmup,
            "duration": run.duration,
            "time_scale": run.time_scale,
            "batches": run.batches,
            "tolerance": "off" if run.tolerance is None else run.tolerance,
        },
        "health": dataclasses.asdict(exp.health),
    }
    network: dict[str, Any] = {"forward_tasks": exp.network.forward_tasks}
    if exp.network.delay is not None:
        network["delay"] = size(exp.network.delay)
    out["network"] = network
    if exp.faults:
        out["faults"] = [_fault(f) for f in exp.faults]
    if exp.nodes:
        out["nodes"] = [
            {"node": o.node}
            | ({"speed_schedule": [_entry(e) for e in o.schedule]} if o.schedule is not None else {})
            | ({"antagonist": _antagonist(o.antagonist)} if o.antagonist is not None else {})
            for o in exp.nodes
        ]
    return out


def size(d: SizeDistribution) -> dict[str, Any]:
    """A work size or delay table."""
    table: dict[str, Any] = {"dist": d.dist, "mean": d.mean}
    if d.dist in ("hyperexponential", "lognormal"):
        table["scv"] = d.scv
    return table


def _speed(s: SpeedSpec) -> Any:
    if s.value is not None:
        return _fraction(s.value)
    return {"dist": "uniform", "low": s.low, "high": s.high}


def _fraction(v: Fraction) -> str:
    """An exact speed: "p/q" reads back as the same fraction (a float would not, in general)."""
    return f"{v.numerator}/{v.denominator}"


def _node_class(c: NodeClass) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": c.name,
        "count": c.count,
        "discipline": c.discipline,
        "speed": _speed(c.speed),
    }
    if c.utility is not None:
        out["utility"] = c.utility.table()
    if c.speed_schedule:
        out["speed_schedule"] = [_entry(e) for e in c.speed_schedule]
    if c.antagonist is not None:
        out["antagonist"] = _antagonist(c.antagonist)
    if c.weight is not None:
        out["weight"] = c.weight
    return out


def _entry(e: Entry) -> dict[str, Any]:
    if isinstance(e, Step):
        return {"at": e.at, "factor": e.factor}
    ramp: dict[str, Any] = {"start": e.start, "end": e.end, "to": e.to, "steps": e.steps}
    if e.frm is not None:
        ramp["from"] = e.frm
    return ramp


def _antagonist(a: Antagonist) -> dict[str, Any]:
    return {"factor": a.factor, "mean_on": a.mean_on, "mean_off": a.mean_off}


def _fault(f: Fault) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": f.kind, "at": f.at, "until": f.until, "settle": f.settle}
    if f.kind in PROCESS_FAULTS:
        out["node"] = f.node
    elif f.kind == "restart_dispatcher":
        out["dispatcher"] = f.dispatcher
    elif f.kind in GRAY_FAULTS:
        out["node"] = f.node
        out |= {"speed": f.speed} if f.kind == "slow" else {"fraction": f.fraction}
    elif f.kind in MESSAGE_FAULTS:
        out["messages"] = list(f.messages)
        if f.kind == "delay":
            assert f.delay is not None
            out["delay"] = size(f.delay)
        else:
            out["fraction"] = f.fraction
    return out
