"""What every table shares: the :class:`Table`, its markers, and the formatting helpers."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parents[1]  # benchmarks/
ROOT = HERE.parent
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Table:
    name: str
    page: str  # relative to the repository root
    records: tuple[str, ...]  # file names in benchmarks/results/
    render: Callable[[dict], str]  # {record name: its JSON} -> Markdown


def begin_marker(name: str) -> str:
    return f"<!-- table:{name} (written by benchmarks/doc_tables from its records; do not edit) -->"


def end_marker(name: str) -> str:
    return f"<!-- table:{name}:end -->"


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fill(text: str, width: int = 90, bullet: str = "") -> str:
    """Prose wrapped as the pages wrap it (never inside a hyphenated word, nor between a
    number and its ``%``); ``bullet`` (``"* "``, ``"- "``) makes it a list item."""
    return textwrap.fill(text.replace(" %", "\0%"), width, initial_indent=bullet,
                         subsequent_indent=" " * len(bullet),
                         break_on_hyphens=False).replace("\0", " ")


def ranks_phrase(P: int, cores: int) -> str:
    return "a core per rank" if P <= cores else f"{P} ranks on {cores} cores"


def md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def span(values, fmt_: str = ".2f", unit: str = "") -> str:
    """``lo-hi`` of values (one value when they round alike)."""
    lo, hi = format(min(values), fmt_), format(max(values), fmt_)
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def ceil2(x: float, digits: int = 2) -> str:
    """``x`` rounded up to ``digits`` decimals: the bound an "at most" or "within" states."""
    scale = 10 ** digits
    return f"{math.ceil(x * scale - 1e-9) / scale:.{digits}f}"


M = 1 << 20


def selection_entry(records: list[dict], method: str, n: int, density=None) -> dict | None:
    """A selection.py record's entry of ``method`` at N (and density, where given), or None:
    the one lookup that the tables here and ``headlines.kernel_times`` share."""
    for r in records:
        if r["method"] == method and r["N"] == n and (
                density is None or abs(r.get("density", float("nan")) - density) < 1e-9):
            return r
    return None


def short_commit(data: dict) -> str:
    commit = data["machine"].get("commit") or "?"
    return commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")


def pct(density: float) -> str:
    return f"{100 * density:g} %"


def size_label(n: int) -> str:
    return f"{n / M:g}M"


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def trained_at(data: dict) -> str:
    """``at <commits>`` of the runs a training record joins (``trained_at``: run -> commit)."""
    commits = sorted({c[:7] for c in (data.get("trained_at") or {}).values() if c})
    return f"at {', '.join(commits)}" if commits else "at commits not recorded"


def measured_at(data: dict) -> str:
    commit = (data.get("machine") or {}).get("commit")
    return f"at {commit[:7]}" if commit else "before records named their commit"
