"""Sweeps and replications on a real Dask cluster: a scheduler and two workers on loopback, each a process
of its own started by the commands the README gives (``dask scheduler``, ``dask worker``), run a small
sweep and ``lbt simulate --replications 3`` with exactly the local process pool's results; a bad address
is one line and exit 2 before anything runs; the processes are always torn down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.cli import main
from lbtestbed.experiment import executor
from lbtestbed.experiment.errors import BadInput, Failed
from lbtestbed.experiment.executor import executor_address, open_executor, run_each
from lbtestbed.spec import load_spec

BIN = Path(sys.executable).parent
START_TIMEOUT = 60.0  # wall seconds for the scheduler and its workers to come up on a busy machine

# Pools of two classes with their utilities under SLTA (policy parameters, utilities and classes all travel
# to the workers inside the Experiment); runs of a few hundred tasks.
SPEC = """
name = "dask-pools"
seed = 5

[[classes]]
name = "small"
count = 3
discipline = "pool"
utility = { kind = "xlog", r = 3 }

[[classes]]
name = "large"
count = 2
discipline = "pool"
utility = { kind = "xlog", r = 4 }

[workload]
load = 1.5
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "slta"
beta_scale = 1.0
rank_order = "ji"

[run]
warmup = 5.0
duration = 60.0
batches = 5
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "pools.toml"
    path.write_text(SPEC)
    return path


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A process in a session of its own, so that its children (a worker's nanny spawns the worker) go
    with it at teardown."""
    with log.open("wb") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process (the workers first), then SIGKILL to whatever is left of its session."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=15)
        if _alive(p.pid):  # a worker's children, or a process that did not stop
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)


def _alive(session: int) -> list[int]:
    """The processes of a session that still run (zombies aside)."""
    alive = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == session and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def _tail(logs: list[Path]) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in logs if log.exists())


def _wait_for_file(path: Path, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"a Dask process exited while starting:\n{_tail(logs)}")
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
    pytest.fail(f"no scheduler file after {START_TIMEOUT:g} s:\n{_tail(logs)}")


def _scheduler(directory: Path, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> str:
    """``dask scheduler`` on a free port of 127.0.0.1 (its HTTP server too); its address."""
    file, log = directory / "scheduler.json", directory / "scheduler.log"
    logs.append(log)
    args = [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"]
    args += ["--no-dashboard", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(file)]
    procs.append(_start(args, log))
    return str(_wait_for_file(file, procs, logs)["address"])


def _worker(address: str, directory: Path, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    log = directory / f"worker{len(logs)}.log"
    logs.append(log)
    args = [str(BIN / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1"]
    args += ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]
    args += ["--local-directory", str(directory / f"space{len(logs)}")]
    procs.insert(0, _start(args, log))  # stopped before the scheduler


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Dask scheduler and two single-threaded workers on loopback; the scheduler's address."""
    from distributed import Client

    directory = tmp_path_factory.mktemp("dask")
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        address = _scheduler(directory, procs, logs)
        for _ in range(2):
            _worker(address, directory, procs, logs)
        with Client(address, timeout=START_TIMEOUT, set_as_default=False) as client:
            try:
                client.wait_for_workers(2, timeout=START_TIMEOUT)
            except TimeoutError:
                pytest.fail(f"two workers did not join in {START_TIMEOUT:g} s:\n{_tail(logs)}")
        yield address
    finally:
        _stop(procs)
        assert not [pid for p in procs for pid in _alive(p.pid)], "Dask processes left behind"


def executed(dask_worker: Any) -> int:
    """Run on each worker (by ``Client.run``): how many tasks it has executed."""
    return int(dask_worker.state.executed_count)


def _executed(address: str) -> int:
    """Tasks the cluster's workers have executed so far, all together."""
    from distributed import Client

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # `executed` goes to the workers as code
    with Client(address, set_as_default=False) as client:
        return sum(client.run(executed).values())


def lbt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "lbt"), *args], capture_output=True, text=True, timeout=120, check=False)


