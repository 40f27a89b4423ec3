"""Reading a spec document into an ``Experiment``: the tables the model owns.

``read_experiment`` validates a decoded TOML document (classes, workload, run, network, health, faults,
nodes) and hands the ``[policy]`` table to the policy's own parameter class, which a ``PolicyLibrary`` (the
policy library's catalog, ``lbtestbed.policies``) finds by name: the model names no policy. Every problem
raises ``SpecError`` (one line: file, key, what is wrong); nothing runs on a spec that did not validate.
``lbtestbed.spec`` puts the two together (``load_spec``). Every key is documented in ``docs/spec.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

from lbtestbed.model import keys
from lbtestbed.model.distributions import SizeDistribution, SpeedSpec
from lbtestbed.model.experiment import (
    COMMON_POLICY_KEYS,
    GRAY_FAULTS,
    MAX_ARRIVALS,
    MAX_BATCHES,
    MAX_MODEL_SECONDS,
    MAX_NAME,
    MAX_NODES,
    MAX_PROCESS_BYTES,
    MAX_SEED,
    MAX_SPEED_CHANGES,
    MEASURED_TASK_BYTES,
    NODE_BYTES,
    PROCESS_FAULTS,
    SENT_TASK_BYTES,
    Experiment,
    Fault,
    HealthSpec,
    NetworkSpec,
    NodeClass,
    PolicyParams,
    RunSpec,
    Workload,
    draw_speeds,
)
from lbtestbed.model.files import MAX_DEPTH, MAX_SPEC_BYTES, TooLarge, read_limited, too_deep
from lbtestbed.model.reader import SpecError, TableReader, show
from lbtestbed.model.schedules import Antagonist, Entry, NodeSpeed, Ramp, Step
from lbtestbed.model.utility import TableUtility, Utility, XLogUtility, first_concavity_violation


class PolicyLibrary(Protocol):
    """What the spec reader needs of the policy library: a policy's parameters by name or alias."""

    def names(self) -> tuple[str, ...]:
        """Every name (and alias) a spec may give ``policy.name``, in the order errors list them."""
        ...

    def params(self, name: str) -> type[PolicyParams]:
        """The parameter class of the policy called ``name`` (one of ``names()``)."""
        ...

    def canonical(self, name: str) -> str:
        """The policy's own name for ``name`` (an alias or the name itself)."""
        ...


_FRACTION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)\s*)?$")


def _parse_speed(r: TableReader) -> SpeedSpec:
    if not r.has("speed"):
        return SpeedSpec(value=Fraction(1))
    v = r.get("speed")
    if isinstance(v, Mapping):
        s = TableReader(r.source, v, r.key("speed"))
        s.check_keys(keys.SPEED_RANGE.names)
        keys.SPEED_RANGE["dist"].read(s)
        low, high = keys.SPEED_RANGE["low"].read(s), keys.SPEED_RANGE["high"].read(s)
        if high <= low:
            raise s.fail("high", f"must exceed low ({low:g}), got {high:g}")
        return SpeedSpec(low=low, high=high)
    if isinstance(v, str):
        m = _FRACTION.match(v)
        if not m:
            raise r.fail("speed", f'must be a number, a fraction like "2/3" or a table, got {v!r}')
        if m.group(2) is not None and Fraction(m.group(2)) == 0:
            raise r.fail("speed", f"the denominator of {v!r} is zero")
        value = Fraction(m.group(1)) / Fraction(m.group(2) or 1)
    else:
        # str() keeps the decimal the user wrote: 0.2 becomes exactly 1/5, so speed ratios tie exactly
        value = Fraction(str(r.as_number("speed", v)))
    if value <= 0:
        raise r.fail("speed", f"must be positive, got {v!r}")
    return SpeedSpec(value=value)


