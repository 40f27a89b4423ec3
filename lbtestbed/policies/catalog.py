"""The catalog of policies: every ``POLICIES`` of the library's modules, found by walking the package.

Nothing lists the policies by hand: a module of ``lbtestbed/policies/`` that declares ``POLICIES`` (its
``unit.Policy`` instances) is in the catalog, so adding a policy is adding its module (docs/contributing.md).
The catalog is the ``PolicyLibrary`` the spec reader asks for a policy's parameters, and the one place the
house asks what a named policy declares (``policy_of``).
"""

from __future__ import annotations

import importlib
import pkgutil
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from lbtestbed.model.experiment import Experiment, PolicyParams
from lbtestbed.policies.base import DispatcherSide, NodeSide
from lbtestbed.policies.unit import Learned, Policy, Quantity


class Catalog:
    """Every policy of the library, by name (and alias)."""

    def __init__(self, policies: Sequence[Policy]) -> None:
        self.policies = sorted(policies, key=lambda p: p.name)
        self._by_name: dict[str, Policy] = {}
        for p in self.policies:
            for name in (p.name, *p.aliases):
                if name in self._by_name:
                    raise ValueError(f"two policies are called {name!r}: {self._by_name[name]!r} and {p!r}")
                self._by_name[name] = p

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def __getitem__(self, name: str) -> Policy:
        return self._by_name[name]

    # ------------------------------------------------------------------------------ PolicyLibrary

    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.policies) + tuple(a for p in self.policies for a in p.aliases)

    def params(self, name: str) -> type[PolicyParams]:
        return self._by_name[name].params

    def canonical(self, name: str) -> str:
        return self._by_name[name].name

    # ---------------------------------------------------------------------------- what they share

    def learned(self) -> tuple[Learned, ...]:
        """Every quantity some policy learns, in name order (each a metric of every result)."""
        return tuple(p.learned for p in self.policies if p.learned is not None)

    def quantities(self) -> dict[str, Quantity]:
        """Every quantity some policy exports, by name (one metric family of the dispatchers'); two
        policies that export the same name declare the same quantity."""
        out: dict[str, Quantity] = {}
        for p in self.policies:
            for q in p.exported:
                if out.setdefault(q.name, q) != q:
                    raise ValueError(f"two policies export {q.name!r} differently: {out[q.name]} and {q}")
        return out

    def message_id(self) -> dict[str, tuple[int, ...]]:
        """Per message kind, the positions of its data that name the event which made it."""
        out: dict[str, tuple[int, ...]] = {}
        for p in self.policies:
            for kind, ids in p.message_id.items():
                if out.setdefault(kind, ids) != ids:
                    raise ValueError(f"two policies name {kind!r} messages by different data")
        return out


def _discover() -> Catalog:
    """Every ``POLICIES`` of the modules beside this one (read from the directory, so that the catalog
    does not import its own package)."""
    package = __name__.rpartition(".")[0]
    found: list[Policy] = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        module = importlib.import_module(f"{package}.{info.name}")
        found.extend(getattr(module, "POLICIES", ()))
    return Catalog(found)


CATALOG = _discover()


def policy_of(exp: Experiment) -> Policy:
    """What the experiment's policy declares."""
    return CATALOG[exp.policy.name]


def make_dispatcher(
    exp: Experiment, rng: random.Random, index: int = 0, dispatchers: int = 1
) -> DispatcherSide:
    """The dispatcher side of the spec's policy; ``index`` of ``dispatchers`` running side by side."""
    return policy_of(exp).make_dispatcher(exp, rng, index, dispatchers)


def make_node_sides(
    exp: Experiment,
    rng: random.Random,
    nodes: Sequence[int] | None = None,
    dispatchers: int = 1,
    replication: int = 0,
) -> list[NodeSide]:
    """The node sides of the spec's policy for ``nodes`` (all by default); they share derived tables."""
    nodes = range(exp.n) if nodes is None else nodes
    return policy_of(exp).make_node_sides(exp, rng, nodes, dispatchers, replication)
