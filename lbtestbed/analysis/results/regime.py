"""What a theory value is: exact at the spec's n, a finite-n approximation with a known error order, or a
limit (docs/theory.md, "Regimes: what each value is").

Every theory metric carries ``regime``. A value set without one gets it from its note's ``assumes``: any
assumption that names a limit (n -> infinity, mean field, Halfin-Whitt, heavy traffic) or an approximation
makes it a ``limit``; none makes it ``exact``. ``lbt run`` counts ``exact`` and ``finite_n`` values in its
verdict (within their stated error) and shows ``limit`` values for information, with their finite-n gap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

EXACT, FINITE_N, LIMIT = "exact", "finite_n", "limit"
REGIMES = (EXACT, FINITE_N, LIMIT)

#: words in an ``assumes`` entry that make a value a limit (or an approximation exact in no limit)
LIMIT_WORDS = (
    "infinity",
    "large n",
    "mean-field",
    "mean field",
    "heavy traffic",
    "halfin",
    "diffusion",
    "approximation",
)


def regime_of(assumes: Iterable[str]) -> str:
    """``limit`` when some assumption is a limit or an approximation, else ``exact``."""
    text = " ".join(assumes).lower()
    return LIMIT if any(w in text for w in LIMIT_WORDS) else EXACT


def counts(regime: str | None) -> bool:
    """Whether a value of this regime may decide a verdict."""
    return regime in (EXACT, FINITE_N)


def metric_regime(metric: dict[str, Any], notes: Iterable[dict[str, Any]], name: str) -> str | None:
    """The regime of a theory metric: its own field, else the one its note's ``assumes`` implies (results
    made by hand or by an older lbtestbed carry notes only); None when neither says."""
    if metric.get("regime") in REGIMES:
        return str(metric["regime"])
    for note in notes:
        if note.get("metric") == name and "assumes" in note:
            return regime_of(note["assumes"])
    return None


GAP_SIGNS = {"estimate": "~", "at least": ">=", "at most": "<="}


def describe(metric: dict[str, Any], with_limit: bool = True) -> str:
    """What a theory value is, in a few words: its regime, its error (and order) or its finite-n gap, and
    the limit a finite-n value replaced, e.g. ``finite_n +-0.00056 O(1/n^2), limit 2.614``."""
    regime = metric.get("regime")
    if regime is None or metric.get("value") is None:
        return ""
    words = [str(regime)]
    if metric.get("error"):  # an error of 0 is no error: nothing to add
        words.append(f"+-{metric['error']:.2g}")
    if metric.get("error_order"):
        words.append(str(metric["error_order"]))
    text = " ".join(words)
    if with_limit and metric.get("limit") is not None:
        text += f", limit {metric['limit']:.6g}"
    gap = metric.get("gap")
    if gap:
        text += f", gap {GAP_SIGNS.get(gap['kind'], '~')} {gap['value']:+.3g}"
    return text
