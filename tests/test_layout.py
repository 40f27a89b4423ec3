"""The package's layout (docs/design.md, principle 9): no module imports itself through others, and nothing
sits loose at the top of the package but the spec reader: every part, the command line too, is a package of
its own.

The import graph is grimp's (the library behind import-linter): every import statement counts, also one
deferred into a function or guarded by ``TYPE_CHECKING``. The layers themselves are import-linter's
contracts in pyproject.toml, checked by ``make lint``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import grimp

#: modules allowed directly under lbtestbed/ beside the subpackages: the spec reader (it joins the model's
#: tables and the policy library's parameters, so it is a layer of its own between the two), and the public
#: Python interface (a layer of its own under the command line: docs/api.md)
TOP_LEVEL_MODULES = {"lbtestbed.spec", "lbtestbed.api"}


def cycles(graph: grimp.ImportGraph, modules: Iterable[str]) -> list[list[str]]:
    """The import cycles among ``modules``: strongly connected components of more than one module, or a
    module that imports itself (Tarjan's algorithm, iterative)."""
    modules = sorted(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & set(modules)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            for j in range(i, len(edges[v])):
                w = edges[v][j]
                if w not in index:
                    work += [(v, j + 1), (w, 0)]
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1 or v in edges[v]:
                        found.append(sorted(component))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    """On a graph built by hand: a three-module cycle, a self-import, and an acyclic chain beside them."""
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.d", "p.d"), ("p.e", "p.f")]:
        graph.add_import(importer=a, imported=b)
    graph.add_module("p.g")
    assert sorted(cycles(graph, graph.modules)) == [["p.a", "p.b", "p.c"], ["p.d"]]


def test_no_module_imports_itself_through_others() -> None:
    # Imports under TYPE_CHECKING are left out: they run only for mypy and mypyc (the kernel's delays name
    # the Simulator they are bound to, so that the compiled build reaches its attributes natively).
    graph = grimp.build_graph("lbtestbed", cache_dir=None, exclude_type_checking_imports=True)
    assert cycles(graph, graph.modules) == []


def test_deferred_imports_are_in_the_graph() -> None:
    """The graph sees imports inside functions (the launcher imports the Prometheus module only when a
    cluster asks for one), so a cycle through one would be found."""
    graph = grimp.build_graph("lbtestbed", cache_dir=None)
    assert "lbtestbed.cluster.prometheus" in graph.find_modules_directly_imported_by(
        "lbtestbed.cluster.launcher"
    )


def test_nothing_loose_at_the_top_of_the_package() -> None:
    graph = grimp.build_graph("lbtestbed", cache_dir=None)
    loose = {m for m in graph.find_children("lbtestbed") if not graph.find_children(m)}
    assert loose == TOP_LEVEL_MODULES


def test_ruff_leaves_make_compileds_build_alone(tmp_path: Path) -> None:
    """``make compiled`` writes mypyc's C and Python into build/; in a copy without .git (a release, a
    container) ruff reads no .gitignore, so ``make test``'s lint would fail on them unless pyproject.toml
    excludes build/ itself."""
    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "build" / "lib").mkdir(parents=True)
    (tmp_path / "build" / "lib" / "generated.py").write_text("import os, sys\nx=1;y = 2\n")  # lint errors
    (tmp_path / "clean.py").write_text('"""A module ruff accepts."""\n')
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run([str(ruff), "check", "."], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
    seen = subprocess.run(
        [str(ruff), "check", "--show-files", "."], cwd=tmp_path, capture_output=True, text=True
    )
    assert "clean.py" in seen.stdout and "build" not in seen.stdout, seen.stdout


def test_make_compiled_runs_without_a_warning() -> None:
    """``make compiled``'s command, asked to ``check`` rather than build (a minute of mypyc), prints no
    runpy warning: ``python -m lbtestbed.analysis.simulator.compiled`` did, the package having imported
    the module before runpy ran it."""
    root = Path(__file__).resolve().parents[1]
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-n", "compiled", "STAMP="], cwd=root, capture_output=True, text=True
    )
    found = re.search(r"(\S+/python -c '[^']*') build", recipe.stdout)
    assert found, recipe.stdout
    check = found.group(1) + " check"
    done = subprocess.run(check, shell=True, cwd=root, capture_output=True, text=True, timeout=120)
    assert "Warning" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr  # up to date, or not built here: said in one line
    assert len(done.stderr.strip().splitlines()) <= 1, done.stderr
