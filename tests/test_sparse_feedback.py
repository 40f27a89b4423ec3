"""JSQ on sparse queue-length feedback and sparsified JIQ (lbtestbed/analysis/theory/sparse_feedback.py;
docs/theory.md, "Sparse feedback: JSQ on occasional updates").

The fluid limits are checked against benchmarks/reference_sparse_feedback.py, a plain simulation of exactly
the same models that shares no code with the package: fixed seeds, independent replications, and the
formula within the simulation's 95 % interval. The settings are ones where the finite-N bias at the N used
is well inside that interval (docs/theory.md gives it: it is largest for asynchronous updates).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from lbtestbed.analysis.theory import sparse_feedback as sf

ROOT = Path(__file__).resolve().parents[1]


@cache
def reference() -> ModuleType:
    """The reference simulation, a script in benchmarks/ rather than a module of the package."""
    path = ROOT / "benchmarks" / "reference_sparse_feedback.py"
    spec = importlib.util.spec_from_file_location("reference_sparse_feedback", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


FLUID = {"async": sf.asynchronous, "sync": sf.synchronous, "jiq": sf.sparse_jiq}


@pytest.mark.parametrize(
    ("scheme", "load", "messages", "n", "warmup", "duration"),
    [
        ("async", 0.7, 1.0, 8000, 20.0, 40.0),
        ("sync", 0.7, 0.5, 2000, 30.0, 100.0),
        ("jiq", 0.7, 0.5, 2000, 30.0, 100.0),
    ],
)
def test_fluid_limit_agrees_with_the_reference_simulation(
    scheme: str, load: float, messages: float, n: int, warmup: float, duration: float
) -> None:
    sim = reference().replicate(scheme, n, load, messages, warmup, duration, seed=7, reps=4)
    fluid = FLUID[scheme](load, messages)
    for name, value in (("mean_sojourn", fluid.mean_sojourn), ("wait", fluid.wait)):
        mean, half = sim[name]
        assert abs(mean - value) <= half, (scheme, name, mean, half, value)
    mean, half = sim["messages_per_task"]
    assert abs(mean - messages) <= half


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_no_wait_from_one_over_one_minus_load_messages_per_task(load: float) -> None:
    edge = sf.zero_wait_messages(load)
    assert edge == pytest.approx(1 / (1 - load))
    for scheme in (sf.asynchronous, sf.synchronous):
        assert scheme(load, 1.02 * edge).wait == pytest.approx(0.0, abs=1e-9)
        assert scheme(load, 1.02 * edge).mean_sojourn == pytest.approx(1.0, abs=1e-9)
        assert scheme(load, 0.9 * edge).wait > 1e-3


def test_ultra_sparse_updates_asynchronous_wait_grows_synchronous_settles() -> None:
    """As messages -> 0 the asynchronous wait grows without bound (the water level grows like load /
    delta) and the synchronous one tends to the round robin's (van der Boor et al. 2019, abstract)."""
    waits = [sf.asynchronous(0.5, m).mean_wait for m in (0.4, 0.2, 0.1, 0.05)]
    assert all(b > 1.6 * a for a, b in itertools.pairwise(waits))
    limit = sf.round_robin_limit(0.5).mean_wait
    sync = [sf.synchronous(0.5, m).mean_wait for m in (0.4, 0.1, 0.02)]
    assert sync[0] < sync[1] < sync[2] < limit
    assert sync[2] == pytest.approx(limit, rel=0.05)


def test_sparse_jiq_spans_random_routing_and_jiq() -> None:
    load = 0.6
    jiq = sf.sparse_jiq(load, 1.0)
    assert jiq.wait == pytest.approx(0.0) and jiq.mean_sojourn == pytest.approx(1.0)
    almost_random = sf.sparse_jiq(load, 1e-9)
    assert almost_random.mean_sojourn == pytest.approx(1 / (1 - load), rel=1e-6)  # M/M/1 per server
    assert almost_random.wait == pytest.approx(load, rel=1e-6)
    assert sum(math.isfinite(t) for t in sf.sparse_jiq(load, 0.5).tail) > 2


def test_bad_input_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="load"):
        sf.asynchronous(1.2, 1.0)
    with pytest.raises(ValueError, match="message rate"):
        sf.synchronous(0.5, 0.0)
    with pytest.raises(ValueError, match="at most one token"):
        sf.sparse_jiq(0.5, 1.5)
