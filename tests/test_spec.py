"""The experiment spec refuses every bad input with one line naming the file, the key and the problem.

docs/design.md, principle 1: one TOML file drives everything, so nothing may run on a spec that did not
validate, and a user must learn from a single line ``<file>: <key>: <what is wrong>`` what to fix (never a
traceback). The good-spec tests pin the conversions documented in ``lbtestbed/model/spec.py``: load and
arrival rate, exact speeds, seeded uniform speeds and ``--set`` overrides.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from lbtestbed import cli
from lbtestbed.model.reader import SpecError
from lbtestbed.spec import apply_overrides, load_spec, parse_spec

SOURCE = "bad.toml"

# Two classes of pools for the utility policies: n = 4, load 2 tasks per pool.
POOL_BASE: dict[str, Any] = {
    "name": "pools",
    "classes": [
        {"name": "small", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 20}},
        {"name": "large", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 30}},
    ],
    "workload": {"load": 2.0},
    "policy": {"name": "jlmu"},
    "run": {"duration": 10.0},
}

# Four processor-sharing nodes, speeds 1, 1, 2, 2 (capacity 6 work/s); load 0.5 brings 2 work/s.
PS_BASE: dict[str, Any] = {
    "name": "queues",
    "classes": [
        {"name": "slow", "count": 2, "discipline": "ps", "speed": 1},
        {"name": "fast", "count": 2, "discipline": "ps", "speed": 2},
    ],
    "workload": {"load": 0.5},
    "policy": {"name": "jsq"},
    "run": {"duration": 10.0},
}


def pools(**top: Any) -> dict[str, Any]:
    d = copy.deepcopy(POOL_BASE)
    d.update(top)
    return d


def queues(**top: Any) -> dict[str, Any]:
    d = copy.deepcopy(PS_BASE)
    d.update(top)
    return d


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of base with one value set (path like 'classes.0.count'); value DELETE removes the key."""
    d = copy.deepcopy(base)
    *parents, last = path.split(".")
    node: Any = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return d


DELETE = object()


