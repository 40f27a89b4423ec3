"""The opt-in mypyc build of the simulator (``lbtestbed/analysis/simulator/compiled.py``).

What must hold: nothing compiled is used unless ``LBT_SIMULATOR=compiled`` asks for it; a build whose
sources have changed since is refused (and ``simulate_once`` then warns once and runs the pure-Python
simulator); a bad ``LBT_SIMULATOR`` is one line of bad input; and a fresh build gives the pure-Python run
to the last bit. The last needs mypyc and a C compiler and takes about a minute: it is marked slow.
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

from lbtestbed.analysis.simulator import compiled, simulate_once
from lbtestbed.analysis.simulator.engine import Simulator
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


@pytest.mark.parametrize(("value", "expected"), [("python", False), ("compiled", True)])
def test_selection(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv(compiled.ENV, value)
    assert compiled.selected() is expected


def test_bad_selection_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compiled.ENV, "fast")
    with pytest.raises(SpecError, match="LBT_SIMULATOR: must be python or compiled, got 'fast'"):
        compiled.selected()


def test_unavailable_build_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(compiled.ENV, "compiled")
    monkeypatch.setenv(compiled.DIR_ENV, str(tmp_path))  # nothing built there
    monkeypatch.setattr(compiled, "_warned", [])
    exp = parse_spec(SPEC)
    raws = [simulate_once(exp), simulate_once(exp)]
    err = capsys.readouterr().err
    assert err.count("lbt: warning: LBT_SIMULATOR=compiled: not built") == 1
    assert len(err.strip().splitlines()) == 1
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


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_fresh_build_gives_the_same_runs_and_goes_stale_with_its_sources(tmp_path: Path) -> None:
    """Build from a private copy of the package, run the copy's compiled simulator and the pure-Python one
    on the same seeds (bitwise equal), then change one source of the copy: the build is refused."""
    package = tmp_path / "src" / "lbtestbed"
    shutil.copytree(compiled.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path / "build"
    try:
        compiled.build(root, package)
    except compiled.Unavailable as e:
        if "mypyc failed" in str(e) and ("gcc" in str(e) or "Python.h" in str(e)):
            pytest.skip(f"cannot compile here: {e}")
        raise
    module = compiled.load(root, package)
    assert str(module.__file__).endswith(compiled._ext_suffix())
    for policy in ({"name": "power_of_d", "d": 2}, {"name": "jsq"}, {"name": "power_of_d", "d": 3}):
        exp = parse_spec(
            {**SPEC, "policy": policy, **({"network": {"delay": 0.05}} if policy["name"] == "jsq" else {})}
        )
        fast, slow = module.Simulator(exp).run(), Simulator(exp).run()
        assert fast.events == slow.events > 1000, policy
        assert fast.sojourns == slow.sojourns, policy
        assert fast.decisions == slow.decisions, policy
        for key, (num, den) in slow.ratios.items():
            assert fast.ratios[key][0].tobytes() == num.tobytes(), (policy, key)
            assert fast.ratios[key][1].tobytes() == den.tobytes(), (policy, key)
    workload = package / "model" / "workload.py"
    workload.write_text(workload.read_text() + "\n# changed\n")
    with pytest.raises(compiled.Unavailable, match=r"stale: lbtestbed/model/workload\.py changed"):
        compiled.load(root, package)
