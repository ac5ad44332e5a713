"""Every benchmark script is run by some test: a script added without a smoke run fails here.

``RUN_BY`` names, for each ``benchmarks/*.py`` (not ``_harness.py``, ``__init__.py`` or
``benchmarks/step_timing/``), the test that runs it (``file::function``). The check: every
script has an entry, no entry names a script that is gone, the named test function is
defined in that file, and that file's code (not its comments or docstrings) names the
script. The self-checks run the same check on doctored inputs, so it can fail.
"""

import ast
import functools
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
BENCHMARKS = ROOT / "benchmarks"

SMOKE = "test_benchmark_smoke.py"
RUN_BY = {
    "adam_fused.py": f"{SMOKE}::test_adam_fused_smoke",
    "adam_pass_time.py": f"{SMOKE}::test_adam_pass_time_smoke",
    "allreduce.py": f"{SMOKE}::test_allreduce_sweep_smoke",
    "asc_wfbp_models.py": "test_asc_wfbp_table4.py::test_bert_cells",
    "asc_wfbp_table4.py": "test_asc_wfbp_table4.py::test_bert_cells",
    "blocked_on_cost.py": f"{SMOKE}::test_blocked_on_cost_smoke",
    "calibration_stability.py": f"{SMOKE}::test_calibration_stability_smoke",
    "compression.py": f"{SMOKE}::test_compression_smoke",
    "convergence.py": "test_convergence_examples.py::test_convergence_plot_has_a_gap_to_dense_panel",
    "dense_allreduce.py": f"{SMOKE}::test_dense_allreduce_smoke",
    "emulated_network.py": "test_emulated_network.py::test_sparse_allreduce_over_emulated_network",
    "faults.py": "test_fault_injection.py::test_the_benchmark_counts_a_wrong_digest_and_replicas_that_differ",
    "gpu_step.py": "test_gpu_campaign.py::test_sparse_step_records_identical_replicas_and_ratios",
    "grouping.py": "test_gpu_campaign.py::test_every_step_ran_and_succeeded",
    "grouping_projection.py": "test_asc_wfbp_table4.py::test_projection_of_our_lm",
    "headlines.py": "test_headlines.py::test_quick_runs_two_entries_and_checks_their_commands",
    "hash_partition_balance.py": "test_hash_partition_balance.py::test_counts_are_exact_and_hash_is_balanced_where_ranges_are_not",
    "hash_partition_time.py": f"{SMOKE}::test_hash_partition_time_smoke",
    "index_encoding_sizes.py": f"{SMOKE}::test_index_encoding_sizes_smoke",
    "long_run.py": "test_long_run_benchmark.py::test_long_run_smoke",
    "oktopk_threshold_drift.py": f"{SMOKE}::test_oktopk_threshold_drift_smoke",
    "oktopk_volume.py": f"{SMOKE}::test_oktopk_volume_sweep_smoke",
    "outer_step.py": "test_outer_step_benchmark.py::test_join_only_smoke",
    "remeasure.py": "test_remeasure.py::test_the_dry_run_plans_the_real_stale_list",
    "second_moment_bias.py": f"{SMOKE}::test_second_moment_bias_smoke",
    "selection.py": "test_selection_benchmark.py::test_every_kernel_is_checked_and_timed_on_a_small_input",
    "shard_map_bench.py": f"{SMOKE}::test_shard_map_bench_smoke",
    "shard_map_example.py": f"{SMOKE}::test_shard_map_example_smoke",
    "sharded_state.py": f"{SMOKE}::test_sharded_state_smoke",
    "shared_support_time.py": f"{SMOKE}::test_shared_support_time_smoke",
    "sparcml_fig3.py": f"{SMOKE}::test_sparcml_fig3_smoke",
    "sparse_allreduce_host.py": "test_sparse_allreduce_host_benchmark.py::test_sparse_allreduce_host_smoke",
    "step_local_work.py": "test_step_local_work.py::test_adam_direction_topk_step_writes_no_extra_n_entry_buffer",
    "step_time.py": "test_gpu_campaign.py::test_host_steps_bind_each_rank_and_predict",
    "time_to_accuracy.py": "test_time_to_accuracy.py::test_worker_times_every_phase_of_the_trained_step",
    "update_profile.py": f"{SMOKE}::test_update_profile_smoke",
    "warmup_wire_stages.py": f"{SMOKE}::test_warmup_wire_stages_smoke",
    "watchdog.py": f"{SMOKE}::test_watchdog_benchmark_smoke",
    "wire_codec_time.py": f"{SMOKE}::test_wire_codec_time_smoke",
    "wire_formats.py": f"{SMOKE}::test_wire_formats_smoke",
}


