"""The terminal tables of ``lbt simulate`` and ``lbt predict``: every row says what its third column is,
bounds read as numbers (no Python dicts, no float noise), and a withheld occupancy tail says why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.results.tables import render, render_notes, show
from lbtestbed.analysis.results.text import DEFAULT_WIDTH, Fit, natural_width, table
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.theory import predict
from lbtestbed.cli import main
from lbtestbed.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def table_rows(text: str) -> list[list[str]]:
    """The metric table's rows (between the dashes and the blank line), split on runs of 2+ spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    end = lines.index("", start)
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start:end]]


def test_every_simulated_row_has_its_interval() -> None:
    exp = load_spec(ROOT / "examples" / "power_of_d_jsq2.toml", ["run.duration=100", "run.warmup=10"])
    rows = table_rows(render(summarize(exp, [simulate_once(exp)])))
    assert any(r[0] == "messages_per_task[probe]" for r in rows)
    for r in rows:
        assert len(r) == 3 and r[2].startswith("± "), r


def test_every_predicted_row_has_its_regime() -> None:
    for spec in ("slta_two_classes.toml", "scheme1_fig3.toml", "power_of_d_jsq2.toml"):
        rows = table_rows(render(predict(load_spec(ROOT / "examples" / spec))))
        for r in rows:
            assert len(r) == 3 and r[2].split(",")[0].split()[0] in {"exact", "finite_n", "limit"}, (spec, r)
    rows = table_rows(render(predict(load_spec(ROOT / "examples" / "slta_two_classes.toml"))))
    # the variance of the M/G/inf total n rho = 100 x 9.75 is itself Poisson: exact
    assert ["variance of tasks in system", "975", "exact"] in rows


def test_bounds_read_as_numbers_and_a_withheld_tail_says_why() -> None:
    result = predict(load_spec(ROOT / "examples" / "jsq_hetero_random.toml", ["policy.name=jiq"]))
    notes = render_notes(result)
    stability = next(line for line in notes.splitlines() if line.startswith("  stability:"))
    assert "{" not in stability and "'" not in stability
    # no float noise: every number in it has at most 6 significant digits
    assert all(len(d.replace(".", "").lstrip("0")) <= 6 for d in re.findall(r"\d+\.\d+|\d+", stability))
    assert "stable=yes" in stability
    tail = next(line for line in render(result).splitlines() if line.startswith("  servers"))
    assert tail.startswith("  servers    none: unequal speeds")


def test_show() -> None:
    assert show({"a": 1 / 3, "b": True, "c": [0.1 + 0.2, "x"]}) == "a=0.333333, b=yes, c=[0.3, x]"


EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def test_lbt_predict_fits_100_columns_for_every_example(capsys: pytest.CaptureFixture[str]) -> None:
    """Not a terminal: ``lbt predict`` fits 100 columns, its notes wrapped with their words whole (a
    note once reached 401 characters); nothing is lost in the wrapping."""
    for spec in EXAMPLES:
        assert main(["predict", str(spec)]) == 0
        out = capsys.readouterr().out
        assert max(map(len, out.splitlines())) <= DEFAULT_WIDTH, spec.name
        flat = " ".join(out.split())
        for note in predict(load_spec(spec)).extras.get("notes", []):
            assert f"{note['metric']}:" in flat and " ".join(str(note.get("source", "")).split()) in flat


ROWS = [
    ["metric", "unit", "cluster", "twin", "verdict", "theory"],
    ["mean_sojourn", "model s", "1.2393 ± 0.12", "1.2379 ± 0.097", "agrees", "1.05 [exact +-4.3e-05]"],
    ["occupancy_tail[servers] at j=2", "fraction", "0.026 ± 0.021", "0.031 ± 0.02", "disagrees (4 se)", "0"],
]


@pytest.mark.parametrize("width", [30, 50, 70, 90, 100, 120, 200])
def test_a_table_fits_its_width_and_says_what_it_left_out(width: int) -> None:
    """``text.table``: never wider than asked; optional columns go first, in their order, and the line
    under the table names them; the wrapping columns give way before a value is split."""
    fit = Fit(width)
    out = table(ROWS, fit, wrap=("metric", "verdict"), drop=("unit", "theory"))
    assert max(map(len, out.splitlines())) <= width, out
    natural = natural_width(ROWS)
    if natural <= width:
        assert "left out" not in out and "1.05 [exact +-4.3e-05]" in out
    else:
        assert "left out" in out and "model s" not in out
    if width >= 90:  # room enough: every value on one line
        assert "1.2379 ± 0.097" in out and "0.026 ± 0.021" in out


def test_wide_shows_every_column_at_full_width() -> None:
    out = table(ROWS, Fit(40, wide=True), wrap=("metric",), drop=("unit", "theory"))
    assert "left out" not in out
    for row in ROWS:
        assert any(all(cell in line for cell in row) for line in out.splitlines()), row
