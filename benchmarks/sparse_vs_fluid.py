"""sparse_jsq and jiq_sparse simulated against their fluid fixed points (docs/theory.md, "What `lbt
predict` uses for `sparse_jsq` and `jiq_sparse`"): the settings of tests/test_sparse_jsq.py and
tests/test_jiq_sparse.py, or others, one row each, with 99 % t intervals from 10 batch means.

    .venv/bin/python benchmarks/sparse_vs_fluid.py                 # the three settings of the tests
    .venv/bin/python benchmarks/sparse_vs_fluid.py --nodes 500 --seed 2
"""

from __future__ import annotations

import argparse

import scipy.stats

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.theory.predict import predict
from lbtestbed.spec import parse_spec

#: (load, policy table) of each row
SETTINGS = (
    (0.5, {"name": "sparse_jsq", "updates": "asynchronous", "rate": 1.0}),
    (0.7, {"name": "sparse_jsq", "updates": "synchronous", "rate": 0.5}),
    (0.7, {"name": "jiq_sparse", "p": 0.5}),
)
T99_OVER_T95 = float(scipy.stats.t.ppf(0.995, 9) / scipy.stats.t.ppf(0.975, 9))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=200.0)
    args = ap.parse_args()
    print("| policy | load | messages per task | W simulated | W fluid | P(wait) simulated | P(wait) fluid |")
    print("|---|---|---|---|---|---|---|")
    for load, policy in SETTINGS:
        exp = parse_spec(
            {
                "name": "sparse-vs-fluid",
                "seed": args.seed,
                "classes": [{"name": "q", "count": args.nodes, "discipline": "fcfs"}],
                "workload": {"load": load, "service": {"dist": "exponential", "mean": 1.0}},
                "policy": policy,
                "run": {"warmup": args.warmup, "duration": args.duration, "batches": 10},
            }
        )
        sim = summarize(exp, [simulate_once(exp)]).metrics
        fluid = predict(exp).metrics
        shown = {
            m: f"{sim[m]['value']:.4f} ± {sim[m]['ci95'] * T99_OVER_T95:.4f}"
            for m in sim
            if m != "occupancy_tail" and sim[m].get("ci95") is not None
        }

        name = " ".join(f"{k} {v}" for k, v in policy.items() if k != "name")
        print(
            f"| `{policy['name']}` {name} | {load} | {shown['messages_per_task']} (predicted "
            f"{fluid['messages_per_task']['value']:.4f}) | {shown['mean_sojourn']} | "
            f"{fluid['mean_sojourn']['value']:.4f} | {shown['wait_probability']} | "
            f"{fluid['wait_probability']['value']:.4f} |"
        )


if __name__ == "__main__":
    main()