def benchmark_scripts() -> list[str]:
    """``benchmarks/*.py`` less the shared harness and the package marker (not step_timing/)."""
    return sorted(p.name for p in BENCHMARKS.glob("*.py")
                  if p.name not in ("_harness.py", "__init__.py"))


@functools.lru_cache(maxsize=None)
def code_text(path: Path) -> str:
    """The file's source without comments and docstrings: what a test does, not says."""
    source = path.read_text()
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add((body[0].lineno, body[0].col_offset))
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING and tok.start in docstrings:
            continue
        kept.append(tok.string)
    return " ".join(kept)


@functools.lru_cache(maxsize=None)
def defined_tests(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def uncovered(scripts: list[str], run_by: dict[str, str], tests: Path = TESTS) -> list[str]:
    """One line per problem: a script no entry covers, an entry for no script, a named test
    that is not defined, a test file whose code never names its script."""
    problems = [f"{s}: no test runs it (add a smoke run to tests/{SMOKE} and an entry "
                "to RUN_BY)" for s in scripts if s not in run_by]
    problems += [f"{s}: in RUN_BY but not in benchmarks/" for s in run_by if s not in scripts]
    for s in scripts:
        if s not in run_by:
            continue
        file, _, func = run_by[s].partition("::")
        path = tests / file
        if not path.exists():
            problems.append(f"{s}: {run_by[s]}: no file tests/{file}")
            continue
        if func not in defined_tests(path):
            problems.append(f"{s}: {run_by[s]}: no test function {func} in tests/{file}")
        if Path(s).stem not in code_text(path):
            problems.append(f"{s}: {run_by[s]}: tests/{file} never names {s}")
    return problems


def test_every_benchmark_script_is_run_by_a_test():
    scripts = benchmark_scripts()
    assert len(scripts) >= len(RUN_BY) - 1 and "allreduce.py" in scripts, scripts
    problems = uncovered(scripts, RUN_BY)
    assert not problems, "\n".join(problems)


def test_the_coverage_check_can_fail():
    scripts = benchmark_scripts()
    # a script added without a smoke run is named
    assert uncovered([*scripts, "new_benchmark.py"], RUN_BY) == [
        f"new_benchmark.py: no test runs it (add a smoke run to tests/{SMOKE} and an entry "
        "to RUN_BY)"]
    # a removed smoke test, a test file that does not run the script, a stale entry
    doctored = dict(RUN_BY, **{"wire_formats.py": f"{SMOKE}::test_wire_formats_gone",
                               "adam_fused.py": "test_long_run_benchmark.py::test_long_run_smoke",
                               "gone.py": f"{SMOKE}::test_compression_smoke"})
    problems = uncovered(scripts, doctored)
    assert any(p.startswith("wire_formats.py:") and "no test function" in p for p in problems)
    assert any(p.startswith("adam_fused.py:") and "never names" in p for p in problems)
    assert any(p.startswith("gone.py:") and "not in benchmarks/" in p for p in problems)
    assert len(problems) == 3, problems


def test_comments_and_docstrings_do_not_count(tmp_path):
    (tmp_path / "test_x.py").write_text(
        '"""Runs benchmarks/alpha.py."""\n# beta.py too\n'
        'def test_a():\n    """gamma.py"""\n    run("delta.py")\n')
    run_by = {f"{s}.py": "test_x.py::test_a" for s in ("alpha", "beta", "gamma", "delta")}
    problems = uncovered([*run_by], run_by, tests=tmp_path)
    assert sorted(p.split(":")[0] for p in problems) == ["alpha.py", "beta.py", "gamma.py"]