def _without_wall_seconds(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "wall_seconds"}


def test_a_sweep_on_dask_gives_the_local_pools_results(dask_cluster: str, spec: Path, tmp_path: Path) -> None:
    sweep = ["sweep", str(spec), "--simulate-only", "--json", "--set", "policy.name=jlmu,slta"]
    sweep += ["--set", "workload.load=1.5,2.5"]
    local = lbt(*sweep, "--out", str(tmp_path / "local"), "--jobs", "2")
    before = _executed(dask_cluster)
    remote = lbt(*sweep, "--out", str(tmp_path / "dask"), "--executor", dask_cluster)
    assert local.returncode == 0, local.stderr
    assert remote.returncode == 0, remote.stderr
    assert _executed(dask_cluster) - before == 4  # every point ran on the workers, once
    doc = json.loads(remote.stdout)
    assert len(doc["points"]) == 4
    assert doc == json.loads(local.stdout)
    assert (tmp_path / "dask" / "sweep.json").read_text() == (tmp_path / "local" / "sweep.json").read_text()
    # progress as points finish: a line for each, counting up
    done = [line for line in remote.stderr.splitlines() if " simulated (" in line]
    assert [line.split("(")[1].split(" ")[0] for line in done] == ["1/4", "2/4", "3/4", "4/4"], remote.stderr


def test_replications_on_dask_give_the_local_pools_results(dask_cluster: str, spec: Path) -> None:
    simulate = ["simulate", str(spec), "--replications", "3", "--json", "--quiet"]
    local = lbt(*simulate, "--jobs", "2")
    before = _executed(dask_cluster)
    remote = lbt(*simulate, "--executor", dask_cluster)
    assert local.returncode == 0, local.stderr
    assert remote.returncode == 0, remote.stderr
    assert _executed(dask_cluster) - before == 3
    local_doc, remote_doc = json.loads(local.stdout), json.loads(remote.stdout)
    assert remote_doc["settings"]["replications"] == 3
    assert _without_wall_seconds(remote_doc) == _without_wall_seconds(local_doc)


def _assert_same_bits(a: RawRun, b: RawRun) -> None:
    for f in dataclasses.fields(RawRun):
        if f.name == "wall_seconds":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "ratios":
            assert x.keys() == y.keys()
            for k in x:
                for u, v in zip(x[k], y[k], strict=True):
                    assert u.dtype == v.dtype and u.tobytes() == v.tobytes(), (f.name, k)
        else:
            assert x == y, f.name


def test_the_same_raw_runs_to_the_bit(dask_cluster: str, spec: Path) -> None:
    exp = load_spec(spec)
    calls = [(exp, i) for i in range(3)]
    with open_executor("local", 2) as local:
        here = run_each(local, simulate_once, calls)
    seen: list[tuple[int, int]] = []
    with open_executor(dask_cluster) as remote:
        there = run_each(remote, simulate_once, calls, lambda k, i, _: seen.append((k, i)))
    assert sorted(i for _, i in seen) == [0, 1, 2] and [k for k, _ in seen] == [1, 2, 3]
    for a, b in zip(here, there, strict=True):
        _assert_same_bits(a, b)
    # and the replications differ from one another: the index reaches the simulator
    assert here[0].ratios["mean_sojourn"][0].tobytes() != here[1].ratios["mean_sojourn"][0].tobytes()


