"""The mypyc build of the simulator (``lbtestbed/analysis/simulator/compiled.py``).

What must hold: the build is used unless ``LBT_SIMULATOR=python`` says not to; a build whose sources have
changed since is refused (and ``simulate_once`` then says so in one line and runs the pure-Python
simulator); a bad ``LBT_SIMULATOR`` is one line of bad input; and the build gives the pure-Python run to
the last bit, for every policy. The last needs mypyc and a C compiler: it uses the project's build
(``make test`` makes it first; built here if missing, about 15 s) and is marked slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator import compiled, simulate_once
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.simulator.rates import RatesSimulator
from lbtestbed.model.reader import SpecError
from lbtestbed.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]

SPEC = {
    "name": "compiled",
    "seed": 4,
    "classes": [
        {"name": "q", "count": 40, "discipline": "fcfs"},
        {"name": "p", "count": 10, "discipline": "ps", "speed": 2},
    ],
    "workload": {"load": 0.85},
    "policy": {"name": "power_of_d", "d": 2},
    "run": {"warmup": 5.0, "duration": 40.0, "batches": 8},
}


def fake_build(root: Path, package: Path = compiled.PACKAGE, **changes: object) -> Path:
    """A manifest as build() writes it (no compiled files): enough for every check before the import."""
    dest = compiled.build_dir(root)
    dest.mkdir(parents=True)
    sources = {
        rel: hashlib.sha256((package / rel).read_bytes()).hexdigest() for rel in compiled.MODULES.values()
    }
    manifest = {"ext_suffix": compiled._ext_suffix(), "python": "3", "sources": sources, **changes}
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def test_missing_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(compiled.Unavailable, match=r"not built .* build it with: python -m"):
        compiled.load(tmp_path)


def test_stale_build_is_refused(tmp_path: Path) -> None:
    sources = {rel: "0" * 64 for rel in compiled.MODULES.values()}
    fake_build(tmp_path, sources=sources)
    with pytest.raises(compiled.Unavailable, match=r"stale: lbtestbed/\S+ changed since the build"):
        compiled.load(tmp_path)


def test_build_for_another_python_is_refused(tmp_path: Path) -> None:
    fake_build(tmp_path, ext_suffix=".cpython-39-x86_64-linux-gnu.so")
    with pytest.raises(compiled.Unavailable, match="built for another Python"):
        compiled.load(tmp_path)


def test_unreadable_manifest_is_refused(tmp_path: Path) -> None:
    dest = compiled.build_dir(tmp_path)
    dest.mkdir(parents=True)
    (dest / "manifest.json").write_text("{not json")
    with pytest.raises(compiled.Unavailable, match="cannot read"):
        compiled.load(tmp_path)


TWIN_NAMES = [compiled.TWIN, *(f"{compiled.TWIN}.{m}" for m in compiled.MODULES)]


@pytest.fixture
def fresh_twin_modules() -> Iterator[None]:
    """No compiled twin in sys.modules during the test, and none it imported left behind after it."""
    saved = {n: sys.modules.pop(n) for n in TWIN_NAMES if n in sys.modules}
    yield
    for n in TWIN_NAMES:
        sys.modules.pop(n, None)
    sys.modules.update(saved)


@pytest.mark.usefixtures("fresh_twin_modules")
def test_a_build_without_its_modules_is_refused(tmp_path: Path) -> None:
    fake_build(tmp_path)  # right hashes, nothing to import
    with pytest.raises(compiled.Unavailable, match="cannot import the build"):
        compiled.load(tmp_path)


@pytest.mark.usefixtures("fresh_twin_modules")
def test_python_copies_are_never_taken_for_the_build(tmp_path: Path) -> None:
    """The twin package holds .py copies beside the compiled modules: without the compiled ones, the
    import finds the copies, and load() must refuse them rather than run them."""
    twin = fake_build(tmp_path) / "src" / compiled.TWIN
    twin.mkdir(parents=True)
    for name in ("__init__", *compiled.MODULES):
        (twin / f"{name}.py").write_text("")
    with pytest.raises(compiled.Unavailable, match="did not load as a compiled module"):
        compiled.load(tmp_path)


@pytest.mark.parametrize(("value", "expected"), [("python", False), ("compiled", True), ("", True)])
def test_selection(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv(compiled.ENV, value)
    assert compiled.selected() is expected


def test_the_build_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.selected()


def test_bad_selection_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compiled.ENV, "fast")
    with pytest.raises(SpecError, match="LBT_SIMULATOR: must be python or compiled, got 'fast'"):
        compiled.selected()


def test_unavailable_build_falls_back_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    monkeypatch.setenv(compiled.DIR_ENV, str(tmp_path))  # nothing built there
    monkeypatch.setattr(compiled, "_said", [])
    exp = parse_spec(SPEC)
    raws = [simulate_once(exp), simulate_once(exp)]
    err = capsys.readouterr().err
    assert err.count("lbt: note: compiled simulator: not built") == 1
    assert "running the pure-Python one" in err and len(err.strip().splitlines()) == 1
    reference = Simulator(exp).run()
    for raw in raws:
        assert raw.sojourns == reference.sojourns and raw.events == reference.events


def test_cli_bad_selection_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(
        'name = "x"\n[[classes]]\nname = "q"\ncount = 4\ndiscipline = "fcfs"\n'
        '[workload]\nload = 0.5\n[policy]\nname = "power_of_d"\n[run]\nduration = 5.0\n'
    )
    env = {**os.environ, compiled.ENV: "fast"}
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "simulate", str(spec), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lbt: error: LBT_SIMULATOR: must be python or compiled, got 'fast'"
    ]


def test_a_current_build_is_not_built_again(tmp_path: Path) -> None:
    """``build`` is cached: with a manifest of the current sources it compiles nothing (here there is no
    compiled module at all, so a build that went ahead would have to run mypyc)."""
    dest = fake_build(tmp_path)
    before = sorted(p.name for p in dest.iterdir())
    assert compiled.build(tmp_path) == dest
    assert sorted(p.name for p in dest.iterdir()) == before


#: specs that reach every path of the kernel (with SPEC's FCFS and PS classes, and POOLS below): instant
#: probes, messages, delays, several dispatchers, learning (SLTA's integer r), latency-learning node sides
#: (Prequal), a clock (peak EWMA), speed changes
BUILD_CASES: dict[str, dict[str, object]] = {
    "power_of_d": {"policy": {"name": "power_of_d", "d": 2}},
    "power_of_d_d3_replace": {"policy": {"name": "power_of_d", "d": 3, "replace": True}},
    "jsq_delay": {"policy": {"name": "jsq"}, "network": {"delay": 0.05}},
    "jiq_two_dispatchers": {"policy": {"name": "jiq", "dispatchers": 2}},
    "least_request_forwarded": {
        "policy": {"name": "least_request"},
        "network": {"delay": {"dist": "exponential", "mean": 0.05}, "forward_tasks": True},
    },
    "prequal": {"policy": {"name": "prequal"}},
    "peak_ewma": {"policy": {"name": "peak_ewma"}},
    "slow_fault": {
        "policy": {"name": "jsq"},
        "faults": [{"kind": "slow", "node": 3, "speed": 0.5, "at": 10.0, "until": 30.0}],
    },
}
POOLS = {
    "name": "compiled-pools",
    "seed": 5,
    "classes": [
        {"name": "small", "count": 6, "discipline": "pool", "utility": {"kind": "xlog", "r": 6}},
        {"name": "large", "count": 6, "discipline": "pool", "utility": {"kind": "xlog", "r": 9}},
    ],
    "workload": {"load": 3.0},
    "run": {"warmup": 5.0, "duration": 30.0, "batches": 6},
}


def assert_same_runs(fast: RawRun, slow: RawRun, case: str) -> None:
    assert fast.events == slow.events > 1000, case
    assert [list(b) for b in fast.sojourns] == [list(b) for b in slow.sojourns], case
    assert fast.decisions == slow.decisions, case
    assert repr(fast.r_series) == repr(slow.r_series) and repr(fast.r_time) == repr(slow.r_time), case
    assert fast.ratios.keys() == slow.ratios.keys(), case
    for key, (num, den) in slow.ratios.items():
        assert fast.ratios[key][0].tobytes() == num.tobytes(), (case, key)
        assert fast.ratios[key][1].tobytes() == den.tobytes(), (case, key)


@pytest.mark.slow
@pytest.mark.parametrize("case", [*BUILD_CASES, "slta", "jlmu", "jsq"])
def test_the_build_gives_the_pure_python_runs(built: object, case: str) -> None:
    """Bitwise the same runs, whichever policy and path: the default (compiled) is the reference (pure)."""
    if case in BUILD_CASES:
        spec = {**SPEC, **BUILD_CASES[case]}
    else:  # pools
        spec = {**POOLS, "policy": {"name": case, **({"beta_scale": 1.0} if case == "slta" else {})}}
    exp = parse_spec(spec)
    assert_same_runs(built.Simulator(exp).run(), Simulator(exp).run(), case)  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["power_of_d", "jiq_one", "least_request"])
def test_the_build_gives_the_pure_python_rates_kernel(built: object, case: str) -> None:
    """The rates kernel too, bitwise (SPEC's FCFS and PS classes: the instant probe, node messages, task
    ends heard by the dispatcher)."""
    policy = {"jiq_one": {"name": "jiq"}, "least_request": {"name": "least_request"}}.get(case)
    exp = parse_spec({**SPEC, "policy": policy or BUILD_CASES[case]["policy"]})
    rates = sys.modules[f"{compiled.TWIN}.rates"]
    assert rates.__file__.endswith(compiled._ext_suffix())
    assert_same_runs(rates.RatesSimulator(exp).run(), RatesSimulator(exp).run(), case)


@pytest.mark.slow
def test_the_build_goes_stale_with_its_sources(built: object, tmp_path: Path) -> None:
    """A copy of the package with one source changed: the project's build is refused for it."""
    package = tmp_path / "lbtestbed"
    shutil.copytree(compiled.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    assert compiled.load(package=package) is built  # the copy as it is: the build is its
    workload = package / "model" / "workload.py"
    workload.write_text(workload.read_text() + "\n# changed\n")
    with pytest.raises(compiled.Unavailable, match=r"stale: lbtestbed/model/workload\.py changed"):
        compiled.load(package=package)
