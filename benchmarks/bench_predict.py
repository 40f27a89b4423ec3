"""How long ``lbt predict`` takes now that it solves Markov chains (docs/theory.md, "The solver and what it
costs").

Two parts, each against a baseline in the same run:

1. The exact chain's solver (level reduction or GMRES over the levels of total tasks) against SciPy's
   general sparse solver (SuperLU, its default column ordering) on the very same generator: JSQ, n = 20,
   load 0.9, K = 3 and 4 (K = 5, the largest ``lbt predict`` solves by default, takes SuperLU minutes, so
   only ours runs there). Wall and CPU seconds, and their ratio.
2. ``predict`` on every example spec, cold (an empty disk cache, a fresh process state) and warm (the disk
   cache the cold run wrote), wall seconds; and cold on 20 fcfs nodes at load 0.9 under JSQ, JIQ and
   JSQ(2), the largest everyday cases.

    .venv/bin/python benchmarks/bench_predict.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def solver_part() -> None:
    from scipy import sparse
    from scipy.sparse import linalg

    from lbtestbed.analysis.theory import ctmc

    model = ctmc.Model("jsq", 20, 18.0)
    print("exact chain, JSQ n = 20, load 0.9: ours against SciPy's spsolve (SuperLU) on the same generator")
    for K in (3, 4, 5):
        m, q, _ = ctmc._generator(model, K)
        pi, wall, cpu = timed(lambda m=m, q=q: ctmc.stationary(m, q))
        line = f"  K = {K}: {len(m):6d} states  ours {wall:6.2f} s wall {cpu:6.2f} s cpu"
        if K <= 4:
            out = np.asarray(q.sum(axis=1)).ravel()
            a = (q.T - sparse.diags(out)).tolil()
            a[0, :] = 1.0
            rhs = np.zeros(len(m))
            rhs[0] = 1.0
            x, w2, c2 = timed(lambda a=a, rhs=rhs: linalg.spsolve(a.tocsc(), rhs))
            same = np.abs(x / x.sum() - pi).max()
            line += f"  SuperLU {w2:6.2f} s wall {c2:6.2f} s cpu  ratio {w2 / wall:5.1f}x wall"
            line += f" (max |diff| {same:.1g})"
        print(line)


def predict_part() -> None:
    from lbtestbed.analysis.theory import ctmc, predict
    from lbtestbed.spec import load_spec, parse_spec

    with tempfile.TemporaryDirectory() as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        print("predict on every example: cold (empty cache), then warm (the disk cache it wrote)")
        for path in sorted((ROOT / "examples").glob("*.toml")):
            exp = load_spec(path)
            ctmc.exact.cache_clear()
            _, cold, _ = timed(lambda exp=exp: predict(exp))
            ctmc.exact.cache_clear()
            _, warm, _ = timed(lambda exp=exp: predict(exp))
            print(f"  {path.name:32s} cold {cold:6.2f} s   warm {warm:6.3f} s")
        for policy in ("jsq", "jiq", "power_of_d"):  # the everyday cluster: 20 fcfs nodes at load 0.9
            exp = parse_spec(
                {
                    "name": f"{policy}-20",
                    "classes": [{"name": "s", "count": 20, "discipline": "fcfs"}],
                    "workload": {"load": 0.9},
                    "policy": {"name": policy},
                    "run": {"duration": 100.0},
                }
            )
            ctmc.exact.cache_clear()
            r, cold, cpu = timed(lambda exp=exp: predict(exp))
            regime = r.metrics["mean_sojourn"]["regime"]
            print(f"  {policy + ', 20 nodes, load 0.9':32s} cold {cold:6.2f} s ({cpu:.2f} s cpu), {regime}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("solver", "predict", "both"), default="both")
    args = parser.parse_args()
    if args.part in ("solver", "both"):
        solver_part()
    if args.part in ("predict", "both"):
        predict_part()


if __name__ == "__main__":
    main()