def _parse_utility(r: TableReader) -> Utility | None:
    if not r.has("utility"):
        return None
    u = r.sub("utility")
    kind = keys.UTILITY["kind"].read(u)
    if kind == "xlog":
        u.check_keys(keys.UTILITY.only("kind", "r"))
        return XLogUtility(keys.UTILITY["r"].read(u))
    u.check_keys(keys.UTILITY.only("kind", "values"))
    values = u.require("values")
    if not isinstance(values, list) or len(values) < 2:
        raise u.fail("values", "must be an array of at least two numbers u(0), u(1), ...")
    nums = [u.as_number(f"values[{i}]", x, positive=None) for i, x in enumerate(values)]
    bad = first_concavity_violation(nums)
    if bad is not None:
        raise u.fail(
            "values", f"utility must be concave: u({bad + 1}) - u({bad}) exceeds u({bad}) - u({bad - 1})"
        )
    return TableUtility(nums)


def _parse_size(r: TableReader, name: str) -> SizeDistribution:
    v = r.get(name)
    if isinstance(v, int | float) and not isinstance(v, bool):
        return SizeDistribution.of("deterministic", r.as_number(name, v))
    t = r.sub(name)
    dist = keys.SIZE["dist"].read(t)
    needs_scv = dist in keys.WITH_SCV
    t.check_keys(keys.SIZE.only("dist", "mean", "scv") if needs_scv else keys.SIZE.only("dist", "mean"))
    mean = keys.SIZE["mean"].read(t)
    scv = keys.SIZE["scv"].read(t) if needs_scv else None
    if dist == "hyperexponential" and scv is not None and scv < 1:
        raise t.fail("scv", f"a hyperexponential has scv >= 1, got {scv:g} (use lognormal below 1)")
    return SizeDistribution.of(dist, mean, scv)


def _parse_class(r: TableReader) -> NodeClass:
    r.check_keys(keys.CLASS.names)
    return NodeClass(
        name=keys.CLASS["name"].read(r),
        count=keys.CLASS["count"].read(r),
        discipline=keys.CLASS["discipline"].read(r),
        speed=_parse_speed(r),
        utility=_parse_utility(r),
        speed_schedule=_parse_schedule(r) or (),
        antagonist=_parse_antagonist(r),
        weight=keys.CLASS["weight"].read(r) if r.has("weight") else None,
    )


def _parse_schedule(r: TableReader) -> tuple[Entry, ...] | None:
    """``speed_schedule``: steps {at, factor} and ramps {start, end, to, from, steps}, in time order."""
    if not r.has("speed_schedule"):
        return None
    raw = r.get("speed_schedule")
    if not isinstance(raw, list):
        raise r.fail("speed_schedule", "must be an array of steps {at, factor} and ramps {start, end, to}")
    entries: list[Entry] = []
    for j, v in enumerate(raw):
        if not isinstance(v, Mapping):
            raise r.fail(
                f"speed_schedule[{j}]", "must be a table: a step {at, factor} or a ramp {start, end, to}"
            )
        e = TableReader(r.source, v, r.key(f"speed_schedule[{j}]"))
        entry: Entry
        if e.has("at"):
            e.check_keys(keys.STEP.names)
            entry = Step(keys.STEP["at"].read(e), keys.STEP["factor"].read(e))
        elif any(e.has(k) for k in keys.RAMP.names):
            e.check_keys(keys.RAMP.names)
            start, end = keys.RAMP["start"].read(e), keys.RAMP["end"].read(e)
            if end <= start:
                raise e.fail("end", f"must come after start ({start:g}), got {end:g}")
            frm = keys.RAMP["from"].read(e) if e.has("from") else None
            entry = Ramp(start, end, keys.RAMP["to"].read(e), frm, keys.RAMP["steps"].read(e))
        else:
            raise e.fail("at", "missing: a step has at and factor, a ramp start, end and to")
        if entries and entry.begins < entries[-1].ends:
            key = "at" if isinstance(entry, Step) else "start"
            raise e.fail(
                key,
                f"must not come before the previous entry ends ({entries[-1].ends:g}), got {entry.begins:g}",
            )
        entries.append(entry)
    return tuple(entries)


def _parse_antagonist(r: TableReader) -> Antagonist | None:
    """``antagonist = {factor, mean_on, mean_off}``: an on/off process slowing each node it acts on."""
    if not r.has("antagonist"):
        return None
    a = r.sub("antagonist")
    a.check_keys(keys.ANTAGONIST.names)
    factor, on, off = (keys.ANTAGONIST[k].read(a) for k in ("factor", "mean_on", "mean_off"))
    return Antagonist(factor, on, off)


