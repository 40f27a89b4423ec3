"""Long storms of faults on a real cluster: the long version of tests/test_chaos.py.

Each round draws a schedule of overlapping faults of every kind with its own seed
(``lbtestbed.experiment.chaos``: kills, pauses, dispatcher restarts, slow and failing nodes, dropped,
duplicated and delayed state messages), runs the spec's load through it on a fresh cluster, and checks what
must hold afterwards: every task accounted for, the drained dispatchers' picture equal to the nodes'
truth, no process left. It reports, per round, the faults, the tasks by outcome, how long the dispatchers
took to heal after the load, and the problems found (none, when all is well); the exit code is 1 if any
round found one.

    .venv/bin/python benchmarks/bench_chaos.py [--rounds 5] [--faults 24] [--seconds 40] [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from lbtestbed.experiment.chaos import chaos_faults, faults_toml, problems, run_chaos
from lbtestbed.spec import load_spec

SCALE = 0.02  # wall seconds per model second


def spec_text(seconds: float) -> str:
    """JSQ over 12 FCFS nodes in 3 node processes, two dispatchers, load 0.6, ``seconds`` of wall time."""
    return f"""
name = "chaos"
seed = 3
[[classes]]
name = "servers"
count = 12
discipline = "fcfs"
[workload]
load = 0.6
service = {{ dist = "exponential", mean = 1.0 }}
[policy]
name = "jsq"
dispatchers = 2
[run]
warmup = 0.0
duration = {seconds / SCALE:g}
time_scale = {SCALE}
[health]
outlier_interval = 0.5
ejection_time = 0.5
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5, help="storms, each with its own seed (default 5)")
    p.add_argument("--faults", type=int, default=24, help="faults per storm (default 24)")
    p.add_argument("--seconds", type=float, default=40.0, help="wall seconds of load per storm (default 40)")
    p.add_argument("--seed", type=int, default=1, help="the first storm's schedule seed (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args()
    rounds = []
    for r in range(args.rounds):
        seed = args.seed + r
        with tempfile.TemporaryDirectory(prefix="lbt-chaos-") as tmp:
            base_path = Path(tmp) / "base.toml"
            base_path.write_text(spec_text(args.seconds))
            base = load_spec(base_path)
            one_way = [k for k in base.policy.message_kinds() if k not in ("probe", "probe_reply")]
            faults = chaos_faults(base, 3, seed, args.faults, one_way)
            spec = Path(tmp) / "spec.toml"
            spec.write_text(spec_text(args.seconds) + faults_toml(faults))
            started = time.monotonic()
            outcome = run_chaos(load_spec(spec), Path(tmp) / "run", 3, lambda line: None)
            found = problems(outcome)
        row = {
            "seed": seed,
            "faults": len(faults),
            "kinds": sorted({f["kind"] for f in faults}),
            "outcomes": dict(outcome.load.outcomes),
            "scheduled": outcome.load.scheduled,
            "heal_seconds": round(outcome.heal_seconds, 3),
            "wall_seconds": round(time.monotonic() - started, 1),
            "switch_errors": [a["error"] for a in outcome.actions if a["error"]],
            "problems": found,
        }
        rounds.append(row)
        print(
            f"round {r + 1}/{args.rounds} (seed {seed}): {len(faults)} faults, {row['outcomes']}, healed in "
            f"{row['heal_seconds']} s, {len(found)} problem(s)",
            file=sys.stderr,
        )
        for line in found:
            print(f"  {line}", file=sys.stderr)
    ok = all(not row["problems"] for row in rounds)
    if args.json:
        json.dump({"rounds": rounds, "ok": ok}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"{sum(not row['problems'] for row in rounds)} of {len(rounds)} storms left nothing wrong")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