def expect_error(data: dict[str, Any], key: str, fragment: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(data, SOURCE)
    err = info.value
    assert err.source == SOURCE
    assert err.key == key, f"wrong key for: {err}"
    assert fragment in err.message, f"{fragment!r} not in {err.message!r}"
    text = str(err)
    assert text == f"{SOURCE}: {key}: {err.message}"
    assert "\n" not in text
    return err


# (id, spec, key, fragment of the message)
Case = tuple[str, dict[str, Any], str, str]

UNKNOWN_KEYS: list[Case] = [
    ("top", pools(colour="red"), "colour", "unknown key"),
    ("class", with_(POOL_BASE, "classes.1.capacity", 3), "classes[1].capacity", "unknown key"),
    ("policy-jsq-weights", with_(PS_BASE, "policy.weights", "speed"), "policy.weights", "unknown key"),
    (
        "policy-lr-decay",
        with_(PS_BASE, "policy", {"name": "least_request", "decay_time": 5.0}),
        "policy.decay_time",
        "unknown key",
    ),
    ("workload", with_(POOL_BASE, "workload.burst", 2), "workload.burst", "unknown key"),
    (
        "service",
        with_(POOL_BASE, "workload.service", {"dist": "exponential", "mean": 1.0, "scv": 2.0}),
        "workload.service.scv",
        "unknown key",
    ),
    ("policy-jlmu-d", with_(POOL_BASE, "policy.d", 2), "policy.d", "unknown key"),
    ("policy-jsq-beta", with_(PS_BASE, "policy.beta", 0.5), "policy.beta", "unknown key"),
    (
        "policy-random-tie",
        with_(PS_BASE, "policy", {"name": "random", "tie_break": "fastest"}),
        "policy.tie_break",
        "unknown key",
    ),
    ("run", with_(POOL_BASE, "run.length", 5.0), "run.length", "unknown key"),
    ("network", pools(network={"jitter": 0.1}), "network.jitter", "unknown key"),
    (
        "utility-xlog",
        with_(POOL_BASE, "classes.0.utility", {"kind": "xlog", "r": 20, "s": 1}),
        "classes[0].utility.s",
        "unknown key",
    ),
    (
        "utility-table",
        with_(POOL_BASE, "classes.1.utility", {"kind": "table", "values": [0, 1], "r": 3}),
        "classes[1].utility.r",
        "unknown key",
    ),
    (
        "speed-table",
        with_(PS_BASE, "classes.0.speed", {"dist": "uniform", "low": 1, "high": 2, "mean": 1.5}),
        "classes[0].speed.mean",
        "unknown key",
    ),
]

WRONG_TYPES: list[Case] = [
    ("count-string", with_(POOL_BASE, "classes.0.count", "3"), "classes[0].count", "must be an integer"),
    ("count-bool", with_(POOL_BASE, "classes.1.count", True), "classes[1].count", "must be an integer"),
    ("count-float", with_(POOL_BASE, "classes.0.count", 2.0), "classes[0].count", "must be an integer"),
    ("load-string", with_(POOL_BASE, "workload.load", "0.5"), "workload.load", "must be a number"),
    ("load-bool", with_(POOL_BASE, "workload.load", True), "workload.load", "must be a number"),
    (
        "rate-bool",
        with_(with_(POOL_BASE, "workload.load", DELETE), "workload.arrival_rate", False),
        "workload.arrival_rate",
        "must be a number",
    ),
    ("load-inf", with_(POOL_BASE, "workload.load", float("inf")), "workload.load", "must be finite"),
    ("load-nan", with_(POOL_BASE, "workload.load", float("nan")), "workload.load", "must be finite"),
    ("duration-bool", with_(POOL_BASE, "run.duration", True), "run.duration", "must be a number"),
    ("seed-string", pools(seed="1"), "seed", "must be an integer"),
    ("name-number", pools(name=5), "name", "must be a string"),
    ("name-missing", with_(POOL_BASE, "name", DELETE), "name", "missing"),
    ("run-missing", with_(POOL_BASE, "run", DELETE), "run", "missing"),
    ("duration-missing", with_(POOL_BASE, "run", {"warmup": 1.0}), "run.duration", "missing"),
    (
        "discipline-missing",
        with_(POOL_BASE, "classes.0.discipline", DELETE),
        "classes[0].discipline",
        "missing",
    ),
    ("classes-table", pools(classes={"name": "a"}), "classes", "must be an array"),
    ("classes-empty", pools(classes=[]), "classes", "must be an array"),
    ("class-not-table", with_(POOL_BASE, "classes.1", 5), "classes[1]", "must be a table"),
    ("workload-number", pools(workload=3), "workload", "must be a table"),
    ("policy-string", pools(policy="jlmu"), "policy", "must be a table"),
    ("utility-number", with_(POOL_BASE, "classes.0.utility", 3), "classes[0].utility", "must be a table"),
    (
        "utility-value-string",
        with_(POOL_BASE, "classes.0.utility", {"kind": "table", "values": ["a", 1]}),
        "classes[0].utility.values[0]",
        "must be a number",
    ),
    (
        "utility-values-short",
        with_(POOL_BASE, "classes.0.utility", {"kind": "table", "values": [0]}),
        "classes[0].utility.values",
        "at least two",
    ),
    (
        "utility-kind",
        with_(POOL_BASE, "classes.0.utility", {"kind": "log"}),
        "classes[0].utility.kind",
        "must be one of",
    ),
    (
        "discipline",
        with_(POOL_BASE, "classes.0.discipline", "lifo"),
        "classes[0].discipline",
        "must be one of",
    ),
    ("policy-name", with_(POOL_BASE, "policy.name", "best"), "policy.name", "must be one of"),
    ("tie-break", with_(PS_BASE, "policy.tie_break", "oldest"), "policy.tie_break", "must be one of"),
    (
        "pod-tie-break",
        with_(PS_BASE, "policy", {"name": "power_of_d", "tie_break": "longest_idle"}),
        "policy.tie_break",
        "random, fastest or slowest",
    ),
    ("rank-order", with_(POOL_BASE, "policy.rank_order", "ik"), "policy.rank_order", "must be one of"),
    (
        "replace-string",
        with_(PS_BASE, "policy", {"name": "power_of_d", "replace": "yes"}),
        "policy.replace",
        "must be true or false",
    ),
    (
        "pod-d-string",
        with_(PS_BASE, "policy", {"name": "power_of_d", "d": "2"}),
        "policy.d",
        "must be an integer",
    ),
    ("delay-string", pools(network={"delay": "fast"}), "network.delay", "must be a table"),
    ("forward-int", pools(network={"forward_tasks": 1}), "network.forward_tasks", "must be true or false"),
    ("speed-bool", with_(PS_BASE, "classes.0.speed", True), "classes[0].speed", "must be a number"),
    ("speed-word", with_(PS_BASE, "classes.0.speed", "fast"), "classes[0].speed", "must be a number"),
    (
        "speed-dist",
        with_(PS_BASE, "classes.0.speed", {"dist": "normal", "low": 1, "high": 2}),
        "classes[0].speed.dist",
        "must be one of",
    ),
    (
        "service-dist",
        with_(POOL_BASE, "workload.service", {"dist": "pareto", "mean": 1}),
        "workload.service.dist",
        "must be one of",
    ),
    (
        "scv-missing",
        with_(POOL_BASE, "workload.service", {"dist": "hyperexponential", "mean": 1}),
        "workload.service.scv",
        "missing",
    ),
]

NON_POSITIVE: list[Case] = [
    ("count-0", with_(POOL_BASE, "classes.0.count", 0), "classes[0].count", "at least 1"),
    ("count-neg", with_(POOL_BASE, "classes.1.count", -2), "classes[1].count", "at least 1"),
    ("load-0", with_(POOL_BASE, "workload.load", 0), "workload.load", "must be positive"),
    (
        "rate-neg",
        with_(with_(POOL_BASE, "workload.load", DELETE), "workload.arrival_rate", -2.0),
        "workload.arrival_rate",
        "must be positive",
    ),
    (
        "mean-0",
        with_(POOL_BASE, "workload.service", {"dist": "exponential", "mean": 0}),
        "workload.service.mean",
        "must be positive",
    ),
    ("deterministic-0", with_(POOL_BASE, "workload.service", 0), "workload.service", "must be positive"),
    ("duration-0", with_(POOL_BASE, "run.duration", 0.0), "run.duration", "must be positive"),
    ("warmup-neg", with_(POOL_BASE, "run.warmup", -1.0), "run.warmup", "must not be negative"),
    ("time-scale-0", with_(POOL_BASE, "run.time_scale", 0), "run.time_scale", "must be positive"),
    ("batches-1", with_(POOL_BASE, "run.batches", 1), "run.batches", "at least 2"),
    ("seed-neg", pools(seed=-1), "seed", "at least 0"),
    (
        "xlog-r-0",
        with_(POOL_BASE, "classes.0.utility", {"kind": "xlog", "r": 0}),
        "classes[0].utility.r",
        "must be positive",
    ),
    ("speed-0", with_(PS_BASE, "classes.0.speed", 0), "classes[0].speed", "must be positive"),
    ("speed-neg", with_(PS_BASE, "classes.1.speed", -1.5), "classes[1].speed", "must be positive"),
    ("speed-0-fraction", with_(PS_BASE, "classes.0.speed", "0/3"), "classes[0].speed", "must be positive"),
    (
        "speed-high-low",
        with_(PS_BASE, "classes.0.speed", {"dist": "uniform", "low": 2, "high": 2}),
        "classes[0].speed.high",
        "must exceed low",
    ),
    (
        "speed-low-0",
        with_(PS_BASE, "classes.0.speed", {"dist": "uniform", "low": 0, "high": 2}),
        "classes[0].speed.low",
        "must be positive",
    ),
    ("delay-neg", pools(network={"delay": -0.1}), "network.delay", "must be positive"),
    ("pod-d-0", with_(PS_BASE, "policy", {"name": "power_of_d", "d": 0}), "policy.d", "at least 1"),
    (
        "slta-beta-0",
        with_(POOL_BASE, "policy", {"name": "slta", "beta": 0}),
        "policy.beta",
        "must be positive",
    ),
]

RULES: list[Case] = [
    # a class weight is Envoy's host weight: read by least_request with weights = "class", and then required
    ("weight-unread", with_(POOL_BASE, "classes.1.weight", 3), "classes[1].weight", 'weights = "class"'),
    (
        "weight-missing",
        with_(
            with_(PS_BASE, "policy", {"name": "least_request", "weights": "class"}), "classes.0.weight", 2.0
        ),
        "policy.weights",
        "has none",
    ),
    (
        "bias-negative",
        with_(PS_BASE, "policy", {"name": "least_request", "active_request_bias": -1.0}),
        "policy.active_request_bias",
        "must not be negative",
    ),
    (
        "decay-zero",
        with_(PS_BASE, "policy", {"name": "peak_ewma", "decay_time": 0}),
        "policy.decay_time",
        "positive",
    ),
    # workload: exactly one of load and arrival_rate
    ("load-and-rate", with_(POOL_BASE, "workload.arrival_rate", 4.0), "workload.load", "exactly one"),
    ("neither-load-nor-rate", with_(POOL_BASE, "workload.load", DELETE), "workload.load", "exactly one"),
    # utility policies need utilities on pools
    (
        "jlmu-no-utility",
        with_(POOL_BASE, "classes.1.utility", DELETE),
        "classes[1].utility",
        "needs a utility",
    ),
    (
        "slta-no-utility",
        with_(with_(POOL_BASE, "classes.0.utility", DELETE), "policy", {"name": "slta", "beta": 1.0}),
        "classes[0].utility",
        "needs a utility",
    ),
    (
        "jlmu-ps-class",
        with_(POOL_BASE, "classes.1.discipline", "ps"),
        "classes[1].discipline",
        "needs pool nodes",
    ),
    (
        "slta-fcfs-class",
        with_(with_(POOL_BASE, "classes.0.discipline", "fcfs"), "policy", {"name": "slta", "beta": 1.0}),
        "classes[0].discipline",
        "needs pool nodes",
    ),
    # probe counts larger than the nodes available
    ("pod-d-gt-n", with_(PS_BASE, "policy", {"name": "power_of_d", "d": 5}), "policy.d", "only 4"),
    ("lr-d-gt-n", with_(PS_BASE, "policy", {"name": "least_request", "d": 5}), "policy.d", "only 4"),
    (
        "scheme1-d0-gt-count",
        with_(PS_BASE, "policy", {"name": "scheme1", "d": [3, 1]}),
        "policy.d[0]",
        "only 2",
    ),
    (
        "scheme2-d1-gt-count",
        with_(PS_BASE, "policy", {"name": "scheme2", "d": [1, 3]}),
        "policy.d[1]",
        "only 2",
    ),
    (
        "scheme1-d-int-gt-count",
        with_(PS_BASE, "policy", {"name": "scheme1", "d": 3}),
        "policy.d[0]",
        "only 2",
    ),
    (
        "scheme2-d-length",
        with_(PS_BASE, "policy", {"name": "scheme2", "d": [1, 1, 1]}),
        "policy.d",
        "one probe count per class",
    ),
    (
        "scheme1-d-short",
        with_(PS_BASE, "policy", {"name": "scheme1", "d": [1]}),
        "policy.d",
        "one probe count per class",
    ),
    (
        "scheme1-d-bool",
        with_(PS_BASE, "policy", {"name": "scheme1", "d": [1, True]}),
        "policy.d[1]",
        "positive integer",
    ),
    (
        "scheme2-d-zero",
        with_(PS_BASE, "policy", {"name": "scheme2", "d": [0, 1]}),
        "policy.d[0]",
        "positive integer",
    ),
    (
        "scheme1-d-string",
        with_(PS_BASE, "policy", {"name": "scheme1", "d": "2"}),
        "policy.d",
        "one probe count per class",
    ),
    # stability: capacity 1 + 1 + 2 + 2 = 6 work/s; load L brings 4 L work/s
    ("ps-at-capacity", with_(PS_BASE, "workload.load", 1.5), "workload", "unstable"),
    ("ps-above-capacity", with_(PS_BASE, "workload.load", 2.0), "workload", "unstable"),
    (
        "fcfs-rate-above-capacity",
        with_(
            with_(with_(PS_BASE, "workload.load", DELETE), "workload.arrival_rate", 3.5),
            "workload.service",
            {"dist": "exponential", "mean": 2.0},
        ),
        "workload",
        "unstable",
    ),
    # random and round robin give every node 4 L / 4 = L work/s; the slowest node serves 1/s
    (
        "random-slowest",
        with_(PS_BASE, "policy", {"name": "random"}) | {"workload": {"load": 1.0}},
        "workload",
        "unstable under random",
    ),
    (
        "round-robin-slowest",
        with_(PS_BASE, "policy", {"name": "round_robin"}) | {"workload": {"load": 1.2}},
        "workload",
        "unstable under round_robin",
    ),
    # work sizes and utilities
    (
        "hyperexponential-scv",
        with_(POOL_BASE, "workload.service", {"dist": "hyperexponential", "mean": 1.0, "scv": 0.5}),
        "workload.service.scv",
        "scv >= 1",
    ),
    (
        "non-concave",
        with_(POOL_BASE, "classes.1.utility", {"kind": "table", "values": [0, 1, 3, 4]}),
        "classes[1].utility.values",
        "concave",
    ),
    # SLTA's beta: n = 4 pools
    ("slta-n-beta-lt-2", with_(POOL_BASE, "policy", {"name": "slta", "beta": 0.25}), "policy.beta", "< 2"),
    # beta_scale 0.5: beta_n = 0.5 * 4^(-1/4) = 0.354, n beta_n = 1.41
    (
        "slta-scale-lt-2",
        with_(POOL_BASE, "policy", {"name": "slta", "beta_scale": 0.5}),
        "policy.beta_scale",
        "< 2",
    ),
    (
        "slta-both",
        with_(POOL_BASE, "policy", {"name": "slta", "beta": 1.0, "beta_scale": 1.0}),
        "policy.beta",
        "exactly one",
    ),
    ("slta-neither", with_(POOL_BASE, "policy", {"name": "slta"}), "policy.beta", "exactly one"),
    # names
    ("duplicate-names", with_(POOL_BASE, "classes.1.name", "small"), "classes[1].name", "duplicate"),
]


@pytest.mark.parametrize(
    ("data", "key", "fragment"), [c[1:] for c in UNKNOWN_KEYS], ids=[c[0] for c in UNKNOWN_KEYS]
)
def test_unknown_keys_are_refused(data: dict[str, Any], key: str, fragment: str) -> None:
    err = expect_error(data, key, fragment)
    assert "expected one of" in err.message


@pytest.mark.parametrize(
    ("data", "key", "fragment"), [c[1:] for c in WRONG_TYPES], ids=[c[0] for c in WRONG_TYPES]
)
def test_wrong_types_are_refused(data: dict[str, Any], key: str, fragment: str) -> None:
    expect_error(data, key, fragment)


@pytest.mark.parametrize(
    ("data", "key", "fragment"), [c[1:] for c in NON_POSITIVE], ids=[c[0] for c in NON_POSITIVE]
)
def test_non_positive_values_are_refused(data: dict[str, Any], key: str, fragment: str) -> None:
    expect_error(data, key, fragment)


@pytest.mark.parametrize(("data", "key", "fragment"), [c[1:] for c in RULES], ids=[c[0] for c in RULES])
def test_rule_violations_are_refused(data: dict[str, Any], key: str, fragment: str) -> None:
    expect_error(data, key, fragment)


def test_unknown_key_message_lists_the_allowed_keys() -> None:
    err = expect_error(with_(POOL_BASE, "run.length", 5.0), "run.length", "unknown key")
    for allowed in ("warmup", "duration", "time_scale", "batches"):
        assert allowed in err.message


@pytest.mark.parametrize("speed", ["3/0", "0/0"])
def test_speed_fraction_with_zero_denominator_is_refused(speed: str) -> None:
    expect_error(with_(PS_BASE, "classes.0.speed", speed), "classes[0].speed", "")


def test_random_routing_overloading_ps_nodes_next_to_pools_is_refused() -> None:
    # 1 ps node of speed 1 beside 3 pools: random routing sends every node 8 / 4 = 2 work/s > 1
    data = {
        "name": "mixed",
        "classes": [
            {"name": "queue", "count": 1, "discipline": "ps", "speed": 1},
            {"name": "pool", "count": 3, "discipline": "pool"},
        ],
        "workload": {"load": 2.0},
        "policy": {"name": "random"},
        "run": {"duration": 10.0},
    }
    expect_error(data, "workload", "unstable under random")


# ------------------------------------------------------------------------------------ good specs


def test_arrival_rate_gives_load_per_node() -> None:
    # n = 4, mean work 0.5: load = rate * mean / n = 2 * 0.5 / 4 = 0.25
    data = with_(with_(PS_BASE, "workload.load", DELETE), "workload.arrival_rate", 2.0)
    data["workload"]["service"] = 0.5
    exp = parse_spec(data, "good.toml")
    assert exp.workload.arrival_rate == 2.0
    assert exp.workload.load == pytest.approx(0.25, rel=1e-12)
    assert exp.workload.service.mean == 0.5 and exp.workload.service.dist == "deterministic"
    assert exp.work_rate == pytest.approx(1.0, rel=1e-12)


def test_load_gives_total_arrival_rate() -> None:
    # load 0.25 per node, n = 4, mean 0.5: rate = load * n / mean = 2
    data = with_(PS_BASE, "workload.load", 0.25)
    data["workload"]["service"] = {"dist": "exponential", "mean": 0.5}
    exp = parse_spec(data, "good.toml")
    assert exp.workload.arrival_rate == pytest.approx(2.0, rel=1e-12)
    assert exp.workload.load == 0.25
    assert exp.n == 4


def test_default_service_is_exponential_with_mean_one() -> None:
    exp = parse_spec(copy.deepcopy(POOL_BASE), "good.toml")
    assert exp.workload.service.dist == "exponential" and exp.workload.service.mean == 1.0
    assert exp.workload.arrival_rate == pytest.approx(8.0)  # load 2 * 4 pools
    assert exp.run.warmup == pytest.approx(1.0)  # duration / 10


def test_exact_speeds() -> None:
    data = copy.deepcopy(PS_BASE)
    data["classes"][0]["speed"] = "2/3"
    data["classes"][1]["speed"] = 0.2
    data["workload"]["load"] = 0.1
    exp = parse_spec(data, "good.toml")
    assert exp.classes[0].speed.value == Fraction(2, 3)
    assert exp.classes[1].speed.value == Fraction(1, 5)
    assert isinstance(exp.classes[1].speed.value, Fraction)
    assert exp.node_class == (0, 0, 1, 1)
    assert exp.node_speeds == (2 / 3, 2 / 3, 0.2, 0.2)


def test_speed_defaults_to_one() -> None:
    exp = parse_spec(copy.deepcopy(POOL_BASE), "good.toml")
    assert [c.speed.value for c in exp.classes] == [Fraction(1), Fraction(1)]


def _uniform_spec(seed: int) -> dict[str, Any]:
    data = copy.deepcopy(PS_BASE)
    data["seed"] = seed
    data["classes"][0]["count"] = 50
    data["classes"][0]["speed"] = {"dist": "uniform", "low": 0.7, "high": 1.3}
    data["workload"]["load"] = 0.3
    return data


def test_uniform_speeds_are_reproducible_and_in_range() -> None:
    a = parse_spec(_uniform_spec(11), "good.toml")
    b = parse_spec(_uniform_spec(11), "good.toml")
    c = parse_spec(_uniform_spec(12), "good.toml")
    assert a.node_speeds == b.node_speeds
    assert a.node_speeds != c.node_speeds
    drawn = a.node_speeds[:50]
    assert all(0.7 <= s <= 1.3 for s in drawn)
    assert len(set(drawn)) == 50  # drawn per node, not one value per class
    assert a.node_speeds[50:] == (2.0, 2.0)
    assert a.classes[0].speed.value is None
    # mean of 50 U(0.7, 1.3) draws: sd = 0.6 / sqrt(12 * 50) = 0.0245; 5 sd = 0.12
    assert abs(sum(drawn) / 50 - 1.0) < 0.12


def test_policy_options_parse() -> None:
    exp = parse_spec(with_(PS_BASE, "policy", {"name": "power_of_d", "d": 6, "replace": True}), "g.toml")
    assert exp.policy.d == 6 and exp.policy.replace is True
    exp = parse_spec(with_(PS_BASE, "policy", {"name": "scheme2", "d": 2}), "g.toml")
    assert exp.policy.d == (2, 2)
    exp = parse_spec(with_(PS_BASE, "policy", {"name": "scheme1"}), "g.toml")
    assert exp.policy.d == (2, 2)
    data = copy.deepcopy(POOL_BASE)
    data["classes"][0]["count"] = 8
    data["classes"][1]["count"] = 8
    data["policy"] = {"name": "slta", "beta_scale": 1.0}
    exp = parse_spec(data, "g.toml")
    assert exp.policy.beta == pytest.approx(0.5)  # 16^(-1/4)
    exp = parse_spec(with_(POOL_BASE, "policy", {"name": "slta", "beta": 0.5}), "g.toml")
    assert exp.policy.beta == 0.5  # n beta = 2 is allowed
    exp = parse_spec(pools(network={"delay": 0}), "g.toml")
    assert exp.network.delay is None


def test_stable_loads_are_accepted() -> None:
    # capacity 6 work/s: load 1.45 brings 5.8 < 6 under JSQ; random routing sends each node 0.95 < 1
    assert parse_spec(with_(PS_BASE, "workload.load", 1.45), "g.toml").workload.load == 1.45
    rnd = with_(PS_BASE, "policy", {"name": "random"}) | {"workload": {"load": 0.95}}
    assert parse_spec(rnd, "g.toml").policy.name == "random"
    # pools have no capacity limit: any load is fine
    assert parse_spec(with_(POOL_BASE, "workload.load", 50.0), "g.toml").workload.load == 50.0


def test_apply_overrides() -> None:
    data = copy.deepcopy(PS_BASE)
    out = apply_overrides(data, ["classes[0].count=10", "policy.name=jiq", "workload.load=0.25"], "x")
    assert out["classes"][0]["count"] == 10
    assert out["policy"]["name"] == "jiq"
    assert out["workload"]["load"] == 0.25
    exp = parse_spec(out, "x")
    assert exp.n == 12 and exp.policy.name == "jiq"


@pytest.mark.parametrize(
    ("override", "key"),
    [("classes[5].count=3", "classes[5].count"), ("name.x=1", "name.x"), ("policy", "policy")],
)
def test_bad_overrides_are_refused(override: str, key: str) -> None:
    with pytest.raises(SpecError) as info:
        apply_overrides(copy.deepcopy(PS_BASE), [override], "x.toml")
    assert info.value.source == "x.toml" and info.value.key == key


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


GOOD_TOML = """
name = "good"
seed = 3

[[classes]]
name = "slow"
count = 2
discipline = "ps"
speed = "2/3"

[[classes]]
name = "fast"
count = 2
discipline = "ps"
speed = "4/3"

[workload]
load = 0.5

[policy]
name = "jsq"
tie_break = "fastest"

[run]
duration = 10.0
"""


def test_load_spec_reads_file_and_applies_overrides(tmp_path: Path) -> None:
    path = _write(tmp_path, "good.toml", GOOD_TOML)
    exp = load_spec(path, ["classes[0].count=10", "policy.name=jiq"])
    assert exp.source == str(path)
    assert exp.classes[0].count == 10 and exp.n == 12
    assert exp.policy.name == "jiq" and exp.policy.tie_break == "fastest"
    assert exp.classes[1].speed.value == Fraction(4, 3)


def test_load_spec_reports_the_file_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "typo.toml", GOOD_TOML.replace("tie_break", "tiebreak"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.key == "policy.tiebreak"
    assert str(info.value).startswith(f"{path}: policy.tiebreak: unknown key")


def test_invalid_toml_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.toml", 'name = "x"\n[[classes]\ncount = \n')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    assert "not valid TOML" in info.value.message
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{path}: ")


def test_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    assert "cannot read" in info.value.message
    assert "\n" not in str(info.value)


def test_overrides_in_load_spec_are_validated(tmp_path: Path) -> None:
    path = _write(tmp_path, "good.toml", GOOD_TOML)
    with pytest.raises(SpecError) as info:
        load_spec(path, ["classes[0].count=0"])
    assert info.value.key == "classes[0].count" and info.value.source == str(path)


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.source == str(path)


# ------------------------------------------------------------------------------------------- CLI


def _cli_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _assert_one_error_line(err: str, *fragments: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lbt: error: ")
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0]


def test_cli_bad_spec_exits_2_with_one_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "BAD.toml",
        GOOD_TOML.replace(
            'count = 2\ndiscipline = "ps"\nspeed = "4/3"', 'count = "2"\ndiscipline = "ps"\nspeed = "4/3"'
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "simulate", str(path), "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "BAD.toml", "classes[1].count")
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (GOOD_TOML.replace("load = 0.5", "load = 0.5\nburst = 3"), ("workload.burst", "unknown key")),
        (GOOD_TOML.replace("load = 0.5", "load = 2.0"), ("workload", "unstable")),
        (GOOD_TOML + '\n[network]\ndelay = "x"\n', ("network.delay",)),
        ("name = [\n", ("not valid TOML",)),
    ],
    ids=["unknown-key", "unstable", "delay-type", "invalid-toml"],
)
def test_cli_errors_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, fragments: tuple[str, ...]
) -> None:
    path = _write(tmp_path, "BAD.toml", text)
    code, out, err = _cli_in_process(["simulate", str(path), "--quiet"], capsys)
    assert code == 2
    assert out == ""
    _assert_one_error_line(err, str(path), *fragments)