def _parse_nodes(top: TableReader, n: int) -> tuple[NodeSpeed, ...]:
    """``[[nodes]]``: a node's own speed schedule and antagonist, each in place of its class's."""
    if not top.has("nodes"):
        return ()
    raw = top.get("nodes")
    if not isinstance(raw, list):
        raise top.fail("nodes", "must be an array of [[nodes]] tables")
    out: list[NodeSpeed] = []
    for i, v in enumerate(raw):
        if not isinstance(v, Mapping):
            raise top.fail(f"nodes[{i}]", "must be a table")
        r = TableReader(top.source, v, f"nodes[{i}]")
        r.check_keys(keys.NODE.names)
        node = keys.NODE["node"].read(r, maximum=n - 1)
        if any(o.node == node for o in out):
            raise r.fail("node", f"node {node} has another [[nodes]] table")
        if not r.has("speed_schedule") and not r.has("antagonist"):
            raise r.fail("speed_schedule", "missing: give speed_schedule, antagonist or both")
        out.append(NodeSpeed(node, _parse_schedule(r), _parse_antagonist(r)))
    return tuple(out)


def _check_speeds_over_time(top: TableReader, exp: Experiment) -> None:
    """Schedules within the run; antagonists' expected switches (and schedules' steps) within the limit."""
    end = exp.run.warmup + exp.run.duration
    horizon = exp.run.warmup + 2 * exp.run.duration
    owners: list[tuple[str, tuple[Entry, ...], Antagonist | None, int]] = [
        (f"classes[{i}]", c.speed_schedule, c.antagonist, c.count) for i, c in enumerate(exp.classes)
    ]
    owners += [(f"nodes[{i}]", o.schedule or (), o.antagonist, 1) for i, o in enumerate(exp.nodes)]
    changes = 0.0
    for where, schedule, antagonist, count in owners:
        for j, e in enumerate(schedule):
            if e.ends > end:
                key = f"{where}.speed_schedule[{j}].{'at' if isinstance(e, Step) else 'end'}"
                raise top.fail(key, f"must lie within the run (warmup + duration = {end:g}), got {e.ends:g}")
            changes += count * (1 if isinstance(e, Step) else e.steps + 1)
        if antagonist is not None:
            changes += count * (1 + 2 * horizon / (antagonist.mean_on + antagonist.mean_off))
            if changes > MAX_SPEED_CHANGES:
                raise top.fail(
                    f"{where}.antagonist",
                    f"about {changes:.3g} speed changes in all over warmup + 2 x duration = {horizon:g} "
                    f"model s (the run and its longest drain): at most {MAX_SPEED_CHANGES:.0e}; "
                    "lengthen mean_on and mean_off",
                )
        if changes > MAX_SPEED_CHANGES:
            raise top.fail(
                f"{where}.speed_schedule",
                f"{changes:.3g} speed changes in all: at most {MAX_SPEED_CHANGES:.0e}; use fewer ramp steps",
            )


def _halfin_whitt_rate(
    w: TableReader, seed: int, classes: Sequence[NodeClass], service: SizeDistribution, beta: float
) -> float:
    """lambda = sum_k mu_k - beta sqrt(n) for the drawn speeds, mu_k = s_k / mean work (docs/theory.md,
    "The heterogeneous-JSQ model")."""
    if any(c.discipline == "pool" for c in classes):
        raise w.fail("beta", "beta sets the spare capacity of fcfs or ps nodes; pools have no capacity")
    speeds = draw_speeds(seed, classes)
    capacity = sum(speeds) / service.mean
    rate = capacity - beta * math.sqrt(len(speeds))
    if rate <= 0:
        raise w.fail(
            "beta",
            f"beta = {beta:g} leaves no arrivals: beta sqrt(n) = {beta * math.sqrt(len(speeds)):.4g} is at "
            f"least the {capacity:.4g} tasks per second the drawn speeds serve",
        )
    return rate


