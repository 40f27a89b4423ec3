"""The pre-flight estimate (experiment/preflight.py): the arithmetic against a calibration given by hand,
the refusal before anything starts, ``time_scale = "auto"``, and one real calibration of this machine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lbtestbed.experiment import preflight as pf
from lbtestbed.model.document import document
from lbtestbed.spec import load_spec, parse_spec

CAL = pf.Calibration(
    dispatcher_us=300.0,
    probe_us=200.0,
    node_us=250.0,
    generator_us=200.0,
    overhead_ms=1.5,
    cores=2,
    machine="test",
)

SPEC = """
name = "preflight"
seed = 1
[[classes]]
name = "s"
count = 20
discipline = "fcfs"
[workload]
load = 0.5
service = {{ dist = "exponential", mean = 2.0 }}
[policy]
{policy}
[run]
warmup = 1.0
duration = 10.0
time_scale = {scale}
"""


def spec_file(tmp_path: Path, policy: str = 'name = "random"', scale: object = 0.1) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(policy=policy, scale=json.dumps(scale) if isinstance(scale, str) else scale))
    return path


def test_the_estimate_is_the_calibrated_cost_times_the_rates(tmp_path: Path) -> None:
    exp = load_spec(spec_file(tmp_path, 'name = "power_of_d"\nd = 2'))
    est = pf.estimate(exp, CAL, node_processes=4)
    tasks = exp.workload.arrival_rate / 0.1  # 20 nodes x 0.5 / 2.0 per model s, over 0.1 wall s each
    assert est.tasks_per_s == pytest.approx(tasks)
    assert est.probes_per_s == pytest.approx(2 * tasks)
    assert est.dispatcher_load == pytest.approx((tasks * 300 + 2 * tasks * 100) * 1e-6)
    assert est.node_load == pytest.approx((tasks * 250 + 2 * tasks * 100) / 4 * 1e-6)
    assert est.generator_load == pytest.approx(tasks * 200e-6)
    busiest = max(est.dispatcher_load, est.node_load, est.generator_load, est.total_load / 2)
    assert est.overhead_ms == pytest.approx(1.5 / (1 - busiest))
    assert est.overhead_fraction == pytest.approx(est.overhead_ms * 1e-3 / (2.0 * 0.1))


@pytest.mark.parametrize(
    ("policy", "per_task"),
    [
        ('name = "jsq"', 0.0),  # the departure notice rides on the task's reply
        ('name = "jsq"\ndispatchers = 3\nview = "full"', 4.0),  # notices to the 2 others, twice
        ('name = "jiq"', 0.0),
        ('name = "jiq"\ndispatchers = 4', 0.75),  # a token for another dispatcher than the task's
        ('name = "jiq"\ndispatchers = 4\nd = 2', 4.0),  # 2 probes and 2 answers per token
    ],
)
def test_messages_on_requests_of_their_own_follow_the_dispatchers(
    tmp_path: Path, policy: str, per_task: float
) -> None:
    """What the dispatchers cost in messages that do not ride on a reply, which the estimate charges."""
    exp = load_spec(spec_file(tmp_path, policy))
    assert pf.own_messages_per_task(exp) == pytest.approx(per_task)
    est = pf.estimate(exp, CAL, node_processes=4)
    assert est.messages_per_s == pytest.approx(per_task * est.tasks_per_s)


def test_a_saturating_spec_is_refused_a_busy_one_warned(tmp_path: Path) -> None:
    base = load_spec(spec_file(tmp_path))  # 5 tasks per model second
    level = {}
    for scale in (1.0, 0.005, 0.004):
        level[scale] = pf.judge(pf.estimate(base, CAL, scale, node_processes=4), CAL)[0]
    # 5, 1000 and 1250 tasks/s: the dispatcher 300 us a task, 4 node processes 250 us / 4, the generator
    # 200 us: 750 us of CPU per task on 2 cores. At 1000/s the machine is 37.5 % busy (under the 40 %
    # warning level), at 1250/s 47 % (over it); no single process reaches 50 %
    assert level == {1.0: "ok", 0.005: "ok", 0.004: "warn"}
    flood = pf.estimate(base, CAL, 0.001, node_processes=4)  # 5000 tasks/s: the dispatcher 1.5 cores
    verdict, why = pf.judge(flood, CAL)
    assert verdict == "refuse" and "5000 tasks/s" in why and "machine, not the policy" in why


def test_auto_picks_the_smallest_scale_that_fits(tmp_path: Path) -> None:
    exp = load_spec(spec_file(tmp_path, scale="auto"))
    assert exp.run.auto_time_scale and exp.run.time_scale == 1.0
    scale, why = pf.auto_time_scale(exp, CAL, node_processes=4)
    est = pf.estimate(exp, CAL, scale, node_processes=4)
    assert est.overhead_fraction <= pf.AUTO_OVERHEAD and est.busiest <= pf.WARN_LOAD
    assert len(pf.AUTO_GRID) == 21 and pf.AUTO_GRID[0] == 1e-4 and pf.AUTO_GRID[-1] == 500.0
    smaller = [s for s in pf.AUTO_GRID if s < scale]
    assert smaller and all(
        pf.estimate(exp, CAL, s, node_processes=4).overhead_fraction > pf.AUTO_OVERHEAD
        or pf.estimate(exp, CAL, s, node_processes=4).busiest > pf.WARN_LOAD
        for s in smaller
    )
    assert f"picked {scale:g}" in why
    # the resolved experiment reads the scale back from its document, as a cluster's processes do
    resolved = pf.resolve(exp, scale)
    assert resolved.run.time_scale == scale and not resolved.run.auto_time_scale
    assert parse_spec(document(resolved), resolved.source).run.time_scale == scale


def test_a_bad_time_scale_word_names_auto(tmp_path: Path) -> None:
    from lbtestbed.model.reader import SpecError

    with pytest.raises(SpecError, match=r'run.time_scale: must be a positive number or "auto"'):
        load_spec(spec_file(tmp_path, scale="fast"))


def test_lbt_run_refuses_a_flood_before_anything_starts(tmp_path: Path) -> None:
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps(CAL.to_json()))
    spec = spec_file(tmp_path, scale=0.0005)  # 10000 tasks/s
    out = tmp_path / "report"
    env = {"PATH": "/usr/bin:/bin", pf.CALIBRATION_ENV: str(cal)}
    long = "run.duration=4000"  # batches of 0.1 s wall: long enough to be scraped (run.wall_problem)
    done = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--set", long, "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "--force" in lines[0] and "10000 tasks/s" in lines[0]
    assert not out.exists()


def test_this_machine_calibrates() -> None:
    """One real calibration (a small cluster at 600 tasks/s, twice): every cost positive and plausible."""
    cal = pf.calibrate(rate=400.0, seconds=1.5)
    for cost in (cal.dispatcher_us, cal.node_us, cal.generator_us):
        assert 10.0 < cost < 20_000.0, cal
    assert cal.probe_us >= 0.0 and 0.05 < cal.overhead_ms < 100.0 and math.isfinite(cal.overhead_ms)
    assert cal.cores >= 1 and cal.machine == pf.fingerprint()


def test_the_machines_calibration_is_cached_by_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached calibration of this machine is used as it is; one of another machine is measured anew."""
    monkeypatch.delenv(pf.CALIBRATION_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mine = {**CAL.to_json(), "machine": pf.fingerprint()}
    pf.cache_path().parent.mkdir(parents=True)
    pf.cache_path().write_text(json.dumps(mine))
    assert pf.load_calibration() == pf.Calibration(**mine)
    measured: list[int] = []
    monkeypatch.setattr(pf, "calibrate", lambda: measured.append(1) or CAL)
    pf.cache_path().write_text(json.dumps({**mine, "machine": "another machine"}))
    assert pf.load_calibration() == CAL and measured == [1]
    assert json.loads(pf.cache_path().read_text()) == CAL.to_json()  # and cached for the next run
