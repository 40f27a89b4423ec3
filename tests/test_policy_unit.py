"""A policy is one unit (docs/design.md, principle 8; docs/contributing.md, "A policy").

The claim is structural: adding a policy is adding its module of ``lbtestbed/policies/``, nothing else in the
package. So the test does just that to a private copy of the package: it writes one new module (a real, if
small, policy: the nodes in turn, in reverse order) and nothing else, and in a fresh interpreter on that copy
the policy reads from a spec, simulates, gets its message count and theory notes, and appears in the
protocol's tables and the spec's JSON Schema. It also checks that no module outside the library (and the
theory, where a formula belongs to a named policy) compares a policy's name or names SLTA or Prequal.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
"""Round-robin in reverse: the nodes in turn, from the highest id down (a test's policy)."""

from __future__ import annotations

from dataclasses import dataclass

from lbtestbed.model.experiment import PolicyParams
from lbtestbed.policies.base import DispatcherSide, Route
from lbtestbed.policies.unit import Policy


@dataclass(frozen=True)
class ReverseParams(PolicyParams):
    name: str = "reverse_round_robin"


class ReverseDispatcher(DispatcherSide):
    name = "reverse_round_robin"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._next = self.n - 1

    def dispatch(self) -> Route:
        k = self._next
        while k in self.live.down:
            k = k - 1 if k > 0 else self.n - 1
        self._next = k - 1 if k > 0 else self.n - 1
        return Route(k, "reverse")


class Reverse(Policy):
    name = "reverse_round_robin"
    summary = "the nodes in turn, from the highest id down"
    params = ReverseParams
    dispatcher = ReverseDispatcher


POLICIES = (Reverse(),)
'''

CHECK = r"""
import json
from lbtestbed.spec import parse_spec
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.theory.predict import predict
from lbtestbed.spec import spec_schema
from lbtestbed.policies import DISPATCHERS, MESSAGE_KINDS, policy_of
exp = parse_spec({
    "name": "reverse", "seed": 1,
    "classes": [{"name": "q", "count": 4, "discipline": "fcfs"}],
    "workload": {"load": 0.5},
    "policy": {"name": "reverse_round_robin"},
    "run": {"duration": 200.0, "batches": 10},
})
raw = simulate_once(exp, 0)
result = summarize(exp, [raw])
schema = json.dumps(spec_schema())
print(json.dumps({
    "decisions": raw.decisions,
    "messages": result.metrics["messages_per_task"]["value"],
    "predicted_messages": predict(exp).metrics["messages_per_task"]["value"],
    "in_tables": "reverse_round_robin" in DISPATCHERS and MESSAGE_KINDS["reverse_round_robin"] == (),
    "in_schema": "reverse_round_robin" in schema,
    "summary": policy_of(exp).summary,
}))
"""


def test_a_new_policy_is_its_module_and_nothing_else(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "lbtestbed", copy / "lbtestbed", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "lbtestbed" / "policies" / "reverse.py").write_text(MODULE)
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CHECK],
        cwd=copy,
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["decisions"]) == {"reverse"} and sum(out["decisions"].values()) > 50
    assert out["messages"] == 0.0 and out["predicted_messages"] == 0.0  # the default cost: none sent
    assert out["in_tables"] and out["in_schema"]
    assert out["summary"] == "the nodes in turn, from the highest id down"


#: policy names as a module outside the library might compare them
NAMES = (
    r"(random|round_robin|jsq|power_of_d|power_of_d_memory|least_request|jiq|jlmu|slta|scheme1|scheme2|"
    r"peak_ewma|prequal)"
)
COMPARED = re.compile(
    rf"""policy\.name\s*(==|!=|in\b)|\bname\s*(==|!=)\s*["']{NAMES}["']|["']{NAMES}["']\s*(==|!=)|"""
    rf"""\bin\s*[(\[{{]["']{NAMES}["']"""
)


def test_no_module_outside_the_library_compares_a_policy_name_or_names_slta_or_prequal() -> None:
    outside = [
        p for p in (ROOT / "lbtestbed").rglob("*.py") if "policies" not in p.parts and "theory" not in p.parts
    ]
    compared = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in outside
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if COMPARED.search(line)
    ]
    assert compared == []
    named = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in outside
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\b(SLTA|Prequal)\b", line)
    ]
    assert named == []