def _check_size(rr: TableReader, n: int, rate: float, run: RunSpec) -> None:
    """Refuse a run longer or a simulation larger than any process can take (docs/spec.md, Limits)."""
    arrivals = rate * (run.warmup + run.duration)
    if arrivals > MAX_ARRIVALS:
        longest = MAX_ARRIVALS / rate
        raise rr.fail(
            "duration" if run.duration >= run.warmup else "warmup",
            f"warmup + duration = {run.warmup + run.duration:g} model s brings {arrivals:.3g} tasks at "
            f"{rate:g} per model s: at most {MAX_ARRIVALS:.0e} ({longest:.4g} model s)",
        )
    need = n * NODE_BYTES + rate * run.duration * MEASURED_TASK_BYTES
    if need > MAX_PROCESS_BYTES:
        raise rr.fail(
            "duration",
            f"the simulation would hold {need / 2**30:.3g} GiB ({n:,} nodes, {rate * run.duration:.3g} "
            f"measured tasks): at most {MAX_PROCESS_BYTES / 2**30:g} GiB per process",
        )


def sent_tasks_problem(exp: Experiment, model_seconds: float, what: str = "the load") -> str | None:
    """Why a load generator cannot hold ``model_seconds`` of the spec's arrivals (the schedule and a record
    of each answer), or None; for ``lbt load`` and ``lbt run`` before anything starts."""
    tasks = exp.workload.arrival_rate * model_seconds
    need = tasks * SENT_TASK_BYTES
    if need <= MAX_PROCESS_BYTES:
        return None
    most = MAX_PROCESS_BYTES / SENT_TASK_BYTES / exp.workload.arrival_rate
    return (
        f"{exp.source}: {what} of {model_seconds:g} model s sends {tasks:.3g} tasks, which the generator "
        f"would hold in {need / 2**30:.3g} GiB: at most {MAX_PROCESS_BYTES / 2**30:g} GiB per process "
        f"({most:.4g} model s at this rate)"
    )


def _parse_faults(top: TableReader, spec: PolicyParams, n: int, run: RunSpec) -> tuple[Fault, ...]:
    if not top.has("faults"):
        return ()
    raw = top.get("faults")
    if not isinstance(raw, list):
        raise top.fail("faults", "must be an array of [[faults]] tables")
    policy = spec.name
    one_way = tuple(k for k in spec.message_kinds() if k not in ("probe", "probe_reply"))
    end = run.warmup + run.duration
    faults: list[Fault] = []
    for i, v in enumerate(raw):
        if not isinstance(v, Mapping):
            raise top.fail(f"faults[{i}]", "must be a table")
        f = TableReader(top.source, v, f"faults[{i}]")
        kind = keys.FAULT["kind"].read(f)
        f.check_keys((*keys.FAULT_COMMON, *keys.FAULT_KEYS[kind]))
        at, until = keys.FAULT["at"].read(f), keys.FAULT["until"].read(f)
        # a restarted node starts empty, and the warm-up is what the spec allows to reach equilibrium
        # from empty; a fault that builds a backlog (a long pause) may need more
        settle = keys.FAULT["settle"].read(f, default=run.warmup)
        if until <= at:
            raise f.fail("until", f"must come after at ({at:g}), got {until:g}")
        if until > end:
            raise f.fail("until", f"must lie within the run (warmup + duration = {end:g}), got {until:g}")
        fault = Fault(kind, at, until)
        if kind in PROCESS_FAULTS:
            fault = Fault(kind, at, until, node=keys.FAULT["node"].read(f, maximum=n - 1))
        elif kind == "restart_dispatcher":
            fault = Fault(kind, at, until, dispatcher=keys.FAULT["dispatcher"].read(f))
        elif kind in GRAY_FAULTS:
            node = keys.FAULT["node"].read(f, maximum=n - 1)
            for j, other in enumerate(faults):
                if other.kind == kind and other.node == node and at < other.until and other.at < until:
                    raise f.fail("at", f"overlaps faults[{j}], another {kind} fault of node {node}")
            if kind == "slow":
                speed = keys.FAULT["speed"].read(f)
                if speed >= 1:
                    raise f.fail(
                        "speed", f"a slow node serves at a fraction of its speed: in (0, 1), got {speed:g}"
                    )
                fault = Fault(kind, at, until, node=node, speed=speed)
            else:
                fraction = keys.FAULT["fraction"].read(f)
                if fraction > 1:
                    raise f.fail("fraction", f"must lie in (0, 1], got {fraction:g}")
                fault = Fault(kind, at, until, node=node, fraction=fraction)
        else:
            if not one_way:
                raise f.fail("kind", f"{policy} sends no state messages to {kind}")
            kinds = f.get("messages", list(one_way))
            if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
                raise f.fail("messages", "must be a non-empty array of message kinds")
            for j, k in enumerate(kinds):
                if k not in one_way:
                    raise f.fail(
                        f"messages[{j}]",
                        f"{policy} sends no {k!r} messages that a fault can hit (one-way kinds: "
                        f"{', '.join(one_way)}; probes are answered on the same connection)",
                    )
            fraction = 1.0
            if kind != "delay":
                fraction = keys.FAULT["fraction"].read(f)
                if fraction > 1:
                    raise f.fail("fraction", f"must lie in (0, 1], got {fraction:g}")
            delay = _parse_size(f, "delay") if kind == "delay" else None
            fault = Fault(kind, at, until, fraction=fraction, messages=tuple(kinds), delay=delay)
        faults.append(dataclasses.replace(fault, settle=settle))
    return tuple(faults)


