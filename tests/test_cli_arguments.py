"""Bad arguments: exit 2 with one line that names the argument, before anything starts.

Each case runs ``lbt`` as a user does (a child process), in a scratch directory, and checks that nothing
was created there: no cluster file, no report directory, no log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JIQ = str(ROOT / "examples" / "jiq.toml")
SLTA = str(ROOT / "examples" / "slta_two_classes.toml")


def lbt(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["simulate", JIQ, "--jobs", "0"], "--jobs"),
        (["simulate", JIQ, "--replications", "0"], "--replications"),
        (["simulate", JIQ, "--jobs", "two"], "--jobs"),
        (["sweep", JIQ, "--simulate-only", "--jobs", "0", "--set", "workload.load=0.5"], "--jobs"),
        (["cluster", "up", JIQ, "--node-processes", "0"], "--node-processes"),
        (["cluster", "up", JIQ, "--node-procs", "0"], "--node-procs"),
        (["cluster", "up", JIQ, "--dispatchers", "0"], "--dispatchers"),
        (["cluster", "up", SLTA, "--set", "policy.view=partial", "--file", "c.json"], "policy.view"),
        (["cluster", "up", JIQ, "--bandwidth", "10mbit", "--file", "c.json"], "--bandwidth"),
        (["run", JIQ, "--endpoints", "missing.json", "--out", "report"], "missing.json"),
        (["run", JIQ, "--set", "policy.d=3", "--dispatchers", "2", "--out", "report"], "policy.d"),
        (["run", JIQ, "--node-processes", "0", "--out", "report"], "--node-processes"),
        (["run", JIQ, "--bandwidth", "10mbit", "--out", "report"], "--bandwidth"),
        (["sweep", SLTA, "--set", "workload.load=9,9.5", "--dispatchers", "2", "--out", "sweep"], "slta"),
        (["load", JIQ, "--max-outstanding", "0", "--dispatcher", "http://127.0.0.1:9"], "--max-outstanding"),
        (
            ["load", JIQ, "--set", "policy.dispatchers=2", "--dispatcher", "http://127.0.0.1:9"],
            "policy.dispatchers",
        ),
        (["load", JIQ, "--threshold", "p99<1", "--dispatcher", "http://127.0.0.1:9"], "p99"),
        (["load", JIQ, "--threshold", "late_sends=0", "--dispatcher", "http://127.0.0.1:9"], "--threshold"),
        (["load", JIQ, "--cluster", "missing.json"], "missing.json"),
        (["load", "--cluster", "missing.json", "--dispatcher", "http://127.0.0.1:9"], "missing.json"),
        (["load", JIQ, "--dispatcher", "http://127.0.0.1:9", "--", "--csv", "out"], "--csv"),
        (["load", JIQ, "--dispatcher", "http://127.0.0.1:9", "--locust", "--", "--host", "x"], "--host"),
        (["load", JIQ, "--dispatcher", "http://127.0.0.1:9", "--locust", "--", "--lbt-spec=x"], "--lbt-spec"),
        # what the load shape sets: users, spawn rate and run time are not locust's to change here
        (["load", JIQ, "--dispatcher", "http://127.0.0.1:9", "--locust", "--", "-u", "5"], "'-u'"),
        (["load", JIQ, "--dispatcher", "http://127.0.0.1:9", "--locust", "--", "-r", "2"], "'-r'"),
        (["load", JIQ, "--dispatcher", "http://127.0.0.1:9", "--locust", "--", "--run-time=3s"], "run-time"),
        (["simulate", JIQ, "--", "--csv", "out"], "--csv"),
        (["simulate", JIQ, "--set", "policy.split=sideways"], "policy.split"),
        (["simulate", JIQ, "--set", "policy.dispatchers=65"], "policy.dispatchers"),
        (["frobnicate"], "frobnicate"),
        # each action of lbt cluster takes its own options only
        (["cluster", "down", "--dispatchers", "3"], "--dispatchers"),
        (["cluster", "down", "--with-prometheus"], "--with-prometheus"),
        (["cluster", "down", "--json"], "--json"),
        (["cluster", "status", "--node-processes", "2"], "--node-processes"),
        (["cluster", "status", "--foreground"], "--foreground"),
        (["cluster", "status", JIQ], JIQ),
        (["cluster", "down", JIQ, "--file", "c.json"], JIQ),
        (["cluster"], "action"),
        (["cluster", "sideways"], "sideways"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_start_nothing(
    tmp_path: Path, args: list[str], named: str
) -> None:
    done = lbt(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "error" in lines[0] and named in lines[0], lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no cluster file, report, logs or .lbt/


def test_version_is_the_package_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = lbt(ROOT, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"lbt {version}"


@pytest.mark.parametrize(
    "command",
    [
        "simulate",
        "predict",
        "cluster",
        "cluster up",
        "cluster status",
        "cluster down",
        "load",
        "run",
        "sweep",
        "frontier",
    ],
)
def test_help_shows_no_format_escapes(command: str) -> None:
    done = lbt(ROOT, *command.split(), "--help")
    assert done.returncode == 0
    assert "%%" not in done.stdout and "%(" not in done.stdout


def test_the_cluster_flag_for_node_processes_is_named_as_in_run() -> None:
    """lbt cluster and lbt run name it the same; the old --node-procs still works but is not shown."""
    cluster_help = lbt(ROOT, "cluster", "up", "--help").stdout
    run_help = lbt(ROOT, "run", "--help").stdout
    assert "--node-processes" in cluster_help and "--node-processes" in run_help
    assert "--node-procs" not in cluster_help


SMALL = """name = "small"
seed = 3
[[classes]]
name = "servers"
count = 2
discipline = "fcfs"
[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "jiq"
[run]
warmup = 0.0
duration = 5.0
time_scale = 0.01
"""


def test_cluster_up_status_and_down_each_with_their_own_options(tmp_path: Path) -> None:
    """The actions as subcommands: up takes the spec and the cluster's options, status --json, down only
    the file; each answers as before (exit 0, the processes, the count stopped)."""
    (tmp_path / "spec.toml").write_text(SMALL)
    up = ["cluster", "up", "spec.toml", "--file", "c.json", "--node-processes", "1", "--dispatchers", "1"]
    try:
        started = lbt(tmp_path, *up, "--max-tasks", "10", "--json")
        assert started.returncode == 0, started.stderr
        processes = json.loads(started.stdout)["processes"]
        assert sorted(p["role"] for p in processes) == ["dispatcher", "nodes"]
        status = lbt(tmp_path, "cluster", "status", "--file", "c.json", "--json")
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert shown["file"] == "c.json"
        assert [p["pid"] for p in shown["processes"]] == [p["pid"] for p in processes]
        assert all(p["healthy"] for p in shown["processes"])
    finally:
        down = lbt(tmp_path, "cluster", "down", "--file", "c.json")
    assert down.returncode == 0, down.stderr
    assert down.stdout == "cluster down: stopped 2 process(es)\n"
    assert not (tmp_path / "c.json").exists()
    gone = lbt(tmp_path, "cluster", "status", "--file", "c.json")
    assert gone.returncode == 1 and "no cluster file" in gone.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`lbt predict ... --json | head -c 1`: the pipe closes before the output is written; the command ends
    as a shell's commands do on SIGPIPE (128 + 13), without a traceback or an "internal error"."""
    import os

    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write breaks the pipe
    done = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "predict", str(ROOT / "examples" / "jiq.toml"), "--json"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    os.close(write)
    assert done.returncode == 128 + 13, done.stderr
    assert "error" not in done.stderr and "Traceback" not in done.stderr


def test_lbt_simulates_on_every_kernel_the_simulator_has() -> None:
    """``lbt simulate --kernel`` spells the simulator's kernels (``analysis.simulator.KERNELS``) so that
    every lbt's start-up does not load the simulator: the two lists must stay one."""
    import argparse

    from lbtestbed.analysis.simulator import KERNELS
    from lbtestbed.cli.parser import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    kernel = next(a for a in commands.choices["simulate"]._actions if a.dest == "kernel")
    assert tuple(kernel.choices or ()) == KERNELS
