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

# the renderers by topic; goal, numpy_name, seed_gaps, selection_entry and within_25pct are
# also benchmarks/headlines.py's and the tests' (__all__)
from .allreduce import (FIG3_ROWS, allreduce_shm, dense_allreduce_shm, oktopk_volume,
    sparcml_fig3, sparse_allreduce_host)
from .common import RESULTS, ROOT, Table, begin_marker, end_marker, selection_entry
from .convergence import (CONV_P8_RECORDS, convergence_600, convergence_lm_p8, convergence_p4,
    seed_gaps, shared_support_cnn)
from .gpu_campaign import (GPU_SELECTION, GPU_STEP_LM, GPU_STEP_MLP, HOST_CAMPAIGN, gpu_step_lm,
    gpu_step_mlp, host_campaign, selection_gpu)
from .grouping import (GROUPING_RECORDS, TIMELINES, calibration_stability, grouping_goals,
    grouping_models, grouping_p2, grouping_timelines)
from .hash_partition import HASH_BALANCE, HASH_HOST, OKTOPK_HASH, hash_balance, hash_host, oktopk_hash
from .local_work import (adam_fused, adam_pass_time, numpy_name, update_profile_adam,
    update_profile_cpu)
from .outer_step import (OUTER_H5, OUTER_MAIN, OUTER_SWEEP, outer_fastest, outer_goals, outer_h5,
    outer_intro, outer_modes, outer_sweep, outer_times)
from .robustness import fuzz_runs, reliability, watchdog_cost
from .selection import compression_cpu, selection_cpu, selection_reuse
from .sharded import SHARDED_PS, goal, sharded_state, sharded_state_goals
from .step_time import STEP_RECORDS, step_algorithms, step_matrix, step_summary, within_25pct
from .time_to_accuracy import tta_cnn, tta_lm

__all__ = ["RESULTS", "ROOT", "TABLES", "Table", "begin_marker", "block_of", "end_marker", "goal",
           "main", "numpy_name", "render", "replace", "seed_gaps", "selection_entry",
           "within_25pct", "write_all"]

