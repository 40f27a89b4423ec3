"""The result documents say where they came from and follow their JSON Schemas (docs/result.schema.json for
``lbt simulate --json`` and ``lbt predict --json``, docs/results.schema.json for ``lbt run``'s
results.json), and two runs of one spec have the same keys (issue 30: ``slta_r.time_fraction`` was keyed
by the values of r a run happened to visit).

``lbt run``'s results.json is checked where the suite makes it: tests/test_run.py (five policies) and
tests/test_run_example_faults.py (two runs of examples/jiq_faults.toml, the same keys).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from result_schemas import DOCS, key_paths, problems

from lbtestbed.analysis.results import provenance
from lbtestbed.analysis.results.result import METRICS
from lbtestbed.cli import main
from lbtestbed.model.reader import SpecError
from lbtestbed.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
#: a short window: the shape of the result, not its numbers, is under test
SHORT = ["run.warmup=2", "run.duration=20", "run.batches=4"]


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def short(spec: Path) -> list[str]:
    """The overrides that shorten ``spec``'s run, or none where the spec refuses them (faults beyond a
    short run's end)."""
    try:
        load_spec(spec, SHORT)
    except SpecError:
        return []
    return SHORT


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.stem)
def test_simulate_json_of_every_example_follows_the_schema(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [x for o in short(spec) for x in ("--set", o)]
    doc = printed(capsys, "simulate", str(spec), "--json", "--quiet", *overrides)
    assert problems("result.schema.json", doc) == []
    assert doc["schema_version"] == provenance.SCHEMA_VERSION


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.stem)
def test_predict_json_of_every_example_follows_the_schema(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = printed(capsys, "predict", str(spec), "--json")
    assert problems("result.schema.json", doc) == []


def test_replications_follow_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(ROOT / "examples" / "slta_two_classes.toml")
    overrides = [x for o in SHORT for x in ("--set", o)]
    doc = printed(
        capsys, "simulate", spec, "--json", "--quiet", "--replications", "2", "--jobs", "1", *overrides
    )
    assert doc["settings"]["ci_method"] == "independent replications"
    assert problems("result.schema.json", doc) == []


def test_the_schemas_catch_what_they_must() -> None:
    """A schema that accepted anything would pass every test above: a key it does not know, a metric
    missing, a value of the wrong type are each refused."""
    doc = json.loads(json.dumps({**provenance.stamp(), **_small_result()}))
    assert problems("result.schema.json", doc) == []
    extra = {**doc, "wall_secs": 1.0}
    missing = {**doc, "metrics": {k: v for k, v in doc["metrics"].items() if k != "utility"}}
    typed = {**doc, "n": "12"}
    unstamped = {k: v for k, v in doc.items() if k != "schema_version"}
    for broken in (extra, missing, typed, unstamped):
        assert problems("result.schema.json", broken), broken.keys()


def _small_result() -> dict[str, Any]:
    from lbtestbed.analysis.results.result import summarize
    from lbtestbed.analysis.simulator import simulate_once

    exp = load_spec(ROOT / "examples" / "jiq.toml", SHORT)
    return summarize(exp, [simulate_once(exp)]).to_json()


def test_the_schema_lists_every_metric() -> None:
    """The schema is written by hand: a metric added to the result object must be added to it too."""
    schema = json.loads((DOCS / "result.schema.json").read_text())
    metrics = schema["$defs"]["metrics"]
    assert set(metrics["properties"]) == set(metrics["required"]) == set(METRICS)


def test_two_simulations_of_one_spec_have_the_same_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """Seeds 1 and 2 of a short SLTA run visit different values of r (18-21 against 17-22): the learned
    index's time fractions are a list of (value, fraction), not a mapping keyed by the values seen."""
    spec = str(ROOT / "examples" / "slta_two_classes.toml")
    docs = []
    for seed in (1, 2):
        overrides = [x for o in [*SHORT, f"seed={seed}"] for x in ("--set", o)]
        docs.append(printed(capsys, "simulate", spec, "--json", "--quiet", *overrides))
    visited = [{e["value"] for e in d["metrics"]["slta_r"]["time_fraction"]} for d in docs]
    assert visited[0] != visited[1], "the two runs must differ where the old keys did"
    assert key_paths(docs[0]) == key_paths(docs[1])


def test_provenance_names_the_version_and_the_commit() -> None:
    """The stamp: the installed version, and the commit of the source tree (``git rev-parse HEAD``) when
    the tree is a git checkout."""
    from importlib import metadata

    stamp = provenance.stamp()
    assert stamp["lbtestbed"]["version"] == metadata.version("lbtestbed")
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the commit is rightly null (tested below)")
    head = subprocess.run([git, "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert stamp["lbtestbed"]["commit"] == head.stdout.strip()
    assert isinstance(stamp["lbtestbed"]["dirty"], bool)


def test_without_git_the_commit_is_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy without .git (a release, a container): commit and dirty are null, not a guess."""
    monkeypatch.setattr(provenance, "SOURCE", tmp_path)
    provenance.commit.cache_clear()
    try:
        assert provenance.stamp()["lbtestbed"] | {"version": None} == {
            "version": None,
            "commit": None,
            "dirty": None,
        }
    finally:
        provenance.commit.cache_clear()
