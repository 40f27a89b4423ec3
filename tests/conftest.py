"""Suite-wide settings.

``lbt run`` judges every spec against this machine's calibration before it starts (docs/run.md, "Before it
starts"). The suite gives it a fixed calibration instead of measuring the machine, so that whether a test
run may start does not depend on how busy the machine is, and so that nothing is written to the user's
cache. tests/test_preflight.py calibrates the machine for real, once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lbtestbed.experiment.preflight import CALIBRATION_ENV, Calibration

#: about this kind of machine's costs (benchmarks/bench_overhead.py), rounded up
SUITE_CALIBRATION = Calibration(
    dispatcher_us=400.0,
    probe_us=250.0,
    node_us=350.0,
    generator_us=250.0,
    overhead_ms=1.5,
    cores=2,
    machine="the test suite's fixed calibration",
)


@pytest.fixture(scope="session", autouse=True)
def fixed_calibration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("calibration") / "calibration.json"
    path.write_text(json.dumps(SUITE_CALIBRATION.to_json()))
    old = os.environ.get(CALIBRATION_ENV)
    os.environ[CALIBRATION_ENV] = str(path)  # child processes (lbt run) inherit it
    yield path
    if old is None:
        os.environ.pop(CALIBRATION_ENV, None)
    else:
        os.environ[CALIBRATION_ENV] = old


@pytest.fixture(scope="session")
def built() -> object:
    """The project's compiled simulator, built if missing or stale (nothing to do when current: ``make
    test`` builds it first); skipped only where there is no C compiler."""
    from lbtestbed.analysis.simulator import compiled

    if compiled.compiler() is None:
        pytest.skip("no C compiler")
    compiled.build()
    return compiled.load()
