"""The alpha-beta fit, its file format, and its effect on algorithm='auto'."""

import warnings

import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.planning import calibration, local_work


def test_fit_recovers_exact_line():
    sizes = np.array([8, 64, 512, 4096, 32768, 262144])
    params = calibration.fit_alpha_beta(sizes, 5e-6 + 2e-9 * sizes)
    assert params.alpha == pytest.approx(5e-6, rel=1e-6)
    assert params.beta == pytest.approx(2e-9, rel=1e-6)


def test_fit_clamps_negative_latency():
    params = calibration.fit_alpha_beta([100, 200, 300], [1e-7, 3e-7, 5e-7])  # alpha < 0
    assert params.alpha == 0.0 and params.beta > 0


def _burst_link_sweep(seed: int, *, alpha=2.5e-4, beta=40e-9, burst=256 << 10,
                      small_noise=0.3, large_noise=0.02):
    """A 200 Mbit/s link behind a 256 KiB token bucket, timed on a loaded machine: sizes
    8 B - 8 MiB every 4x, the first ``burst`` bytes at host speed, the latency-bound
    sizes scattered by ``small_noise`` (log-normal), the large ones by ``large_noise``."""
    rng = np.random.default_rng(seed)
    sizes = np.array([2**e for e in range(3, 24, 2)], np.float64)
    times = alpha + beta * np.maximum(sizes - burst, 0.0)
    noise = np.where(sizes < burst, small_noise, large_noise)
    return sizes, times * np.exp(rng.normal(0.0, noise))


def _relative_least_squares(sizes, times):
    """The fit before issue 33: one line through every size, relative error weighted."""
    a = np.stack([np.ones_like(sizes), sizes], axis=1)
    w = 1.0 / times
    return np.linalg.lstsq(a * w[:, None], times * w, rcond=None)[0]


@pytest.mark.parametrize("seed", range(5))
def test_fit_takes_beta_from_the_large_sizes_on_a_burst_link(seed):
    sizes, times = _burst_link_sweep(seed)
    params = calibration.fit_alpha_beta(sizes, times)
    assert params.beta == pytest.approx(40e-9, rel=0.05)
    assert params.alpha == pytest.approx(2.5e-4, rel=0.3)
    # the old fit on the same timings: the many latency points and the bucket's
    # fast medium sizes set its slope, far from the link's
    _, old_beta = _relative_least_squares(sizes, times)
    assert abs(old_beta - 40e-9) / 40e-9 > 0.2


def test_fit_takes_the_median_of_repeated_sizes():
    sizes = np.repeat([8.0, 4096.0, 1 << 20, 1 << 22], 3)
    times = 1e-4 + 1e-8 * sizes
    times[-1] *= 10.0  # one stalled repeat of the largest size
    params = calibration.fit_alpha_beta(sizes, times)
    assert params.beta == pytest.approx(1e-8, rel=1e-6)
    assert params.alpha == pytest.approx(1e-4, rel=1e-6)


def test_fit_rejects_one_size_and_mismatched_lengths():
    with pytest.raises(ValueError, match="two different sizes"):
        calibration.fit_alpha_beta([64, 64], [1e-5, 2e-5])
    with pytest.raises(ValueError, match="equal length"):
        calibration.fit_alpha_beta([8, 64, 512], [1e-5, 2e-5])


def test_save_load_roundtrip(tmp_path):
    p = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9)
    calibration.save_alpha_beta(p, tmp_path / "ab.json", nranks=4)
    assert calibration.load_alpha_beta(tmp_path / "ab.json") == p
    bucket = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9, burst_bytes=262144.0)
    calibration.save_alpha_beta(bucket, tmp_path / "burst.json")
    assert calibration.load_alpha_beta(tmp_path / "burst.json") == bucket


def test_the_links_burst_is_kept_checked_and_planned_with():
    from jax_sparse_sync.planning.plan_grouping import sparse_link
    p = jss.planning.calibrate(sizes=(8, 64), burst_bytes=262144, install=False)
    assert p.burst_bytes == 262144.0
    assert jss.planning.calibrate(sizes=(8, 64), install=False).burst_bytes == 0.0
    for bad in (-1, float("nan"), float("inf"), "256k", True):
        with pytest.raises(ValueError, match="calibrate: burst_bytes"):
            jss.planning.calibrate(sizes=(8, 64), burst_bytes=bad, install=False)
    ab = cost_model.AlphaBeta(alpha=1e-4, beta=4e-8, burst_bytes=262144.0)
    link, _, _ = sparse_link(nranks=2, size=10_000, k=100, params=ab)
    assert link.burst_s == pytest.approx(4e-8 * 262144)  # 10.5 ms: 256 KiB at 200 Mbit/s
    assert sparse_link(nranks=2, size=10_000, k=100,
                       params=cost_model.AlphaBeta(alpha=1e-4, beta=4e-8))[0].burst_s == 0.0


