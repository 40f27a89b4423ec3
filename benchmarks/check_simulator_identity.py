"""Does the simulator still give bit-identical results? The working tree against a git revision.

A speed-up of the simulator must not change what it computes: for a fixed seed, every RawRun (ratios,
sojourns, decisions, message counts, r series, events) and the ``lbt simulate --json`` object must stay the
same to the last bit. This script runs a set of specs (every example with short run lengths, plus variants
that reach the other code paths: network delay, forwarded tasks, tie-breaks, sampling with replacement, other
service distributions and disciplines) twice, each time in a fresh process on a private copy of the
package:

* **reference**: the working tree's ``lbtestbed`` with the simulator's files taken from ``--ref``
  (``git show``, read-only), so that other people's edits elsewhere do not count as differences;
* **candidate**: the working tree's ``lbtestbed`` as it is.

Both run the pure-Python simulator (``LBT_SIMULATOR=python``). With ``--compiled`` the reference is the
working tree's pure-Python simulator and the candidate the same tree on the mypyc build
(``lbtestbed/analysis/simulator/compiled.py``; a build that is missing or stale is an error here, not a
fallback).

It compares a digest of each RawRun and the JSON result object without ``wall_seconds``, and prints the
first difference it finds for a case that differs. Exit status 0 when every case is identical, 1 otherwise.

    .venv/bin/python benchmarks/check_simulator_identity.py                  # against HEAD, about a minute
    .venv/bin/python benchmarks/check_simulator_identity.py --ref HEAD~3 --only jsq2
    .venv/bin/python benchmarks/check_simulator_identity.py --compiled  # after the mypyc build
    .venv/bin/python benchmarks/check_simulator_identity.py --ref 3e58d53 --whole  # before the layout moved
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the files whose old versions make the reference (the simulator and what its hot path calls)
SIMULATOR_FILES = (
    "lbtestbed/analysis/simulator/engine.py",
    # every policy module, the registry and the interface: both halves run in the simulator
    "lbtestbed/policies/__init__.py",
    "lbtestbed/policies/catalog.py",
    "lbtestbed/policies/unit.py",
    "lbtestbed/policies/base.py",
    "lbtestbed/policies/sampling.py",
    "lbtestbed/policies/jsq.py",
    "lbtestbed/policies/jlmu.py",
    "lbtestbed/policies/jiq.py",
    "lbtestbed/policies/slta.py",
    "lbtestbed/policies/static.py",
    "lbtestbed/policies/hetero_ps.py",
    "lbtestbed/policies/peak_ewma.py",
    "lbtestbed/policies/prequal.py",
    "lbtestbed/policies/edf.py",
    "lbtestbed/policies/structures.py",
    "lbtestbed/policies/ranking.py",
    "lbtestbed/model/nodes.py",
    "lbtestbed/model/workload.py",
    "lbtestbed/model/experiment.py",  # the experiment and its policy's parameters
    "lbtestbed/model/streams.py",  # its random streams
    "lbtestbed/model/distributions.py",
)

SHORT = ["run.warmup=20.0", "run.duration=150.0"]
SHORT_POOLS = ["run.warmup=10.0", "run.duration=30.0"]  # 100 pools at rho 10: about 1000 arrivals a second

#: case name -> (spec file, overrides); short runs, each reaching some path of the simulator
CASES: dict[str, tuple[str, list[str]]] = {
    **{
        p.stem: (
            str(p.relative_to(ROOT)),
            # the simulator ignores faults, and the short runs end before a file's fault windows
            [*(SHORT_POOLS if '"pool"' in p.read_text() else SHORT)]
            + (["faults=[]"] if "[[faults]]" in p.read_text() else []),
        )
        for p in sorted((ROOT / "examples").glob("*.toml"))
    },
    "jsq2_bench": (
        "examples/power_of_d_jsq2.toml",
        ["classes[0].count=1000", "run.warmup=5.0", "run.duration=30.0"],
    ),
    "jsq2_d1": ("examples/power_of_d_jsq2.toml", [*SHORT, "policy.d=1"]),
    "jsq2_d3_replace": ("examples/power_of_d_jsq2.toml", [*SHORT, "policy.d=3", "policy.replace=true"]),
    "jsq2_d5": ("examples/power_of_d_jsq2.toml", [*SHORT, "policy.d=5"]),
    "jsq2_d40": ("examples/power_of_d_jsq2.toml", [*SHORT, "policy.d=40"]),
    "jsq2_fastest_hetero": (
        "examples/power_of_d_jsq2.toml",
        [*SHORT, "policy.tie_break='fastest'", "classes[0].speed={dist='uniform', low=0.7, high=1.3}"],
    ),
    "jsq2_slowest": ("examples/power_of_d_jsq2.toml", [*SHORT, "policy.tie_break='slowest'"]),
    "jsq2_hyperexp": (
        "examples/power_of_d_jsq2.toml",
        [*SHORT, "workload.service={dist='hyperexponential', mean=1.0, scv=4.0}"],
    ),
    "jsq2_lognormal_ps": (
        "examples/power_of_d_jsq2.toml",
        [*SHORT, "workload.service={dist='lognormal', mean=1.0, scv=2.0}", "classes[0].discipline='ps'"],
    ),
    "jsq2_deterministic": (
        "examples/power_of_d_jsq2.toml",
        [*SHORT, "workload.service={dist='deterministic', mean=1.0}"],
    ),
    "jsq2_two_classes_mixed": (
        "examples/scheme1_fig3.toml",
        [*SHORT, "policy.name=power_of_d", "policy.d=2", "classes[1].discipline='fcfs'"],
    ),
    "jsq2_delay": ("examples/power_of_d_jsq2.toml", [*SHORT, "network.delay=0.05"]),
    "jsq2_delay_forward": (
        "examples/power_of_d_jsq2.toml",
        [*SHORT, "network.delay={dist='exponential', mean=0.05}", "network.forward_tasks=true"],
    ),
    "least_request_forward": (
        "examples/least_request.toml",
        [*SHORT, "network.delay=0.1", "network.forward_tasks=true"],
    ),
    "jiq_delay": ("examples/jiq.toml", [*SHORT, "network.delay=0.02"]),
    "slta_delay": ("examples/slta_two_classes.toml", [*SHORT_POOLS, "network.delay=0.01"]),
    "jsq_pools": ("examples/jlmu_two_classes.toml", [*SHORT_POOLS, "policy.name=jsq"]),
    "round_robin_fcfs": ("examples/power_of_d_jsq2.toml", [*SHORT, "policy.name=round_robin"]),
}

#: runs in the child process: one case, printed as one JSON line {"raw": digest, "result": object}
CHILD = r"""
import hashlib, io, json, os, sys, contextlib
import numpy as np
simulator = "python"
if os.environ.get("LBT_SIMULATOR") == "compiled":
    from lbtestbed.analysis.simulator import compiled
    simulator = compiled.load().__file__  # a missing or stale build fails the case here
