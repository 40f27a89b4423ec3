"""The processes' metrics keep Prometheus's naming conventions (https://prometheus.io/docs/practices/naming/;
docs/protocol.md, "Metrics").

- **One family per quantity.** Every policy declares the quantities of its state that its dispatcher
  exports (``unit.Policy.exported``); its dispatcher side gives exactly those (``gauges``), and the
  dispatcher's ``/metrics`` holds a family for each, of the declared type, with the declared label and
  nothing else of the policy's: no family mixes quantities under a label.
- **Created timestamps, alike everywhere.** No counter or histogram of any process (dispatcher, node host,
  load generator) carries a ``_created`` series, not even those prometheus_client makes itself
  (``transport.registry`` says why none rather than all).
- **Base units.** No family is a time in anything but seconds: the node host's start is
  ``process_start_time_seconds``, not a count of microseconds.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.loadgen.metrics import LoadCollector, registry_for
from lbtestbed.loadgen.openloop import LoadReport
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.policies import CATALOG, Policy
from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import parse_spec
from lbtestbed.transport.registry import Registry

ROOT = Path(__file__).resolve().parents[1]

#: the two clusters every policy runs on in these tests: pools with utilities (JLMU, SLTA need them), and
#: FCFS servers (for the policies that refuse pools); two classes, so that a quantity per class has two
CLUSTERS: tuple[list[dict[str, Any]], ...] = (
    [
        {"name": "small", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 2}},
        {"name": "large", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 3}},
    ],
    [
        {"name": "slow", "count": 2, "discipline": "fcfs", "speed": 1.0},
        {"name": "fast", "count": 2, "discipline": "fcfs", "speed": 2.0},
    ],
)

#: keys a policy requires that have no default
REQUIRED: dict[str, dict[str, Any]] = {"slta": {"beta": 0.5}}


def experiment_for(policy: Policy) -> Experiment:
    """A small experiment of ``policy`` on the first cluster it accepts."""
    refusals = []
    for classes in CLUSTERS:
        load = 0.5 * sum(c["count"] for c in classes) if classes[0]["discipline"] == "pool" else 0.5
        try:
            return parse_spec(
                {
                    "name": "conventions",
                    "seed": 5,
                    "classes": classes,
                    "workload": {"load": load, "service": {"dist": "exponential", "mean": 1.0}},
                    "policy": {"name": policy.name, **REQUIRED.get(policy.name, {})},
                    "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.01},
                }
            )
        except SpecError as e:
            refusals.append(str(e))
    raise AssertionError(f"{policy.name} runs on none of the test clusters: {refusals}")


POLICIES = list(CATALOG)
IDS = [p.name for p in POLICIES]


# ------------------------------------------------------------------------- one family per quantity


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_a_policy_declares_what_its_dispatcher_side_exports(policy: Policy) -> None:
    exp = experiment_for(policy)
    values = policy.make_dispatcher(exp, random.Random(1)).gauges()
    assert set(values) == {q.name for q in policy.exported}
    classes = {c.name for c in exp.classes}
    for q in policy.exported:
        value = values[q.name]
        if q.label is None:
            assert isinstance(value, float), (q.name, value)
        else:
            assert isinstance(value, dict) and value, (q.name, value)
            assert all(isinstance(k, str) and isinstance(v, float) for k, v in value.items())
            if q.label == "class":
                assert set(value) == classes, (q.name, value)
        if q.kind == "counter":  # a count: 0 before anything happened
            assert all(v == 0 for v in (value.values() if isinstance(value, dict) else [value]))


def test_the_learned_quantity_and_the_picture_are_exported_gauges() -> None:
    checked = 0
    for policy in CATALOG:
        exported = {q.name: q for q in policy.exported}
        for name in (policy.learned.name if policy.learned else None, policy.picture):
            if name is not None:
                q = exported[name]
                assert (q.kind, q.label) == ("gauge", None), (policy.name, q)
                checked += 1
    assert checked >= 3  # SLTA's r, JSQ's idle nodes, JIQ's idle tokens at least


def test_a_name_means_one_quantity_across_policies() -> None:
    quantities = CATALOG.quantities()  # raises when two policies declare one name differently
    declared = [q.name for p in CATALOG for q in p.exported]
    shared = [name for name, count in Counter(declared).items() if count > 1]
    assert "pending_tasks" in shared  # least_request and peak_ewma: one family, one meaning
    assert set(declared) == set(quantities)


def families(text: str) -> dict[str, Any]:
    """The families of an exposition, by name, read by prometheus_client's own parser; a name twice is
    an error."""
    seen = list(text_string_to_metric_families(text))
    names = Counter(f.name for f in seen)
    assert all(count == 1 for count in names.values()), [n for n, c in names.items() if c > 1]
    return {f.name: f for f in seen}


def dispatcher_page(exp: Experiment) -> str:
    host = DispatcherHost(exp, 0, 1, [f"http://127.0.0.1:9/v1/nodes/{k}" for k in range(exp.n)], "token")
    return generate_latest(host.registry).decode()


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_the_dispatcher_exports_a_family_per_declared_quantity(policy: Policy) -> None:
    exp = experiment_for(policy)
    found = families(dispatcher_page(exp))
    assert not [n for n in found if "policy_state" in n]
    ours = {q.metric.removesuffix("_total") for q in CATALOG.quantities().values()}
    declared = {q.metric.removesuffix("_total"): q for q in policy.exported}
    assert {n for n in found if n in ours} == set(declared)  # no other policy's quantity
    values = policy.make_dispatcher(exp, random.Random(1)).gauges()
    for name, q in declared.items():
        family = found[name]
        assert (family.type, family.documentation) == (q.kind, q.help)
        series = {s.name: s for s in family.samples if not s.name.endswith("_created")}
        samples = [s for s in family.samples if s.name == q.metric]
        assert samples and set(series) == {q.metric}
        if q.label is None:
            assert [dict(s.labels) for s in samples] == [{}]
            assert samples[0].value == values[q.name]
        else:
            assert all(set(s.labels) == {q.label} for s in samples)
            assert {s.labels[q.label]: s.value for s in samples} == values[q.name]


def test_the_dashboard_shows_every_quantity() -> None:
    """SLTA's quantities have panels of their own; the panel "Other policy state" names all the others."""
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "lbtestbed-policy.json").read_text())
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    (other,) = [p for p in board["panels"] if p["title"] == "Other policy state"]
    (named,) = re.findall(r'__name__=~\\?"lbtestbed_dispatcher_\(([\w|]+)\)', other["targets"][0]["expr"])
    quantities = set(CATALOG.quantities())
    assert set(named.split("|")) == {q for q in quantities if not q.startswith("slta_")}
    for q in quantities:
        if q.startswith("slta_"):
            assert f"lbtestbed_dispatcher_{q}{{" in exprs, q


