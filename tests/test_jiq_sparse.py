"""Sparsified JIQ (``jiq_sparse``): JIQ whose node, left idle, sends its token with probability p only
(docs/spec.md, "`jiq_sparse`"; docs/theory.md, "Sparsified JIQ at the same message rate"): its keys, its
thinning rule by hand, p = 1 as JIQ run for run, and 2000 nodes against the fluid fixed point.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import scipy.stats

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.theory import sparse_feedback
from lbtestbed.analysis.theory.predict import predict
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.model.streams import node_random
from lbtestbed.policies import make_node_sides, policy_of
from lbtestbed.policies.jiq_sparse import SparseTokenSender, tokens_per_task
from lbtestbed.spec import parse_spec


def experiment(
    n: int = 4, load: float = 0.5, warmup: float = 10.0, duration: float = 100.0, seed: int = 3, **policy: Any
) -> Experiment:
    return parse_spec(
        {
            "name": "jiq-sparse",
            "seed": seed,
            "classes": [{"name": "queues", "count": n, "discipline": "fcfs"}],
            "workload": {"load": load, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "jiq_sparse", **policy},
            "run": {"warmup": warmup, "duration": duration, "batches": 10},
        }
    )


def test_reads_p_with_jiqs_keys_and_its_alias() -> None:
    exp = experiment()
    assert (exp.policy.name, exp.policy.p, exp.policy.d, exp.policy.tie_break) == (
        "jiq_sparse",
        1.0,
        1,
        "random",
    )  # type: ignore[attr-defined]
    alias = experiment(name="sparsified_jiq", p=0.25, tie_break="longest_idle")
    assert (alias.policy.name, alias.policy.p, alias.policy.tie_break) == ("jiq_sparse", 0.25, "longest_idle")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("policy", "key", "fragment"),
    [
        ({"p": 0}, "policy.p", "must be positive"),
        ({"p": 1.5}, "policy.p", "probability in (0, 1]"),
        ({"p": "half"}, "policy.p", "number"),
        ({"d": 2}, "policy.d", "probes 2 distinct dispatchers"),
        ({"rate": 1}, "policy.rate", "expected one of name, dispatchers, split, tie_break, d, p"),
    ],
)
def test_bad_keys_are_refused_with_their_path(policy: dict[str, Any], key: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        experiment(**policy)
    assert info.value.key == key
    assert fragment in info.value.message


def sender(p: float, node: int = 1, dispatchers: int = 1) -> SparseTokenSender:
    exp = experiment(p=p, dispatchers=dispatchers)
    [side] = make_node_sides(exp, random.Random(0), [node], dispatchers)
    assert isinstance(side, SparseTokenSender)
    return side


def test_a_node_left_idle_sends_its_token_when_its_own_draw_is_below_p() -> None:
    """p = 0.4, node 1: each time its last task leaves it draws u from its own stream (node_random) and
    sends its token numbered by its arrivals iff u < 0.4; a departure that leaves a task draws nothing.
    A silent idle node reports token_to = -1, so that no dispatcher takes its token for lost."""
    side = sender(0.4)
    draws = node_random(3, 1)
    sent = 0
    for arrivals in range(1, 41):
        side.on_arrival(1, 0, ())
        side.on_arrival(2, 0, ())
        assert side.on_departure(1, 0) == ()  # one task left: no draw
        msgs = side.on_departure(0, 0)
        if draws.random() < 0.4:
            assert [(m.kind, m.data) for m in msgs] == [("idle_token", (2 * arrivals,))]
            assert side.report(0) == (0, 2 * arrivals, 0)
            sent += 1
        else:
            assert msgs == () and side.report(0) == (0, 2 * arrivals, -1)
    assert 0 < sent < 40


def test_p_one_draws_nothing_and_is_jiq_run_for_run() -> None:
    side = sender(1.0)
    state = side.rng.getstate()
    side.on_arrival(1, 0, ())
    assert [m.kind for m in side.on_departure(0, 0)] == ["idle_token"] and side.rng.getstate() == state
    exp = experiment(n=20, load=0.8, duration=200.0)
    jiq = parse_spec({**_document(exp), "policy": {"name": "jiq"}})
    ours, theirs = simulate_once(exp), simulate_once(jiq)
    assert ours.sojourns == theirs.sojourns and ours.decisions == theirs.decisions


def _document(exp: Experiment) -> dict[str, Any]:
    return {
        "name": exp.name,
        "seed": exp.seed,
        "classes": [{"name": "queues", "count": exp.n, "discipline": "fcfs"}],
        "workload": {"load": exp.workload.load, "service": {"dist": "exponential", "mean": 1.0}},
        "run": {"warmup": exp.run.warmup, "duration": exp.run.duration, "batches": exp.run.batches},
    }


def test_with_two_dispatchers_the_token_goes_to_one_drawn_after_the_thinning_draw() -> None:
    side = sender(0.5, node=2, dispatchers=2)
    draws = node_random(3, 2)
    for arrivals in range(1, 21):
        side.on_arrival(1, 0, ())
        msgs = side.on_departure(0, 0)
        if draws.random() < 0.5:
            to = int(draws.random() * 2)
            assert [(m.data, m.dispatcher) for m in msgs] == [((arrivals,), to)]
        else:
            assert msgs == ()


#: the 99 % two-sided t interval from the 95 % one of 10 batch means (9 degrees of freedom)
T99_OVER_T95 = float(scipy.stats.t.ppf(0.995, 9) / scipy.stats.t.ppf(0.975, 9))


def test_2000_nodes_agree_with_the_fluid_fixed_point() -> None:
    """Load 0.7, p = 0.5: mean sojourn, P(wait) and tokens per task within the run's 99 % interval (10
    batch means, seed 1) of the fixed point, m = p (1 - load) / (1 - load p) = 0.2308 tokens per task.
    JIQ's fixed point (p = 1: no wait) and random routing's (p -> 0) lie outside it."""
    exp = experiment(n=2000, load=0.7, warmup=100.0, duration=200.0, seed=1, p=0.5)
    metrics = summarize(exp, [simulate_once(exp)]).metrics
    m = tokens_per_task(0.5, 0.7)
    fluid = sparse_feedback.sparse_jiq(0.7, m)
    random_routing = 1.0 / (1.0 - 0.7)
    for metric, value, other in (
        ("mean_sojourn", fluid.mean_sojourn, random_routing),
        ("wait_probability", fluid.wait, 0.0),
        ("messages_per_task", m, 1.0),
    ):
        mean, half = metrics[metric]["value"], metrics[metric]["ci95"] * T99_OVER_T95
        assert abs(mean - value) <= half, (metric, mean, half, value)
        assert abs(mean - other) > half
    cost = policy_of(exp).messages(exp)
    assert cost.per_task == pytest.approx(m, rel=1e-12)
    predicted = predict(exp).metrics
    assert predicted["mean_sojourn"]["value"] == pytest.approx(fluid.mean_sojourn, rel=1e-12)
    assert predicted["messages_per_task"]["regime"] == "limit"


def test_several_dispatchers_have_no_formula_for_their_tokens() -> None:
    exp = experiment(p=0.5, dispatchers=2)
    assert policy_of(exp).messages(exp).per_task is None
    assert predict(exp).metrics["mean_sojourn"]["value"] is None