try:  # the spec reader above the policy library (issue 25), or a --whole reference from before it
    from lbtestbed.spec import load_spec
except ImportError:
    from lbtestbed.model.spec import load_spec
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.cli import main

spec, overrides = sys.argv[1], sys.argv[2:]
exp = load_spec(spec, overrides)
raw = simulate_once(exp, 0)
digests = {}
def feed(key, value):
    # exact encodings: an array's bytes, else repr (floats repr to the last bit)
    is_array = isinstance(value, np.ndarray)
    data = value.dtype.str.encode() + value.tobytes() if is_array else repr(value).encode()
    digests[key] = hashlib.sha256(data).hexdigest()[:16]
for key in sorted(raw.ratios):
    num, den = raw.ratios[key]
    feed(key + "/num", num); feed(key + "/den", den)
for key in ("batches", "r_time", "r_series", "decisions", "message_kinds", "censored", "events",
            "stale_tokens"):
    feed(key, getattr(raw, key))
feed("sojourns", [list(b) for b in raw.sojourns])  # their values, whatever holds them (lists, arrays)
args = ["simulate", spec, "--json", "--quiet"]
for o in overrides:
    args += ["--set", o]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(args)
result = json.loads(out.getvalue())
def strip(v):
    # wall_seconds is the machine's; df (an interval's degrees of freedom, in the result object since
    # issue 14) follows from the batch counts the digests already cover
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in ("wall_seconds", "df")}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
import lbtestbed
whole = hashlib.sha256(repr(sorted(digests.items())).encode()).hexdigest()[:12]
print(json.dumps({"package": lbtestbed.__file__, "simulator": simulator, "digest": whole, "raw": digests,
                  "events": raw.events, "exit": code, "result": strip(result)}))
