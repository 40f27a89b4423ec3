"""Bounds on every input (issue 27): a spec, a cluster file, a trace or an output that is too large, too
deep, too long, endless or impossible gets one line naming it and exit 2 (1 for a full disk, said as such),
before anything starts, within 3 CPU seconds and 2 GB of address space.

Each case runs ``lbt`` as a process under ``RLIMIT_CPU`` = 3 s (the kernel stops it beyond: a quantity the
machine's load does not move, unlike wall time) and ``RLIMIT_AS`` = 2,000,000 KiB (``ulimit -v 2000000``):
a reader that takes in ``/dev/zero`` whole, or recurses 5,000 deep, is killed or raises, and fails here.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = """
name = "bounds"
seed = 3
[[classes]]
name = "servers"
count = 6
discipline = "fcfs"
[workload]
load = 0.6
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "jsq"
[run]
warmup = 20
duration = 400
time_scale = 0.02
batches = 10
"""
CPU_SECONDS = 3
ADDRESS_SPACE = 2_000_000 * 1024  # ulimit -v 2000000
WAIT = 120.0  # wall seconds: a bound on the wait for the process (the CPU limit decides, not this)


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def lbt(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # one BLAS thread's stack, not one per core
    return subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", *args],
        cwd=tmp, capture_output=True, text=True, timeout=WAIT, preexec_fn=limited, env=env,
    )  # fmt: skip


def nested_toml(levels: int) -> str:
    return SPEC + "[extra]\nvalue = " + "[" * levels + "]" * levels + "\n"


def with_set(*overrides: str) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


LOAD = ["load", "spec.toml", "--dispatcher", "http://127.0.0.1:9"]
SIMULATE = ["simulate", "spec.toml", "--quiet"]
RUN = ["run", "spec.toml", "--quiet"]
DEEP = "[" * 100_000 + "]" * 100_000

#: (what the case is, the files it needs, lbt's arguments, the exit code, what the one line names)
CASES = [
    ("spec /dev/zero", {}, ["predict", "/dev/zero"], 2, "larger than 4 MiB"),
    ("spec /dev/urandom", {}, ["simulate", "/dev/urandom"], 2, "/dev/urandom"),
    ("spec 5,000 deep", {"deep.toml": nested_toml(5000)}, ["predict", "deep.toml"], 2, "nested too deeply"),
    ("spec 33 deep", {"deep.toml": nested_toml(33)}, ["predict", "deep.toml"], 2, "at most 32"),
    ("JSON spec deep", {"deep.json": DEEP}, ["predict", "deep.json"], 2, "nested too deeply"),
    ("override 5,000 deep", {}, ["predict", "spec.toml", *with_set("name=" + DEEP[99_000:101_000])], 2,
     "name: a value nested too deeply"),
    ("key path 30,000 parts", {}, ["predict", "spec.toml", *with_set(".".join(["a"] * 30_000) + "=1")], 2,
     "a key path of 30000 parts"),
    ("class name 100,000", {}, ["predict", "spec.toml", *with_set(f'classes[0].name="{"x" * 100_000}"')], 2,
     "classes[0].name: 100,000 characters"),
    ("name with a newline", {}, ["predict", "spec.toml", *with_set('name="a\\nb"')], 2, "control characters"),
    ("seed beyond 64 bits", {}, ["predict", "spec.toml", *with_set("seed=99999999999999999999")], 2,
     "seed: must be at most 2**64 - 1"),
    ("a million batches", {}, [*SIMULATE, *with_set("run.batches=1000000")], 2, "run.batches: at most"),
    ("service mean 1e308", {}, [*SIMULATE, *with_set('workload.service={dist="exponential",mean=1e308}')], 2,
     "at least one is needed"),
    ("load 1e-300", {}, [*SIMULATE, *with_set("workload.load=1e-300")], 2, "at least one is needed"),
    ("model time 1e13", {}, [*SIMULATE, *with_set("run.warmup=1e13", "workload.load=1e-9")], 2, "1e+12"),
    ("batches shorter than a scrape", {}, [*RUN, "--out", "r", *with_set("run.batches=1000")], 2,
     "run.batches: 1000 batches of 8 ms wall"),
    ("a run of years", {}, [*RUN, "--out", "r", *with_set("run.time_scale=1e300")], 2, "604800 (a week)"),
    ("cluster file /dev/zero", {}, [*RUN, "--endpoints", "/dev/zero"], 2, "larger than 16 MiB"),
    ("cluster file deep", {"c.json": DEEP}, ["load", "spec.toml", "--cluster", "c.json"], 2, "too deeply"),
    ("cluster up --file /dev/full", {}, ["cluster", "up", "spec.toml", "--file", "/dev/full"], 2,
     "--file /dev/full: not a regular file"),
    ("cluster down --file /dev/full", {}, ["cluster", "down", "--file", "/dev/full"], 2, "not a regular"),
    ("cluster status --file /dev/zero", {}, ["cluster", "status", "--file", "/dev/zero"], 2, "not a regular"),
    ("replay /dev/zero", {}, [*LOAD, "--replay", "/dev/zero"], 2, "/dev/zero:1: a line longer than 256"),
    ("replay /dev/urandom", {}, [*LOAD, "--replay", "/dev/urandom"], 2, "/dev/urandom"),
    ("--out /dev/full", {}, [*RUN, "--out", "/dev/full"], 2, "--out /dev/full: not a directory"),
    ("--out /proc/x", {}, [*RUN, "--out", "/proc/x"], 2, "--out /proc/x: cannot write there"),
    ("sweep --out /proc/x", {}, ["sweep", "spec.toml", *with_set("seed=1,2"), "--simulate-only", "--quiet",
     "--out", "/proc/x"], 2, "--out /proc/x"),
    ("--records /dev/full", {}, [*SIMULATE, "--records", "/dev/full"], 1, "/dev/full: the disk is full"),
    ("--records /proc/x", {}, [*SIMULATE, "--records", "/proc/x"], 2, "--records /proc/x"),
    ("--record /dev/full", {}, [*LOAD, "--record", "/dev/full"], 1, "--record /dev/full: the disk is full"),
    ("report of /dev/zero", {}, ["report", "/dev/zero"], 2, "/dev/zero: not a directory"),
    ("report of a directory with no run", {"empty/x": ""}, ["report", "empty"], 2, "not a run's directory"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("files", "args", "code", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_and_an_exit_code_within_its_bounds(
    tmp_path: Path, files: dict[str, str], args: list[str], code: int, named: str
) -> None:
    (tmp_path / "spec.toml").write_text(SPEC)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    done = lbt(tmp_path, *args)
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])  # -24: out of CPU, -9/-6: memory
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lbt: error: "), done.stderr[-2000:]
    assert named in lines[0], lines[0]
    assert "internal error" not in lines[0] and "Traceback" not in done.stderr
    assert (
        not (tmp_path / "r" / "cluster.json").exists() and not (tmp_path / ".lbt").exists()
    )  # nothing started


def test_a_run_directory_whose_journal_is_endless_is_refused(tmp_path: Path) -> None:
    """``lbt report`` on a directory whose files are devices: each read stops at its bound."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.json").symlink_to("/dev/zero")
    (run / "journal.jsonl").symlink_to("/dev/zero")
    done = lbt(tmp_path, "report", "run")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("lbt: error: ") and len(done.stderr.splitlines()) == 1
    assert "experiment.json" in done.stderr