def test_auto_follows_the_installed_parameters():
    before = cost_model.current_alpha_beta()
    try:
        # a latency-bound network favours fewer rounds; a slow link favours fewer bytes
        cost_model.set_alpha_beta(cost_model.AlphaBeta(alpha=1.0, beta=1e-15))
        latency_choice = jss.planning.resolve_algorithm("auto", nranks=8, size=1_000_000, k=100_000)
        cost_model.set_alpha_beta(cost_model.AlphaBeta(alpha=1e-9, beta=1e-6))
        bandwidth_choice = jss.planning.resolve_algorithm("auto", nranks=8, size=1_000_000, k=100_000)
        assert latency_choice != bandwidth_choice
        assert cost_model.predict_time(bandwidth_choice, nranks=8, size=1_000_000, k=100_000) <= \
            cost_model.predict_time(latency_choice, nranks=8, size=1_000_000, k=100_000)
    finally:
        cost_model.set_alpha_beta(before)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="beta > 0"):
        cost_model.set_alpha_beta(cost_model.AlphaBeta(alpha=1e-6, beta=0.0))


def test_single_rank_calibration_returns_current():
    assert jss.planning.calibrate(sizes=(8, 64)) == cost_model.current_alpha_beta()


def test_local_work_fit_and_file_roundtrip(tmp_path):
    sizes = np.array([1 << 20, 1 << 22, 1 << 24])
    fixed, per_entry, per_kept = local_work.fit_local_work(sizes, 2e-3 + 3e-9 * sizes)
    assert fixed == pytest.approx(2e-3, rel=1e-6) and per_entry == pytest.approx(3e-9, rel=1e-6)
    assert per_kept == 0.0
    # noise that makes the slope negative: all of the time is taken per entry
    assert local_work.fit_local_work([100, 200], [2e-3, 1e-3]) == (0.0, pytest.approx(2e-5), 0.0)
    p = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9,
                             local=(("topk_sync", fixed, per_entry, 5e-8),))
    calibration.save_alpha_beta(p, tmp_path / "ab.json")
    assert calibration.load_alpha_beta(tmp_path / "ab.json") == p
    assert cost_model.local_work_time("topk_sync", size=1 << 22, k=1000, params=p) == \
        pytest.approx(2e-3 + 3e-9 * (1 << 22) + 5e-8 * 1000)
    assert cost_model.local_work_time("dense_sync", size=1 << 22, params=p) == 0.0  # not measured
    with pytest.raises(ValueError, match="unknown local-work kind"):
        p.local_work("topk")


def test_group_local_work_is_per_group_and_the_planner_charges_it():
    from jax_sparse_sync.planning.plan_grouping import sparse_link
    sizes = np.array([1 << 16, 1 << 18], np.float64)
    groups = local_work.groups_timed("topk_sync_group")
    assert groups == local_work.GROUPS_TIMED == 16 and local_work.groups_timed("topk_sync") == 1
    # a 16-group step: 16 fixed parts and the per-entry work of all entries
    fixed, per_entry, _ = local_work.fit_local_work(sizes, groups * 5e-4 + 3e-9 * sizes, groups)
    assert fixed == pytest.approx(5e-4, rel=1e-6) and per_entry == pytest.approx(3e-9, rel=1e-6)
    one = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9, local=(("topk_sync", 1e-3, 2e-9),))
    both = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9, local=(("topk_sync", 1e-3, 2e-9),
                                                             ("topk_sync_group", fixed, per_entry)))
    *_, local_one = sparse_link(nranks=4, size=1 << 20, k=1 << 10, params=one)
    *_, local_both = sparse_link(nranks=4, size=1 << 20, k=1 << 10, params=both)
    assert local_one(1000) == pytest.approx(1e-3 + 2e-9 * 1000)  # ungrouped term: no group one
    # with a per-kept term the planner charges a group its share of k (k n / N entries)
    kept = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9, local=(("topk_sync", 1e-3, 2e-9, 1e-7),))
    *_, local_kept = sparse_link(nranks=4, size=1 << 20, k=1 << 10, params=kept)
    assert local_kept(1 << 18) == pytest.approx(1e-3 + 2e-9 * (1 << 18) + 1e-7 * (1 << 8))
    assert local_both(1000) == pytest.approx(5e-4 + 3e-9 * 1000)


