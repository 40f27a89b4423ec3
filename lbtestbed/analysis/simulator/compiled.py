"""The simulator compiled with mypyc: opt-in, built beside the package, refused once its sources change.

Pure Python is the default and the reference. ``python -m lbtestbed.analysis.simulator.compiled build``
compiles copies of the simulator's hot modules (``analysis/simulator/engine.py``, ``model/nodes.py``,
``model/workload.py``) with mypyc, as the private package ``_lbt_compiled`` in ``build/compiled-simulator/``
(or ``$LBT_COMPILED_DIR``), and records the SHA-256 of every source it compiled. Compiling the modules
in place would put ``.so`` files beside the sources, where an editable install imports them instead of
the ``.py`` files long after those have changed; the copies here live outside the package, so nothing
imports them unless asked:

* ``LBT_SIMULATOR=compiled`` makes ``simulate_once`` (``lbt simulate``, its replications, ``lbt run``)
  use them; ``LBT_SIMULATOR=python`` or unset keeps the pure-Python simulator.
* ``load()`` checks the recorded hashes against the current sources first and refuses a stale build. For
  ``simulate_once`` a refusal means one warning on stderr and the pure-Python simulator: the results are
  the same either way, only slower.

The copies import each other and the rest of the package as it is (policies, spec, distributions): only
the three copies are frozen (the ``RawRun`` they fill is the package's own), and the hashes pin exactly
those. mypyc turns the same Python float and int
operations into the same IEEE double operations, so a compiled run gives the pure-Python run to the last
bit (``tests/test_compiled_simulator.py``, ``benchmarks/check_simulator_identity.py --compiled``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

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
    "nodes": "model/nodes.py",
    "workload": "model/workload.py",
}
#: import lines rewritten so that the copies use each other
REWRITES = {
    "lbtestbed.analysis.simulator.engine": f"{TWIN}.engine",
    "lbtestbed.analysis.simulator.calendar_queue": f"{TWIN}.calendar_queue",
    "lbtestbed.analysis.simulator.delays": f"{TWIN}.delays",
    "lbtestbed.analysis.simulator.measure": f"{TWIN}.measure",
    "lbtestbed.model.nodes": f"{TWIN}.nodes",
    "lbtestbed.model.workload": f"{TWIN}.workload",
}
ENV, DIR_ENV = "LBT_SIMULATOR", "LBT_COMPILED_DIR"
BUILD_HINT = "build it with: python -m lbtestbed.analysis.simulator.compiled build"


class Unavailable(Exception):
    """Why the compiled simulator cannot be used, in one line."""


def build_dir(root: Path | None = None) -> Path:
    """Where the build for this Python lives: one directory per extension ABI."""
    base = root or Path(os.environ.get(DIR_ENV) or PACKAGE.parent / "build" / "compiled-simulator")
    return base / _ext_suffix().strip(".").removesuffix(".so")


def _ext_suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX"))  # e.g. .cpython-311-x86_64-linux-gnu.so


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(root: Path | None = None, package: Path = PACKAGE) -> Path:
    """Compile the copies; return the build directory. Raises Unavailable when mypyc fails."""
    dest = build_dir(root)
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


def load(root: Path | None = None, package: Path = PACKAGE) -> ModuleType:
    """The compiled simulator module, after checking that it was built from the current sources."""
    dest = build_dir(root)
    manifest_path = dest / "manifest.json"
    if not manifest_path.is_file():
        raise Unavailable(f"not built (no {manifest_path}); {BUILD_HINT}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise Unavailable(f"cannot read {manifest_path}: {e}; {BUILD_HINT}") from None
    if not isinstance(manifest, dict):
        raise Unavailable(f"{manifest_path} is not a manifest; {BUILD_HINT}")
    if manifest.get("ext_suffix") != _ext_suffix():
        raise Unavailable(f"{dest} was built for another Python; {BUILD_HINT}")
    sources = manifest.get("sources")
    if not isinstance(sources, dict) or set(sources) != set(MODULES.values()):
        raise Unavailable(f"{manifest_path} does not list the modules this version compiles; {BUILD_HINT}")
    for rel, digest in sources.items():
        if _digest(package / rel) != digest:
            raise Unavailable(f"stale: lbtestbed/{rel} changed since the build; {BUILD_HINT}")
    name = f"{TWIN}.engine"
    loaded = sys.modules.get(name)
    if loaded is not None and not str(loaded.__file__).startswith(str(dest / "src")):
        raise Unavailable(f"another build ({loaded.__file__}) is loaded in this process already")
    if loaded is None:
        path = str(dest / "src")
        sys.path.insert(0, path)  # only while importing: the copies and mypyc's shared library live here
        try:
            importlib.import_module(name)
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
    """Whether ``LBT_SIMULATOR`` asks for the compiled simulator; a value other than python or compiled
    is bad input."""
    value = os.environ.get(ENV, "python")
    if value not in ("python", "compiled"):
        raise SpecError(ENV, "", f"must be python or compiled, got {value!r}")
    return value == "compiled"


_warned: list[str] = []


def run_selected(exp: Experiment, replication: int = 0, progress: Progress | None = None) -> RawRun | None:
    """One replication on the compiled simulator when ``LBT_SIMULATOR`` asks for it; None when it does
    not, or when the build is unavailable (then with one warning per process: the pure-Python simulator
    gives the same result)."""
    if not selected():
        return None
    try:
        module = load()
    except Unavailable as e:
        if not _warned:
            _warned.append(str(e))
            print(f"lbt: warning: {ENV}=compiled: {e}; running the pure-Python simulator", file=sys.stderr)
        return None
    raw = module.Simulator(exp, replication, progress).run()
    assert isinstance(raw, RawRun)  # the copies build the package's own RawRun: it is not compiled
    return raw


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["build"], ["check"]):
        print("usage: python -m lbtestbed.analysis.simulator.compiled build|check", file=sys.stderr)
        return 2
    try:
        if args == ["build"]:
            print(f"compiling {', '.join(MODULES.values())} with mypyc (about a minute) ...", file=sys.stderr)
            print(f"built {build(root=None)}")
        module = load()
    except Unavailable as e:
        print(f"lbt: error: compiled simulator: {e}", file=sys.stderr)
        return 1
    print(f"compiled simulator up to date: {module.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
