"""jss.calibrate on every rank: the same fit everywhere, written by rank 0."""

import json
import os
import tempfile

from conftest import WORLD

import jax_sparse_sync as jss
from jax_sparse_sync import cost_model


def test_calibrate_agrees_across_ranks_and_installs():
    before = cost_model.current_alpha_beta()
    path = WORLD.bcast(tempfile.mkdtemp() if WORLD.Get_rank() == 0 else None)
    path = os.path.join(path, "alpha_beta.json")
    try:
        params = jss.calibrate(sizes=(8, 1024, 65536, 262144), repeats=3, path=path)
        assert len(set(WORLD.allgather((params.alpha, params.beta)))) == 1
        assert params.beta > 0 and params.alpha >= 0
        if WORLD.Get_size() > 1:
            assert cost_model.current_alpha_beta() == params
            if WORLD.Get_rank() == 0:
                record = json.load(open(path))
                assert record["nranks"] == WORLD.Get_size() and len(record["median_s"]) == 4
    finally:
        cost_model.set_alpha_beta(before)
        WORLD.Barrier()