def test_the_experiments_travel_whole(spec: Path) -> None:
    """What goes to a worker is the Experiment itself: it pickles and comes back equal, for every example
    spec (policy parameters, utilities, faults, schedules)."""
    specs = sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.toml"))
    assert specs
    for path in [spec, *specs]:
        exp = load_spec(path)
        assert cloudpickle.loads(cloudpickle.dumps(exp)) == exp, path


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["sweep", "--simulate-only", "--executor", "dask://127.0.0.1:8786"],
            ["--executor", "tcp://HOST:PORT"],
        ),
        (
            ["simulate", "--replications", "2", "--executor", "tcp://127.0.0.1"],
            ["--executor", "tcp://HOST:PORT"],
        ),
        (["simulate", "--replications", "2", "--executor", "tcp://127.0.0.1:70000"], ["--executor"]),
    ],
)
def test_a_malformed_address_is_one_line_and_exit_2(
    spec: Path, argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main([argv[0], str(spec), *argv[1:]])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_no_scheduler_is_one_line_and_exit_2_before_anything_runs(
    spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        out = tmp_path / "sweep"
        argv = ["sweep", str(spec), "--simulate-only", "--set", "workload.load=1.5,2", "--out", str(out)]
        assert main([*argv, "--executor", address]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and address in err and "no Dask scheduler answers" in err, err
        assert not out.exists()
        assert main(["simulate", str(spec), "--replications", "2", "--executor", address]) == 2
        assert "no Dask scheduler answers" in capsys.readouterr().err


def test_what_is_not_a_scheduler_is_refused(dask_cluster: str) -> None:
    """A worker's address answers in Dask's protocol but is no scheduler; a scheduler is accepted."""
    from distributed import Client

    with Client(dask_cluster, set_as_default=False) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
    with pytest.raises(BadInput, match="not a Dask scheduler"), open_executor(worker, timeout=5):
        pass
    with open_executor(dask_cluster) as ex:
        assert ex.name == dask_cluster


def test_workers_of_another_version_are_refused(dask_cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client of another lbtestbed version than its workers' is refused, naming a worker and both."""
    monkeypatch.setattr(executor, "version", lambda: "0.0.0+other")
    words = r"worker tcp://127\.0\.0\.1:\d+ runs lbtestbed .*, this machine 0\.0\.0\+other"
    with pytest.raises(BadInput, match=words), open_executor(dask_cluster):
        pass


def test_a_scheduler_without_workers_is_refused(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        address = _scheduler(tmp_path, procs, [])
        with pytest.raises(BadInput, match="no worker after 1 s"), open_executor(address, timeout=1):
            pass
    finally:
        _stop(procs)
        assert not [pid for p in procs for pid in _alive(p.pid)], "Dask processes left behind"


def test_a_run_that_loses_every_worker_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dask would wait for a worker for ever; the run gives up (exit 1) after WORKERLESS seconds."""
    monkeypatch.setattr(executor, "WORKERLESS", 1.0)
    monkeypatch.setattr(executor, "CHECK_WORKERS", 0.2)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        address = _scheduler(tmp_path, procs, [])
        _worker(address, tmp_path, procs, [])
        with open_executor(address, timeout=START_TIMEOUT) as ex:
            os.killpg(procs[0].pid, signal.SIGKILL)  # the worker and its nanny, at once
            procs[0].wait()
            with pytest.raises(Failed, match="no worker for 1 s, 2 calls not done"):
                run_each(ex, time.sleep, [(0.01,), (0.01,)])
    finally:
        _stop(procs)
        assert not [pid for p in procs for pid in _alive(p.pid)], "Dask processes left behind"


def test_one_run_and_cluster_sweeps_stay_here(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The executor runs replications and simulated points; a single run and a sweep of cluster runs say
    so (exit 2) instead of ignoring it."""
    address = "tcp://127.0.0.1:8786"
    assert main(["simulate", str(spec), "--executor", address]) == 2
    assert "--replications" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--set", "workload.load=1.5,2", "--executor", address]) == 2
    assert "--simulate-only" in capsys.readouterr().err


def test_executor_address_spelling() -> None:
    assert executor_address("local") == "local"
    assert executor_address("tcp://127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    assert executor_address("tcp://scheduler-1.example:8786") == "tcp://scheduler-1.example:8786"
    assert executor_address("tcp://[::1]:8786") == "tcp://[::1]:8786"
    for bad in ("", "LOCAL", "tcp://:8786", "tcp://host", "tcp://host:0", "host:8786", "tls://host:8786"):
        with pytest.raises(ValueError, match="tcp://HOST:PORT"):
            executor_address(bad)
