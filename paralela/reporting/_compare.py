"""A comparison's run directory as a report section: leaderboards and score spread.

Reads ``compare.json`` (every candidate with its fold scores, written by
``paralela.compare``) into a section with the best candidate of each family, the overall
leaderboard and the failed candidates; :func:`scores_png` draws the distribution of the
candidates' mean scores per family (one box and the candidates as dots, the best starred),
which shows whether a family is better everywhere or only at its best setting.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.reporting._section import Section, Table, fmt_seconds, read_json

__all__ = ["LEADERBOARD", "load_compare", "scores_png"]

LEADERBOARD = 10  # candidates in the overall leaderboard table
_ORDER = {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2}


def load_compare(path: Path) -> Section:
    """The section of the comparison run directory at ``path``.

    ``section.source`` holds ``{family: [(mean score, ran every fold), ...]}``, one pair
    per scored candidate, for :func:`scores_png`.

    Raises:
        ConfigError: ``compare.json`` is unreadable or has no candidate list.
    """
    data = _read_record(path)
    candidates: list[dict[str, Any]] = sorted(data["candidates"], key=_rank)
    scoring = str(data.get("scoring") or "score")
    section = Section("compare", path, f"Compare: {path.name}")
    states: dict[str, int] = {}
    for c in candidates:
        states[str(c.get("state"))] = states.get(str(c.get("state")), 0) + 1
    families = list(dict.fromkeys(str(c.get("family")) for c in data["candidates"]))
    best = next((c for c in candidates if c.get("number") == data.get("best")), None)
    section.facts = _facts(path, data, scoring, families, states, best)
    section.notes.extend(str(n) for n in data.get("notes") or [])
    per_family = _best_per_family(candidates, families)
    section.tables.append(_best_of_each_family(scoring, candidates, per_family))
    section.tables.append(_leaderboard(scoring, candidates, states))
    failed = [c for c in candidates if c.get("state") == "FAIL"]
    if failed:
        section.tables.append(_failed_table(failed))
    scores = {
        family: [
            (float(c["mean"]), c.get("state") == "COMPLETE")
            for c in candidates
            if c.get("family") == family and _finite(c)
        ]
        for family in families
    }
    section.source = scores
    section.data = _summary(data, scoring, best, per_family, scores)
    return section


def _read_record(path: Path) -> dict[str, Any]:
    """``compare.json`` of the run directory ``path``, checked to hold a candidate list."""
    data = read_json(path / "compare.json", "record paralela compare writes")
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
        raise ConfigError(
            f"{path / 'compare.json'} has no candidate list; it was not written by "
            "paralela compare. Run the comparison again with this run directory."
        )
    return data


def _facts(
    path: Path,
    data: dict[str, Any],
    scoring: str,
    families: list[str],
    states: dict[str, int],
    best: dict[str, Any] | None,
) -> list[tuple[str, str]]:
    """The section's facts: scoring, folds, families, candidates, slots, time, best."""
    facts = [
        ("scoring", f"{scoring} (higher is better)"),
        ("folds", str(data.get("cv", "?"))),
        ("families", ", ".join(families) or "-"),
        (
            "candidates",
            ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())) or "0",
        ),
        ("slots", str(data.get("slots", "?"))),
        ("wall time", fmt_seconds(float(data.get("wall_seconds") or 0.0))),
    ]
    if best is not None:
        facts.append(("best", f"#{best.get('number')} {best.get('family')}: {_score(best)}"))
        refit = (path / "best.pkl").is_file()
        facts.append(("best model", str(path / "best.pkl") if refit else "not refit (refit=False)"))
    return facts


def _best_of_each_family(
    scoring: str, candidates: list[dict[str, Any]], per_family: dict[str, dict[str, Any]]
) -> Table:
    return Table(
        "Best of each family",
        ["family", "candidate", f"{scoring} mean ± std", "fit time", "scored", "params"],
        [
            [
                family,
                f"#{c.get('number')}",
                _score(c),
                fmt_seconds(c.get("fit_seconds")),
                str(sum(1 for d in candidates if d.get("family") == family and _finite(d))),
                _params(c.get("params")),
            ]
            for family, c in per_family.items()
        ],
        "Mean ± standard deviation of the score over the folds; fit time is per fold; "
        "'scored' counts the family's candidates with a score (complete or pruned).",
    )


def _leaderboard(scoring: str, candidates: list[dict[str, Any]], states: dict[str, int]) -> Table:
    """The ``LEADERBOARD`` best candidates that ran every fold (``candidates`` is ranked)."""
    top = [c for c in candidates if c.get("state") == "COMPLETE"][:LEADERBOARD]
    return Table(
        "Leaderboard",
        ["", "candidate", "family", f"{scoring} mean ± std", "fit time", "params"],
        [
            [
                str(i + 1),
                f"#{c.get('number')}",
                str(c.get("family")),
                _score(c),
                fmt_seconds(c.get("fit_seconds")),
                _params(c.get("params")),
            ]
            for i, c in enumerate(top)
        ],
        f"The {len(top)} best of {states.get('COMPLETE', 0)} candidates that ran every "
        "fold, highest mean first."
        if top
        else "No candidate ran every fold.",
    )


