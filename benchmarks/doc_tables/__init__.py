"""The documentation's result tables, written from their records.

Each table is a named :class:`Table`: the page it lives on, the records it reads, and a
function from those records to Markdown. On the page it lies between two markers,

    <!-- table:NAME (written by benchmarks/doc_tables from its records; do not edit) -->
    ...
    <!-- table:NAME:end -->

so that a number in it cannot differ from its record: ``tests/test_doc_tables.py``
renders every table and compares it with the page. After re-measuring a record:

    python -m benchmarks.doc_tables            # rewrite every table from the records
    python -m benchmarks.doc_tables --check    # exit 1 if a page differs from its records

(``python -m benchmarks.headlines --write`` runs the first too.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import (allreduce, convergence, gpu_campaign, grouping, hash_partition, local_work,
    outer_step, robustness, selection, sharded, step_time, time_to_accuracy)
from .common import RESULTS, ROOT, Table, begin_marker, end_marker, selection_entry
# also benchmarks/headlines.py's and the tests' (__all__)
from .convergence import seed_gaps
from .local_work import numpy_name
from .sharded import goal
from .step_time import within_25pct

__all__ = ["RESULTS", "ROOT", "TABLES", "Table", "begin_marker", "block_of", "end_marker", "goal",
           "main", "numpy_name", "render", "replace", "seed_gaps", "selection_entry",
           "within_25pct", "write_all"]

# each topic's module keeps its tables beside their renderers; a new topic is one module
# here
TOPICS = (selection, allreduce, convergence, grouping, gpu_campaign, hash_partition, outer_step,
          robustness, local_work, step_time, time_to_accuracy, sharded)
TABLES: tuple[Table, ...] = tuple(t for topic in TOPICS for t in topic.TABLES)


def render(table: Table, results: Path = RESULTS, loaded: dict | None = None) -> str:
    """``table`` rendered from its records; ``loaded`` keeps the records read so far, so
    that tables sharing a record (the step-time ones, selection_cpu) read it once."""
    loaded = {} if loaded is None else loaded
    for n in table.records:
        if n not in loaded:
            loaded[n] = json.loads((results / n).read_text())
    return table.render({n: loaded[n] for n in table.records})


def block_of(text: str, name: str) -> str | None:
    """What lies between ``name``'s markers in ``text`` (None: no markers)."""
    begin, end = begin_marker(name), end_marker(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace(text: str, name: str, block: str) -> str:
    begin, end = begin_marker(name), end_marker(name)
    if block_of(text, name) is None:
        raise SystemExit(f"table {name}: its markers must appear once each: {begin} ... {end}")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}"


def write_all(root: Path = ROOT, results: Path = RESULTS, check: bool = False) -> list[str]:
    """Rewrite (or with ``check``, only compare) every table; the names that differed."""
    differ, pages, loaded = [], {}, {}
    for table in TABLES:
        path = root / table.page
        text = pages.setdefault(path, path.read_text())
        block = render(table, results, loaded)
        if block_of(text, table.name) != block:
            differ.append(table.name)
            pages[path] = replace(text, table.name, block)
    if not check:
        for path, text in pages.items():
            path.write_text(text)
    return differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs")
    args = ap.parse_args(argv)
    differ = write_all(check=args.check)
    verb = "differ from their records" if args.check else "rewritten"
    print(f"{len(differ)} of {len(TABLES)} tables {verb}: {', '.join(differ) or '-'}")
    return 1 if args.check and differ else 0