# ------------------------------------------------------------------------------------------- overrides


def toml_value(value: Any) -> str:
    """``value`` written as TOML, as ``--set KEY=VALUE`` takes it: ``0.8``, ``"jiq"``, ``[2, 2]``,
    ``{kind = "xlog", r = 6}``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r}: a spec holds finite numbers only")
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"{value!r}: not a value a spec holds")


def apply_overrides(
    data: dict[str, Any], overrides: Iterable[str], source: str, policies: PolicyLibrary
) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (``classes[0].count=10``, ``policy.name=jiq``) to a document."""
    for item in overrides:
        if "=" not in item:
            raise SpecError(source, item, "an override reads key.path=value")
        path, _, text = item.partition("=")
        if not [p for p in re.split(r"\.|\[(\d+)\]", path.strip()) if p]:
            raise SpecError(source, item, "an override needs a key path before '='")
        value = _override_value(source, path, text)
        parts = [p for p in re.split(r"\.|\[(\d+)\]", path.strip()) if p]
        if len(parts) > MAX_DEPTH:
            raise SpecError(source, path[:80], f"a key path of {len(parts)} parts: at most {MAX_DEPTH}")
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            key: Any = int(part) if part.isdigit() else part
            if isinstance(node, list):
                if not isinstance(key, int) or key >= len(node):
                    raise SpecError(source, path, f"no list element {part}")
            elif isinstance(node, dict):
                if not last and key not in node:
                    node[key] = {}
            else:
                raise SpecError(source, path, f"{'.'.join(parts[:i])} is not a table")
            if last:
                node[key] = value
            else:
                node = node[key]
        if parts == ["policy", "name"] and isinstance(value, str) and value in policies.names():
            # switching policy drops the old one's parameters that the new one does not take, so that
            # a sweep over policies needs no per-policy file; the new policy's own defaults apply
            table = data["policy"]
            keep = ("name", *COMMON_POLICY_KEYS, *policies.params(value).KEYS)
            for k in [k for k in table if k not in keep]:
                del table[k]
    return data


def _override_value(source: str, path: str, text: str) -> Any:
    """An override's value: a TOML value, or the text itself (bare words are strings: policy.name=jiq);
    SpecError for one nested deeper than MAX_DEPTH."""
    try:
        value: Any = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:  # thousands of nested arrays: the parser gives up
        raise SpecError(source, path, f"a value nested too deeply (at most {MAX_DEPTH} levels)") from None
    problem = too_deep(value)
    if problem:
        raise SpecError(source, path, f"a value {problem}")
    return value