def _failed_table(failed: list[dict[str, Any]]) -> Table:
    return Table(
        "Failed candidates",
        ["candidate", "family", "params", "error"],
        [
            [
                f"#{c.get('number')}",
                str(c.get("family")),
                _params(c.get("params")),
                _last_line(c.get("error")),
            ]
            for c in failed[:20]
        ],
        f"{len(failed)} failed" + (" (first 20 shown)" if len(failed) > 20 else ""),
    )


def _summary(
    data: dict[str, Any],
    scoring: str,
    best: dict[str, Any] | None,
    per_family: dict[str, dict[str, Any]],
    scores: dict[str, list[tuple[float, bool]]],
) -> dict[str, Any]:
    """``section.data``: the comparison in a few numbers, for ``report.json``."""
    return {
        "scoring": scoring,
        "cv": data.get("cv"),
        "best": None
        if best is None
        else {k: best.get(k) for k in ("number", "family", "params", "mean", "std")},
        "families": {
            family: {
                "best": c.get("number"),
                "mean": c.get("mean"),
                "std": c.get("std"),
                "candidates": len(scores[family]),
            }
            for family, c in per_family.items()
        },
        "wall_seconds": data.get("wall_seconds"),
        "slots": data.get("slots"),
    }


def scores_png(section: Section) -> bytes:
    """Each family's candidates' mean scores: a box over them, each candidate a dot
    (hollow when it was stopped before its last fold), the family's best complete
    candidate a star (orange for the best overall). Needs matplotlib (ImportError)."""
    from paralela.reporting._charts import COLORS, _png, load_matplotlib

    new_figure = load_matplotlib()
    scores: dict[str, list[tuple[float, bool]]] = section.source or {}
    families = [f for f, scored in scores.items() if scored]
    fig = new_figure(3.6)
    ax = fig.add_subplot(1, 1, 1)
    if not families:
        ax.text(0.5, 0.5, "No candidate has a score", ha="center", va="center")
        ax.set_axis_off()
        return _png(fig)
    data = [[mean for mean, _ in scores[f]] for f in families]
    # families along x (the default orientation: its keyword changed in matplotlib 3.10)
    ax.boxplot(data, widths=0.5, showfliers=False, medianprops={"color": "#333333"})
    complete = [mean for f in families for mean, whole in scores[f] if whole]
    best = max(complete) if complete else None
    for column, family in enumerate(families, 1):
        for i, (mean, whole) in enumerate(scores[family]):
            # spread the dots across the box so that equal scores stay visible
            x = column + ((i * 0.618) % 1.0 - 0.5) * 0.3
            ax.scatter(
                [x],
                [mean],
                s=16,
                color=COLORS["ok"] if whole else "none",
                edgecolors=COLORS["ok"] if whole else COLORS["pruned"],
                alpha=0.8,
                zorder=3,
            )
        whole_means = [mean for mean, whole in scores[family] if whole]
        if whole_means:
            top = max(whole_means)
            ax.scatter(
                [column],
                [top],
                marker="*",
                s=160,
                color=COLORS["straggler"] if top == best else COLORS["ok"],
                edgecolors="black",
                linewidths=0.5,
                zorder=4,
            )
    ax.set_xticks(range(1, len(families) + 1))
    ax.set_xticklabels(
        [f"{f}\n({len(scores[f])})" for f in families],
        rotation=30 if len(families) > 8 else 0,
    )
    scoring = str(section.data.get("scoring") or "score")
    ax.set_ylabel(f"mean {scoring} over folds")
    ax.set_title("Score distribution per family (higher is better; candidates in brackets)")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _rank(c: dict[str, Any]) -> tuple[int, float, int]:
    mean = float(c["mean"]) if _finite(c) else -math.inf
    return (_ORDER.get(str(c.get("state")), 3), -mean, int(c.get("number") or 0))


def _best_per_family(
    candidates: list[dict[str, Any]], families: list[str]
) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for c in candidates:  # ranked: the first of each family is its best
        best.setdefault(str(c.get("family")), c)
    return {f: best[f] for f in families if f in best}


def _finite(c: dict[str, Any]) -> bool:
    value = c.get("mean")
    return isinstance(value, int | float) and math.isfinite(value)


def _score(c: dict[str, Any]) -> str:
    if not _finite(c):
        return "-" if c.get("state") != "FAIL" else "failed"
    std = c.get("std")
    spread = f" ± {std:.3g}" if isinstance(std, int | float) and math.isfinite(std) else ""
    return f"{float(c['mean']):.4g}{spread}"


def _params(params: Any) -> str:
    if not params:
        return "(defaults)"
    return json.dumps(params, sort_keys=True, default=str)


def _last_line(text: Any) -> str:
    line = str(text or "").strip().splitlines()[-1:] or ["-"]
    return line[0][:200]
