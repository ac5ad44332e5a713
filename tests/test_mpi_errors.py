"""MPI failures come back as Python exceptions naming the call and the rank."""

import jax
import jax.numpy as jnp
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.mpi.sparse_allreduce import sparse_allreduce_p


def test_invalid_communicator_is_an_exception_not_an_abort():
    with pytest.raises(Exception, match=r"MPI_Comm_rank failed on rank \? \(COMM_WORLD rank 0"):
        out = sparse_allreduce_p.bind(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), jnp.int32(0),
                                      size=4, algorithm=1, comm=987654, nan_policy=0,
                                      quantize_bits=0, qsgd_bucket=1024, wire=0)
        jax.block_until_ready(out)
    jss.mpi.reset_after_mpi_error()  # on GPU the failed call's token would fail the next call
    # the process and the default communicator are still fine
    assert float(jss.sparse_allreduce(jnp.ones(1), jnp.zeros(1, jnp.int32), size=2)[0]) == 1.0


def test_freed_communicator_is_rejected_in_python():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD.Dup()
    comm.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):
        jss.sparse_allreduce(jnp.ones(1), jnp.zeros(1, jnp.int32), size=2, comm=comm)


def test_a_new_communicator_on_a_freed_ones_handle_gets_its_own_id():
    # MPICH gives a freed communicator's Fortran handle to the next one created. The id
    # compiled programs name a communicator by is cached on the communicator (an MPI
    # attribute, dropped by Free, not copied by Dup): keyed by the handle, the new one
    # would be taken for the freed one, and after an MPI error's renewal
    # (reset_after_mpi_error) run on that one's duplicate, another group.
    from mpi4py import MPI

    from jax_sparse_sync.mpi.comm import _IN_USE, comm_attribute
    first = MPI.COMM_WORLD.Dup()
    first_id = comm_attribute(first)
    assert comm_attribute(first) == first_id  # stable while it lives
    handle = first.py2f()
    first.Free()
    second = MPI.COMM_WORLD.Dup()
    try:
        second_id = comm_attribute(second)
        assert second_id != first_id
        index = second_id - jss._ext.cpu_module.COMM_ID_BASE
        assert _IN_USE[index] is second
        assert second.py2f() == handle  # MPICH's reuse: the case this is about
        copy = second.Dup()  # a duplicate does not inherit the id
        assert comm_attribute(copy) not in (first_id, second_id)
        copy.Free()
        out = jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4, comm=second)
        assert out.tolist() == [1.0, 1.0, 0.0, 0.0]
    finally:
        second.Free()
