"""Helpers for tests that run on every rank of an MPI job.

These tests run both as plain ``pytest`` (a world of one rank) and under
``mpiexec -n N python -m pytest tests/mpi`` (tests/test_multirank.py launches
that for several N, with timeouts). Every test must issue the same collectives
in the same order on every rank.
"""

import contextlib
import hashlib
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

# Test plumbing talks on COMM_WORLD; the library uses its own clone.
WORLD = MPI.COMM_WORLD


def digest(x) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(x)).tobytes()).hexdigest()


def assert_same_on_all_ranks(x, what="result"):
    digests = WORLD.allgather(digest(x))
    assert len(set(digests)) == 1, f"{what} differs across ranks: {digests}"


@pytest.fixture
def world():
    return WORLD


@contextlib.contextmanager
def raises_mpi_error(match):
    """pytest.raises for an error an MPI handler returns, then the recovery a
    user needs on GPU before the next MPI call (jss.reset_after_mpi_error)."""
    import jax_sparse_sync as jss

    with pytest.raises(Exception, match=match) as info:
        yield info
    jss.reset_after_mpi_error()