# ----------------------------------------------------------------------------------------- the document


def read_experiment(data: Mapping[str, Any], source: str, policies: PolicyLibrary) -> Experiment:
    """Validate a decoded TOML document and build the experiment; the ``[policy]`` table goes to the
    parameter class ``policies`` holds for its name."""
    top = TableReader(source, data, "")
    top.check_keys(keys.TOP.names)
    name = keys.TOP["name"].read(top)
    if top.has("description"):
        keys.TOP["description"].read(top)
    seed = keys.TOP["seed"].read(top)
    classes = _read_classes(top)
    n = sum(c.count for c in classes)
    workload = _read_workload(top, seed, classes, n)
    policy = read_policy(top.sub("policy"), classes, policies)
    _check_weights(top, classes, policy)
    run = _read_run(top.sub("run"), n, workload.arrival_rate)
    faults = _parse_faults(top, policy, n, run)
    exp = Experiment(
        name,
        seed,
        tuple(classes),
        workload,
        policy,
        run,
        _read_network(top),
        source,
        data,
        faults,
        _read_health(top),
        nodes=_parse_nodes(top, n),
    )
    _check_bounds(top, exp)
    _check_speeds_over_time(top, exp)
    _check_stability(exp, top)
    policy.check(exp, top)
    for i, c in enumerate(classes):
        if c.utility is not None and c.discipline != "pool":
            raise top.fail(f"classes[{i}].utility", f"utilities belong to pool classes, not {c.discipline!r}")
    return exp


def _check_bounds(top: TableReader, exp: Experiment) -> None:
    """Refuse what no run can use, before anything starts (docs/spec.md, "Limits"): a seed beyond 64
    bits, a name too long to label a metric with, more batches than a report can hold, model times where
    a second is lost in a float's rounding, and a workload that brings no task to the window or whose
    rate overflows."""
    if exp.seed > MAX_SEED:
        raise top.fail("seed", f"must be at most 2**64 - 1 = {MAX_SEED}, got {show(exp.seed)}")
    names = [("name", exp.name)] + [(f"classes[{i}].name", c.name) for i, c in enumerate(exp.classes)]
    for key, name in names:
        if len(name) > MAX_NAME:
            raise top.fail(key, f"{len(name):,} characters: at most {MAX_NAME}")
        if any(ch < " " or ch == "\x7f" for ch in name):
            raise top.fail(key, "must not hold control characters (a newline, a tab, ...)")
    run, rate = exp.run, exp.workload.arrival_rate
    if run.batches > MAX_BATCHES:
        raise top.fail("run.batches", f"at most {MAX_BATCHES:,}, got {run.batches:,}")
    if run.warmup + run.duration > MAX_MODEL_SECONDS:
        raise top.fail(
            "run.duration",
            f"warmup + duration = {run.warmup + run.duration:.3g} model s: at most {MAX_MODEL_SECONDS:.0e} "
            f"(beyond, a model second is lost in the rounding of the times); choose another time unit",
        )
    if not (math.isfinite(rate) and math.isfinite(exp.work_rate)):
        raise top.fail("workload", f"the arrival rate ({rate:g}) or the work it brings overflows")
    expected = rate * run.duration
    if expected < 1:
        raise top.fail(
            "workload",
            f"{rate:.3g} tasks per model s bring {expected:.3g} tasks to the {run.duration:g} model s of the "
            f"window: at least one is needed (a higher load, a shorter service or a longer duration)",
        )