def test_predicted_step_time_adds_compute_local_and_wire():
    p = cost_model.AlphaBeta(alpha=1e-4, beta=8e-9,
                             local=(("topk_sync", 1e-3, 2e-9), ("dense_sync", 0.0, 4e-9)))
    n, k, pr = 7_500_000, 7_500, 4
    sparse = cost_model.predict_step_time("topk_sync", nranks=pr, size=n, k=k, compute_s=0.1,
                                          algorithm="allgather", params=p)
    wire = cost_model.predict_time("allgather", nranks=pr, size=n, k=k, params=p)
    assert sparse == pytest.approx(0.1 + 1e-3 + 2e-9 * n + wire)
    dense = cost_model.predict_step_time("dense_sync", nranks=pr, size=n, k=n, compute_s=0.1,
                                         params=p)
    assert dense == pytest.approx(0.1 + 4e-9 * n + cost_model.predict_time(
        "dense", nranks=pr, size=n, k=n, params=p))
    assert dense > sparse


def test_local_work_fit_separates_work_per_kept_entry():
    # two sizes at two densities: the three terms come back exactly
    n = np.array([1 << 20, 1 << 22, 1 << 20, 1 << 22], np.float64)
    k = np.array([10_486, 41_943, 1_049, 4_194], np.float64)
    t = 16 * 1e-3 + 2e-9 * n + 8e-8 * k
    fixed, per_entry, per_kept = local_work.fit_local_work(n, t, groups=16, kept=k)
    assert fixed == pytest.approx(1e-3, rel=1e-6)
    assert per_entry == pytest.approx(2e-9, rel=1e-6) and per_kept == pytest.approx(8e-8, rel=1e-6)
    # a negative per-kept slope (noise) is dropped: the two-term fit of the same points
    noisy = 1e-3 + 2e-9 * n - 1e-8 * k
    assert local_work.fit_local_work(n, noisy, kept=k)[2] == 0.0
    assert local_work.fit_local_work(n, noisy, kept=k)[:2] == \
        pytest.approx(local_work.fit_local_work(n, noisy)[:2])
    # one density only: k is proportional to N and cannot be told apart
    with pytest.raises(ValueError, match="at least 3"):
        local_work.fit_local_work(n[:2], t[:2], kept=k[:2])


def test_a_triple_without_per_kept_is_zero_per_kept_entry(tmp_path):
    import json
    old = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9, local=(("oktopk_sync", 1e-3, 2e-9),))
    assert old.local_work("oktopk_sync") == (1e-3, 2e-9, 0.0)
    assert cost_model.local_work_time("oktopk_sync", size=100, k=10, params=old) == \
        pytest.approx(1e-3 + 2e-7)
    # a file written before the per-kept term loads with 0 per kept entry
    (tmp_path / "v1.json").write_text(json.dumps({
        "alpha_s": 2e-5, "beta_s_per_byte": 1e-9,
        "local_work": [{"kind": "topk_sync", "fixed_s": 1e-3, "per_entry_s": 2e-9}]}))
    assert calibration.load_alpha_beta(tmp_path / "v1.json").local_work("topk_sync") == \
        (1e-3, 2e-9, 0.0)
    # dense_sync keeps everything at no cost per kept entry
    dense = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9, local=(("dense_sync", 0.0, 4e-9, 1e-7),))
    assert cost_model.local_work_time("dense_sync", size=100, k=100, params=dense) == \
        pytest.approx(4e-7)


def test_local_work_needs_two_densities():
    with pytest.raises(ValueError, match="local_densities"):
        jss.planning.calibrate(sizes=(8, 64), local=("topk_sync",), local_densities=(0.01, 0.01))
    with pytest.raises(ValueError, match="local_densities"):
        jss.planning.calibrate(sizes=(8, 64), local=("topk_sync",), local_densities=(0.01, 2.0))


