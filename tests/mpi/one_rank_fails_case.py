"""Not collected by the suite (no test_ prefix): tests/test_multirank.py runs it
under mpiexec to check that a test failing on one rank fails on every rank, so
``-x`` stops them all instead of leaving the others in the next collective."""

from conftest import WORLD


def test_fails_on_the_last_rank_only():
    assert WORLD.Get_rank() != WORLD.Get_size() - 1, "planted failure"


def test_a_collective_the_failed_rank_would_never_join():
    WORLD.Barrier()
