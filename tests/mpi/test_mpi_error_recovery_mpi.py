"""Recovery after an MPI error (jss.mpi.reset_after_mpi_error) on every rank.

Run by tests/test_multirank.py at 2 and 3 ranks (and as a world of one rank by
plain pytest). The failure that leaves a peer's message behind is
tests/mpi/pending_request_case.py's; here: what the reset asks of the ranks.
"""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import raises_mpi_error
from mpi4py import MPI

import jax_sparse_sync as jss
from jax_sparse_sync import _ext
from jax_sparse_sync.mpi import comm as jss_comm
from jax_sparse_sync.mpi.sparse_allreduce import sparse_allreduce_p

SIZE = 8


def _sum_on(comm):
    """A sparse_allreduce on `comm` (each rank one entry, index = its rank)."""
    rank = comm.Get_rank()
    return jss.sparse_allreduce(jnp.ones(1), jnp.full(1, rank % SIZE, jnp.int32), size=SIZE,
                                comm=comm)


def _index(comm):
    return jss_comm.comm_attribute(comm) - _ext.cpu_module.COMM_ID_BASE


def test_the_reset_renews_communicators_handed_over_in_different_orders_on_each_rank(world):
    # Two duplicates of the world, handed to the library (traced: their ids given,
    # nothing run) in one order on even ranks and the other on odd ones, so their ids
    # are in opposite orders. After an MPI error on every rank, the reset agrees on the
    # error and duplicates each communicator: posted non-blocking for all of them, it
    # does not depend on the ids' order. (Blocking, in id order, rank 0 waited in
    # `first`'s allreduce and rank 1 in `second`'s: a deadlock, measured at P = 2, in
    # the MPI_Comm_dup that mpi4py's pickle-based allreduce makes first, holding the
    # GIL, so the per-test timeout could not fire either: the job's wall-clock limit
    # in tests/test_multirank.py ends it.)
    first, second = world.Dup(), world.Dup()
    for comm in (first, second):
        comm.Set_errhandler(MPI.ERRORS_RETURN)
    order = (first, second) if world.Get_rank() % 2 == 0 else (second, first)
    for comm in order:
        jax.make_jaxpr(lambda: _sum_on(comm))()
    assert (_index(first) < _index(second)) == (world.Get_rank() % 2 == 0)
    # an MPI call that fails on every rank (an invalid communicator: MPI_Comm_rank)
    with raises_mpi_error(r"MPI_Comm_rank failed"):
        jax.block_until_ready(sparse_allreduce_p.bind(
            jnp.ones(2), jnp.arange(2, dtype=jnp.int32), jnp.int32(0), size=4, algorithm=1,
            comm=987654, nan_policy=0, quantize_bits=0, qsgd_bucket=1024, wire=0))
    # (raises_mpi_error ran the reset)
    expected = np.zeros(SIZE, np.float32)
    np.add.at(expected, np.arange(world.Get_size()) % SIZE, 1.0)
    for comm in (first, second):
        fresh = jss_comm._IN_USE[_index(comm)]
        assert fresh is not comm and any(c is comm for c in jss_comm._RETIRED), (
            "the reset did not move the id to a duplicate")
        assert MPI.Comm.Compare(fresh, comm) == MPI.CONGRUENT
        errhandler = fresh.Get_errhandler()
        assert errhandler == MPI.ERRORS_RETURN  # errors still come back as exceptions
        errhandler.Free()
        np.testing.assert_array_equal(np.asarray(_sum_on(comm)), expected)