TABLES: tuple[Table, ...] = (
    Table("selection_cpu", "benchmarks/README.md", ("selection_cpu.json",), selection_cpu),
    Table("selection_cpu_reuse", "benchmarks/README.md", ("selection_cpu.json",), selection_reuse),
    Table("compression_cpu", "benchmarks/README.md", ("compression_cpu.json",), compression_cpu),
    Table("allreduce_shm", "benchmarks/README.md", ("allreduce_shm.json",), allreduce_shm),
    Table("oktopk_volume", "benchmarks/README.md", ("oktopk_volume.json",), oktopk_volume),
    *(Table(f"convergence_{m}_p4", "benchmarks/README.md",
            (f"convergence_{m}.json", f"convergence_{m}_seeds.json"), convergence_p4(m))
      for m in ("cnn", "lm")),
    Table("convergence_lm_p8", "benchmarks/README.md", CONV_P8_RECORDS, convergence_lm_p8),
    Table("shared_support_cnn", "docs/topics/shared_support.md",
          ("convergence_cnn_shared_support.json", "convergence_cnn.json"), shared_support_cnn),
    *(Table(f"convergence_lm_600_p{P}", "benchmarks/README.md", (n,), convergence_600(n))
      for P, n in ((4, "convergence_lm_steps600.json"), (8, "convergence_lm_steps600_meanv_P8.json"))),
    Table("grouping_timelines", "benchmarks/README.md", TIMELINES, grouping_timelines),
    Table("selection_gpu", "docs/topics/gpu_campaign.md", (GPU_SELECTION,), selection_gpu),
    Table("gpu_step_lm", "docs/topics/gpu_campaign.md", (GPU_STEP_LM,), gpu_step_lm),
    Table("gpu_step_mlp", "docs/topics/gpu_campaign.md", GPU_STEP_MLP, gpu_step_mlp),
    Table("host_campaign", "docs/topics/gpu_campaign.md", HOST_CAMPAIGN, host_campaign),
    Table("hash_balance", "docs/topics/wire_formats.md", (HASH_BALANCE,), hash_balance),
    Table("hash_host", "docs/topics/wire_formats.md", (HASH_HOST,), hash_host),
    Table("oktopk_hash", "docs/topics/wire_formats.md", OKTOPK_HASH, oktopk_hash),
    Table("outer_step_sweep", "docs/topics/slow_links.md", (OUTER_SWEEP,), outer_sweep),
    Table("outer_step_intro", "docs/topics/slow_links.md", OUTER_MAIN, outer_intro),
    Table("outer_step_modes", "docs/topics/slow_links.md", OUTER_MAIN, outer_modes),
    Table("outer_step_times", "docs/topics/slow_links.md", OUTER_MAIN, outer_times),
    Table("outer_step_goals", "docs/topics/slow_links.md", OUTER_MAIN, outer_goals),
    Table("outer_step_h5", "docs/topics/slow_links.md", OUTER_MAIN + OUTER_H5, outer_h5),
    Table("outer_step_fastest", "docs/topics/slow_links.md", OUTER_MAIN + OUTER_H5, outer_fastest),
    Table("reliability", "docs/topics/reliability.md", ("reliability.json",), reliability),
    Table("watchdog_cost", "docs/topics/reliability.md", ("watchdog_cpu.json",), watchdog_cost),
    Table("update_profile_cpu", "benchmarks/README.md", ("update_profile_cpu.json",),
          update_profile_cpu),
    Table("adam_fused_lm", "docs/topics/adam_direction.md", ("adam_fused_lm.json",), adam_fused),
    Table("fuzz_runs", "docs/topics/test_suite.md", ("fuzz_runs.json",), fuzz_runs),
    Table("dense_allreduce_shm", "docs/topics/dense_sync.md", ("dense_allreduce_shm.json",),
          dense_allreduce_shm),
    Table("sparse_allreduce_host", "docs/performance.md", ("sparse_allreduce_host_shm.json",),
          sparse_allreduce_host),
    Table("calibration_stability", "docs/topics/scheduling.md",
          ("calibration_stability_200mbit_p2.json",), calibration_stability),
    Table("adam_pass_time", "docs/topics/adam_direction.md", ("adam_pass_time.json",),
          adam_pass_time),
    Table("update_profile_adam", "benchmarks/README.md", ("update_profile_adam.json",),
          update_profile_adam),
    Table("sparcml_fig3", "benchmarks/README.md",
          tuple(dict.fromkeys(r for _, r in FIG3_ROWS)), sparcml_fig3),
    Table("step_time_matrix", "benchmarks/README.md", STEP_RECORDS, step_matrix),
    Table("step_time_algorithms", "benchmarks/README.md", STEP_RECORDS, step_algorithms),
    Table("step_time_summary", "benchmarks/README.md", STEP_RECORDS, step_summary),
    *(Table(f"time_to_accuracy_lm_p{P}", "docs/topics/time_to_accuracy.md",
            (f"time_to_accuracy_lm_1gbit_p{P}.json", f"time_to_accuracy_lm_200mbit_p{P}.json"),
            tta_lm(P)) for P in (2, 4)),
    *(Table(f"time_to_accuracy_cnn_p{P}", "docs/topics/time_to_accuracy.md",
            (f"time_to_accuracy_cnn_1gbit_p{P}.json", f"time_to_accuracy_cnn_200mbit_p{P}.json"),
            tta_cnn(P)) for P in (4, 2)),
    Table("grouping_1gbit_p4", "benchmarks/README.md", ("grouping_1gbit_p4.json",),
          grouping_models("grouping_1gbit_p4.json")),
    Table("grouping_p2", "docs/topics/scheduling.md", GROUPING_RECORDS, grouping_p2),
    Table("grouping_p2_goals", "docs/topics/scheduling.md", GROUPING_RECORDS, grouping_goals),
    Table("sharded_state_goals", "docs/topics/sharded_state.md",
          tuple(f"sharded_state_p{P}.json" for P in SHARDED_PS), sharded_state_goals),
    *(Table(f"sharded_state_p{P}", "docs/topics/sharded_state.md", (f"sharded_state_p{P}.json",),
            sharded_state(P)) for P in SHARDED_PS),
)


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
