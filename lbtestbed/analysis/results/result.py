"""The result object that ``lbt simulate``, ``lbt predict`` and ``lbt run`` share, and its table.

JSON shape (``docs/spec.md``, "Result object"): ``{"name", "policy", "source", "metrics": {...}}`` plus
context (``spec``, ``n``, ``load``, ``settings``) and, for simulations, ``decisions`` and ``series``. Every
metric is ``{"value", "ci95"}``; ``ci95`` is the half-width of the 95% interval; a metric that does not
apply has value null.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.statistics import Estimate, mean_ci, ratio_estimate, replication_estimate
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import CATALOG, policy_of

#: metrics every result carries, in table order
METRICS = (
    "mean_sojourn",
    "sojourn_p50",
    "sojourn_p99",
    "mean_tasks_per_node",
    "tasks_in_system",
    "utility",
    "wait_probability",
    "idle_capacity",
    "idle_nodes",
    "messages_per_task",
    "occupancy_tail",
    # what some policy learns (unit.Learned): a metric of every result, null where the policy learns nothing
    *(learned.name for learned in CATALOG.learned()),
)

#: metrics that are ratios of a run's batch sums (RawRun.ratios under the same key)
RATIO_METRICS = (
    "mean_sojourn",
    "mean_tasks_per_node",
    "utility",
    "wait_probability",
    "idle_capacity",
    "idle_nodes",
    "messages_per_task",
    *(learned.name for learned in CATALOG.learned()),
    "tasks_in_system",
)
#: metrics that are quantiles of the sojourns, and their levels
QUANTILE_METRICS = {"sojourn_p50": 0.5, "sojourn_p99": 0.99}

#: occupancy tails stop at the first j whose (pooled) fraction falls below this
TAIL_CUTOFF = 1e-6


@dataclass
class Result:
    name: str
    policy: str
    source: str
    metrics: dict[str, Any]
    context: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policy": self.policy,
            "source": self.source,
            **self.context,
            "metrics": self.metrics,
            **self.extras,
        }

    def value(self, metric: str) -> float | None:
        v = self.metrics[metric].get("value")
        return None if v is None else float(v)


def learned_name(exp: Experiment) -> str:
    """The metric of what the experiment's policy learns (it must learn something)."""
    learned = policy_of(exp).learned
    assert learned is not None, f"{exp.policy.name} learns nothing"
    return learned.name


def _estimate(raws: Sequence[RawRun], key: str) -> Estimate:
    """Batch means for one replication, replication means for several."""
    present = [r for r in raws if key in r.ratios]
    if not present:
        return Estimate.none()
    if len(present) == 1:
        num, den = present[0].ratios[key]
        return ratio_estimate(num, den)
    values = []
    for r in present:
        num, den = r.ratios[key]
        values.append(float(num.sum() / den.sum()) if den.sum() > 0 else None)
    return replication_estimate(values)


def _quantile(raws: Sequence[RawRun], q: float) -> Estimate:
    if len(raws) == 1:
        batches = [b for b in raws[0].sojourns if b]
        if not batches:
            return Estimate.none()
        pooled = float(np.quantile(np.concatenate([np.asarray(b) for b in batches]), q))
        return mean_ci([float(np.quantile(b, q)) for b in batches], center=pooled)
    values = []
    for r in raws:
        s = [x for b in r.sojourns for x in b]
        values.append(float(np.quantile(s, q)) if s else None)
    return replication_estimate(values)


def summarize(exp: Experiment, raws: Sequence[RawRun], source: str = "simulation") -> Result:
    """Turn the measurements of one or more replications into the shared result object."""
    est = {key: _estimate(raws, key) for key in RATIO_METRICS}
    metrics: dict[str, Any] = {k: e.to_json() for k, e in est.items()}
    for metric, q in QUANTILE_METRICS.items():
        metrics[metric] = _quantile(raws, q).to_json()
    metrics["mean_sojourn"]["by_class"] = {
        c.name: _estimate(raws, f"sojourn:{i}").to_json() for i, c in enumerate(exp.classes)
    }
    # variance of the number of tasks in the system about its mean (Poisson(n rho) for pools)
    mean = est["tasks_in_system"].value
    if mean is not None and "tasks_in_system_sq" in raws[0].ratios:  # a cluster cannot integrate it
        sq = _estimate(raws, "tasks_in_system_sq")
        if len(raws) == 1:
            num, den = raws[0].ratios["tasks_in_system"]
            num2, _ = raws[0].ratios["tasks_in_system_sq"]
            var = ratio_estimate(num2 - 2 * mean * num + mean * mean * den, den)
        else:
            var = Estimate((sq.value or 0.0) - mean * mean, None)
        metrics["tasks_in_system"]["variance"] = var.to_json()
    kinds = raws[0].message_kinds
    by_kind = {kind: _estimate(raws, f"messages:{kind}") for kind in kinds}
    metrics["messages_per_task"]["by_kind"] = {kind: e.value for kind, e in by_kind.items()}
    metrics["messages_per_task"]["by_kind_ci95"] = {kind: e.ci95 for kind, e in by_kind.items()}
    tails: dict[str, list[dict[str, float | None]]] = {}
    for i, c in enumerate(exp.classes):
        entries: list[dict[str, float | None]] = [{"value": 1.0, "ci95": 0.0}]  # every node holds >= 0 tasks
        j = 1
        while any(f"tail:{i}:{j}" in r.ratios for r in raws):
            e = _estimate(raws, f"tail:{i}:{j}")
            if (e.value or 0.0) < TAIL_CUTOFF:
                break
            if e.value is not None and e.value > 1.0:  # a ratio of sums can round just above 1
                e = Estimate(1.0, e.ci95, e.df)
            entries.append(e.to_json())
            j += 1
        tails[c.name] = entries
    metrics["occupancy_tail"] = tails
    if raws[0].r_time:
        total: dict[int | float, float] = {}
        for r in raws:
            for k, v in r.r_time.items():
                total[k] = total.get(k, 0.0) + v
        whole = sum(total.values())
        # a list, not a mapping keyed by the values seen: its keys would change from run to run
        metrics[learned_name(exp)]["time_fraction"] = [
            {"value": k, "fraction": v / whole} for k, v in sorted(total.items())
        ]
    metrics = {k: metrics[k] for k in METRICS}

    decisions: dict[str, int] = {}
    for r in raws:
        for outcome, count in r.decisions.items():
            decisions[outcome] = decisions.get(outcome, 0) + count
    extras: dict[str, Any] = {
        "decisions": decisions,
        "censored_tasks": sum(r.censored for r in raws),
        "events": sum(r.events for r in raws),
        "wall_seconds": max(r.wall_seconds for r in raws),
    }
    if raws[0].r_time:
        extras["stale_tokens"] = sum(r.stale_tokens for r in raws)
        extras["series"] = {learned_name(exp): [[t, v] for t, v in raws[0].r_series]}
    context = {
        "spec": exp.source,
        "n": exp.n,
        "load": exp.workload.load,
        "arrival_rate": exp.workload.arrival_rate,
        "settings": {
            "seed": exp.seed,
            "warmup": exp.run.warmup,
            "duration": exp.run.duration,
            "batches": exp.run.batches,
            "dispatchers": exp.policy.dispatchers,
            "split": exp.policy.split,
            "view": exp.policy.view,
            "replications": len(raws),
            "ci_method": "batch means" if len(raws) == 1 else "independent replications",
        },
    }
    return Result(exp.name, exp.policy.name, source, metrics, context, extras)
