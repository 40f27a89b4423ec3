"""JIQ with several dispatchers: theory against long simulations (docs/theory.md, "JIQ with K dispatchers:
stale tokens").

Runs ``lbt simulate examples/jiq.toml`` (50 or 200 FCFS nodes of speed 1, exponential work of mean 1, tokens
used oldest first) for JIQ-Random with K = 1, 2, 4 dispatchers and JIQ-SQ(2) with K = 2, 4, at loads 0.5,
0.7 and 0.9, with independent replications, and keeps each result as JSON in ``--dir`` (a setting already
there is not run again). Then prints the table of docs/theory.md: mean sojourn and wait probability,
simulated (95 % interval) against Lu et al.'s limit and against the models of
``lbtestbed/analysis/theory/jiq_stale.py``.

    .venv/bin/python benchmarks/jiq_dispatchers.py --dir /tmp/jiq_sims            # simulate, then the table
    .venv/bin/python benchmarks/jiq_dispatchers.py --dir /tmp/jiq_sims --table    # only the table

Each setting simulates about 2 * 10^7 tasks (``--tasks``) in ``--replications`` replications (one process:
``--jobs 1``); the whole grid takes a couple of hours of one core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "jiq.toml"
LOADS = (0.5, 0.7, 0.9)
SIZES = (50, 200)
#: (dispatchers K, probes d): JIQ-Random for d = 1, JIQ-SQ(d) otherwise
RULES = ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2))


def key(n: int, load: float, k: int, d: int, tie: str) -> str:
    return f"n{n}_l{load}_K{k}_d{d}_{tie}"


def simulate(out: Path, n: int, load: float, k: int, d: int, tie: str, tasks: float, reps: int) -> None:
    path = out / (key(n, load, k, d, tie) + ".json")
    if path.exists():
        return
    duration = tasks / (reps * n * load)
    cmd = [
        str(ROOT / ".venv" / "bin" / "lbt"),
        "simulate",
        str(SPEC),
        "--json",
        "--quiet",
        "--replications",
        str(reps),
        "--jobs",
        "1",
        "--set",
        f"classes[0].count={n}",
        "--set",
        f"workload.load={load}",
        "--set",
        f"policy.dispatchers={k}",
        "--set",
        f"policy.d={d}",
        "--set",
        f"policy.tie_break={tie}",
        "--set",
        f"run.duration={duration:.0f}",
        "--set",
        "run.warmup=1000",
    ]
    print("running", path.name, file=sys.stderr, flush=True)
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    path.write_text(res.stdout)


def read(out: Path, n: int, load: float, k: int, d: int, tie: str) -> dict | None:
    path = out / (key(n, load, k, d, tie) + ".json")
    if not path.exists():
        return None
    return json.loads(path.read_text())["metrics"]


def table(out: Path, tie: str) -> None:
    from lbtestbed.analysis.theory import dispatchers, jiq_stale

    head = "| n | load | rule | K | W sim | W Lu | W stale | W finite | P(wait) sim | Lu | stale | finite |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in SIZES:
        for load in LOADS:
            for k, d in RULES:
                m = read(out, n, load, k, d, tie)
                if m is None:
                    continue
                rule = "Random" if d == 1 else f"SQ({d})"
                w, pw = m["mean_sojourn"], m["wait_probability"]
                rho = dispatchers.occupied_iqueues(n / k, load, d)
                lu_w = 1.0 / (1.0 - load * (1.0 - rho))
                lu_pw = (1.0 - rho) * load
                st = jiq_stale.limit(n / k, load, d)
                fin = jiq_stale.finite(n, k, load, d)
                sim_w = f"{w['value']:.4f} ± {w['ci95']:.4f}"
                sim_pw = f"{pw['value']:.4f} ± {pw['ci95']:.4f}"
                print(
                    f"| {n} | {load} | {rule} | {k} | {sim_w} | {lu_w:.4f} | {st.mean_sojourn:.4f} | "
                    f"{fin.mean_sojourn:.4f} | {sim_pw} | {lu_pw:.4f} | {st.wait:.4f} | {fin.wait:.4f} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--table", action="store_true", help="only print the table from the results in --dir")
    ap.add_argument("--tasks", type=float, default=2e7)
    ap.add_argument("--replications", type=int, default=4)
    ap.add_argument("--tie-break", default="longest_idle", choices=("longest_idle", "random"))
    ap.add_argument("--n", type=int, nargs="*", default=list(SIZES))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if not args.table:
        for n in args.n:
            for load in LOADS[::-1]:
                for k, d in RULES:
                    simulate(args.dir, n, load, k, d, args.tie_break, args.tasks, args.replications)
    table(args.dir, args.tie_break)


if __name__ == "__main__":
    main()
