"""The simulator compiled with mypyc: used by default where it is built, refused once its sources change.

``python -m lbtestbed.analysis.simulator.compiled build`` compiles copies of the simulator's modules
(``MODULES``: the event kernel, its queue, delays and measurement, the rates kernel, the node models and
the workload) with mypyc, as the private package ``_lbt_compiled``, and records the SHA-256 of every source
it compiled. The build lives outside the package (``default_root``: ``$LBT_COMPILED_DIR``; in a source
checkout its ``build/compiled-simulator/``; else the user's cache), one directory per extension ABI.
Compiling the modules in place would put ``.so`` files beside the sources, where an editable install
imports them instead of the ``.py`` files long after those have changed; the copies here are imported only
through ``load()``, which checks the recorded hashes against the current sources first and refuses a stale
build. ``build`` does nothing when the build is current, so ``make test`` and ``make demo`` (which run it)
pay for it only when a source has changed.

``simulate_once`` (``lbt simulate``, its replications, ``lbt run``, ``lbt sweep``) runs the build unless
``LBT_SIMULATOR=python`` says not to; when it is missing or stale (no C compiler, not built yet, a source
changed), one line says so and the pure-Python simulator runs: the results are the same either way, to the
last bit (mypyc turns the same Python float and int operations into the same IEEE double operations;
``tests/test_compiled_simulator.py``, ``benchmarks/check_simulator_identity.py --compiled``). The copies
import each other and the rest of the package as it is (policies, spec, distributions; the ``RawRun``
they fill is the package's own).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.engine import Progress
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError

PACKAGE = Path(__file__).resolve().parents[2]  # the lbtestbed package directory
TWIN = "_lbt_compiled"
#: the compiled copies: name in the twin package -> source, relative to the package
MODULES = {
    "engine": "analysis/simulator/engine.py",
    "calendar_queue": "analysis/simulator/calendar_queue.py",
    "delays": "analysis/simulator/delays.py",
    "measure": "analysis/simulator/measure.py",
    "rates": "analysis/simulator/rates.py",
    "nodes": "model/nodes.py",
    "workload": "model/workload.py",
}
#: import lines rewritten so that the copies use each other
REWRITES = {
    "lbtestbed.analysis.simulator.engine": f"{TWIN}.engine",
    "lbtestbed.analysis.simulator.calendar_queue": f"{TWIN}.calendar_queue",
    "lbtestbed.analysis.simulator.delays": f"{TWIN}.delays",
    "lbtestbed.analysis.simulator.measure": f"{TWIN}.measure",
    "lbtestbed.analysis.simulator.rates": f"{TWIN}.rates",
    "lbtestbed.model.nodes": f"{TWIN}.nodes",
    "lbtestbed.model.workload": f"{TWIN}.workload",
}
ENV, DIR_ENV = "LBT_SIMULATOR", "LBT_COMPILED_DIR"
#: LBT_SIMULATOR's values: the mypyc build where it is current (the default), or the pure-Python simulator
CHOICES = ("compiled", "python")
BUILD_HINT = "build it with: python -m lbtestbed.analysis.simulator.compiled build"


class Unavailable(Exception):
    """Why the compiled simulator cannot be used, in one line."""


def default_root() -> Path:
    """Where builds live: ``$LBT_COMPILED_DIR``; in a source checkout (``pyproject.toml`` beside the
    package) its ``build/compiled-simulator``; else ``lbtestbed/compiled-simulator`` in the user's cache."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    if (PACKAGE.parent / "pyproject.toml").is_file():
        return PACKAGE.parent / "build" / "compiled-simulator"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "lbtestbed" / "compiled-simulator"


def build_dir(root: Path | None = None) -> Path:
    """Where the build for this Python lives: one directory per extension ABI."""
    return (root or default_root()) / _ext_suffix().strip(".").removesuffix(".so")


def compiler() -> str | None:
    """The C compiler mypyc would use, if there is one."""
    cc = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc") or shutil.which("gcc")


def _ext_suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX"))  # e.g. .cpython-311-x86_64-linux-gnu.so


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(root: Path | None = None, package: Path = PACKAGE, force: bool = False) -> Path:
    """Compile the copies, unless a build of the current sources is there (``force``: all the same); return
    the build directory. Raises Unavailable when there is no C compiler or mypyc fails."""
    dest = build_dir(root)
    if not force and _stale_because(dest, package) is None:
        return dest
    if compiler() is None:
        raise Unavailable("no C compiler (cc) to build it with")
    src = dest / "src"
    twin = src / TWIN
    twin.mkdir(parents=True, exist_ok=True)
    (dest / "manifest.json").unlink(missing_ok=True)  # no manifest while half built
    (twin / "__init__.py").write_text(
        '"""Compiled copies of lbtestbed modules: lbtestbed/analysis/simulator/compiled.py."""\n'
    )
    sources: dict[str, str] = {}
    for name, rel in MODULES.items():
        data = (package / rel).read_bytes()
        sources[rel] = hashlib.sha256(data).hexdigest()  # the bytes load() will hash
        text = data.decode("utf-8")
        for old, new in REWRITES.items():
            text = text.replace(f"from {old} import ", f"from {new} import ")
            if re.search(rf"^\s*(from|import)\s+{re.escape(old)}\b", text, re.MULTILINE):
                raise Unavailable(f"{rel} imports {old} in a form the build does not rewrite")
        (twin / f"{name}.py").write_text(text, encoding="utf-8")
    # mypy finds the package's sources through MYPYPATH (an editable install hides them behind an import
    # hook); errors elsewhere in the package are not the build's business
    env = {**os.environ, "MYPYPATH": str(package.parent)}
    cmd = [sys.executable, "-m", "mypyc", "--follow-imports=silent", *(f"{TWIN}/{n}.py" for n in MODULES)]
    proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        raise Unavailable(f"mypyc failed: {lines[-1] if lines else f'exit status {proc.returncode}'}")
    manifest = {"ext_suffix": _ext_suffix(), "python": sys.version.split()[0], "sources": sources}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return dest


