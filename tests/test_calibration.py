"""The alpha-beta fit, its file format, and its effect on algorithm='auto'."""

import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.planning import calibration, cost_model


def test_fit_recovers_exact_line():
    sizes = np.array([8, 64, 512, 4096, 32768, 262144])
    params = calibration.fit_alpha_beta(sizes, 5e-6 + 2e-9 * sizes)
    assert params.alpha == pytest.approx(5e-6, rel=1e-6)
    assert params.beta == pytest.approx(2e-9, rel=1e-6)


def test_fit_clamps_negative_latency():
    params = calibration.fit_alpha_beta([100, 200, 300], [1e-7, 3e-7, 5e-7])  # alpha < 0
    assert params.alpha == 0.0 and params.beta > 0


def test_save_load_roundtrip(tmp_path):
    p = cost_model.AlphaBeta(alpha=3e-5, beta=8e-9)
    calibration.save_alpha_beta(p, tmp_path / "ab.json", nranks=4)
    assert calibration.load_alpha_beta(tmp_path / "ab.json") == p


def test_auto_follows_the_installed_parameters():
    before = cost_model.current_alpha_beta()
    try:
        # a latency-bound network favours fewer rounds; a slow link favours fewer bytes
        cost_model.set_alpha_beta(cost_model.AlphaBeta(alpha=1.0, beta=1e-15))
        latency_choice = jss.resolve_algorithm("auto", nranks=8, size=1_000_000, k=100_000)
        cost_model.set_alpha_beta(cost_model.AlphaBeta(alpha=1e-9, beta=1e-6))
        bandwidth_choice = jss.resolve_algorithm("auto", nranks=8, size=1_000_000, k=100_000)
        assert latency_choice != bandwidth_choice
        assert cost_model.predict_time(bandwidth_choice, nranks=8, size=1_000_000, k=100_000) <= \
            cost_model.predict_time(latency_choice, nranks=8, size=1_000_000, k=100_000)
    finally:
        cost_model.set_alpha_beta(before)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="beta > 0"):
        cost_model.set_alpha_beta(cost_model.AlphaBeta(alpha=1e-6, beta=0.0))


def test_single_rank_calibration_returns_current():
    assert jss.calibrate(sizes=(8, 64)) == cost_model.current_alpha_beta()
