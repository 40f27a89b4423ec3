"""The example spec simulates end to end and gives the documented JSON shape."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_simulate_json_shape() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtestbed.cli",
            "simulate",
            str(ROOT / "examples/slta_two_classes.toml"),
            "--json",
            "--quiet",
            "--set",
            "run.duration=20",
            "--set",
            "run.warmup=5",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["source"] == "simulation" and result["policy"] == "slta"
    for key in (
        "mean_sojourn",
        "mean_tasks_per_node",
        "utility",
        "wait_probability",
        "messages_per_task",
        "occupancy_tail",
        "slta_r",
    ):
        assert key in result["metrics"]
    assert result["metrics"]["wait_probability"]["value"] is None  # pools never queue
    tail = result["metrics"]["occupancy_tail"]["small"]
    assert tail[0]["value"] == 1.0
