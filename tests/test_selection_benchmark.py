"""benchmarks/selection.py checks every kernel against XLA (and the threshold-reuse
selections against the exact top-k) before it times them: those checks run here on a
small input."""

from benchmark_scripts import load_benchmark


def _selection_benchmark():
    return load_benchmark("selection")


def test_every_kernel_is_checked_and_timed_on_a_small_input():
    bench = _selection_benchmark()
    data = bench.run([1 << 14], [0.01], repeats=1, warmup=1, seed=0, lax_full_max=1 << 30,
                     lax_repeats=1, calls_per_sample=1)
    assert not data["unavailable"]
    (check,) = data["correctness"]
    assert check["k"] == 164 and check["topk_equals_lax_top_k"]
    assert check["updates_equal_xla_scatter"] is True
    # within the capacity, from the overflow list, beyond it: each checked
    assert all(check[f"{name}_checked"] for name in bench.REUSE_PASSING)
    timed = {r["method"] for r in data["records"]}
    assert timed == set(bench.OURS) | set(bench.BASELINES)
    assert all(r["median_s"] > 0 for r in data["records"])