def _read_classes(top: TableReader) -> list[NodeClass]:
    raw_classes = top.require("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise top.fail("classes", "must be an array of one or more [[classes]] tables")
    classes: list[NodeClass] = []
    for i, c in enumerate(raw_classes):
        if not isinstance(c, Mapping):
            raise top.fail(f"classes[{i}]", "must be a table")
        classes.append(_parse_class(TableReader(top.source, c, f"classes[{i}]")))
    names = [c.name for c in classes]
    for i, nm in enumerate(names):
        if nm in names[:i]:
            raise top.fail(f"classes[{i}].name", f"duplicate class name {nm!r}")
    n = sum(c.count for c in classes)
    if n > MAX_NODES:
        raise top.fail("classes", f"{n:,} nodes in all: at most {MAX_NODES:,} (docs/spec.md, Limits)")
    return classes


def _read_workload(top: TableReader, seed: int, classes: Sequence[NodeClass], n: int) -> Workload:
    w = top.sub("workload")
    w.check_keys(keys.WORKLOAD.names)
    service = _parse_size(w, "service") if w.has("service") else SizeDistribution.of("exponential", 1.0)
    given = [k for k in keys.RATES if w.has(k)]
    if len(given) != 1:
        raise w.fail(
            "load",
            "give exactly one of load (per node), arrival_rate (total per second) and beta (the Halfin-Whitt "
            "spare capacity)",
        )
    beta = None
    if given[0] == "load":
        load = keys.WORKLOAD["load"].read(w)
        rate = load * n / service.mean
    elif given[0] == "arrival_rate":
        rate = keys.WORKLOAD["arrival_rate"].read(w)
        load = rate * service.mean / n
    else:
        beta = keys.WORKLOAD["beta"].read(w)
        rate = _halfin_whitt_rate(w, seed, classes, service, beta)
        load = rate * service.mean / n
    return Workload(arrival_rate=rate, load=load, service=service, beta=beta, given=given[0])


def read_policy(p: TableReader, classes: Sequence[NodeClass], policies: PolicyLibrary) -> PolicyParams:
    """The ``[policy]`` table: the keys every policy takes, then the named policy's own."""
    name = p.string("name", choices=policies.names())
    params = policies.params(name)
    p.check_keys(("name", *COMMON_POLICY_KEYS, *params.KEYS))
    common = {
        "name": policies.canonical(name),
        "dispatchers": keys.POLICY["dispatchers"].read(p),
        "split": keys.POLICY["split"].read(p),
    }
    if "view" in params.KEYS:
        common["view"] = keys.POLICY["view"].read(p)
    return params.read(p, common, classes)


def _check_weights(top: TableReader, classes: Sequence[NodeClass], policy: PolicyParams) -> None:
    """A class weight is read by a policy that weighs its nodes by class, and refused elsewhere: a user
    who writes it expects it to act."""
    if policy.reads_class_weights():
        return
    for i, c in enumerate(classes):
        if c.weight is not None:
            raise top.fail(
                f"classes[{i}].weight",
                'only least_request with weights = "class" reads a class weight '
                "(Envoy's load_balancing_weight)",
            )


def _read_run(rr: TableReader, n: int, rate: float) -> RunSpec:
    rr.check_keys(keys.RUN.names)
    duration = keys.RUN["duration"].read(rr)
    auto = rr.get("time_scale") == "auto"
    if isinstance(rr.get("time_scale"), str) and not auto:
        raise rr.fail("time_scale", f'must be a positive number or "auto", got {show(rr.get("time_scale"))}')
    run = RunSpec(
        warmup=keys.RUN["warmup"].read(rr, default=duration / 10),
        duration=duration,
        time_scale=1.0 if auto else rr.number("time_scale", default=1.0),
        batches=keys.RUN["batches"].read(rr),
        auto_time_scale=auto,
        tolerance=_read_tolerance(rr),
    )
    _check_size(rr, n, rate, run)
    return run


def _read_tolerance(rr: TableReader) -> float | None:
    """``run.tolerance``: a share in (0, 1] (default 0.05), or "off"."""
    v = rr.get("tolerance", RunSpec.tolerance)
    if v == "off":
        return None
    tolerance = rr.as_number("tolerance", v) if not isinstance(v, str) else math.nan
    if isinstance(v, str) or tolerance > 1:
        raise rr.fail("tolerance", f'must be a share in (0, 1] or "off", got {show(v)}')
    return tolerance


def _read_network(top: TableReader) -> NetworkSpec:
    if not top.has("network"):
        return NetworkSpec()
    nw = top.sub("network")
    nw.check_keys(keys.NETWORK.names)
    delay = None
    if nw.has("delay"):
        v = nw.get("delay")
        zero = isinstance(v, int | float) and not isinstance(v, bool) and v == 0
        delay = None if zero else _parse_size(nw, "delay")
    return NetworkSpec(delay=delay, forward_tasks=keys.NETWORK["forward_tasks"].read(nw))


def _read_health(top: TableReader) -> HealthSpec:
    if not top.has("health"):
        return HealthSpec()
    h = top.sub("health")
    h.check_keys(keys.HEALTH.names)
    max_ejection = keys.HEALTH["max_ejection"].read(h)
    if max_ejection > 1:
        raise h.fail("max_ejection", f"must lie in [0, 1], got {max_ejection:g}")
    slow_share = keys.HEALTH["slow_share"].read(h)
    if slow_share >= 1:
        raise h.fail("slow_share", f"must lie in [0, 1) (0: no ejection for slowness), got {slow_share:g}")
    read = {
        k.name: k.read(h) if k.name not in ("max_ejection", "slow_share") else None for k in keys.HEALTH.keys
    }
    return HealthSpec(**{**read, "max_ejection": max_ejection, "slow_share": slow_share})


def _check_stability(exp: Experiment, top: TableReader) -> None:
    """Refuse loads that no policy can carry on ps/fcfs nodes (a policy that cannot carry what another
    could refuses it in its own ``check``)."""
    queued = [k for k in range(exp.n) if exp.classes[exp.node_class[k]].discipline != "pool"]
    if len(queued) < exp.n:
        return  # with a pool (infinite capacity) somewhere, some policy can always keep the system stable
    speeds = long_run_speeds(exp)
    capacity = sum(speeds)
    if exp.work_rate >= capacity:
        raise top.fail(
            "workload",
            f"unstable: work arrives at {exp.work_rate:.4g}/s but the nodes serve at most "
            f"{capacity:.4g}/s{over_time_note(exp)} (load must stay below the mean speed "
            f"{capacity / exp.n:.4g})",
        )


def varies_over_time(exp: Experiment) -> bool:
    return bool(exp.nodes) or any(c.speed_schedule or c.antagonist for c in exp.classes)


def long_run_speeds(exp: Experiment) -> Sequence[float]:
    """Every node's speed in the long run: with schedules and antagonists, the speeds they leave
    (docs/spec.md, Speed over time)."""
    if varies_over_time(exp):
        return [exp.long_run_speed(k) for k in range(exp.n)]
    return exp.node_speeds


def over_time_note(exp: Experiment) -> str:
    """The words a stability error adds when the speeds vary over time."""
    if varies_over_time(exp):
        return " in the long run (schedules' last levels, antagonists' mean factors)"
    return ""


def read_document(path: str | Path) -> dict[str, Any]:
    """A spec file's TOML document (or its JSON form, ``model.document``, in a ``.json`` file), or
    SpecError: cannot read it, not UTF-8, not TOML (or JSON)."""
    source = str(path)
    text = _spec_text(path)
    try:
        if source.endswith(".json"):
            try:
                data = json.loads(text)
            except ValueError as e:
                raise SpecError(source, "", f"not valid JSON: {e}") from None
            if not isinstance(data, dict):
                raise SpecError(source, "", "a spec document in JSON is an object")
        else:
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise SpecError(source, "", f"not valid TOML: {e}") from None
    except RecursionError:  # arrays or tables nested thousands deep: the parser gives up
        raise SpecError(source, "", f"nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    problem = too_deep(data)
    if problem:
        raise SpecError(source, "", problem)
    return data


def _spec_text(path: str | Path) -> str:
    """A spec file's text, at most MAX_SPEC_BYTES of it (SpecError: cannot read it, too large, not
    UTF-8)."""
    source = str(path)
    try:
        return read_limited(path, MAX_SPEC_BYTES).decode("utf-8")
    except OSError as e:
        raise SpecError(source, "", f"cannot read: {e.strerror or e}") from None
    except TooLarge as e:
        raise SpecError(source, "", str(e)) from None
    except UnicodeDecodeError as e:
        raise SpecError(source, "", f"not UTF-8 text: {e.reason} at byte {e.start}") from None
