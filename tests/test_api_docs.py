"""The public Python interface (lbtestbed.api, re-exported by the package) and docs/api.md, whose Python
blocks run here as they are written, one after the other in one namespace, from a directory that looks
like the repository's top (``examples/`` beside it)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lbtestbed
from lbtestbed import api

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_docs_api_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block, in order (the walk-through's cells), without an error; what they print is shown on
    failure. The cluster run is a real one: ten pools for 40 model seconds."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__api_md__"}
    found = blocks()
    assert len(found) >= 8
    for i, code in enumerate(found):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(
                    f"block {i + 1} failed: {e!r}\n{code}\n--- printed:\n{out.getvalue()}"
                ) from e
        assert out.getvalue().strip(), f"block {i + 1} prints nothing to look at"
    report = namespace["report"]
    assert isinstance(report, api.RunReport) and (tmp_path / "jlmu-run" / "results.json").is_file()
    assert (tmp_path / "sweep" / "sweep.json").is_file()


def test_the_public_names_are_the_packages() -> None:
    """``import lbtestbed as lbt; lbt.simulate(...)``: every name of lbtestbed.api's __all__ is the
    package's, the same object, typed and documented."""
    assert set(lbtestbed.__all__) == {*api.__all__, "__version__"}
    for name in api.__all__:
        obj = getattr(lbtestbed, name)
        assert obj is getattr(api, name)
        assert obj.__doc__, name
    with pytest.raises(AttributeError):
        _ = lbtestbed.no_such_name  # type: ignore[attr-defined]


def test_a_node_process_does_not_load_the_interface() -> None:
    """The cluster's processes import the package first: its names load on first use only."""
    code = "import sys, lbtestbed.server_node; print('lbtestbed.api' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_overrides_as_a_mapping_are_the_command_lines() -> None:
    """A mapping of Python values means what the same --set strings mean."""
    spec = ROOT / "examples" / "scheme1_fig3.toml"
    values = {"policy.d": [1, 3], "workload.load": 0.5, "policy.name": "scheme2", "run.batches": 4}
    strings = ["policy.d=[1, 3]", "workload.load=0.5", "policy.name=scheme2", "run.batches=4"]
    assert api.load(spec, values) == api.load(spec, strings)
    assert api.toml_value({"kind": "xlog", "r": 6.0}) == '{kind = "xlog", r = 6.0}'
    assert api.toml_value('say "hi"') == '"say \\"hi\\""'


def test_without_pandas_the_frames_say_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas fails as where it is not installed
    result = api.simulate(api.load(ROOT / "examples" / "jiq.toml", {"run.duration": 20, "run.batches": 4}))
    with pytest.raises(ImportError, match="pip install pandas"):
        api.batch_frame(result)


def test_a_batch_frame_holds_the_batch_values() -> None:
    """Its rows are the batches, its values those the result carries (lbt simulate --json's batch_values),
    and the pooled estimate lies within the batches' range."""
    exp = api.load(ROOT / "examples" / "jiq.toml", {"run.duration": 100, "run.batches": 5})
    result = api.simulate(exp)
    frame = api.batch_frame(result)
    assert list(frame.index) == [0, 1, 2, 3, 4]
    assert list(frame["mean_sojourn"]) == result.extras["batch_values"]["values"]["mean_sojourn"]
    assert (
        frame["mean_sojourn"].min() <= result.metrics["mean_sojourn"]["value"] <= frame["mean_sojourn"].max()
    )
    assert os.path.basename(str(result.context["spec"])) == "jiq.toml"
