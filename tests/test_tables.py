"""The terminal tables of ``lbt simulate`` and ``lbt predict``: every row says what its third column is,
bounds read as numbers (no Python dicts, no float noise), and a withheld occupancy tail says why."""

from __future__ import annotations

import re
from pathlib import Path

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.results.tables import render, render_notes, show
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.theory import predict
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