def test_local_work_below_the_noise_is_priced_at_zero_with_a_warning(monkeypatch):
    # every point timed the synced step no slower than the plain one (clamped to 0)
    monkeypatch.setattr(calibration, "time_local_work", lambda *a, **kw: 0.0)
    with pytest.warns(RuntimeWarning, match="'dense_sync' was not measurable.*local_sizes"):
        params = jss.planning.calibrate(sizes=(8, 64), local=("dense_sync",),
                                        local_sizes=(1 << 10, 1 << 12), install=False)
    assert params.local_work("dense_sync") == (0.0, 0.0, 0.0)
    # one point above the noise is a measurement: no warning
    monkeypatch.setattr(calibration, "time_local_work",
                        lambda kind, n, **kw: 1e-3 if n > 1024 else 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params = jss.planning.calibrate(sizes=(8, 64), local=("dense_sync",),
                                        local_sizes=(1 << 10, 1 << 12), install=False)
    assert params.local_work("dense_sync")[1] > 0


def test_old_calibration_file_loads_without_local_work(tmp_path):
    import json
    (tmp_path / "old.json").write_text(json.dumps({"alpha_s": 2e-5, "beta_s_per_byte": 1e-9}))
    p = calibration.load_alpha_beta(tmp_path / "old.json")
    assert p == cost_model.AlphaBeta(alpha=2e-5, beta=1e-9) and p.local == ()


def test_a_grouped_dense_sync_is_planned_with_its_own_local_work():
    # every entry kept with the dense algorithm: the dense_sync_group term (no per-kept
    # part) and the dense allreduce's bytes; a sparse plan keeps topk_sync_group's
    from jax_sparse_sync.planning.plan_grouping import sparse_link
    params = cost_model.AlphaBeta(alpha=1e-4, beta=4e-8, gamma=1.5, local=(
        ("topk_sync_group", 2e-3, 1e-8, 1e-6), ("dense_sync_group", 5e-4, 3e-9, 1e-6)))
    link, message_bytes, local_s = sparse_link(nranks=2, size=1000, k=1000, algorithm="dense",
                                               params=params)
    assert local_s(400) == pytest.approx(5e-4 + 3e-9 * 400)
    assert message_bytes(400) == cost_model.wire_volume("dense", nranks=2, size=400,
                                                        k=400).bytes_max
    assert link.a == pytest.approx(params.alpha * cost_model.wire_volume(
        "dense", nranks=2, size=1000, k=1000).messages)
    _, _, sparse_local = sparse_link(nranks=2, size=1000, k=10, algorithm="allgather",
                                     params=params)
    assert sparse_local(400) == pytest.approx(2e-3 + 1e-8 * 400 + 1e-6 * 4)
    assert local_work.groups_timed("dense_sync_group") == local_work.GROUPS_TIMED
    assert cost_model.local_work_time("dense_sync_group", size=100, k=100, params=params) == \
        pytest.approx(5e-4 + 3e-7)


def test_fit_group_fixed_adds_the_least_squares_cost_per_group():
    params = cost_model.AlphaBeta(alpha=1e-4, beta=4e-8, local=(("dense_sync_group", 0.0, 2e-8),))
    # plans of 10, 40 and 100 groups, each 5 ms per group slower than predicted
    fitted = calibration.fit_group_fixed(params, "dense_sync_group", [10, 40, 100],
                                         [1.05, 1.2, 1.5], [1.0, 1.0, 1.0])
    assert fitted.local_work("dense_sync_group") == pytest.approx((5e-3, 2e-8, 0.0))
    assert fitted.alpha == params.alpha and fitted.beta == params.beta
    # faster than predicted: nothing is taken away
    assert calibration.fit_group_fixed(params, "dense_sync_group", [3], [0.9], [1.0]) \
        .local_work("dense_sync_group")[0] == 0.0
    with pytest.raises(ValueError, match="group count"):
        calibration.fit_group_fixed(params, "dense_sync_group", [0], [1.0], [1.0])


def test_gamma_is_fitted_from_the_bandwidth_bound_sizes():
    sizes = [64, 512, 4096, 32768, 262144, 2097152]
    # recorded (P = 2, 200 Mbit/s, a link two operations share): the latency-bound sizes
    # scatter around the startup, one below it; over every size the median was 1.19
    one = [1.882e-3, 1.979e-3, 1.418e-3, 1.265e-3, 9.644e-3, 146.5e-3]
    two = [1.702e-3, 1.832e-3, 1.881e-3, 1.925e-3, 21.090e-3, 174.7e-3]
    t0 = one[0]
    every = [(b - t0) / (a - t0) for a, b in zip(one[1:], two[1:]) if a > t0]
    assert np.median(every) == pytest.approx(1.19, abs=0.01)  # the old estimate
    assert calibration.fit_gamma(sizes, one, two) == pytest.approx(
        np.median([(21.090e-3 - t0) / (9.644e-3 - t0), (174.7e-3 - t0) / (146.5e-3 - t0)]))
    assert calibration.fit_gamma(sizes, one, two) > 1.8
    # a shared link (alpha 0.2 ms, 40 ns/B, two at once at twice the bytes): 2; two
    # independent links: 1; the order of the sizes does not matter
    m = np.array(sizes, float)
    shared_one, shared_two = 2e-4 + 4e-8 * m, 2e-4 + 8e-8 * m
    assert calibration.fit_gamma(m, shared_one, shared_two) == pytest.approx(2.0)
    assert calibration.fit_gamma(m[::-1], shared_one[::-1], shared_one[::-1]) == pytest.approx(1.0)
    assert calibration.fit_gamma(m, shared_one, shared_one * 3) == 2.0  # clamped
    assert calibration.fit_gamma([8, 64], [1e-3, 1e-3], [2e-3, 2e-3]) == 1.0  # nothing above t0
    with pytest.raises(ValueError, match="fit_gamma"):
        calibration.fit_gamma([8, 64], [1e-3], [1e-3, 2e-3])