"""


def make_tree(dest: Path, ref: str | None, whole: bool = False) -> Path:
    """A private copy of the package; with ``ref``, the simulator's files as they were at that revision
    (``whole``: the whole package as it was, for a reference from before files moved)."""
    if whole and ref is not None:
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "lbtestbed"], capture_output=True, check=False
        )
        if archive.returncode != 0:
            sys.exit(f"check_simulator_identity: cannot read lbtestbed at {ref}: {archive.stderr.decode()}")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return dest
    shutil.copytree(ROOT / "lbtestbed", dest / "lbtestbed", ignore=shutil.ignore_patterns("__pycache__"))
    if ref is not None:
        for rel in SIMULATOR_FILES:
            old = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{ref}:{rel}"], capture_output=True, text=True, check=False
            )
            if old.returncode != 0:
                sys.exit(f"check_simulator_identity: cannot read {rel} at {ref}: {old.stderr.strip()}")
            (dest / rel).write_text(old.stdout, encoding="utf-8")
    return dest


def run_case(tree: Path, spec: str, overrides: list[str], compiled: bool = False) -> dict[str, object]:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "LBT_SIMULATOR": "python"}
    if compiled:
        env["LBT_SIMULATOR"] = "compiled"
        env["LBT_COMPILED_DIR"] = os.environ.get("LBT_COMPILED_DIR") or str(
            ROOT / "build" / "compiled-simulator"
        )
    # -P and cwd=tree: the working tree's own lbtestbed (cwd would come first on sys.path) must not win
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(ROOT / spec), *overrides],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return {
            "error": proc.stderr.strip().splitlines()[-1]
            if proc.stderr.strip()
            else f"exit {proc.returncode}"
        }
    result: dict[str, object] = json.loads(proc.stdout)
    if not str(result.pop("package")).startswith(str(tree)):
        sys.exit(f"check_simulator_identity: the child imported lbtestbed from outside {tree}")
    simulator = str(result.pop("simulator"))
    if simulator.endswith(".so") != compiled:
        sys.exit(f"check_simulator_identity: ran the wrong simulator ({simulator})")
    return result


def first_difference(a: object, b: object, path: str = "") -> str:
    if type(a) is not type(b):
        return f"{path or '/'}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'candidate' if k in b else 'reference'}"
            if a[k] != b[k]:
                return first_difference(a[k], b[k], f"{path}/{k}")
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or '/'}: {a!r} != {b!r}"


def added_keys(ref: object, new: object, path: str = "") -> tuple[object, list[str]]:
    """``new`` without the keys of its objects that ``ref`` lacks (what a newer result object adds, such as
    its batch values), and their paths: an addition leaves every value the reference had unchanged."""
    if isinstance(ref, dict) and isinstance(new, dict):
        kept, added = {}, [f"{path}/{k}" for k in new if k not in ref]
        for k in ref:
            if k in new:
                kept[k], more = added_keys(ref[k], new[k], f"{path}/{k}")
                added += more
        return kept, added
    if isinstance(ref, list) and isinstance(new, list) and len(ref) == len(new):
        pairs = [added_keys(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(ref, new, strict=True))]
        return [p for p, _ in pairs], sorted({k for _, more in pairs for k in more})
    return new, []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ref", default="HEAD", help="git revision of the reference simulator files (HEAD)")
    p.add_argument(
        "--whole",
        action="store_true",
        help="take the whole package from --ref, not only the simulator's files (a reference from before "
        "modules moved; other changes in the package then count too, except keys the result object gained "
        "since, which are listed)",
    )
    p.add_argument("--only", default="", help="run only the cases whose name contains this text")
    p.add_argument(
        "--compiled",
        action="store_true",
        help="compare the working tree's compiled simulator with its pure-Python one (ignores --ref)",
    )
    args = p.parse_args()
    cases = {k: v for k, v in CASES.items() if args.only in k}
    if not cases:
        p.error(f"--only {args.only!r} matches no case; cases: {', '.join(CASES)}")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="lbt-identity-") as tmp:
        ref_tree = make_tree(Path(tmp) / "reference", None if args.compiled else args.ref, args.whole)
        new_tree = make_tree(Path(tmp) / "candidate", None)
        for name, (spec, overrides) in cases.items():
            ref = run_case(ref_tree, spec, overrides)
            new = run_case(new_tree, spec, overrides, compiled=args.compiled)
            if "error" in ref or "error" in new:
                failed += 1
                why = f"reference {ref.get('error', 'ok')}; candidate {new.get('error', 'ok')}"
                print(f"ERROR      {name}: {why}")
                continue
            added: list[str] = []
            if args.whole:  # a result object may have grown since: its new keys are not differences
                new["result"], added = added_keys(ref["result"], new["result"])
            if ref != new:
                failed += 1
                where = first_difference({**ref, "digest": None}, {**new, "digest": None})
                runs = "the same RawRun" if ref["digest"] == new["digest"] else "another RawRun"
                print(f"DIFFERENT  {name} ({runs}): {where}")
            else:
                more = f"; keys added to the result: {', '.join(sorted(set(added)))}" if added else ""
                print(f"identical  {name} ({ref['events']:,} events, digest {ref['digest']}{more})")
    against = "the pure-Python simulator" if args.compiled else args.ref
    print(f"{len(cases) - failed} of {len(cases)} cases identical to {against}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
