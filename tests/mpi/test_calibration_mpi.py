"""jss.planning.calibrate on every rank: the same fit everywhere, written by rank 0."""

import contextlib
import json
import os
import tempfile
import warnings

import pytest
from conftest import WORLD

import jax_sparse_sync as jss
from jax_sparse_sync.planning import cost_model
from jax_sparse_sync.planning.calibration import load_alpha_beta


@contextlib.contextmanager
def alpha_beta_restored():
    """Yields the installed alpha-beta parameters; reinstalls them after the block, then
    waits for every rank."""
    before = cost_model.current_alpha_beta()
    try:
        yield before
    finally:
        cost_model.set_alpha_beta(before)
        WORLD.Barrier()


def calibration_path():
    """A file path for calibrate's record, the same on every rank (rank 0's new directory)."""
    path = WORLD.bcast(tempfile.mkdtemp() if WORLD.Get_rank() == 0 else None)
    return os.path.join(path, "alpha_beta.json")


def test_calibrate_agrees_across_ranks_and_installs():
    with alpha_beta_restored():
        path = calibration_path()
        # the sweep is extended 4x a step while an exchange takes < 10 s: to max_bytes
        params = jss.planning.calibrate(sizes=(8, 1024, 65536, 262144), repeats=3, path=path,
                                        bandwidth_seconds=10.0, max_bytes=1 << 22)
        assert len(set(WORLD.allgather((params.alpha, params.beta)))) == 1
        assert params.beta > 0 and params.alpha >= 0
        if WORLD.Get_size() > 1:
            assert cost_model.current_alpha_beta() == params
            if WORLD.Get_rank() == 0:
                record = json.load(open(path))
                assert record["nranks"] == WORLD.Get_size()
                assert record["sizes"] == [8, 1024, 65536, 262144, 1 << 20, 1 << 22]
                assert len(record["median_s"]) == 6


#: where a selection's local work is always above the noise (CI's oversubscribed cores)
LOCAL_SIZES = (1 << 16, 1 << 18)


def check_local_work_fit(params, kinds, unmeasured):
    """Every rank holds the same fit of ``kinds``, in that order, non-negative terms that
    grow with N; a kind within the noise is priced at 0 and named in a warning."""
    assert len(set(WORLD.allgather(params.local))) == 1
    assert [k for k, *_ in params.local] == list(kinds)
    for kind in kinds:
        fixed, per_entry, per_kept = params.local_work(kind)
        assert fixed >= 0 and per_entry >= 0 and per_kept >= 0
        # A dense sync on a one-rank communicator adds little to the plain step at
        # these sizes: on CI's oversubscribed cores every point once measured <= 0
        # (the sync step no slower). Then the fit prices it at 0 and says so; a
        # selection (the sparse kinds) is always above the noise here.
        if kind == "dense_sync" and per_entry == 0:
            assert fixed == 0 and any(repr(kind) in m for m in unmeasured), unmeasured
            continue
        assert per_entry > 0 and not any(repr(kind) in m for m in unmeasured)
        # the term grows with N: 64x the entries cost more than 1x
        assert cost_model.local_work_time(kind, size=1 << 22, params=params) > \
            cost_model.local_work_time(kind, size=1 << 16, params=params)


@contextlib.contextmanager
def noise_warnings():
    """Yields the list that, after the block, holds rank 0's "not measurable above the
    noise" warnings (rank 0 fits and warns; the fit is everyone's), on every rank."""
    unmeasured = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield unmeasured
    unmeasured += WORLD.bcast([str(w.message) for w in caught
                               if "not measurable above the noise" in str(w.message)])


def test_local_work_calibration_is_the_same_on_every_rank():
    # topk_sync_group's fit is checked the same way in the group-cost test below, which
    # calibrates it anyway (its 16 groups are this file's largest programs)
    with alpha_beta_restored() as before:
        with noise_warnings() as unmeasured:
            params = jss.planning.calibrate(
                sizes=(8, 4096), repeats=1, local=("topk_sync", "dense_sync"),
                local_sizes=LOCAL_SIZES, install=False)
        check_local_work_fit(params, ("topk_sync", "dense_sync"), unmeasured)
        assert cost_model.current_alpha_beta() == before  # install=False


def test_contention_gamma_is_measured_saved_and_the_same_on_every_rank():
    with alpha_beta_restored() as before:
        path = calibration_path()
        params = jss.planning.calibrate(sizes=(8, 65536), repeats=2, path=path, contention=True,
                               contention_sizes=(64, 65536, 524288))
        assert len(set(WORLD.allgather(params.gamma))) == 1
        if WORLD.Get_size() > 1:
            assert 1.0 <= params.gamma <= 2.0
            if WORLD.Get_rank() == 0:
                record = json.load(open(path))
                assert len(record["contention"]["two_s"]) == 3
                assert load_alpha_beta(path).gamma == params.gamma
        else:
            assert params.gamma == before.gamma  # nothing to measure on one rank


def test_group_cost_is_measured_on_the_transport_saved_and_the_same_on_every_rank():
    with alpha_beta_restored():
        path = calibration_path()
        with noise_warnings() as unmeasured:
            params = jss.planning.calibrate(sizes=(8, 4096), repeats=2,
                                            local=("topk_sync_group",), local_sizes=LOCAL_SIZES,
                                            bandwidth_seconds=0, install=False,
                                            group_cost=True, path=path)
        # the local-work fit, as for the other kinds (the group cost adds to its fixed part)
        check_local_work_fit(params, ("topk_sync_group",), unmeasured)
        if WORLD.Get_rank() == 0:
            records = json.load(open(path))["group_cost"]
            if WORLD.Get_size() == 1:  # nothing on the wire: nothing measured
                assert records == []
                return
            (record,) = records
            assert record["kind"] == "topk_sync_group" and record["groups"] == 16
            assert record["measured_s"] > 0 and record["predicted_s"] > 0
            # what the step cost beyond the model, per group, is in the fixed part
            assert record["per_group_s"] == pytest.approx(
                max(0.0, (record["measured_s"] - record["predicted_s"]) / 16))
            fixed = load_alpha_beta(path).local_work("topk_sync_group")[0]
            assert fixed >= record["per_group_s"] >= 0
