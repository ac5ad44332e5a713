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
    user needs before the next MPI call (jss.mpi.reset_after_mpi_error).

    The reset is collective, so it runs only where every rank raised: a rank that
    did not fails the test, and its peers must not wait for it in the reset (they
    meet it in the outcome agreement below instead)."""
    import jax_sparse_sync as jss

    raised = False
    try:
        with pytest.raises(Exception, match=match) as info:
            yield info
        raised = True
    finally:
        if WORLD.allreduce(raised, op=MPI.LAND):
            jss.mpi.reset_after_mpi_error()


def _failure_summary(report) -> str:
    """The one line a peer needs: the exception's message where pytest has it."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:300] if text.strip() else report.when


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Every rank gets the same outcome for every phase of every test.

    A test that fails on one rank only (a timing check under load, say) would
    otherwise stop that rank under ``-x`` while the others walk into the next
    test's collective and wait for it until the per-test timeout: a hang that
    hides the real failure. Agreeing here costs one small allgather per phase;
    setup, call and teardown stay in step on every rank because a setup failure
    anywhere fails the setup everywhere (and so skips the call everywhere). A
    rank whose own phase passed reports the failing ranks and their errors.
    """
    outcome = yield
    report = outcome.get_result()
    if WORLD.Get_size() == 1:
        return
    mine = _failure_summary(report) if report.failed else None
    failures = [(r, s) for r, s in enumerate(WORLD.allgather(mine)) if s is not None]
    if failures and not report.failed:
        report.outcome = "failed"
        report.longrepr = (
            f"{report.when} failed on rank(s) {[r for r, _ in failures]} (this is rank "
            f"{WORLD.Get_rank()}, where it passed):\n"
            + "\n".join(f"  rank {r}: {s}" for r, s in failures))
