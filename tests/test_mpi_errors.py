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
