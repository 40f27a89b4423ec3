"""``lbt run examples/jiq_faults.toml --node-processes 3`` end to end, as a user runs it: the report of a
run with faults (a node process killed, one paused, idle tokens lost), read from its terminal output and
its report directory.

A fault run leaves out the batches a fault touched (and those at whose ends a process did not answer a
scrape). Every column of a row (cluster, twin, cluster - twin, simulation, net cost, theory) must then be
over the same batches, and the row must say how many: otherwise the report reads "1.158 against 1.804,
-0.38 %, agrees", two averages over all 20 batches beside a gap paired over the 7 kept (issue 30).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from result_schemas import key_paths, problems

from lbtestbed.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "jiq_faults.toml"


class Run:
    def __init__(self, out: Path, proc: subprocess.CompletedProcess[str]) -> None:
        self.out, self.stdout, self.stderr, self.code = out, proc.stdout, proc.stderr, proc.returncode
        self.doc: dict[str, Any] = json.loads((out / "results.json").read_text())
        self.markdown = (out / "report.md").read_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Run]:
    """Two runs of the example at once (each mostly waits on its clock): what they measure differs,
    their documents' keys must not."""
    command = [sys.executable, "-m", "lbtestbed.cli", "run", str(SPEC), "--node-processes", "3"]
    outs = [tmp_path_factory.mktemp("faults") / "report" for _ in range(2)]
    procs = [
        subprocess.Popen(
            [*command, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for out in outs
    ]
    done = []
    for out, proc in zip(outs, procs, strict=True):
        try:
            stdout, stderr = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.terminate()  # lbt run stops its cluster on SIGTERM
            proc.communicate(timeout=30)
            raise
        # a verdict either way; 2 or a traceback is a failure
        assert proc.returncode in (0, 1), stderr
        done.append(Run(out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)))
    return done


@pytest.fixture(scope="module")
def run(runs: list[Run]) -> Run:
    return runs[0]


def touched_by_faults(outages: list[dict[str, Any]] | None = None) -> set[int]:
    """The batches a fault of the spec overlaps, [at, until + settle], and with ``outages`` (the run's
    observed outages, results.json) those each overlaps from its ``last_seen`` to its ``end`` plus the
    settle time of its fault (docs/faults.md, "What the comparison leaves out"), worked out here from the
    spec and the raw outage records: a killed process restarting slowly on a busy machine is out past its
    fault's ``until``, and its batches must be left out too."""
    exp = load_spec(str(SPEC))
    r = exp.run
    marks = [r.warmup + r.duration * b / r.batches for b in range(r.batches + 1)]
    windows = [(f.at, f.until + f.settle) for f in exp.faults]
    for o in outages or []:
        settle = exp.faults[o["fault"]].settle if o["fault"] is not None else r.warmup
        windows.append((o["last_seen"], (float("inf") if o["end"] is None else o["end"]) + settle))
    return {
        b
        for b, (lo, hi) in enumerate(itertools.pairwise(marks))
        if any(a < hi and lo < z for a, z in windows)
    }


def test_every_row_is_over_one_batch_set(run: Run) -> None:
    """Every comparison of a metric (cluster - twin, the net cost, simulation against theory) is over the
    same batches, the cluster's kept ones, and every source's batch values hold exactly those: each
    column of the row is computed over them."""
    window = load_spec(str(SPEC)).run.batches
    kept = run.doc["results"]["cluster"]["batches"]["kept"]
    assert set(kept).isdisjoint(touched_by_faults()) and 2 <= len(kept) < window
    for v in run.doc["comparison"]:
        if v["agrees"] is not None:
            assert v["batches"] == kept, (v["metric"], v["subject"], v["reference"], v["batches"])
    for source in ("cluster", "twin", "simulation"):
        table = run.doc["results"][source]["batch_values"]
        assert table["batches"] == kept, source
        for metric, values in table["values"].items():
            assert len(values) == len(kept), (source, metric)


def table_rows(text: str) -> list[list[str]]:
    """The terminal table's rows, split on its two-space column gaps (header first)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("metric"))
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        if not set(line) <= {"-", " "}:
            rows.append([c.strip() for c in line.split("  ") if c.strip()])
    return rows


def test_every_row_says_its_batch_set(run: Run) -> None:
    """The row says over how many of the window's batches it is, and the line under the table which
    were left out and why: the batches the spec's faults touch."""
    window = load_spec(str(SPEC)).run.batches
    info = run.doc["results"]["cluster"]["batches"]
    said = f"{len(info['kept'])} of {window}"
    lines = run.markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| metric"))
    md_rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    head = [c.strip() for c in md_rows[0].strip("|").split("|")]
    assert "batches" in head, head
    for line in md_rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[head.index("batches")] == said, line
    outages = run.doc["results"]["cluster"]["faults"]["outages"]
    assert touched_by_faults() <= set(info["faults"]) == touched_by_faults(outages)
    left_out = window - len(info["kept"])
    note = f"{left_out} left out: {len(info['faults'])} touched by a fault or its settling"
    assert note in run.markdown and note in " ".join(run.stdout.split())  # wrapped on the terminal


def test_the_terminal_output_fits_100_columns(run: Run) -> None:
    """Not a terminal: the table fits 100 columns (it was 216 wide), the columns it left out are named
    under it, and the verdicts that decide (cluster - twin, the simulation against the theory) stay."""
    # every line but the one naming the report's path, whose length is the directory's (pytest-xdist's
    # workers put theirs one level deeper)
    lines = [line for line in run.stdout.splitlines() if not line.startswith(f"report: {run.out}")]
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    header = next(line for line in lines if line.startswith("metric"))
    for column in ("cluster", "twin", "cluster-twin", "verdict"):
        assert column in header.split("  ") or f" {column} " in f" {header} ", header
    flat = " ".join(run.stdout.split())
    assert "left out to fit 100 columns:" in flat and "--wide shows them" in flat


def test_results_json_follows_its_schema_and_two_runs_have_the_same_keys(runs: list[Run]) -> None:
    """docs/results.schema.json holds for both runs, and their documents have the same keys although
    what they measured differs (issue 30: the keys followed the values a run happened to see)."""
    for r in runs:
        assert problems("results.schema.json", r.doc) == []
        assert r.doc["lbtestbed"]["version"] and r.doc["schema_version"] == 1
    a, b = (r.doc for r in runs)
    assert a["results"]["cluster"]["metrics"] != b["results"]["cluster"]["metrics"]
    assert key_paths(a) == key_paths(b)