def _stale_because(dest: Path, package: Path) -> str | None:
    """Why the build in ``dest`` is not of ``package``'s current sources for this Python; None if it is."""
    manifest_path = dest / "manifest.json"
    if not manifest_path.is_file():
        return f"not built (no {manifest_path})"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"cannot read {manifest_path}: {e}"
    if not isinstance(manifest, dict):
        return f"{manifest_path} is not a manifest"
    if manifest.get("ext_suffix") != _ext_suffix():
        return f"{dest} was built for another Python"
    sources = manifest.get("sources")
    if not isinstance(sources, dict) or set(sources) != set(MODULES.values()):
        return f"{manifest_path} does not list the modules this version compiles"
    for rel, digest in sources.items():
        if _digest(package / rel) != digest:
            return f"stale: lbtestbed/{rel} changed since the build"
    return None


def load(root: Path | None = None, package: Path = PACKAGE) -> ModuleType:
    """The compiled simulator module, after checking that it was built from the current sources."""
    dest = build_dir(root)
    why = _stale_because(dest, package)
    if why is not None:
        raise Unavailable(f"{why}; {BUILD_HINT}")
    name = f"{TWIN}.engine"
    loaded = sys.modules.get(name)
    if loaded is not None and not str(loaded.__file__).startswith(str(dest / "src")):
        raise Unavailable(f"another build ({loaded.__file__}) is loaded in this process already")
    if loaded is None:
        path = str(dest / "src")
        sys.path.insert(0, path)  # only while importing: the copies and mypyc's shared library live here
        try:
            for twin_name in MODULES:  # the rates kernel too, which the event kernel does not import
                importlib.import_module(f"{TWIN}.{twin_name}")
        except ImportError as e:
            raise Unavailable(f"cannot import the build in {dest}: {e}; {BUILD_HINT}") from None
        finally:
            sys.path.remove(path)
    for twin_name in MODULES:
        module = sys.modules.get(f"{TWIN}.{twin_name}")
        if module is None or not str(module.__file__).endswith(_ext_suffix()):
            raise Unavailable(f"{TWIN}.{twin_name} did not load as a compiled module from {dest}")
    return sys.modules[name]


def selected() -> bool:
    """Whether the compiled simulator is to be used: unless ``LBT_SIMULATOR=python``; a value other than
    python or compiled is bad input."""
    value = os.environ.get(ENV) or "compiled"
    if value not in CHOICES:
        raise SpecError(ENV, "", f"must be python or compiled, got {value!r}")
    return value == "compiled"


_said: list[str] = []


def kernel_class(module: ModuleType, kernel: str) -> Any:
    """The build's simulator of ``kernel`` (``events``: ``Simulator``; ``rates``: ``RatesSimulator``), from
    ``module`` as ``load`` returns it (its other modules were imported with it)."""
    if kernel == "rates":
        return sys.modules[f"{TWIN}.rates"].RatesSimulator
    return module.Simulator


def run_selected(
    exp: Experiment, replication: int = 0, progress: Progress | None = None, kernel: str = "events"
) -> RawRun | None:
    """One replication on the compiled simulator's ``kernel`` (``events`` or ``rates``), unless
    ``LBT_SIMULATOR=python``; None when not asked for, or when the build is unavailable (then with one line
    per process: the pure-Python simulator gives the same result)."""
    if not selected():
        return None
    try:
        module = load()
    except Unavailable as e:
        if not _said:
            _said.append(str(e))
            print(f"lbt: note: compiled simulator: {e}; running the pure-Python one", file=sys.stderr)
        return None
    raw = kernel_class(module, kernel)(exp, replication, progress).run()
    assert isinstance(raw, RawRun)  # the copies build the package's own RawRun: it is not compiled
    return raw


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["build"], ["check"]):
        print("usage: python -m lbtestbed.analysis.simulator.compiled build|check", file=sys.stderr)
        return 2
    try:
        if args == ["build"]:
            why = _stale_because(build_dir(), PACKAGE)
            if why is not None:
                print(f"{why}: compiling the simulator with mypyc (about 15 s) ...", file=sys.stderr)
                print(f"built {build(root=None)}")
        module = load()
    except Unavailable as e:
        print(f"lbt: error: compiled simulator: {e}", file=sys.stderr)
        return 1
    print(f"compiled simulator up to date: {module.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