# ------------------------------------------------------------------------------ created timestamps


def node_page(exp: Experiment) -> tuple[NodeHost, str]:
    """A started node host of every node of ``exp``, and its page."""

    async def page() -> tuple[NodeHost, str]:
        host = NodeHost(exp, list(range(exp.n)), ["http://127.0.0.1:9"], "token")
        await host.start()
        try:
            return host, generate_latest(host.registry).decode()
        finally:
            await host.stop()

    return asyncio.run(page())


def generator_page(exp: Experiment) -> str:
    r = LoadReport(scheduled=4)
    r.lateness, r.sojourns, r.other_sojourns = [0.001, 0.003, 0.0005], [0.5, 2.0], [("refused", 0.1)]
    r.outcomes.update(completed=2, refused=1, dropped=1)
    return generate_latest(registry_for(LoadCollector(r, exp.run.time_scale, [1.0, 10.0]))).decode()


def test_no_counter_or_histogram_of_any_process_has_a_created_series() -> None:
    """The dispatcher's and the node host's histograms are prometheus_client's own, which give every series
    a ``_created``; the generator's and every counter are families of ours, which have none. Every page
    has counters and histograms with series, and none has a ``_created``."""
    exp = experiment_for(CATALOG["jiq"])
    pages = {
        "dispatcher": dispatcher_page(exp),
        "node host": node_page(exp)[1],
        "generator": generator_page(exp),
    }
    for role, text in pages.items():
        found = families(text)
        counts = {"counter": 0, "histogram": 0}
        for family in found.values():
            if family.type in counts:
                counts[family.type] += len(family.samples)
        assert min(counts.values()) > 0, (role, counts)
        assert not [name for name in found if name.endswith("_created")], role
        assert "_created" not in text, role


def test_the_library_would_give_its_histograms_a_created_series() -> None:
    """What ``Registry`` leaves out: the same histogram on the client library's own registry has one."""
    pages = []
    for registry in (CollectorRegistry(auto_describe=False), Registry()):
        Histogram("h_seconds", "a histogram", buckets=(1.0,), registry=registry).observe(0.5)
        pages.append(generate_latest(registry).decode())
    assert "h_seconds_created " in pages[0] and "_created" not in pages[1]
    assert pages[1] == "".join(line for line in pages[0].splitlines(True) if "_created" not in line)


# ----------------------------------------------------------------------------------------- base units


def test_the_node_host_exports_its_start_in_seconds_and_no_incarnation() -> None:
    """The incarnation (microseconds, an identity on the wire) is no metric; ``process_start_time_seconds``
    says when the process started, before the host took its incarnation."""
    exp = experiment_for(CATALOG["jsq"])
    host, text = node_page(exp)
    found = families(text)
    assert not [name for name in found if "incarnation" in name]
    started = found["process_start_time_seconds"].samples[0].value
    assert started <= host.incarnation / 1e6 <= time.time()
