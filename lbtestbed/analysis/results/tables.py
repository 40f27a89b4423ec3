"""Readable tables of result objects for the terminal."""

from __future__ import annotations

from typing import Any

from lbtestbed.analysis.results.regime import describe
from lbtestbed.analysis.results.result import METRICS, Result
from lbtestbed.analysis.results.text import Fit, paragraph, table
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import CATALOG


def _fmt(v: float | None, digits: int = 6) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


def _row(label: str, m: dict[str, Any], theory: bool = False) -> list[str]:
    if theory:  # a theory value has no interval: what it is takes the column (docs/theory.md, "Regimes")
        return [label, _fmt(m.get("value")), describe(m)]
    ci = m.get("ci95")
    return [label, _fmt(m.get("value")), "" if ci is None else f"± {_fmt(ci, 3)}"]


def _part(label: str, total: dict[str, Any], part: dict[str, Any], theory: bool) -> list[str]:
    if theory:
        return _row(
            label, {"value": part.get("value"), "regime": part.get("regime", total.get("regime"))}, True
        )
    return _row(label, part)


def render(result: Result, fit: Fit = Fit()) -> str:  # noqa: B008 (frozen)
    """The result as aligned text: headline metrics, messages by kind, occupancy tails, fitted to
    ``fit`` (the terminal's width)."""
    m = result.metrics
    theory = result.source == "theory"
    rows: list[list[str]] = [["metric", "value", "regime" if theory else "95% CI"]]
    for key in METRICS:
        if key != "occupancy_tail" and m[key].get("value") is not None:
            rows.append(_row(key, m[key], theory))
    # the parts of a total: a theory part has its total's regime (not its error), a measured one its interval
    variance = m["tasks_in_system"].get("variance", {})
    if variance.get("value") is not None:
        rows.append(_part("  variance of tasks in system", m["tasks_in_system"], variance, theory))
    by_class = m["mean_sojourn"].get("by_class", {})
    if len(by_class) > 1:
        for name, e in by_class.items():
            rows.append(_part(f"  mean_sojourn[{name}]", m["mean_sojourn"], e, theory))
    kind_ci = m["messages_per_task"].get("by_kind_ci95") or {}
    for kind, v in m["messages_per_task"].get("by_kind", {}).items():
        part = {"value": v, "ci95": kind_ci.get(kind)}
        rows.append(_part(f"  messages_per_task[{kind}]", m["messages_per_task"], part, theory))
    for learned in CATALOG.learned():
        fr = m.get(learned.name, {}).get("time_fraction")
        if fr:
            top = sorted(fr, key=lambda e: -e["fraction"])[:4]
            shares = ", ".join(f"{e['value']:g}: {e['fraction']:.3f}" for e in top)
            rows.append([f"  time at {learned.name}", shares, "share of time"])
    lines = [
        paragraph(
            f"{result.name}  policy={result.policy}  source={result.source}  n={result.context.get('n')}  "
            f"load={_fmt(result.context.get('load'), 4)}",
            fit,
        ),
        table(rows, fit, wrap=(rows[0][0], rows[0][2])),
        "",
        paragraph("occupancy tail: fraction of a class's nodes holding at least j tasks", fit),
    ]
    withheld = _withheld(result, "occupancy_tail")
    for name, tail in m["occupancy_tail"].items():
        cells = [f"{j}:{e['value']:.4f}" for j, e in enumerate(tail) if e["value"] is not None][1:]
        if not cells:  # say why rather than print nothing
            why = withheld.get(name) or withheld.get("") or "no value"
            lines.append(paragraph(f"{name:<10} none: {why}", fit, "  ", " " * 11))
            continue
        kind = f" ({tail[0]['regime']})" if theory and tail and tail[0].get("regime") else ""
        text = f"{name:<10} " + " ".join(cells[:16]) + (" ..." if len(cells) > 16 else "") + kind
        lines.append(paragraph(text, fit, "  ", " " * 11))
    decisions = result.extras.get("decisions")
    if decisions:
        total = sum(decisions.values())
        shares = ", ".join(f"{k} {v / total:.4f}" for k, v in sorted(decisions.items()))
        lines.append(paragraph(f"decisions: {shares}", fit))
    if result.extras.get("censored_tasks"):
        lines.append(
            paragraph(
                f"warning: {result.extras['censored_tasks']} measured tasks had not completed when the "
                "simulation stopped; their sojourn times are missing",
                fit,
            )
        )
    return "\n".join(lines)


def _withheld(result: Result, metric: str) -> dict[str, str]:
    """Why the theory left ``metric`` empty, by class name ("" for every class), from its notes."""
    out = {}
    for note in result.extras.get("notes", []):
        name = str(note.get("metric", ""))
        if "null" in note and (name == metric or name.startswith(f"{metric}[")):
            out[name[len(metric) :].strip("[]")] = str(note["null"])
    return out


def show(value: Any) -> str:
    """A bound's value as a reader wants it: numbers to 6 significant digits, mappings as key=value."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _fmt(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={show(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def render_notes(result: Result, fit: Fit = Fit()) -> str:  # noqa: B008 (frozen)
    """Bounds and the note behind every predicted (or withheld) metric, each wrapped to ``fit.width``
    with its continuation lines indented."""
    lines = []
    bounds = result.extras.get("bounds") or {}
    if bounds:
        lines.append("bounds:")
        for key, value in bounds.items():
            lines.append(paragraph(f"{key}: {show(value)}", fit, "  ", "    "))
    for warning in result.extras.get("warnings", []):
        lines.append(paragraph(f"warning: {warning}", fit))
    lines.append("notes:")
    for note in result.extras.get("notes", []):
        if "null" in note:
            lines.append(paragraph(f"{note['metric']}: null - {note['null']}", fit, "  ", "    "))
        else:
            assumes = f" [assumes: {'; '.join(note['assumes'])}]" if note.get("assumes") else ""
            regime = f" [{note['regime']}]" if note.get("regime") else ""
            text = f"{note['metric']}: {note['formula']} ({note['source']}){assumes}{regime}"
            lines.append(paragraph(text, fit, "  ", "    "))
            if note.get("limit"):
                limit = f"limit: {note['limit']['formula']} ({note['limit']['source']})"
                lines.append(paragraph(limit, fit, "    ", "    "))
    return "\n".join(lines)


def render_transient(exp: Experiment, result: Result, points: list[dict[str, float]]) -> str:
    """The fluid trajectory from empty and the warm-up check."""
    lines = [
        "JLMU fluid trajectory from an empty system:",
        f"  {'t':>8} {'mass s(t)':>10} {'U*(s(t))':>10} {'|q-q*|_1':>10}",
    ]
    for pt in points:
        lines.append(f"  {pt['t']:8.3f} {pt['mass']:10.4f} {pt['utility']:10.5f} {pt['distance']:10.5f}")
    need = result.extras["bounds"]["warmup_needed"]
    verdict = "enough" if exp.run.warmup >= need else "TOO SHORT"
    lines.append(
        f"warm-up: the spec discards {exp.run.warmup:g} model seconds; the fluid model needs {need:.3g} "
        f"({verdict})"
    )
    return "\n".join(lines)