def test_cli_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "missing.toml"
    code, _, err = _cli_in_process(["simulate", str(path), "--quiet"], capsys)
    assert code == 2
    _assert_one_error_line(err, str(path), "cannot read")


def test_cli_bad_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "good.toml", GOOD_TOML)
    code, _, err = _cli_in_process(["simulate", str(path), "--quiet", "--set", "classes[0].count=0"], capsys)
    assert code == 2
    _assert_one_error_line(err, str(path), "classes[0].count", "at least 1")


def _never(*args: Any) -> Any:  # pragma: no cover - called only if the CLI runs a bad spec
    raise AssertionError("the simulator ran on a spec that did not validate")


def test_cli_runs_nothing_on_a_bad_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lbtestbed.analysis.simulator as simulator

    monkeypatch.setattr(simulator, "simulate_once", _never)
    path = _write(tmp_path, "BAD.toml", GOOD_TOML.replace('speed = "2/3"', "speed = -1"))
    code, _, err = _cli_in_process(["simulate", str(path), "--quiet"], capsys)
    assert code == 2
    _assert_one_error_line(err, "classes[0].speed")


def test_utility_on_a_queue_class_is_refused() -> None:
    # utilities are the pool model's (docs/theory.md, "The pool model"); on a ps class nothing would use them
    data = with_(PS_BASE, "classes.0.utility", {"kind": "xlog", "r": 20})
    expect_error(data, "classes[0].utility", "pool classes")
