"""Nemesis soak (issue 27, not in CI): many seeded schedules of overlapping faults, crashes and stalls on
supervised clusters, every invariant checked after each (``lbtestbed.experiment.nemesis``).

The suite runs 20 schedules (tests/test_chaos.py: seeds 101-120 on JSQ and JIQ); this runs as many as asked,
``--per-cluster`` schedules on each cluster (one run of that many segments), clusters one after the other,
the policies in turn. It prints, per cluster, the seeds, the tasks by fate, the outages seen (planned and
not), the restarts, and every invariant that did not hold; with ``--json`` one object.

    .venv/bin/python benchmarks/bench_nemesis.py                          # 100 schedules, JSQ and JIQ
    .venv/bin/python benchmarks/bench_nemesis.py --schedules 20 --first-seed 500 --policies jiq
    .venv/bin/python benchmarks/bench_nemesis.py --schedules 400 --out /tmp/nemesis --json

Exit status: 0 when every invariant held after every schedule, 1 when one did not, 2 for bad arguments.
Nothing here judges speed; a schedule costs about 5 wall seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from lbtestbed.experiment.nemesis import BASE, SEGMENT, run_nemesis, segment_problems, task_fates

POLICIES = ("jsq", "jiq")


def one_cluster(policy: str, seeds: list[int], out: Path) -> dict[str, Any]:
    """Run ``seeds`` on one cluster of ``policy``; what it dealt and what did not hold."""
    began = time.monotonic()
    outcome = run_nemesis(BASE.replace("{policy}", policy), seeds, 3, SEGMENT, out, lambda _: None)
    problems = [p for segment in segment_problems(outcome) for p in segment]
    fates = Counter(f.ends[0] if len(f.ends) == 1 else "several" for f in task_fates(outcome.events).values())
    return {
        "policy": policy,
        "seeds": [seeds[0], seeds[-1]],
        "wall_seconds": round(time.monotonic() - began, 1),
        "tasks": dict(fates),
        "faults": sum(len(s.faults) for s in outcome.schedules),
        "strikes": sum(len(s.strikes) for s in outcome.schedules),
        "outages": len(outcome.outages),
        "unplanned": sum(1 for o in outcome.outages if o["fault"] is None),
        "restarts": sum(len(o["restarted"]) for o in outcome.outages),
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--schedules", type=int, default=100, help="schedules in all (default 100)")
    p.add_argument("--per-cluster", type=int, default=10, help="schedules on each cluster (default 10)")
    p.add_argument("--first-seed", type=int, default=1000, help="the first schedule's seed (default 1000)")
    p.add_argument("--policies", default=",".join(POLICIES), help="one per cluster, in turn (jsq,jiq)")
    p.add_argument("--out", type=Path, help="where the runs' directories go (default a temporary one)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    policies = [x for x in args.policies.split(",") if x]
    if args.schedules < 2 or args.per_cluster < 2 or not set(policies) <= set(POLICIES) or not policies:
        p.error(f"--schedules and --per-cluster at least 2; --policies among {', '.join(POLICIES)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="nemesis-"))
    seeds = list(range(args.first_seed, args.first_seed + args.schedules))
    clusters = [seeds[i : i + args.per_cluster] for i in range(0, len(seeds), args.per_cluster)]
    clusters = [c for c in clusters if len(c) >= 2]  # a run needs two segments
    results = []
    for k, chunk in enumerate(clusters):
        policy = policies[k % len(policies)]
        result = one_cluster(policy, chunk, out / f"{k:03d}-{policy}")
        results.append(result)
        if not args.json:
            held = "every invariant held" if not result["problems"] else f"{len(result['problems'])} problems"
            print(
                f"{policy} seeds {chunk[0]}-{chunk[-1]}: {result['tasks']}, {result['faults']} faults, "
                f"{result['strikes']} strikes, {result['outages']} outages "
                f"({result['unplanned']} unplanned), "
                f"{result['restarts']} restarts, {result['wall_seconds']} s: {held}",
                flush=True,
            )
            for line in result["problems"]:
                print(f"  {line}")
    failed = sum(1 for r in results for _ in r["problems"])
    if args.json:
        json.dump({"out": str(out), "clusters": results, "problems": failed}, sys.stdout, indent=1)
        print()
    else:
        total = sum(len(c) for c in clusters)
        print(f"{total} schedules on {len(clusters)} clusters: {failed} problems; runs in {out}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
